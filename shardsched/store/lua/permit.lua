-- permit: the check right before a batch is bound. Per pod: is this shard still the pod's lease
-- holder with this token, and still the owner of the node at the current shard-map epoch? If so
-- the lease is extended (it covers the bind call); otherwise nothing changes.
--
-- KEYS[1]    shard-map epoch              <prefix>epoch
-- KEYS[2]    shard map, node -> shard id  <prefix>owners
-- KEYS[2+i]  pod hash of pod i            <prefix>pod:<uid>   (i = 1..n)
-- ARGV[1]    shard id
-- ARGV[2]    the caller's shard-map epoch (integer)
-- ARGV[3]    ttl_ms: new lease lifetime from now, milliseconds of server time
-- ARGV[4]    JSON array: pod i at index i as [lease token (decimal string), node name]
--
-- Per pod, checked in this order (the codes of reserve.lua):
--   2 LEASE_LOST  the lease is not held by this shard with this token, or has expired
--   3 FENCED      ARGV[2] is not the current epoch, or the node's owner is not this shard
--   0 OK          the lease now expires at now + ttl_ms
-- Returns: a JSON array of the codes, one per pod in order.

local shard, epoch, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local pods = cjson.decode(ARGV[4])
local now = now_ms()
local epoch_ok = tonumber(redis.call('GET', KEYS[1]) or '0') == epoch
local out = {}
for i = 1, #pods do
  local token, node = pods[i][1], pods[i][2]
  local pod_key = KEYS[2 + i]
  local lease = redis.call('HMGET', pod_key, 's', 't', 'e')
  if lease[1] ~= shard or lease[2] ~= token or tonumber(lease[3]) <= now then
    out[i] = 2
  elseif not epoch_ok or redis.call('HGET', KEYS[2], node) ~= shard then
    out[i] = 3
  else
    redis.call('HSET', pod_key, 'e', now + ttl)
    extend_ttl(pod_key, ttl)
    out[i] = 0
  end
end
return cjson.encode(out)
