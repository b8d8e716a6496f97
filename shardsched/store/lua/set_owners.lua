-- set_owners: update the shard map (node -> owner shard) and its epoch in one step.
--
-- KEYS[1]    shard-map epoch                          <prefix>epoch
-- KEYS[2]    shard map, hash node -> shard id         <prefix>owners
-- ARGV[1]    the new epoch (integer >= the current one; equal re-applies, e.g. a retry)
-- then 2 per node: node name, shard id ("" removes the node from the map)
--
-- Nodes not named keep their owner. Reserve refuses callers whose epoch differs from the
-- current one, so bumping the epoch fences off every shard that has not seen the new map.
-- Returns: {1, epoch} applied; {0, current epoch} refused because ARGV[1] < current (no change).

local epoch = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if epoch < current then
  return {0, current}
end
redis.call('SET', KEYS[1], ARGV[1])
for k = 2, #ARGV, 2 do
  if ARGV[k + 1] == '' then
    redis.call('HDEL', KEYS[2], ARGV[k])
  else
    redis.call('HSET', KEYS[2], ARGV[k], ARGV[k + 1])
  end
end
return {1, epoch}
