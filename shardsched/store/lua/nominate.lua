-- nominate: a preemptor's nomination on one node (kube's status.nominatedNodeName), held as a
-- reservation of its requests until it binds, is deleted, or the nomination is cleared
-- (unnominate), or its expiry passes. This is where two preemptors that chose the same node are
-- arbitrated: the second one is refused when the node cannot hold both once all victims are gone.
--
-- KEYS[1..4] the node: <prefix>node:<name>, <prefix>resv:<name>, <prefix>rexp:<name>,
--            <prefix>bound:<name>
-- KEYS[5]    the node's nominations, hash pod uid -> JSON [priority, requests (resource list as a
--            JSON string, incl. pods=1), victim uids (array), expiry (server ms)]   <prefix>nom:<name>
-- ARGV[1]    the preemptor's uid
-- ARGV[2]    its priority (integer)
-- ARGV[3]    its requests (resource list, incl. pods=1)
-- ARGV[4]    JSON array of the uids of its victims on this node (being deleted)
-- ARGV[5]    ttl_ms: lifetime of the nomination, milliseconds of server time
--
-- The check, for every requested resource: used - (what the victims of every live nomination of
-- the node, this one's included, hold in "u:") + reserved + (the requests of the other live
-- nominations of priority >= ARGV[2]) + request <= allocatable. Nominations of lower priority do
-- not count (upstream clears them: they are dropped when this one is recorded), expired ones are
-- dropped. A nomination of the same uid is replaced (a new preemption of the same pod).
-- Returned code (JSON [code, detail, dropped uids]):
--   0 OK            recorded; dropped = the lower-priority nominations removed from the node
--                   (an empty array may come back as {}, cjson's empty table)
--   1 INSUFFICIENT  detail: the first resource (resource list order) that does not fit
--   4 NODE_UNKNOWN  the node was never upserted (or was removed)

local node_key, resv_key, rexp_key, bound_key, nom_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local uid, priority, requests, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[5])
local victims = cjson.decode(ARGV[4])
local now = now_ms()
sweep(node_key, resv_key, rexp_key, now)
flush_counters()

local flat = redis.call('HGETALL', node_key)
local counters = {}
for k = 1, #flat, 2 do counters[flat[k]] = tonumber(flat[k + 1]) end
if not counters.up then return cjson.encode({4, '', {}}) end

local doomed, held, lower = {}, {}, {}
for _, v in ipairs(victims) do doomed[v] = true end
local noms = redis.call('HGETALL', nom_key)
for k = 1, #noms, 2 do
  local other, rec = noms[k], cjson.decode(noms[k + 1])
  if tonumber(rec[4]) <= now then
    redis.call('HDEL', nom_key, other)
  elseif other ~= uid then
    for _, v in ipairs(rec[3]) do doomed[v] = true end
    if tonumber(rec[1]) >= priority then
      local _, amounts = decode_list(rec[2])
      for name, amount in pairs(amounts) do held[name] = (held[name] or 0) + amount end
    else
      lower[#lower + 1] = other
    end
  end
end

local freed = {}
for v in pairs(doomed) do
  local raw = redis.call('HGET', bound_key, v)
  if raw then
    local _, amounts = decode_list(raw)
    for name, amount in pairs(amounts) do freed[name] = (freed[name] or 0) + amount end
  end
end

local names, amounts = decode_list(requests)
for _, name in ipairs(names) do
  local used = (counters['u:' .. name] or 0) - (freed[name] or 0)
  local total = used + (counters['r:' .. name] or 0) + (held[name] or 0) + amounts[name]
  if total > (counters['a:' .. name] or 0) then
    return cjson.encode({1, name, {}})
  end
end

for _, other in ipairs(lower) do redis.call('HDEL', nom_key, other) end
redis.call('HSET', nom_key, uid, cjson.encode({priority, requests, victims, now + ttl}))
return cjson.encode({0, '', lower})
