-- leases.lua: live leases for status output, soonest to expire first.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  most leases to list
-- Returns  one array per lease: {lease id, job id, scope, epoch, counter, worker,
--          age ms, expires in ms (negative once expired but not yet reaped)}
-- Errors   none
local base = KEYS[1]
local now = now_ms()
local out = {}
local listed = redis.call('ZRANGE', base .. 'leases', 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #listed, 2 do
  local lease = listed[i]
  local id = redis.call('HGET', base .. 'lease_job', lease)
  local f = id and redis.call('HMGET', base .. 'job:' .. id, 'scope', 'epoch', 'counter',
    'worker', 'claimed')
  if f and f[1] then
    out[#out + 1] = { lease, id, f[1], f[2], f[3], f[4] or '',
      fmt(now - tonumber(f[5] or now)), fmt(tonumber(listed[i + 1]) - now) }
  end
end
return out
