-- nominate_renew: extend live nominations (the coordinator, while their preemptors wait).
--
-- KEYS[j]    nominations of node j, <prefix>nom:<name> (nominate.lua)
-- ARGV[1]    ttl_ms: the new lifetime from now, milliseconds of server time
-- ARGV[2]    JSON array of pods, each [uid, node index j (1-based)]
-- Returns: a JSON array, one entry per pod in order: 1 renewed, 0 not there (expired, dropped by
-- a preemptor of higher priority, or lost with a Redis restart: nominate again).

local now = now_ms()
local ttl = tonumber(ARGV[1])
local out = {}
for _, pod in ipairs(cjson.decode(ARGV[2])) do
  local uid, j = unpack(pod)
  local raw = redis.call('HGET', KEYS[j], uid)
  local done = 0
  if raw then
    local rec = cjson.decode(raw)
    if tonumber(rec[4]) > now then
      rec[4] = now + ttl
      redis.call('HSET', KEYS[j], uid, cjson.encode(rec))
      done = 1
    else
      redis.call('HDEL', KEYS[j], uid)
    end
  end
  out[#out + 1] = done
end
return cjson.encode(out)
