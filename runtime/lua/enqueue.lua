-- enqueue.lua: adds jobs, all in one atomic step.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  job count n, then 9 fields per job:
--          id queue kind payload scope priority delay_ms max_attempts max_stalls
-- Returns  n
-- Errors   none of its own (jobs are validated by the client before they are sent)
local base = KEYS[1]
local now = now_ms()
local n = tonumber(ARGV[1])
local last = redis.call('INCRBY', base .. 'seq', n)
local queues = {}
for i = 0, n - 1 do
  local o = 1 + i * 9
  local id, queue, scope = ARGV[o + 1], ARGV[o + 2], ARGV[o + 5]
  local priority, delay = tonumber(ARGV[o + 6]), tonumber(ARGV[o + 7])
  local seq = last - n + i + 1
  redis.call('HSET', base .. 'job:' .. id, 'queue', queue, 'kind', ARGV[o + 3],
    'payload', ARGV[o + 4], 'scope', scope, 'own', scope == id and '1' or '0',
    'priority', priority, 'seq', seq, 'attempt', 0, 'stalls', 0,
    'max_attempts', ARGV[o + 8], 'max_stalls', ARGV[o + 9])
  if delay > 0 then
    redis.call('ZADD', base .. 'q:' .. queue .. ':delayed', now + delay, id)
  else
    redis.call('ZADD', base .. 'q:' .. queue .. ':ready', seq - priority * PRIORITY_SPAN, id)
  end
  queues[queue] = true
end
for queue in pairs(queues) do
  redis.call('SADD', base .. 'queues', queue)
end
return n
