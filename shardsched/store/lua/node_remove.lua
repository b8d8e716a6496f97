-- node_remove: nodes deleted from the cluster: drop their allocatable, reservations and owner
-- entry. The usage of pods still bound to them is kept (pod GC deletes those pods later, and
-- forget then removes them): a node re-created under the same name before that must not look
-- empty (kube-scheduler's cache likewise keeps a deleted node's pods until they are gone).
--
-- KEYS[1]    shard map, hash node -> shard id         <prefix>owners
-- KEYS[1+4(j-1)+1 .. +4]  node j:  <prefix>node:<name>, <prefix>resv:<name>,
--                                  <prefix>rexp:<name>, <prefix>bound:<name>
-- ARGV[j]    name of node j
--
-- Idempotent. Reservations on a removed node are gone; reserve on it answers FENCED (no owner).
-- Returns: the number of nodes that were known.

local removed = 0
for j = 1, #ARGV do
  local node_key, resv_key, rexp_key, bound_key = node_keys(1, j)
  if redis.call('HEXISTS', node_key, 'up') == 1 then removed = removed + 1 end
  redis.call('DEL', resv_key, rexp_key)
  if redis.call('HLEN', bound_key) == 0 then
    redis.call('DEL', node_key, bound_key)
  else
    -- keep the "u:" usage counters and the bound hash; the node is unknown until upserted again
    local fields = redis.call('HKEYS', node_key)
    for _, f in ipairs(fields) do
      if string.sub(f, 1, 2) ~= 'u:' then redis.call('HDEL', node_key, f) end
    end
  end
  redis.call('HDEL', KEYS[1], ARGV[j])
end
return removed
