-- lease_acquire: take the leases of a batch of pods for one shard, with fencing tokens.
--
-- KEYS[1]    fencing-token counter, one for all pods   <prefix>token
-- KEYS[1+i]  pod hash of pod i                        <prefix>pod:<uid>   (i = 1..n)
-- ARGV[1]    shard id
-- ARGV[2]    ttl_ms: lease lifetime, milliseconds of server time
--
-- Per pod: a lease that is free or expired is granted with a new token (INCR of KEYS[1], so tokens
-- grow across all pods); a live lease already held by this shard keeps its token and gets a new
-- expiry (so a retried acquire does not fence off the shard's own reservations); a live lease of
-- another shard is refused.
-- Pod hash fields: "s" shard id, "t" token, "e" expiry (server ms).
-- Returns: a JSON array, one per pod in order: the token (> 0) when granted, 0 when held by
-- another shard.

local shard, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local out = {}
for i = 2, #KEYS do
  local pod_key = KEYS[i]
  local lease = redis.call('HMGET', pod_key, 's', 't', 'e')
  local live = lease[3] and tonumber(lease[3]) > now
  if live and lease[1] ~= shard then
    out[#out + 1] = 0
  else
    local token = live and tonumber(lease[2]) or redis.call('INCR', KEYS[1])
    redis.call('HSET', pod_key, 's', shard, 't', token, 'e', now + ttl)
    extend_ttl(pod_key, ttl)
    out[#out + 1] = token
  end
end
return cjson.encode(out)
