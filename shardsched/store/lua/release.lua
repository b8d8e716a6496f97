-- release: drop reservations (the rollback path after a failed Permit or Bind).
--
-- KEYS[4(j-1)+1 .. +4]  node j:  <prefix>node:<name>, <prefix>resv:<name>,
--                                <prefix>rexp:<name>, <prefix>bound:<name>
-- ARGV[1]    JSON array of pods, each [uid, node index j (1-based), lease token the pod was
--            reserved with (decimal string)]
--
-- Only the reservation made with this token is dropped, so a stale shard cannot release the
-- reservation of the pod's new holder. Idempotent, and safe when reserve never ran.
-- Per pod, returned code:
--   4 RELEASED   the reservation was dropped and subtracted from "r:"
--   6 NOT_FOUND  no reservation of the pod with this token on this node; nothing changes
-- Returns: a JSON array, one code per pod in order.

local out = {}
for _, pod in ipairs(cjson.decode(ARGV[1])) do
  local uid, j, token = unpack(pod)
  local node_key, resv_key, rexp_key = node_keys(0, j)
  local raw = redis.call('HGET', resv_key, uid)
  if raw and cjson.decode(raw)[2] == token then
    drop_reservation(node_key, resv_key, rexp_key, uid)
    out[#out + 1] = 4
  else
    out[#out + 1] = 6
  end
end
flush_counters()
return cjson.encode(out)
