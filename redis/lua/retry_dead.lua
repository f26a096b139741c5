-- retry_dead.lua: moves dead-lettered jobs back to ready with fresh attempts and stalls.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] most jobs to move (oldest first)
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  how many were moved
-- Errors   none (a record whose keys another program wrote over, or whose id names a live job
--          again, stays in the list, at its end)
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, queue = KEYS[1], ARGV[1]
local now = now_ms()
local moved = 0
for _ = 1, tonumber(ARGV[2]) do
  local raw = redis.call('LPOP', base .. 'q:' .. queue .. ':dead')
  if not raw then
    break
  end
  if not revive(base, raw, now) then
    -- Not a record we wrote, its id names a live job again, or a key it would write holds
    -- another type: the record stays (at the end), unchanged, rather than fail halfway.
    redis.call('RPUSH', base .. 'q:' .. queue .. ':dead', raw)
    break
  end
  moved = moved + 1
end
return moved
