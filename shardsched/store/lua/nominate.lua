-- nominate: preemptors' nominations (kube's status.nominatedNodeName), each held on its node as a
-- reservation of its requests until it binds, is deleted, or the nomination is cleared
-- (unnominate), or its expiry passes. This is where preemptors that chose the same node are
-- arbitrated: one is refused when the node cannot hold it with the others once all their victims
-- are gone. A batch is handled in order, each recorded nomination counting for the next ones.
--
-- KEYS[5(j-1)+1 .. +5]  node j: <prefix>node:<name>, <prefix>resv:<name>, <prefix>rexp:<name>,
--                       <prefix>bound:<name>, and its nominations <prefix>nom:<name>, a hash
--                       pod uid -> JSON [priority, requests (resource list as a JSON string, incl.
--                       pods=1), victim uids (array), expiry (server ms)]
-- ARGV[1]    ttl_ms: lifetime of the nominations, milliseconds of server time
-- ARGV[2]    JSON array of nominations, each [uid, node index j (1-based), priority (integer),
--            requests (resource list, incl. pods=1, and the thousandths it holds of each of its GPU
--            devices as resources shardsched.io/gpu-device-<i>), uids of its victims on the node (array)]
--
-- The check, for every requested resource: used - (what the victims of every live nomination of
-- the node, this one's included, hold in "u:") + reserved + (the requests of the other live
-- nominations of priority >= this one's) + request <= allocatable. Nominations of lower priority
-- do not count (upstream clears them: they are dropped when this one is recorded), expired ones
-- are dropped. A nomination of the same uid is replaced (a new preemption of the same pod).
-- Returns: a JSON array, per nomination in order [code, detail, dropped uids]:
--   0 OK            recorded; dropped = the lower-priority nominations removed from the node
--                   (an empty array may come back as {}, cjson's empty table)
--   1 INSUFFICIENT  detail: the first resource (resource list order) that does not fit
--   4 NODE_UNKNOWN  the node was never upserted (or was removed)

local ttl = tonumber(ARGV[1])
local now = now_ms()
local swept = {}

local function nominate_one(uid, j, priority, requests, victims)
  local base = (j - 1) * 5
  local node_key, resv_key, rexp_key, bound_key, nom_key = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3],
    KEYS[base + 4], KEYS[base + 5]
  if not swept[j] then
    sweep(node_key, resv_key, rexp_key, now)
    flush_counters()
    swept[j] = true
  end
  local flat = redis.call('HGETALL', node_key)
  local counters = {}
  for k = 1, #flat, 2 do counters[flat[k]] = tonumber(flat[k + 1]) end
  if not counters.up then return {4, '', {}} end

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
      return {1, name, {}}
    end
  end

  for _, other in ipairs(lower) do redis.call('HDEL', nom_key, other) end
  redis.call('HSET', nom_key, uid, cjson.encode({priority, requests, victims, now + ttl}))
  return {0, '', lower}
end

local out = {}
for _, item in ipairs(cjson.decode(ARGV[2])) do
  local uid, j, priority, requests, victims = unpack(item)
  out[#out + 1] = nominate_one(uid, j, tonumber(priority), requests, victims)
end
return cjson.encode(out)
