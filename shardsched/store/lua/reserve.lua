-- reserve: the second resource check and reservation of a batch of pods (the hot path: one call
-- per batch). Pods are handled in order and each pod's reservation counts for the later ones.
-- Expired reservations of every node of the batch are swept first.
--
-- KEYS[1]        shard-map epoch              <prefix>epoch
-- KEYS[2]        shard map, node -> shard id  <prefix>owners
-- KEYS[2+i]      pod hash of pod i            <prefix>pod:<uid>          (i = 1..n_pods)
-- KEYS[2+n_pods+4(j-1)+1 .. +4]  node j:      <prefix>node:<name>, <prefix>resv:<name>,
--                                             <prefix>rexp:<name>, <prefix>bound:<name>
-- KEYS[2+n_pods+4*n_nodes+j]     node j's nominations  <prefix>nom:<name> (nominate.lua)
-- ARGV[1]        shard id
-- ARGV[2]        the caller's shard-map epoch (integer)
-- ARGV[3]        ttl_ms: lifetime of the reservations, milliseconds of server time
-- ARGV[4]        JSON [node names, pods]: node j's name at index j; pod i is
--                [uid, node index j (1-based), lease token (decimal string),
--                 requests (resource list as a JSON string, including pods=1), priority (integer)]
--
-- Per pod, the checks in order, and the returned code:
--   2 LEASE_LOST    the pod's lease is not held by this shard with this token, or has expired
--   3 FENCED        the node's owner is not this shard, or ARGV[2] is not the current epoch
--   4 NODE_UNKNOWN  the node was never upserted (or was removed)
--   1 INSUFFICIENT  used + reserved + nominated + request > allocatable for a resource (detail: its
--                   name; the first in the list's order: pods, cpu, memory, ephemeral-storage,
--                   others); nominated = the requests of the node's live nominations of other pods
--                   whose priority is >= the pod's (upstream RunFilterPluginsWithNominatedPods)
--   0 OK            reserved: record {shard, token, requests} with expiry now + ttl_ms, add the
--                   requests to "r:". Also OK when this shard already holds the reservation with
--                   this token on this node (idempotent; the expiry is refreshed). A reservation of
--                   the pod on this node with another token is stale (the lease check passed) and
--                   is replaced.
-- Returns: a JSON flat array, two entries per pod in batch order: code, detail ("" unless
-- INSUFFICIENT).

local shard, epoch, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local batch = cjson.decode(ARGV[4])
local names, pods = batch[1], batch[2]
local n_nodes, n_pods = #names, #pods
local base = 2 + n_pods
local now = now_ms()
local expiry = now + ttl
local epoch_ok = tonumber(redis.call('GET', KEYS[1]) or '0') == epoch

for j = 1, n_nodes do
  local node_key, resv_key, rexp_key = node_keys(base, j)
  sweep(node_key, resv_key, rexp_key, now)
end
flush_counters()

-- Per node: whether this shard owns it at this epoch, and its counters as read now; the batch's
-- own changes are pending (lib.lua) until the end.
local owned, counters, noms = {}, {}, {}
for j = 1, n_nodes do
  local list = {}
  local nflat = redis.call('HGETALL', KEYS[base + 4 * n_nodes + j])
  for k = 1, #nflat, 2 do
    local rec = cjson.decode(nflat[k + 1])
    if tonumber(rec[4]) > now then
      local _, amounts = decode_list(rec[2])
      list[#list + 1] = {nflat[k], tonumber(rec[1]), amounts}
    end
  end
  noms[j] = list
  owned[j] = epoch_ok and redis.call('HGET', KEYS[2], names[j]) == shard
  local flat = redis.call('HGETALL', (node_keys(base, j)))
  local values = {}
  for k = 1, #flat, 2 do values[flat[k]] = tonumber(flat[k + 1]) end
  counters[j] = values
end

local function current(j, node_key, field)
  return (counters[j][field] or 0) + pending_change(node_key, field)
end

-- what the node's nominations of priority >= prio (other pods than uid) hold of a resource
local function nominated(j, uid, prio, name)
  local sum = 0
  for _, n in ipairs(noms[j]) do
    if n[1] ~= uid and n[2] >= prio then sum = sum + (n[3][name] or 0) end
  end
  return sum
end

local out = {}
for i = 1, n_pods do
  local uid, j, token, requests, prio = unpack(pods[i])
  local pod_key = KEYS[2 + i]
  local node_key, resv_key, rexp_key = node_keys(base, j)
  local code, detail = 0, ''
  local lease = redis.call('HMGET', pod_key, 's', 't', 'e')
  if lease[1] ~= shard or lease[2] ~= token or tonumber(lease[3]) <= now then
    code = 2
  elseif not owned[j] then
    code = 3
  elseif not counters[j].up then
    code = 4
  else
    local raw = redis.call('HGET', resv_key, uid)
    local mine = false
    if raw then
      local rec = cjson.decode(raw)
      mine = rec[1] == shard and rec[2] == token
      if not mine then drop_reservation(node_key, resv_key, rexp_key, uid) end
    end
    if not mine then
      local res, amounts = decode_list(requests)
      for _, name in ipairs(res) do
        local used, reserved = current(j, node_key, 'u:' .. name), current(j, node_key, 'r:' .. name)
        local held = #noms[j] > 0 and nominated(j, uid, prio, name) or 0
        if used + reserved + held + amounts[name] > current(j, node_key, 'a:' .. name) then
          code, detail = 1, name
          break
        end
      end
      if code == 0 then
        add_counters(node_key, 'r:', requests, 1)
        redis.call('HSET', resv_key, uid, cjson.encode({shard, token, requests}))
      end
    end
    if code == 0 then
      redis.call('ZADD', rexp_key, expiry, uid)
      redis.call('HSET', pod_key, 'rn', names[j])
    end
  end
  out[#out + 1] = code
  out[#out + 1] = detail
end
flush_counters()
return cjson.encode(out)
