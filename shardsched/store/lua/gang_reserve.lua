-- gang_reserve: hold gangs on their nodes, each gang all or nothing, in one call across the
-- shards: a gang's members are recorded as nominations (nominate.lua's records, without
-- victims), so that every other pod of equal or lower priority, the shards' Reserve included
-- (reserve.lua), leaves their room to them until each member is reserved and bound by its node's
-- owner shard, or the gang is released (unnominate), or the expiry passes. The gangs are checked
-- in order; a gang held counts against the gangs after it as the nominations it now is.
--
-- KEYS[1]        shard-map epoch              <prefix>epoch
-- KEYS[2]        shard map, node -> shard id  <prefix>owners
-- KEYS[2+i]      pod hash of member i         <prefix>pod:<uid>          (i = 1..n_pods, every gang's)
-- KEYS[2+n_pods+4(j-1)+1 .. +4]  node j:      <prefix>node:<name>, <prefix>resv:<name>,
--                                             <prefix>rexp:<name>, <prefix>bound:<name>
-- KEYS[2+n_pods+4*n_nodes+j]     node j's nominations  <prefix>nom:<name>
-- ARGV[1]        the caller's shard-map epoch (integer)
-- ARGV[2]        ttl_ms: lifetime of the nominations, milliseconds of server time
-- ARGV[3]        JSON [node names, members, ends]: node j's name at index j; member i is
--                [uid, node index j (1-based), the shard id that owns the node and will bind it,
--                 requests (resource list as a JSON string, incl. pods=1 and its GPU devices'
--                 shardsched.io/gpu-device-<i>, so a hold is checked and kept per device), priority (integer)];
--                gang g is members ends[g-1]+1 .. ends[g] (ends[0] = 0), a uid in one gang only
--
-- The checks, per gang, member by member in order, the first failure ending that gang with
-- nothing written for it:
--   3 FENCED        ARGV[1] is not the current epoch, or the node's owner is not the member's shard
--   2 LEASE_HELD    a shard holds a live lease of the member (it is being scheduled there)
--   4 NODE_UNKNOWN  the node was never upserted (or was removed)
--   1 INSUFFICIENT  used + reserved + (the node's live nominations of other pods of priority >=
--                   the member's, the gangs held before it in this call included) + (the gang's
--                   members placed on the node before it) + request > allocatable for a resource
--                   (detail: its name)
--   0 OK            every member passed: each is recorded as a nomination on its node, expiring
--                   at now + ttl_ms (a nomination of the same uid is replaced)
-- Returns: JSON [[code, index of the failing member (1-based over all members; 0 when OK),
--          detail] for each gang, in order].

local epoch, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local batch = cjson.decode(ARGV[3])
local names, pods, ends = batch[1], batch[2], batch[3]
local n_nodes, n_pods = #names, #pods
local base = 2 + n_pods
local nom_base = base + 4 * n_nodes
local now = now_ms()

for j = 1, n_nodes do
  local node_key, resv_key, rexp_key = node_keys(base, j)
  sweep(node_key, resv_key, rexp_key, now)
end
flush_counters()

local epoch_ok = tonumber(redis.call('GET', KEYS[1]) or '0') == epoch
-- node j's owner, read in chunks (unpack's stack is bounded)
local owner = {}
for lo = 1, n_nodes, 512 do
  local hi = math.min(lo + 511, n_nodes)
  local got = redis.call('HMGET', KEYS[2], unpack(names, lo, hi))
  for j = lo, hi do owner[j] = got[j - lo + 1] end
end
-- requests JSON -> {names, amounts}: a gang's members mostly share theirs
local decoded_requests = {}
local function requests_of(json)
  local r = decoded_requests[json]
  if r == nil then
    local res, amounts = decode_list(json)
    r = {res, amounts}
    decoded_requests[json] = r
  end
  return r[1], r[2]
end
-- uid -> its gang's index, for every member of the call
local gang_of = {}
local first = 1
for g = 1, #ends do
  for i = first, ends[g] do gang_of[pods[i][1]] = g end
  first = ends[g] + 1
end

local counters, held = {}, {}
for j = 1, n_nodes do
  local flat = redis.call('HGETALL', (node_keys(base, j)))
  local values = {}
  for k = 1, #flat, 2 do values[flat[k]] = tonumber(flat[k + 1]) end
  counters[j] = values
  -- the node's live nominations: {priority, amounts, gang index of the uid (0: no member), uid}
  held[j] = {}
  local nflat = redis.call('HGETALL', KEYS[nom_base + j])
  for k = 1, #nflat, 2 do
    local rec = cjson.decode(nflat[k + 1])
    if tonumber(rec[4]) > now then
      local _, amounts = requests_of(rec[2])
      held[j][#held[j] + 1] = {tonumber(rec[1]), amounts, gang_of[nflat[k]] or 0, nflat[k]}
    end
  end
end

-- what node j's live nominations of pods outside gang g of priority >= prio hold of a resource
local function nominated(j, prio, name, g)
  local sum = 0
  for _, n in ipairs(held[j]) do
    if n[3] ~= g and n[1] >= prio then sum = sum + (n[2][name] or 0) end
  end
  return sum
end

-- gang g, members lo..hi: {code, failing member, detail}; on OK its nominations are written
local function hold(g, lo, hi)
  local gang = {}
  local decoded = {}
  for i = lo, hi do
    local _, j, shard, requests, prio = unpack(pods[i])
    if not epoch_ok or owner[j] ~= shard then
      return {3, i, ''}
    end
    local lease = redis.call('HMGET', KEYS[2 + i], 's', 'e')
    if lease[1] and tonumber(lease[2]) > now then
      return {2, i, lease[1]}
    end
    local c = counters[j]
    if not c.up then
      return {4, i, ''}
    end
    local res, amounts = requests_of(requests)
    local on_node = gang[j] or {}
    for _, name in ipairs(res) do
      local total = (c['u:' .. name] or 0) + (c['r:' .. name] or 0) + nominated(j, prio, name, g)
                    + (on_node[name] or 0) + amounts[name]
      if total > (c['a:' .. name] or 0) then
        return {1, i, name}
      end
    end
    for _, name in ipairs(res) do on_node[name] = (on_node[name] or 0) + amounts[name] end
    gang[j] = on_node
    decoded[i] = amounts
  end
  -- held: a member's earlier nomination on the same node is replaced by the new one
  local written = {}
  for i = lo, hi do
    local uid, j, _, requests, prio = unpack(pods[i])
    redis.call('HSET', KEYS[nom_base + j], uid, cjson.encode({prio, requests, {}, now + ttl}))
    written[j] = written[j] or {}
    written[j][uid] = true
  end
  for j, uids in pairs(written) do
    local kept = {}
    for _, n in ipairs(held[j]) do
      if not uids[n[4]] then kept[#kept + 1] = n end
    end
    held[j] = kept
  end
  for i = lo, hi do
    local uid, j, _, _, prio = unpack(pods[i])
    held[j][#held[j] + 1] = {prio, decoded[i], g, uid}
  end
  return {0, 0, ''}
end

local out = {}
first = 1
for g = 1, #ends do
  out[g] = hold(g, first, ends[g])
  first = ends[g] + 1
end
return cjson.encode(out)
