-- binding_mark: say that one shard has binds in flight (or no longer has).
--
-- KEYS[1]    binding zset (shard id -> expiry, server ms)      <prefix>binding
-- ARGV[1]    shard id
-- ARGV[2]    time to live in ms; 0 removes the shard's mark
--
-- A mark expires by itself (a shard that dies while binding holds nobody back for longer than
-- its TTL); a shard binding for longer marks again. Returns: 1.

local shard = ARGV[1]
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now_ms() + ttl, shard)
else
  redis.call('ZREM', KEYS[1], shard)
end
return 1
