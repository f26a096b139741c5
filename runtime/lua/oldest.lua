-- oldest.lua: how long the job next in line has been claimable, for the depth sampler.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue
-- Returns  milliseconds, the longest over the queue's kinds' heads and its first due delayed
--          job; -1 when nothing is ready. Read-only.
-- Errors   none
local base, queue = KEYS[1], ARGV[1]
local now = now_ms()
local q = base .. 'q:' .. queue .. ':'
local oldest = nil
local due = redis.call('ZRANGEBYSCORE', q .. 'delayed', '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
if due[2] then
  oldest = tonumber(due[2])
end
for _, kind in ipairs(redis.call('SMEMBERS', q .. 'kinds')) do
  local head = redis.call('ZRANGE', ready_key(base, queue, kind), 0, 0)[1]
  if head then
    -- A job enqueued before 'at' was recorded counts from now.
    local at = tonumber(redis.call('HGET', base .. 'job:' .. head, 'at') or '') or now
    if oldest == nil or at < oldest then
      oldest = at
    end
  end
end
if oldest == nil then
  return -1
end
return math.max(0, now - oldest)
