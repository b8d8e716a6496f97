-- lease_renew: extend live leases held by one shard with their current tokens.
--
-- KEYS[i]    pod hash of pod i                        <prefix>pod:<uid>   (i = 1..n)
-- ARGV[1]    shard id
-- ARGV[2]    ttl_ms: new lifetime from now, milliseconds of server time
-- ARGV[3]    JSON array: the lease token of pod i at index i (decimal strings)
--
-- A lease is renewed only when held by this shard with this token and not expired (an expired
-- lease is lost even if nobody took it yet: acquire it again for a new token).
-- Returns: a JSON array, one per pod in order: 1 renewed, 0 lost.

local shard, ttl = ARGV[1], tonumber(ARGV[2])
local tokens = cjson.decode(ARGV[3])
local now = now_ms()
local out = {}
for i = 1, #KEYS do
  local pod_key = KEYS[i]
  local lease = redis.call('HMGET', pod_key, 's', 't', 'e')
  if lease[1] == shard and lease[2] == tokens[i] and tonumber(lease[3]) > now then
    redis.call('HSET', pod_key, 'e', now + ttl)
    extend_ttl(pod_key, ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return cjson.encode(out)
