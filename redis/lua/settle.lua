-- settle.lua: completes, retries, dead-letters or reseeds finished jobs, each checked by lease.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  count, ARGV[2] dead-letter records kept per queue, ARGV[3] how long a completed
--          job's record is kept (ms; 0: not kept, deleted as before), ARGV[4] most completed
--          records kept (the oldest go first), then 6 fields per settlement:
--          lease id, action, arg, reason, follow-ups (a completion's follow-up jobs and flows
--          as JSON, kept at "then:<job id>" and listed in the zset "thens" by the time kept,
--          until the coordinator enqueued them; "" for none), added steps (the steps a flow
--          step's completion adds to its flow, as JSON, kept with the step's end; "" for none)
--          action "complete" (arg = how long its result is kept, ms, and reason = the result's
--          JSON, kept at "result:<job id>"; arg 0: no result) | "retry" (arg = delay ms) |
--          "dead" | "release" (back to ready,
--          the attempt not counted) | "snooze" (arg = delay ms; the attempt not counted, the
--          job's snooze count one higher) | "fenced" (arg = the epoch of the highest token the sink
--          reported)
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  one entry per settlement, then "w:<epoch>:<counter>", the low watermark after the
--          batch (or "w:" before any epoch exists). Per settlement: "ok", "stale" (lease not
--          current: nothing changed),
--          "invalid" (unknown action or an arg that is not a non-negative integer below 10^15: nothing
--          changed),
--          "exhausted" (a fenced settlement would need an epoch above 2^23 - 1: nothing
--          changed), "corrupt:<why>" (a key this settlement would write holds another type
--          or a count it increments is not an integer: this settlement changed nothing, its
--          lease stays for the reaper once the key is repaired; the others go through), or
--          "reseeded:<epoch>" (a fenced settlement moved the coordinator there). A job record
--          of another type counts as gone: its settlement is "ok", ends the lease and hands a
--          named scope's turn on (the scope is in the lease entry).
-- Errors   none of its own: every settlement is checked, on its own, before the first write
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base = KEYS[1]
local now = now_ms()
local count, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
-- Completed jobs' records: kept (renamed to "done:<id>", listed in the zset "done" by when
-- they completed) for keep_ms, at most keep_max of them. Arguments that are not the decimals
-- our client sends keep none (the completions themselves go through).
local keep_ms, keep_max = 0, 0
local EVICT_STEP = 1000
if string.match(ARGV[3] or '', '^%d+$') and #ARGV[3] <= 15
    and string.match(ARGV[4] or '', '^%d+$') and #ARGV[4] <= 15 then
  keep_ms, keep_max = tonumber(ARGV[3]), tonumber(ARGV[4])
end
if keep_max == 0 then
  keep_ms = 0
end
-- A "done" key another program wrote as another type: completions go through, none kept
-- (refusing them would wedge every completion on a key no job needs).
if keep_ms > 0 then
  local t = redis.call('TYPE', base .. 'done').ok
  if t ~= 'zset' and t ~= 'none' then
    keep_ms = 0
    redis.log(redis.LOG_WARNING, 'palisade: ' .. base .. 'done is a ' .. t
      .. ', not a zset: completed jobs are not kept until it is repaired')
  end
end

