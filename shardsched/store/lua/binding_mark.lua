-- binding_mark: say that one shard has binds in flight (or no longer has), and whether a burst.
--
-- KEYS[1]    binding zset (shard id -> expiry, server ms)      <prefix>binding
-- KEYS[2]    burst zset (shard id -> expiry, server ms)        <prefix>bursting
-- ARGV[1]    shard id
-- ARGV[2]    time to live in ms; 0 removes the shard's marks
-- ARGV[3]    1 when a burst (a bind call that fills its request slots) is among the binds, else 0
--
-- A mark expires by itself (a shard that dies while binding holds nobody back for longer than
-- its TTL); a shard binding for longer marks again. Returns: 1.

local shard = ARGV[1]
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now_ms() + ttl, shard)
  if ARGV[3] == '1' then
    redis.call('ZADD', KEYS[2], now_ms() + ttl, shard)
  else
    redis.call('ZREM', KEYS[2], shard)
  end
else
  redis.call('ZREM', KEYS[1], shard)
  redis.call('ZREM', KEYS[2], shard)
end
return 1
