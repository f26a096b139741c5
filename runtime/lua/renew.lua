-- renew.lua: extends every still-current lease of a worker in one call.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  ttl (ms), ARGV[2..] lease ids
-- Returns  the lease ids that are not current (expired, reaped, settled, unknown)
-- Errors   none
local base, ttl = KEYS[1], tonumber(ARGV[1])
local now = now_ms()
local leases = base .. 'leases'
local lost = {}
for i = 2, #ARGV do
  local expiry = redis.call('ZSCORE', leases, ARGV[i])
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', leases, 'XX', now + ttl, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
