-- volume_release: give up the volume reservations of one pod (VolumeBinding's Unreserve).
--
-- KEYS[i]    volume key i                               <prefix>vol:pv/<name> or <prefix>vol:pvc/<ns>/<name>
-- ARGV[1]    pod uid
--
-- Only keys this pod holds are deleted (another pod's, taken after this one's expired, stay).
-- Returns: how many were deleted (idempotent).

local uid = ARGV[1]
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == uid then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
