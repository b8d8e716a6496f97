-- observe: pods seen bound on the watch (by any scheduler) are counted in their node's usage,
-- idempotently by uid.
--
-- KEYS[i]    pod hash of pod i                        <prefix>pod:<uid>   (i = 1..n_pods)
-- KEYS[n_pods+4(j-1)+1 .. +4]  node j:  <prefix>node:<name>, <prefix>resv:<name>,
--                                       <prefix>rexp:<name>, <prefix>bound:<name>
-- ARGV[1]    JSON [node names, pods]: node j's name at index j; pod i is
--            [uid, index of the node it is bound to, requests (resource list as a JSON string,
--             incl. pods=1), index of the node the caller expects the pod hash's reservation
--             pointer ("rn") to name, 0 when it expects none or the bound node]
--
-- Per pod: a reservation of the pod on its node is dropped from "r:"; a reservation on the node
-- the pointer names is released; then, unless the pod is already in the bound hash, its requests
-- are added to "u:" and it is recorded there; a pod already there with other requests (an
-- in-place resize) has its old requests taken from "u:" and the new ones added. The returned code:
--   1 ADDED      counted, there was no reservation on this node
--   2 CONVERTED  counted, in place of its reservation on this node
--   3 ALREADY    was already counted with these requests; only reservations were cleaned up
--   8 RESIZED    was counted with other requests: now counted with these
--   7 MOVED      the pointer names a node whose keys were not passed: nothing done; the detail
--                is that node, pass its keys and retry
-- Returns: a JSON flat array, two entries per pod in order: code, detail ("" unless MOVED).

local batch = cjson.decode(ARGV[1])
local names, pods = batch[1], batch[2]
local n_pods = #pods
local out = {}
for i = 1, n_pods do
  local uid, j, requests, p = unpack(pods[i])
  local pod_key = KEYS[i]
  local pointer = redis.call('HGET', pod_key, 'rn')
  local code, detail = 0, ''
  if pointer and pointer ~= names[j] and (p == 0 or pointer ~= names[p]) then
    code, detail = 7, pointer
  else
    local node_key, resv_key, rexp_key, bound_key = node_keys(n_pods, j)
    local converted = drop_reservation(node_key, resv_key, rexp_key, uid) ~= nil
    if pointer and p ~= 0 and pointer == names[p] then
      local other_node, other_resv, other_rexp = node_keys(n_pods, p)
      drop_reservation(other_node, other_resv, other_rexp, uid)
    end
    if pointer then redis.call('HDEL', pod_key, 'rn') end
    local counted = redis.call('HGET', bound_key, uid)
    if counted == requests then
      code = 3
    elseif counted then
      redis.call('HSET', bound_key, uid, requests)
      add_counters(node_key, 'u:', counted, -1)
      add_counters(node_key, 'u:', requests, 1)
      code = 8
    else
      redis.call('HSET', bound_key, uid, requests)
      add_counters(node_key, 'u:', requests, 1)
      code = converted and 2 or 1
    end
  end
  out[#out + 1] = code
  out[#out + 1] = detail
end
flush_counters()
return cjson.encode(out)
