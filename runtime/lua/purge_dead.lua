-- purge_dead.lua: deletes the oldest dead-letter records of a queue.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] most records to delete (oldest first)
-- Returns  how many were deleted
-- Errors   none
local dead = KEYS[1] .. 'q:' .. ARGV[1] .. ':dead'
local n = math.min(tonumber(ARGV[2]), redis.call('LLEN', dead))
if n > 0 then
  redis.call('LTRIM', dead, n, -1)
end
return n
