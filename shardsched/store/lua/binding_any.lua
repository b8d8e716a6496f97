-- binding_any: how many shards have binds in flight, and how many a burst (marks not yet expired).
--
-- KEYS[1]    binding zset (shard id -> expiry, server ms)      <prefix>binding
-- KEYS[2]    burst zset (shard id -> expiry, server ms)        <prefix>bursting
--
-- Expired marks are removed first. Returns: {live binding marks, live burst marks}.

local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return {redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])}
