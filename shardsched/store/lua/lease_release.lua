-- lease_release: give up leases held by one shard with their current tokens.
--
-- KEYS[i]    pod hash of pod i                        <prefix>pod:<uid>   (i = 1..n)
-- ARGV[1]    shard id
-- ARGV[2]    JSON array: the lease token of pod i at index i (decimal strings)
--
-- The lease fields are removed only when held by this shard with this token (expired or not);
-- otherwise nothing changes, so a stale holder cannot release its successor's lease. Reservations
-- are not touched (release them with the release script).
-- Returns: a JSON array, one per pod in order: 1 released, 0 not held with this token
-- (idempotent).

local shard = ARGV[1]
local tokens = cjson.decode(ARGV[2])
local out = {}
for i = 1, #KEYS do
  local pod_key = KEYS[i]
  local lease = redis.call('HMGET', pod_key, 's', 't')
  if lease[1] == shard and lease[2] == tokens[i] then
    redis.call('HDEL', pod_key, 's', 't', 'e')
    out[i] = 1
  else
    out[i] = 0
  end
end
return cjson.encode(out)
