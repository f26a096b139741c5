-- enqueue.lua: adds jobs, all in one atomic step.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  job count n, then 9 fields per job:
--          id queue kind payload scope priority delay_ms max_attempts max_stalls
-- Returns  n
-- Errors   none of its own (jobs are validated by the client before they are sent)
local base = KEYS[1]
local now = now_ms()
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local o = 1 + i * 9
  local id, queue = ARGV[o + 1], ARGV[o + 2]
  local priority, delay = tonumber(ARGV[o + 6]), tonumber(ARGV[o + 7])
  redis.call('HSET', base .. 'job:' .. id, 'queue', queue, 'kind', ARGV[o + 3],
    'payload', ARGV[o + 4], 'scope', ARGV[o + 5], 'priority', priority, 'attempt', 0,
    'stalls', 0, 'max_attempts', ARGV[o + 8], 'max_stalls', ARGV[o + 9])
  redis.call('SADD', base .. 'queues', queue)
  park(base, id, now + delay, now)
end
return n
