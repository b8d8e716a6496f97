-- commit: a reserved pod was bound: turn its reservation into usage of the node.
--
-- KEYS[4(j-1)+1 .. +4]  node j:  <prefix>node:<name>, <prefix>resv:<name>,
--                                <prefix>rexp:<name>, <prefix>bound:<name>
-- ARGV[1]    JSON array of pods, each [uid, node index j (1-based), lease token the pod was
--            reserved with (decimal string)]
--
-- Per pod, returned code:
--   3 ALREADY    the pod is already counted in the node's usage (idempotent repeat, or the watch
--                observed the binding first); nothing changes
--   2 CONVERTED  the reservation with this token (expired or not, as long as it was not swept) moved
--                from "r:" to "u:", and the pod is recorded in the bound hash by uid
--   6 NOT_FOUND  no reservation of the pod with this token on this node (swept after expiry,
--                released, or replaced): nothing changes; count the pod with observe instead
-- Returns: a JSON array, one code per pod in order.

local out = {}
for _, pod in ipairs(cjson.decode(ARGV[1])) do
  local uid, j, token = unpack(pod)
  local node_key, resv_key, rexp_key, bound_key = node_keys(0, j)
  local code = 6
  if redis.call('HEXISTS', bound_key, uid) == 1 then
    code = 3
  else
    local raw = redis.call('HGET', resv_key, uid)
    if raw and cjson.decode(raw)[2] == token then
      local rec = drop_reservation(node_key, resv_key, rexp_key, uid)
      redis.call('HSET', bound_key, uid, rec[3])
      add_counters(node_key, 'u:', rec[3], 1)
      code = 2
    end
  end
  out[#out + 1] = code
end
flush_counters()
return cjson.encode(out)
