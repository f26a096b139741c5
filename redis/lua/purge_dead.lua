-- purge_dead.lua: deletes the oldest dead-letter records of a queue.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] most records to delete (oldest first)
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  how many were deleted
-- Errors   none
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local dead = KEYS[1] .. 'q:' .. ARGV[1] .. ':dead'
local n = math.min(tonumber(ARGV[2]), redis.call('LLEN', dead))
if n > 0 then
  redis.call('LTRIM', dead, n, -1)
end
return n
