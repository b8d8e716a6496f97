-- volume_reserve: reserve the volumes one pod's binding chose (VolumeBinding's Reserve in the
-- sharded runtime), all or none, so that two shards never bind one PersistentVolume, or one
-- claim, for two pods.
--
-- KEYS[i]    volume key i                               <prefix>vol:pv/<name> or <prefix>vol:pvc/<ns>/<name>
-- ARGV[1]    pod uid
-- ARGV[2]    TTL of the reservations, ms (server time)
--
-- A key held by another pod refuses the whole call and nothing changes; keys held by this pod
-- already (a retry) are renewed. Returns: 0 when every key is this pod's now, else the 1-based
-- index of the first key held by another pod.

local uid = ARGV[1]
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  local holder = redis.call('GET', KEYS[i])
  if holder and holder ~= uid then
    return i
  end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], uid, 'PX', ttl)
end
return 0
