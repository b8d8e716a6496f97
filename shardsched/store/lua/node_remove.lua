-- node_remove: forget nodes: their allocatable, usage, reservations and owner entry.
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
  redis.call('DEL', node_key, resv_key, rexp_key, bound_key)
  redis.call('HDEL', KEYS[1], ARGV[j])
end
return removed
