-- run_now.lua: makes a delayed job due now; it keeps its attempts.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  job id
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  1 if it was delayed and is due now, 0 otherwise (nothing changed)
-- Errors   none but "PALISADE_LAYOUT ..." (before anything) for a caller of another layout
--          generation
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, id = KEYS[1], ARGV[1]
local job = base .. 'job:' .. id
local f = fields(job, 'queue')
if not f[1] then
  return 0
end
local delayed = base .. 'q:' .. f[1] .. ':delayed'
if redis.call('TYPE', delayed).ok ~= 'zset' or not redis.call('ZSCORE', delayed, id) then
  return 0
end
local now = now_ms()
-- The next claim of the queue promotes it (due jobs first, earliest first), as any due job.
redis.call('ZADD', delayed, 'XX', now, id)
redis.call('HSET', job, 'at', now)
return 1
