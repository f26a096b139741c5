-- counts.lua: one consistent snapshot of a queue's counts.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue
-- Returns  {ready, waiting, delayed, leased, completed, dead, cancelled, died} (due delayed
--          jobs count as ready; cancelled counts every job cancel.lua ever cancelled in the
--          queue, died every job ever dead-lettered in it)
-- Errors   none
local base, queue = KEYS[1], ARGV[1]
local now = now_ms()
local q = base .. 'q:' .. queue .. ':'
local due = redis.call('ZCOUNT', q .. 'delayed', '-inf', now)
local stats = redis.call('HMGET', q .. 'stats', 'leased', 'completed', 'waiting', 'cancelled',
  'died', 'grouped')
local ready = count_of(stats[6])
for _, kind in ipairs(redis.call('SMEMBERS', q .. 'kinds')) do
  ready = ready + redis.call('ZCARD', base .. 'q:' .. queue .. '\t' .. kind)
end
return { ready + due, tonumber(stats[3] or '0'),
  redis.call('ZCARD', q .. 'delayed') - due, tonumber(stats[1] or '0'),
  tonumber(stats[2] or '0'), redis.call('LLEN', q .. 'dead'), tonumber(stats[4] or '0'),
  count_of(stats[5]) }
