-- gang_reserve: hold every member of a gang on its node, all or nothing, in one call across the
-- shards: the members are recorded as nominations (nominate.lua's records, without victims), so
-- that every other pod of equal or lower priority, the shards' Reserve included (reserve.lua),
-- leaves their room to them until each member is reserved and bound by its node's owner shard,
-- or the gang is released (unnominate), or the expiry passes.
--
-- KEYS[1]        shard-map epoch              <prefix>epoch
-- KEYS[2]        shard map, node -> shard id  <prefix>owners
-- KEYS[2+i]      pod hash of member i         <prefix>pod:<uid>          (i = 1..n_pods)
-- KEYS[2+n_pods+4(j-1)+1 .. +4]  node j:      <prefix>node:<name>, <prefix>resv:<name>,
--                                             <prefix>rexp:<name>, <prefix>bound:<name>
-- KEYS[2+n_pods+4*n_nodes+j]     node j's nominations  <prefix>nom:<name>
-- ARGV[1]        the caller's shard-map epoch (integer)
-- ARGV[2]        ttl_ms: lifetime of the nominations, milliseconds of server time
-- ARGV[3]        JSON [node names, members]: node j's name at index j; member i is
--                [uid, node index j (1-based), the shard id that owns the node and will bind it,
--                 requests (resource list as a JSON string, incl. pods=1), priority (integer)]
--
-- The checks, member by member in order, the first failure ending the call with nothing written:
--   3 FENCED        ARGV[1] is not the current epoch, or the node's owner is not the member's shard
--   2 LEASE_HELD    a shard holds a live lease of the member (it is being scheduled there)
--   4 NODE_UNKNOWN  the node was never upserted (or was removed)
--   1 INSUFFICIENT  used + reserved + (the node's live nominations of other pods of priority >=
--                   the member's) + (the gang's members placed on the node before it) + request >
--                   allocatable for a resource (detail: its name)
--   0 OK            every member passed: each is recorded as a nomination on its node, expiring
--                   at now + ttl_ms (a nomination of the same uid is replaced)
-- Returns: JSON [code, index of the failing member (1-based; 0 when OK), detail].

local epoch, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local batch = cjson.decode(ARGV[3])
local names, pods = batch[1], batch[2]
local n_nodes, n_pods = #names, #pods
local base = 2 + n_pods
local now = now_ms()

for j = 1, n_nodes do
  local node_key, resv_key, rexp_key = node_keys(base, j)
  sweep(node_key, resv_key, rexp_key, now)
end
flush_counters()

local epoch_ok = tonumber(redis.call('GET', KEYS[1]) or '0') == epoch
local members = {}
for i = 1, n_pods do members[pods[i][1]] = true end

local counters, held, gang = {}, {}, {}
for j = 1, n_nodes do
  local flat = redis.call('HGETALL', (node_keys(base, j)))
  local values = {}
  for k = 1, #flat, 2 do values[flat[k]] = tonumber(flat[k + 1]) end
  counters[j] = values
  held[j] = {}
  gang[j] = {}
end

-- what the node's live nominations of other pods (not members) of priority >= prio hold
local function nominated(j, prio, name)
  local sum = 0
  for _, n in ipairs(held[j]) do
    if n[1] >= prio then sum = sum + (n[2][name] or 0) end
  end
  return sum
end

for j = 1, n_nodes do
  local nflat = redis.call('HGETALL', KEYS[base + 4 * n_nodes + j])
  for k = 1, #nflat, 2 do
    local rec = cjson.decode(nflat[k + 1])
    if tonumber(rec[4]) > now and not members[nflat[k]] then
      local _, amounts = decode_list(rec[2])
      held[j][#held[j] + 1] = {tonumber(rec[1]), amounts}
    end
  end
end

for i = 1, n_pods do
  local uid, j, shard, requests, prio = unpack(pods[i])
  if not epoch_ok or redis.call('HGET', KEYS[2], names[j]) ~= shard then
    return cjson.encode({3, i, ''})
  end
  local lease = redis.call('HMGET', KEYS[2 + i], 's', 'e')
  if lease[1] and tonumber(lease[2]) > now then
    return cjson.encode({2, i, lease[1]})
  end
  if not counters[j].up then
    return cjson.encode({4, i, ''})
  end
  local res, amounts = decode_list(requests)
  for _, name in ipairs(res) do
    local c = counters[j]
    local total = (c['u:' .. name] or 0) + (c['r:' .. name] or 0) + nominated(j, prio, name)
                  + (gang[j][name] or 0) + amounts[name]
    if total > (c['a:' .. name] or 0) then
      return cjson.encode({1, i, name})
    end
  end
  for _, name in ipairs(res) do gang[j][name] = (gang[j][name] or 0) + amounts[name] end
end

for i = 1, n_pods do
  local uid, j, _, requests, prio = unpack(pods[i])
  redis.call('HSET', KEYS[base + 4 * n_nodes + j], uid, cjson.encode({prio, requests, {}, now + ttl}))
end
return cjson.encode({0, 0, ''})
