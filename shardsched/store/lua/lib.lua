-- lib: local helpers that ledger.py prepends to every script of this folder (Redis 6.2 has no
-- function libraries). Defines no globals. Every helper reads and writes only the keys its caller
-- hands it, and callers take those from KEYS.
--
-- Encodings (built by ledger.py):
--   resource list   JSON flat array of names and amounts in canonical integer units
--                   (cpu millicores, memory and ephemeral-storage bytes, everything else a count),
--                   e.g. ["pods",1,"cpu",500,"memory",1073741824]; amounts are exact up to 2^53.
--   reservation     value in a node's reservations hash: JSON array of three strings
--                   [shard id, lease token, resource list].
--   node hash       fields "a:<resource>" allocatable, "u:<resource>" used by bound pods,
--                   "r:<resource>" reserved; "up" = server time (ms) of the last upsert, present
--                   only for nodes the ledger knows.
-- Times are Redis server time in milliseconds (TIME), never the caller's clock.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Keys of node group j (1-based) when groups of four start after KEYS[base]:
-- node hash, reservations hash (uid -> reservation), reservation expiry zset (uid -> expiry ms),
-- bound hash (uid -> resource list of a pod counted in "u:").
local function node_keys(base, j)
  local i = base + (j - 1) * 4
  return KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], KEYS[i + 4]
end

-- Decode a resource list: ordered names and a name -> amount table.
local function decode_list(json)
  local flat = cjson.decode(json)
  local names, amounts = {}, {}
  for i = 1, #flat, 2 do
    names[#names + 1] = flat[i]
    amounts[flat[i]] = flat[i + 1]
  end
  return names, amounts
end

-- Counter changes are gathered per node hash and field, and written by flush_counters (one
-- HINCRBY per node and field instead of one per pod and resource). Every script that changes
-- counters calls flush_counters before it returns, and before it reads counters with HGETALL.
local pending = {}

-- Add sign * amounts of a resource list to the node's counters of one kind ("u:" or "r:").
local function add_counters(node_key, kind, json, sign)
  local changes = pending[node_key]
  if not changes then
    changes = {}
    pending[node_key] = changes
  end
  local flat = cjson.decode(json)
  for i = 1, #flat, 2 do
    local field = kind .. flat[i]
    changes[field] = (changes[field] or 0) + sign * flat[i + 1]
  end
end

-- The change of a counter not yet written by flush_counters.
local function pending_change(node_key, field)
  local changes = pending[node_key]
  return changes and changes[field] or 0
end

local function flush_counters()
  for node_key, changes in pairs(pending) do
    for field, change in pairs(changes) do
      if change ~= 0 then redis.call('HINCRBY', node_key, field, change) end
    end
  end
  pending = {}
end

-- Make the node's fields of one kind ("a:", "u:" or "r:") equal to amounts (name -> amount);
-- returns how many resources changed value.
local function replace_counters(node_key, kind, amounts)
  local changed = 0
  local seen = {}
  local flat = redis.call('HGETALL', node_key)
  for i = 1, #flat, 2 do
    local field = flat[i]
    if string.sub(field, 1, 2) == kind then
      local name = string.sub(field, 3)
      local want = amounts[name] or 0
      seen[name] = true
      if tonumber(flat[i + 1]) ~= want then changed = changed + 1 end
      if want == 0 then
        redis.call('HDEL', node_key, field)
      elseif tonumber(flat[i + 1]) ~= want then
        redis.call('HSET', node_key, field, want)
      end
    end
  end
  for name, want in pairs(amounts) do
    if not seen[name] and want ~= 0 then
      redis.call('HSET', node_key, kind .. name, want)
      changed = changed + 1
    end
  end
  return changed
end

-- Drop the reservation of uid on a node, if any: subtract it from "r:". Returns the decoded
-- reservation {shard, token, resource list} or nil.
local function drop_reservation(node_key, resv_key, rexp_key, uid)
  local raw = redis.call('HGET', resv_key, uid)
  if not raw then return nil end
  local rec = cjson.decode(raw)
  add_counters(node_key, 'r:', rec[3], -1)
  redis.call('HDEL', resv_key, uid)
  redis.call('ZREM', rexp_key, uid)
  return rec
end

-- Drop the node's reservations whose expiry is at or before now (ms); returns how many.
local function sweep(node_key, resv_key, rexp_key, now)
  local expired = redis.call('ZRANGEBYSCORE', rexp_key, '-inf', now)
  for _, uid in ipairs(expired) do
    drop_reservation(node_key, resv_key, rexp_key, uid)
  end
  return #expired
end

-- Garbage collection of a pod hash: let the key live at least ttl_ms more (never shorten it).
local function extend_ttl(key, ttl_ms)
  if redis.call('PTTL', key) < ttl_ms then
    redis.call('PEXPIRE', key, ttl_ms)
  end
end
