-- enqueue.lua: adds jobs, all in one atomic step.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  job count n, then 7 fields per job: id queue kind scope (empty for the job's
--          default scope) priority delay_ms meta (JSON: kind payload queue scope priority
--          max_attempts max_stalls)
-- Returns  n
-- Errors   none of its own (jobs are validated by the client before they are sent)
local base = KEYS[1]
local now = now_ms()
local n = tonumber(ARGV[1])
local last = redis.call('INCRBY', base .. 'seq', n)
local queues = {}
local kinds = {}
for i = 0, n - 1 do
  local o = 1 + i * 7
  local id, queue, kind, scope = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  local priority, delay = tonumber(ARGV[o + 5]), tonumber(ARGV[o + 6])
  local at = now + math.max(delay, 0) -- claimable from (the oldest-ready gauge)
  if scope == '' then
    scope = nil
    redis.call('HSET', base .. 'job:' .. id, 'meta', ARGV[o + 7], 'queue', queue, 'kind', kind,
      'at', at)
  else
    redis.call('HSET', base .. 'job:' .. id, 'meta', ARGV[o + 7], 'queue', queue, 'kind', kind,
      'scope', scope, 'at', at)
  end
  if delay > 0 then
    redis.call('ZADD', base .. 'q:' .. queue .. ':delayed', now + delay, id)
  else
    enter(base, id, queue, kind, scope, last - n + i + 1 - priority * PRIORITY_SPAN, true)
  end
  queues[queue] = true
  kinds[queue .. '\t' .. kind] = true
end
for queue in pairs(queues) do
  redis.call('SADD', base .. 'queues', queue)
end
for pair in pairs(kinds) do
  local queue, kind = string.match(pair, '^(.*)\t(.*)$')
  redis.call('SADD', base .. 'q:' .. queue .. ':kinds', kind)
end
return n
