-- forget_queue.lua: forgets a queue that holds no job: its listing, kinds, counts, pause and
-- rate limit. A later enqueue to it lists it again.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  1 if forgotten, 0 if it holds a job (ready, waiting, delayed, leased, dead, or a
--          flow step's job held for it; more than 10,000 held steps in all count as in use)
-- Errors   none but "PALISADE_LAYOUT ..." (before anything) for a caller of another layout
--          generation. A key of another type counts as in use.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, queue = KEYS[1], ARGV[1]
local q = base .. 'q:' .. queue .. ':'
local function of_type(key, t)
  local got = redis.call('TYPE', key).ok
  return got == 'none' or got == t
end
if not (of_type(q .. 'kinds', 'set') and of_type(q .. 'delayed', 'zset')
    and of_type(q .. 'groups', 'zset')
    and of_type(q .. 'dead', 'list') and of_type(q .. 'stats', 'hash')
    and of_type(base .. 'held', 'zset')) then
  return 0
end
if redis.call('ZCARD', q .. 'delayed') > 0 or redis.call('LLEN', q .. 'dead') > 0
    or redis.call('ZCARD', q .. 'groups') > 0 then
  return 0
end
local stats = redis.call('HMGET', q .. 'stats', 'leased', 'waiting')
if (tonumber(stats[1] or '0') or 1) ~= 0 or (tonumber(stats[2] or '0') or 1) ~= 0 then
  return 0
end
local kinds = redis.call('SMEMBERS', q .. 'kinds')
for _, kind in ipairs(kinds) do
  local ready = ready_key(base, queue, kind)
  if not of_type(ready, 'zset') or redis.call('ZCARD', ready) > 0 then
    return 0
  end
end
if redis.call('ZCARD', base .. 'held') > 10000 then
  return 0
end
for _, id in ipairs(redis.call('ZRANGE', base .. 'held', 0, -1)) do
  if fields(base .. 'job:' .. id, 'queue')[1] == queue then
    return 0
  end
end
for _, kind in ipairs(kinds) do
  -- (A rotation left with groups whose sets are gone: nothing ready is in it.)
  redis.call('DEL', ready_key(base, queue, kind), rotation_key(base, queue, kind))
end
redis.call('DEL', q .. 'kinds', q .. 'stats', q .. 'delayed', q .. 'dead', q .. 'rate')
if of_type(base .. 'queues', 'set') then
  redis.call('SREM', base .. 'queues', queue)
end
if of_type(base .. 'paused', 'set') then
  redis.call('SREM', base .. 'paused', queue)
end
return 1