-- Look every lease up at once: its expiry and its job. Every script adds and removes a lease
-- in `leases` and `lease_job` together, so when no lease has expired and both hold as many,
-- they hold the same leases and one with an entry is current: its expiry need not be read.
-- (ZMSCORE's reply turns each score into text with printf, a cost on every lease:
-- docs/performance-log.md.) Otherwise, as a reaper that is behind leaves it, or
-- another program's writes, each lease's expiry is read.
local all, expiries, jobs, entries, epochs, seconds = {}, {}, {}, {}, {}, {}
for i = 0, count - 1 do
  all[#all + 1] = ARGV[5 + i * 6]
end
-- (A claim keeps SKIPLIST in `leases` at +inf: the count is of finite expiries.)
local leases = base .. 'leases'
local all_current = redis.call('ZCOUNT', leases, '-inf', fmt(now)) == 0
  and redis.call('ZCOUNT', leases, '-inf', '(+inf') == redis.call('HLEN', base .. 'lease_job')
for i = 1, #all, 500 do
  local chunk = { unpack(all, i, math.min(i + 499, #all)) }
  local e = not all_current and redis.call('ZMSCORE', leases, unpack(chunk))
  local j = redis.call('HMGET', base .. 'lease_job', unpack(chunk))
  for k = 1, #chunk do
    expiries[i + k - 1] = e and e[k]
    jobs[i + k - 1], epochs[i + k - 1], seconds[i + k - 1] = job_and_epoch(j[k])
    entries[i + k - 1] = j[k]
  end
end

-- Every entry is checked before it changes anything (Redis does not roll a script back).
local ACTIONS = { complete = true, retry = true, dead = true, release = true, fenced = true,
  snooze = true }
-- An arg is a decimal as Redis' own integer parser reads it ("0", or no leading zero, no sign,
-- no exponent, no spaces): Lua's tonumber takes "1e3" or "0x10", which a PX would refuse
-- after the script's first write. (So below, an arg is above 0 exactly when it is not "0".)
local function valid(action, arg)
  return ACTIONS[action] ~= nil and #arg <= 15 and (arg == '0' or arg:match('^[1-9]%d*$') ~= nil)
end

-- First, read-only: which settlements are current, their jobs' records, and that every key
-- each settlement may write has its type (a key another program wrote over fails only the
-- settlements that would write it, before the first write; a job record of another type
-- counts as gone). Types are asked once per key for the whole batch (`memo`).
local out, current, records, settled = {}, {}, {}, {}
local memo = {}
-- The verdicts of settlements of jobs without a named scope, by what decides their keys:
-- the lease's epoch, the job's queue, the action (and, for one that parks the job, its kind
-- and group). A batch is mostly such settlements, alike: building and checking their keys
-- once each was a large share of a settlement's instructions (docs/performance-log.md). A tree,
-- part by part, not one string: parts another program wrote (a tab in a kind, a group of "")
-- cannot run together, and an absent part (NONE) is not an empty one.
local verdicts, NONE, VERDICT = {}, {}, {}
local function branch(node, part)
  if part == nil then
    part = NONE
  end
  local next = node[part]
  if not next then
    next = {}
    node[part] = next
  end
  return next
end
-- An argument list that does not fit its count (from another client) has every settlement
-- refused: a field read at the wrong place — a reason or follow-ups past the end — would be
-- written.
local fits = #ARGV == 5 + count * 6
for i = 0, count - 1 do
  local o = 4 + i * 6
  local lease, action, arg = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3]
  local expiry, id = expiries[i + 1], jobs[i + 1]
  if not id or not (all_current or (expiry and tonumber(expiry) > now)) or settled[lease] then
    -- (a lease named twice in one batch is current only for its first settlement)
    out[i + 1] = 'stale'
  elseif not fits or not valid(action, arg) then
    out[i + 1] = 'invalid'
  elseif action == 'fenced' and tonumber(arg) >= 8388607 then
    out[i + 1] = 'exhausted'
  else
    -- (Named twice, even the first refused: the later one is stale, not a second chance.)
    settled[lease] = true
    local parks = action ~= 'complete' and action ~= 'dead'
    local job = base .. 'job:' .. id
    local f
    if parks then
      f = fields(job, 'queue', 'scope', 'capped', 'unique', 'unique_until', 'kind', 'flow', 'group')
    else
      -- A completion or a burial puts the job in no ready set: its kind and group are not
      -- read, nor the end of a unique key it has none of (three fields fewer a completion:
      -- docs/performance-log.md). Same places as above.
      -- (A burial gives its unique key up in `bury`, which reads the end itself.)
      f = fields(job, 'queue', 'scope', 'capped', 'unique', 'flow')
      f[5], f[7] = nil, f[5]
      if f[4] and action == 'complete' then
        f[5] = redis.call('HGET', job, 'unique_until')
      end
    end
    local delayed = (action == 'retry' or action == 'snooze') and arg ~= '0'
    local thens = action == 'complete' and ARGV[o + 5] ~= ''
    -- (The action is one of ACTIONS: with its flags appended it is still one of a kind.)
    local alike = nil
    if f[1] and not f[2] and (not parks or f[6]) then
      alike = branch(branch(verdicts, epochs[i + 1]), f[1])
      alike = branch(alike, action .. (delayed and '+d' or '') .. (thens and '+t' or ''))
      if parks then
        alike = branch(branch(alike, f[6]), f[8])
      end
    end
    local wrong = nil
    if alike then
      wrong = alike[VERDICT]
    end
    if wrong == nil then
      local want, counted = {}, {}
      settle_keys(base, want, counted, id, { f[1], f[2], f[6], f[8] }, parks, delayed,
        action == 'dead', entries[i + 1])
      if action == 'fenced' then
        want[base .. 'epoch'] = 'hash'
      end
      if thens then
        want[base .. 'thens'] = 'zset'
      end
      wrong = unsafe(base, want, counted, memo) or false
      if alike then
        alike[VERDICT] = wrong
      end
    end
    if wrong then
      out[i + 1] = 'corrupt:' .. wrong
      redis.log(redis.LOG_WARNING, 'palisade: settlement of lease ' .. lease .. ' refused: ' .. wrong)
    else
      current[#current + 1] = i
      records[i + 1] = f
    end
  end
end

local released, finished, leased, completed, kept = {}, {}, {}, {}, {}
local by_epoch = {} -- settled leases by their token's epoch, untracked in bulk below
for _, i in ipairs(current) do
  local o = 4 + i * 6
  local lease, action, arg, reason = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  local follow_ups, added = ARGV[o + 5], ARGV[o + 6]
  local id = jobs[i + 1]
  released[#released + 1] = lease
  local lease_epoch = epochs[i + 1]
  if lease_epoch then
    by_epoch[lease_epoch] = by_epoch[lease_epoch] or {}
    table.insert(by_epoch[lease_epoch], lease)
  end
  local job = base .. 'job:' .. id
  local f = records[i + 1]
  local queue, result = f[1], 'ok'
  -- (A lease counts against its group's cap only if its entry names a group: an entry that
  -- holds nothing past its worker needs no walk for one.)
  if holds_more(entries[i + 1], seconds[i + 1]) then
    unhold_group(base, entries[i + 1], now)
  end
  if not queue then
    let_go(base, lease, id, entries[i + 1])
  end
  if queue then
    if f[2] and redis.call('HGET', base .. 'live', f[2]) == lease then
      redis.call('HDEL', base .. 'live', f[2])
    end
    leased[queue] = (leased[queue] or 0) + 1
    uncap(base, id, f[3])
    if action == 'complete' then
      if arg ~= '0' then
        -- With the completion, never after it: an accepted completion has its result.
        redis.call('SET', base .. 'result:' .. id, reason, 'PX', arg)
      end
      if follow_ups ~= '' then
        -- Likewise its follow-up jobs: kept until the coordinator enqueued them.
        redis.call('SET', base .. 'then:' .. id, follow_ups)
        redis.call('ZADD', base .. 'thens', now, id)
      end
      release_unique_key(base, id, f[4], f[5], now)
      note_step_end(base, id, f[7], 'completed', added, arg ~= '0' and reason or '')
      leave(base, id, f[2])
      -- (EXISTS: a job two current leases completed in one batch was renamed by the first.)
      if keep_ms > 0 and redis.call('EXISTS', job) == 1 then
        -- Kept for operators under another name, out of every live job's way: the record as
        -- it ran (its 'start' and 'tries' the attempts); when it completed is its score in
        -- "done" (a field of its own cost a command a job: docs/performance-log.md).
        local done = base .. 'done:' .. id
        redis.call('RENAME', job, done)
        redis.call('PEXPIRE', done, keep_ms)
        kept[#kept + 1] = now
        kept[#kept + 1] = id
      else
        finished[#finished + 1] = job
      end
      completed[queue] = (completed[queue] or 0) + 1
    elseif action == 'retry' then
      -- The failure it retries after, for operators (`view.lua`); the next one overwrites it.
      redis.call('HSET', job, 'error', reason)
      note_try(job, 'retried', now, reason)
      park(base, id, now + tonumber(arg), now)
    elseif action == 'dead' then
      note_try(job, 'died', now, reason)
      bury(base, id, reason, keep)
    elseif action == 'release' then
      note_try(job, 'released', now, '')
      bump(job, 'attempt', -1)
      park(base, id, now, now)
    elseif action == 'snooze' then
      note_try(job, 'snoozed', now, '')
      -- Not a failure: the attempt is given back, the snooze counted (a claim reads it).
      bump(job, 'attempt', -1)
      bump(job, 'snoozes', 1)
      park(base, id, now + tonumber(arg), now)
    elseif action == 'fenced' then
      -- A sink holds a token at least as new as this current lease's: the counter
      -- regressed. Move above the sink's epoch now, remember it as a floor for later
      -- recoveries, and run the job again under a fresh token.
      local floor = tonumber(arg) + 1
      local e = redis.call('HMGET', base .. 'epoch', 'epoch', 'floor')
      local cur = tonumber(e[1] or '0') or 0
      if cur < floor then
        redis.call('HSET', base .. 'epoch', 'epoch', floor)
        redis.call('SET', base .. 'counter', 0)
        cur = floor
      end
      if (tonumber(e[2] or '0') or 0) < floor then
        redis.call('HSET', base .. 'epoch', 'floor', floor)
      end
      note_try(job, 'released', now, 'a sink held a newer token: the coordinator moved above it')
      bump(job, 'attempt', -1)
      park(base, id, now, now)
      result = 'reseeded:' .. fmt(cur)
    end
  end
  out[i + 1] = result
end
if #released > 0 then
  bulk('ZREM', base .. 'leases', released)
  bulk('HDEL', base .. 'lease_job', released)
end
for epoch, leases in pairs(by_epoch) do
  untrack(base, epoch, leases)
end
for i = 1, #finished, 500 do
  redis.call('DEL', unpack(finished, i, math.min(i + 499, #finished)))
end
if #kept > 0 then
  local done = base .. 'done'
  bulk('ZADD', done, kept)
  -- The list follows the records' own expiry, and holds at most keep_max: the oldest
  -- records beyond it go with their entries.
  redis.call('ZREMRANGEBYSCORE', done, '-inf', '(' .. fmt(now - keep_ms))
  -- (Its entries are no older than its records: once no completion came for keep_ms, both
  -- are gone.)
  redis.call('PEXPIRE', done, keep_ms)
  -- At most EVICT_STEP records go per call (a lowered maximum would otherwise delete
  -- millions in one script, blocking Redis): each later completion takes the next step.
  local over = math.min(redis.call('ZCARD', done) - keep_max, EVICT_STEP)
  if over > 0 then
    local gone = redis.call('ZRANGE', done, 0, over - 1)
    redis.call('ZREMRANGEBYRANK', done, 0, over - 1)
    for i = 1, #gone do
      gone[i] = base .. 'done:' .. gone[i]
    end
    for i = 1, #gone, 500 do
      redis.call('DEL', unpack(gone, i, math.min(i + 499, #gone)))
    end
  end
end
for queue, count in pairs(leased) do
  local stats = base .. 'q:' .. queue .. ':stats'
  redis.call('HINCRBY', stats, 'leased', -count)
  if completed[queue] then
    redis.call('HINCRBY', stats, 'completed', completed[queue])
  end
end
local w = watermark(base)
out[#out + 1] = w and ('w:' .. fmt(w[1]) .. ':' .. fmt(w[2])) or 'w:'
return out
