-- flow_home.lua: a flow at its home (core/src/store/flows.rs): keeps it ("put") or records how steps
-- ended and decides what that unblocks ("advance"); the rule is core/src/flow.rs' `decide`, mirrored in
-- `decide_step` below. Every change is once-only: an end is recorded with HSETNX, a decision
-- with HSETNX, and a dependency count goes down only when its dependency's end was recorded —
-- so a repeated or replayed call changes nothing.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  "put" | "grow" | "advance" | "cancel", ARGV[2] flow id, ARGV[3] how long a finished flow is kept (ms)
--          put:     ARGV[4] step count n, then 3 fields per
--                   step: name, JSON {job, scope, after: [[step, fail|skip|run]], next:
--                   [step]}, number of dependencies
--          grow:    ARGV[4] the step whose completion added steps, ARGV[5] n, then n steps as
--                   for put (full names; each runs after that step): added unless that
--                   step's end is recorded or one of them is a step already; every step that
--                   runs after that step then also runs after each of them, on the same kind
--                   of edge (core/src/flow.rs' `Home::grow`); in a cancelled flow they are decided
--                   "fail:flow cancelled" at once
--          advance: ARGV[4] n, then n pairs (step, completed|dead|skipped), then m, then m
--                   steps whose releases their partitions confirmed
--          cancel:  nothing more: unless every step ended, every step not decided is
--                   decided "fail:flow cancelled" (and has ended, dead); the flow is marked
--                   cancelled
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  "1" if this call kept the flow ("put" of a flow not kept yet), else "0"; then k
--          and k job ids (for "cancel": the jobs of steps released to run that have not
--          ended, for the caller to cancel; else k = 0); then 4 fields per release decided and not confirmed: step, job id, scope ("" for none),
--          decision ("run" | "skip" | "fail:<reason>"); nothing more for a flow it
--          does not keep
-- Errors   "PALISADE_CORRUPT ..." when one of the flow's keys holds another type: raised before
--          anything changed; also "PALISADE_LAYOUT ..." (before anything)
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, op, fid, retention = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local F = base .. 'flow:' .. fid
local STEPS, LEFT, ENDS, DECIDED, OUT = F .. ':steps', F .. ':left', F .. ':ends', F .. ':decided',
  F .. ':out'
local wrong = mistyped({ [F] = 'hash', [STEPS] = 'hash', [LEFT] = 'hash', [ENDS] = 'hash',
  [DECIDED] = 'hash', [OUT] = 'set', [base .. 'flows:out'] = 'zset' })
if wrong then
  return corrupt(wrong)
end
local now = now_ms()
-- The list of running flows only feeds `status` and a gauge: another program's key there is
-- left alone (and said) rather than stopping every flow.
local RUNNING = base .. 'flows:running'
local running_ok = redis.call('TYPE', RUNNING).ok
running_ok = running_ok == 'zset' or running_ok == 'none'
if not running_ok then
  redis.log(redis.LOG_WARNING, 'palisade: ' .. RUNNING .. ' holds another type; running flows are not listed')
end

-- A step's record, or nil when it does not decode (another program wrote it): such a step
-- is never decided, which the flow's state shows (running), rather than failing the call.
local function step_of(name)
  local raw = redis.call('HGET', STEPS, name)
  local ok, step = pcall(cjson.decode, raw or '')
  if not (ok and type(step) == 'table' and type(step.job) == 'string'
    and (step.scope == nil or type(step.scope) == 'string')
    and type(step.after) == 'table' and type(step.next) == 'table') then
    return nil
  end
  for _, e in ipairs(step.after) do
    if type(e) ~= 'table' or type(e[1]) ~= 'string' or type(e[2]) ~= 'string' then
      return nil
    end
  end
  for _, d in ipairs(step.next) do
    if type(d) ~= 'string' then
      return nil
    end
  end
  return step
end

-- core/src/flow.rs' `decide`: nil while a dependency has not ended; then fail on a fail edge whose step
-- did not complete (the first), else skip on such a skip edge, else run.
local function decide_step(after)
  local ends = {}
  for i = 1, #after, 500 do
    local names = {}
    for k = i, math.min(i + 499, #after) do
      names[#names + 1] = tostring(after[k][1])
    end
    local got = redis.call('HMGET', ENDS, unpack(names))
    for k = 1, #got do
      if not got[k] then
        return nil
      end
      ends[i + k - 1] = got[k]
    end
  end
  for i, e in ipairs(after) do
    if ends[i] ~= 'completed' and e[2] == 'fail' then
      return 'fail:step "' .. tostring(e[1]) .. '" it runs after was ' .. ends[i]
    end
  end
  for i, e in ipairs(after) do
    if ends[i] ~= 'completed' and e[2] == 'skip' then
      return 'skip'
    end
  end
  return 'run'
end

local exists = redis.call('EXISTS', F) == 1
local changed = false
local kept = '0'
if op == 'put' and not exists then
  local n = tonumber(ARGV[4])
  redis.call('HSET', F, 'steps', n, 'created', now)
  if running_ok then
    redis.call('ZADD', RUNNING, now, fid)
  end
  kept = '1'
  -- Flows ever kept here, whoever created them, for the sampler. Counted only where it can
  -- be (pcall): a stats hash written over must not fail the creation halfway.
  local before = redis.pcall('HGET', base .. 'flow_stats', 'created')
  if type(before) ~= 'table' and countable(before) then
    redis.pcall('HINCRBY', base .. 'flow_stats', 'created', 1)
  end
  for i = 0, n - 1 do
    local o = 4 + i * 3
    local name, deps = ARGV[o + 1], ARGV[o + 3]
    redis.call('HSET', STEPS, name, ARGV[o + 2])
    if deps == '0' then
      redis.call('HSET', DECIDED, name, 'run')
      redis.call('SADD', OUT, name)
      changed = true
    else
      redis.call('HSET', LEFT, name, deps)
    end
  end
  exists = true
elseif op == 'grow' and exists then
  local parent, n = ARGV[4], tonumber(ARGV[5])
  local pstep = step_of(parent)
  local fresh = pstep ~= nil and n > 0 and redis.call('HEXISTS', ENDS, parent) == 0
  local added, records = {}, {}
  for i = 0, n - 1 do
    local o = 5 + i * 3
    local ok, rec = pcall(cjson.decode, ARGV[o + 2])
    if not ok or type(rec) ~= 'table' or type(rec.next) ~= 'table'
      or redis.call('HEXISTS', STEPS, ARGV[o + 1]) == 1 then
      fresh = false
    end
    added[#added + 1] = ARGV[o + 1]
    records[#records + 1] = rec
  end
  -- Every record is encoded before the first write (Redis does not roll a script back).
  local writes, dependents = {}, {}
  if fresh then
    for i, name in ipairs(added) do
      local rec = records[i]
      for _, d in ipairs(pstep.next) do
        rec.next[#rec.next + 1] = d
      end
      writes[#writes + 1] = { name, rec }
    end
    for _, d in ipairs(pstep.next) do
      local dstep = step_of(d)
      if dstep then
        local kind = 'fail'
        for _, e in ipairs(dstep.after) do
          if e[1] == parent then
            kind = e[2]
          end
        end
        for _, name in ipairs(added) do
          dstep.after[#dstep.after + 1] = { name, kind }
        end
        writes[#writes + 1] = { d, dstep }
        dependents[#dependents + 1] = d
      end
    end
    for _, name in ipairs(added) do
      pstep.next[#pstep.next + 1] = name
    end
    writes[#writes + 1] = { parent, pstep }
    for _, w in ipairs(writes) do
      local ok, json = pcall(cjson.encode, w[2])
      if not ok then
        fresh = false
      end
      w[2] = json
    end
  end
  if fresh then
    for _, w in ipairs(writes) do
      redis.call('HSET', STEPS, w[1], w[2])
    end
    for i, name in ipairs(added) do
      redis.call('HSET', LEFT, name, ARGV[5 + (i - 1) * 3 + 3])
    end
    for _, d in ipairs(dependents) do
      if redis.call('HEXISTS', DECIDED, d) == 0 then
        redis.call('HSET', LEFT, d, count_of(redis.call('HGET', LEFT, d)) + #added)
      end
    end
    redis.call('HSET', F, 'steps', count_of(redis.call('HGET', F, 'steps')) + #added)
    if redis.call('HEXISTS', F, 'cancelled') == 1 then
      for _, name in ipairs(added) do
        redis.call('HSET', DECIDED, name, 'fail:flow cancelled')
        redis.call('HDEL', LEFT, name)
        redis.call('SADD', OUT, name)
        redis.call('HSET', ENDS, name, 'dead')
      end
      changed = true
    end
  end
elseif op == 'advance' and exists then
  local n = tonumber(ARGV[4])
  local work = {}
  for i = 0, n - 1 do
    local name, end_ = ARGV[5 + i * 2], ARGV[6 + i * 2]
    if redis.call('HEXISTS', STEPS, name) == 1 and redis.call('HSETNX', ENDS, name, end_) == 1 then
      work[#work + 1] = name
    end
  end
  while #work > 0 do
    local name = table.remove(work)
    local step = step_of(name)
    for _, d in ipairs(step and step.next or {}) do
      if redis.call('HEXISTS', DECIDED, d) == 0 then
        local left = math.max(count_of(redis.call('HGET', LEFT, d)) - 1, 0)
        redis.call('HSET', LEFT, d, left)
        local dstep = left == 0 and step_of(d)
        local decision = dstep and decide_step(dstep.after)
        if decision then
          redis.call('HSET', DECIDED, d, decision)
          redis.call('HDEL', LEFT, d)
          redis.call('SADD', OUT, d)
          changed = true
          local ended = (decision == 'skip' and 'skipped')
            or (string.sub(decision, 1, 5) == 'fail:' and 'dead') or nil
          if ended and redis.call('HSETNX', ENDS, d, ended) == 1 then
            work[#work + 1] = d
          end
        end
      end
    end
  end
  local m = tonumber(ARGV[5 + n * 2])
  for i = 1, m do
    redis.call('SREM', OUT, ARGV[5 + n * 2 + i])
  end
end
local running = {}
-- (A finished flow keeps its state.)
if op == 'cancel' and exists
  and redis.call('HLEN', ENDS) < count_of(redis.call('HGET', F, 'steps')) then
  redis.call('HSET', F, 'cancelled', '1')
  local names = redis.call('HKEYS', STEPS)
  table.sort(names)
  for _, name in ipairs(names) do
    if redis.call('HEXISTS', DECIDED, name) == 0 then
      redis.call('HSET', DECIDED, name, 'fail:flow cancelled')
      redis.call('HDEL', LEFT, name)
      redis.call('SADD', OUT, name)
      redis.call('HSETNX', ENDS, name, 'dead')
      changed = true
    elseif redis.call('HGET', DECIDED, name) == 'run' and redis.call('HEXISTS', ENDS, name) == 0 then
      local step = step_of(name)
      if step then
        running[#running + 1] = step.job
      end
    end
  end
end
if not exists then
  -- (Forgotten after its retention: no sweep should look for it again.)
  redis.call('ZREM', base .. 'flows:out', fid)
  if running_ok then
    redis.call('ZREM', RUNNING, fid)
  end
  return { kept, '0' }
end
local pending = redis.call('SMEMBERS', OUT)
if #pending == 0 then
  redis.call('ZREM', base .. 'flows:out', fid)
elseif changed then
  redis.call('ZADD', base .. 'flows:out', now, fid)
else
  redis.call('ZADD', base .. 'flows:out', 'NX', now, fid)
end
if redis.call('HLEN', ENDS) >= count_of(redis.call('HGET', F, 'steps')) then
  -- Finished: kept for its retention, like its steps' results.
  if running_ok then
    redis.call('ZREM', RUNNING, fid)
  end
  for _, key in ipairs({ F, STEPS, LEFT, ENDS, DECIDED, OUT, F .. ':results' }) do
    redis.call('PEXPIRE', key, retention)
  end
end
table.sort(pending)
local out = { kept, tostring(#running) }
for _, job in ipairs(running) do
  out[#out + 1] = job
end
for _, name in ipairs(pending) do
  local step = step_of(name)
  if step then
    out[#out + 1] = name
    out[#out + 1] = step.job
    out[#out + 1] = type(step.scope) == 'string' and step.scope or ''
    out[#out + 1] = redis.call('HGET', DECIDED, name) or 'run'
  end
end
return out
