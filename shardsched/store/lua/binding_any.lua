-- binding_any: how many shards have binds in flight (marks not yet expired).
--
-- KEYS[1]    binding zset (shard id -> expiry, server ms)      <prefix>binding
--
-- Expired marks are removed first. Returns: the number of live marks.

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
return redis.call('ZCARD', KEYS[1])
