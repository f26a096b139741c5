-- groups.lua: a group's limits set, a group read, a queue's top groups (core/src/group.rs; the keys
-- are in common.lua).
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  "set": ARGV[2] group, ARGV[3] cap ("" none), ARGV[4] rate jobs and ARGV[5] its
--          period in ms ("" "" none), ARGV[6] paused ("1" or ""); every limit replaced, a
--          new or changed rate limit starting with a full bucket; then the group comes back
--          to its rotations if nothing holds it any more
--          With a cap, its running jobs are counted afresh from the live leases (each lease
--          entry of the group's jobs then names the group, so its end gives the slot back): a
--          count an older version left high heals here (O(live leases): an operator's call).
--          "status": ARGV[2] group
--          "top": ARGV[2] queue, ARGV[3] how many
--          "limited": ARGV[2] how many: the groups with a limit or a pause, by name
-- Returns  "set": "ok". "status": one group row, its ready jobs counted over every queue.
--          "limited": a row per group with limits (ready 0).
--          "top": the queue's groups with the most ready jobs (ties by name), a row each, its
--          ready jobs in that queue. A row: {group, ready, running, cap, jobs, per_ms,
--          paused, parked} ("" for what is not set).
-- Errors   "set": "PALISADE_LAYOUT ..." or "PALISADE_FORMAT ..." (before anything) for a
--          caller of another layout generation or outside the format level (ARGV[7], the
--          last, is the caller's generation: common.lua, wrong_layout); "PALISADE_CORRUPT ..."
--          (before anything) when the group's record holds another type. The reads: none (a key of another type reads as empty).
local base, action = KEYS[1], ARGV[1]
local now = now_ms()

local function row(group, ready)
  local g = fields(base .. 'group:' .. group, unpack(GROUP_FIELDS))
  return { group, fmt(ready), fmt(count_of(g[1])), g[2] or '', g[3] or '', g[4] or '',
    g[7] or '', g[8] or '' }
end

local function depth(queue, group)
  local d = redis.pcall('ZSCORE', base .. 'q:' .. queue .. ':groups', group)
  return type(d) == 'string' and math.max(0, -(tonumber(d) or 0)) or 0
end

if action == 'set' then
  -- (It rewrites the group's lease entries: refused, like every script that acts, for a
  -- process of another layout generation or outside the format level.)
  local refused = wrong_layout(base)
  if refused then
    return refused
  end
  local group = ARGV[2]
  local key = base .. 'group:' .. group
  local wrong = mistyped({ [key] = 'hash', [base .. 'glimited'] = 'zset',
    [base .. 'lease_job'] = 'hash' })
  if wrong then
    return corrupt(wrong)
  end
  if ARGV[3] ~= '' then
    local running, entries = 0, redis.call('HGETALL', base .. 'lease_job')
    for i = 1, #entries, 2 do
      local entry = entries[i + 1]
      local id = job_of(entry)
      if id and fields(base .. 'job:' .. id, 'group')[1] == group then
        running = running + 1
        if group_of(entry) ~= group then
          local _, tabs = string.gsub(entry, '\t', '')
          if tabs == 4 then
            redis.call('HSET', base .. 'lease_job', entries[i], entry .. '\t\t\t' .. group)
          elseif tabs == 6 then
            redis.call('HSET', base .. 'lease_job', entries[i], entry .. '\t' .. group)
          end
        end
      end
    end
    if running > 0 then
      redis.call('HSET', key, 'running', running)
    else
      redis.call('HDEL', key, 'running')
    end
  end
  local was = redis.call('HMGET', key, 'jobs', 'per_ms')
  local function put(field, value)
    if value == '' then
      redis.call('HDEL', key, field)
    else
      redis.call('HSET', key, field, value)
    end
  end
  put('cap', ARGV[3])
  put('paused', ARGV[6])
  if (was[1] or '') ~= ARGV[4] or (was[2] or '') ~= ARGV[5] then
    put('jobs', ARGV[4])
    put('per_ms', ARGV[5])
    put('tokens', ARGV[4])
    put('at', ARGV[4] ~= '' and fmt(now) or '')
  end
  -- Claims read the records of limited groups only.
  if ARGV[3] ~= '' or ARGV[4] ~= '' or ARGV[6] ~= '' then
    redis.call('ZADD', base .. 'glimited', 0, group)
  else
    redis.call('ZREM', base .. 'glimited', group)
  end
  unpark(base, group, now)
  return 'ok'
elseif action == 'limited' then
  local out = {}
  local groups = redis.pcall('ZRANGE', base .. 'glimited', 0, tonumber(ARGV[2]) - 1)
  if type(groups) == 'table' and not groups.err then
    for _, group in ipairs(groups) do
      out[#out + 1] = row(group, 0)
    end
  end
  return out
elseif action == 'status' then
  local ready = 0
  local queues = redis.pcall('SMEMBERS', base .. 'queues')
  if type(queues) == 'table' and not queues.err then
    for _, queue in ipairs(queues) do
      ready = ready + depth(queue, ARGV[2])
    end
  end
  return { row(ARGV[2], ready) }
else
  local out = {}
  local top = redis.pcall('ZRANGE', base .. 'q:' .. ARGV[2] .. ':groups', 0, math.min(tonumber(ARGV[3]), 1000) - 1,
    'WITHSCORES')
  if type(top) == 'table' and not top.err then
    for i = 1, #top, 2 do
      out[#out + 1] = row(top[i], math.max(0, -(tonumber(top[i + 1]) or 0)))
    end
  end
  return out
end
