-- node_upsert: add nodes or update their allocatable, and optionally their owner shard.
--
-- KEYS[1]    shard map, hash node -> shard id         <prefix>owners
-- KEYS[1+i]  node hash of node i                      <prefix>node:<name>   (i = 1..n)
-- then 3 ARGV per node i: name, owner shard id ("" leaves the shard map as it is),
--            allocatable (resource list; resources not listed become 0)
--
-- Used and reserved counters are kept: a node whose allocatable shrank below its usage stays
-- overcommitted in the ledger (reserve then refuses it) until pods leave.
-- Returns: the number of nodes that were not known before.

local now = now_ms()
local added = 0
for i = 2, #KEYS do
  local node_key = KEYS[i]
  local o = 3 * (i - 2)
  local name, owner = ARGV[o + 1], ARGV[o + 2]
  local _, allocatable = decode_list(ARGV[o + 3])
  if redis.call('HEXISTS', node_key, 'up') == 0 then added = added + 1 end
  replace_counters(node_key, 'a:', allocatable)
  redis.call('HSET', node_key, 'up', now)
  if owner ~= '' then redis.call('HSET', KEYS[1], name, owner) end
end
return added
