-- unnominate: clear nominations (the preemptor bound, was deleted, or its nomination was cleared
-- or moved to another node). Idempotent.
--
-- KEYS[j]    nominations of node j, <prefix>nom:<name> (nominate.lua)
-- ARGV[1]    JSON array of pods, each [uid, node index j (1-based)]
-- Returns: a JSON array, one code per pod in order: 4 RELEASED (it was there), 6 NOT_FOUND.

local out = {}
for _, pod in ipairs(cjson.decode(ARGV[1])) do
  local uid, j = unpack(pod)
  out[#out + 1] = redis.call('HDEL', KEYS[j], uid) == 1 and 4 or 6
end
return cjson.encode(out)
