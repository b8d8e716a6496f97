-- sweep: drop expired reservations of some nodes (reserve does it on its own nodes; this is for
-- nodes no batch touches, e.g. a periodic pass of the coordinator).
--
-- KEYS[4(j-1)+1 .. +4]  node j:  <prefix>node:<name>, <prefix>resv:<name>,
--                                <prefix>rexp:<name>, <prefix>bound:<name>
-- ARGV: none. Expiry is compared with Redis server time.
-- Returns: the number of reservations dropped.

local now = now_ms()
local swept = 0
for j = 1, #KEYS / 4 do
  local node_key, resv_key, rexp_key = node_keys(0, j)
  swept = swept + sweep(node_key, resv_key, rexp_key, now)
end
flush_counters()
return swept
