-- oldest.lua: how long the job next in line has been claimable, for the depth sampler.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] how many groups of each rotation to look at
-- Returns  milliseconds, the longest over the queue's kinds' heads (and groups' heads) and its first due delayed
--          job; -1 when nothing is ready. Read-only.
-- Errors   "PALISADE_CORRUPT ..." naming a key of the queue that holds another type (another
--          program writing under our prefix), rather than a bare WRONGTYPE, as counts.lua: the
--          views of every queue leave such a queue out and name the key (core/src/error.rs,
--          leaves_queue_out). A job record of another type counts from now.
local base, queue = KEYS[1], ARGV[1]
local now = now_ms()
local q = base .. 'q:' .. queue .. ':'
local function read(command, key, ...)
  local got = redis.pcall(command, key, ...)
  if type(got) == 'table' and got.err then
    error({ err = 'PALISADE_CORRUPT ' .. key .. ' is a ' .. redis.call('TYPE', key).ok
      .. ': no age was read' })
  end
  return got
end
local oldest = nil
local due = read('ZRANGEBYSCORE', q .. 'delayed', '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
if due[2] then
  oldest = tonumber(due[2])
end
-- The kinds' ready sets, and of grouped jobs the heads of the groups next in each rotation
-- (ARGV[2] of them: store::GROUP_HEADS_LOOKED_AT, a bounded read).
for _, kind in ipairs(read('SMEMBERS', q .. 'kinds')) do
  local sets = { ready_key(base, queue, kind) }
  for _, group in ipairs(read('ZRANGE', rotation_key(base, queue, kind), 0, tonumber(ARGV[2]) - 1)) do
    sets[#sets + 1] = group_key(base, queue, kind, group)
  end
  for _, set in ipairs(sets) do
    local head = read('ZRANGE', set, 0, 0)[1]
    if head then
      -- A job enqueued before 'at' was recorded counts from now (so does a record of another
      -- type: an error table here).
      local at = tonumber(redis.pcall('HGET', base .. 'job:' .. head, 'at')) or now
      if oldest == nil or at < oldest then
        oldest = at
      end
    end
  end
end
if oldest == nil then
  return -1
end
return math.max(0, now - oldest)
