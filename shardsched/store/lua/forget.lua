-- forget: pods deleted or terminal (Succeeded, Failed) no longer use their node.
--
-- KEYS[4(j-1)+1 .. +4]  node j:  <prefix>node:<name>, <prefix>resv:<name>,
--                                <prefix>rexp:<name>, <prefix>bound:<name>
-- ARGV[1]    JSON array of pods, each [uid, node index j (1-based)]
--
-- Removes the pod from the node's bound hash and "u:", and drops its reservation on that node if
-- one is left. Idempotent.
-- Per pod, returned code:
--   5 REMOVED    usage or a reservation was removed
--   6 NOT_FOUND  the node had neither; nothing changes
-- Returns: a JSON array, one code per pod in order.

local out = {}
for _, pod in ipairs(cjson.decode(ARGV[1])) do
  local uid, j = unpack(pod)
  local node_key, resv_key, rexp_key, bound_key = node_keys(0, j)
  local code = 6
  local requests = redis.call('HGET', bound_key, uid)
  if requests then
    add_counters(node_key, 'u:', requests, -1)
    redis.call('HDEL', bound_key, uid)
    code = 5
  end
  if drop_reservation(node_key, resv_key, rexp_key, uid) then code = 5 end
  out[#out + 1] = code
end
flush_counters()
return cjson.encode(out)
