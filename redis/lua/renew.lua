-- renew.lua: extends every still-current lease of a worker in one call.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  ttl (ms), ARGV[2..] lease ids
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  the lease ids that are not current (expired, reaped, settled, unknown)
-- Errors   none
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, ttl = KEYS[1], tonumber(ARGV[1])
local now = now_ms()
local leases = base .. 'leases'
local lost = {}
for i = 2, #ARGV - 1 do -- (the last ARGV is the layout generation)
  local expiry = redis.call('ZSCORE', leases, ARGV[i])
  -- (The claims' SKIPLIST marker at +inf is no lease: given a finite expiry it would count as
  -- one, and settle.lua counts finite expiries.)
  if expiry and tonumber(expiry) > now and ARGV[i] ~= SKIPLIST then
    redis.call('ZADD', leases, 'XX', now + ttl, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
