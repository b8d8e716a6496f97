-- reconcile: rebuild one node's ledger from the cluster's truth (after a fault, or periodically).
--
-- KEYS[1..4] the node: <prefix>node:<name>, <prefix>resv:<name>, <prefix>rexp:<name>,
--            <prefix>bound:<name>
-- ARGV[1]    allocatable (resource list)
-- then 2 per pod bound to the node in the cluster: uid, requests (resource list, incl. pods=1)
--
-- Afterwards: allocatable is ARGV[1]; the bound hash holds exactly the listed pods and "u:" is
-- their sum; expired reservations and reservations of listed (bound) pods are dropped; live
-- reservations of other pods are kept and "r:" is recomputed from them. The node becomes known
-- (as after an upsert); its owner is not changed.
-- Returns: {drift, n_bound, n_reserved}: drift = 1 when "u:" differed from the listed pods' sum
-- or "r:" from the sum of the kept reservations (dropping expired or spent reservations is not
-- drift).

local node_key, resv_key, rexp_key, bound_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms()
sweep(node_key, resv_key, rexp_key, now)
local _, allocatable = decode_list(ARGV[1])
replace_counters(node_key, 'a:', allocatable)
redis.call('HSET', node_key, 'up', now)

redis.call('DEL', bound_key)
local used = {}
for k = 2, #ARGV, 2 do
  local uid, requests = ARGV[k], ARGV[k + 1]
  redis.call('HSET', bound_key, uid, requests)
  local _, amounts = decode_list(requests)
  for name, amount in pairs(amounts) do used[name] = (used[name] or 0) + amount end
  drop_reservation(node_key, resv_key, rexp_key, uid)
end

flush_counters()
local reserved = {}
local records = redis.call('HVALS', resv_key)
for _, raw in ipairs(records) do
  local _, amounts = decode_list(cjson.decode(raw)[3])
  for name, amount in pairs(amounts) do reserved[name] = (reserved[name] or 0) + amount end
end

local drift = replace_counters(node_key, 'u:', used) + replace_counters(node_key, 'r:', reserved)
return {drift > 0 and 1 or 0, (#ARGV - 1) / 2, #records}
