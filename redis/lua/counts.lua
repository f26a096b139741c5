-- counts.lua: one consistent snapshot of a queue's counts.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue
-- Returns  {ready, waiting, delayed, leased, completed, dead, cancelled, died, enqueued,
--          stalled} (due delayed jobs count as ready; cancelled counts every job cancel.lua
--          ever cancelled in the queue, died every job ever dead-lettered in it, enqueued every
--          job enqueue.lua added to it, stalled every stall reap.lua reaped in it)
-- Errors   "PALISADE_CORRUPT ..." naming the first key it reads that holds another type
--          (another program writing under our prefix), rather than a bare WRONGTYPE. A count
--          field that is not a count reads as 0, as every script reads it.
local base, queue = KEYS[1], ARGV[1]
local now = now_ms()
local q = base .. 'q:' .. queue .. ':'
local wrong = mistyped({ [q .. 'delayed'] = 'zset', [q .. 'stats'] = 'hash', [q .. 'kinds'] = 'set',
  [q .. 'dead'] = 'list' })
-- (The kinds' ready sets, known once the kinds key is known to be a set.)
local ready_sets = {}
if not wrong then
  for _, kind in ipairs(redis.call('SMEMBERS', q .. 'kinds')) do
    ready_sets[ready_key(base, queue, kind)] = 'zset'
  end
  wrong = mistyped(ready_sets)
end
if wrong then
  return redis.error_reply('PALISADE_CORRUPT ' .. wrong .. ': no counts were read')
end
local due = redis.call('ZCOUNT', q .. 'delayed', '-inf', now)
local stats = redis.call('HMGET', q .. 'stats', 'leased', 'completed', 'waiting', 'cancelled',
  'died', 'grouped', 'enqueued', 'stalled')
local ready = count_of(stats[6])
for key in pairs(ready_sets) do
  ready = ready + redis.call('ZCARD', key)
end
return { ready + due, count_of(stats[3]), redis.call('ZCARD', q .. 'delayed') - due,
  count_of(stats[1]), count_of(stats[2]), redis.call('LLEN', q .. 'dead'), count_of(stats[4]),
  count_of(stats[5]), count_of(stats[7]), count_of(stats[8]) }
