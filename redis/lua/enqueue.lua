-- enqueue.lua: adds jobs, all in one atomic step.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  job count n, then 15 fields per job: id queue kind scope (empty for the job's
--          default scope) priority delay_ms meta (JSON: kind payload queue scope priority
--          max_attempts max_stalls ...) unique_key (empty: none) unique_ttl_ms debounce_key
--          (empty: none; a debounced job's delay is its quiet period) quiet_ms max_wait_ms
--          group (empty: none) fingerprint (empty: none; kept as the job record's `fp`)
--          id_ttl_ms (a producer-chosen id whose job has a unique key of another name: its
--          `id:<id>` key is taken too, for this long; 0: none)
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  per job, its id when it was added; "=" and the id of the job it is when it was not:
--          the job (an earlier one of this batch included) holding its unique key, or the job
--          its (producer-chosen) id already names; "~" and the id of the pending job holding
--          its debounce key when it replaced that job's meta and pushed its start instead
-- Errors   "PALISADE_CORRUPT ..." when a key it would write holds another type (or the
--          enqueue counter is not an integer): raised before anything changed (jobs are
--          validated by the client before they are sent). "PALISADE_INVALID ..." (before
--          anything) when a debounce key is held by a pending job of another queue, kind,
--          scope or group. "PALISADE_CONFLICT ..." (before anything) when a job's unique key
--          (or id) is held by a job whose record keeps another fingerprint than the one sent.
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base = KEYS[1]
local now = now_ms()
local n = tonumber(ARGV[1])
local F = 15
local DEBOUNCE_KEPT_MS = 86400000 -- core/src/job/new.rs, DEBOUNCE_KEPT
-- First, read-only: every key the batch may write is of its type, the counters are numbers.
local want, jobs, scoped = { [base .. 'queues'] = 'set', [base .. 'seq'] = 'string' }, {}, {}
for i = 0, n - 1 do
  local o = 1 + i * F
  local id, queue, kind, scope = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  -- Numbers another client sent oddly would fail a write halfway: refused before any.
  if not string.match(ARGV[o + 5], '^-?%d+$') or #ARGV[o + 5] > 6 then
    return redis.error_reply('PALISADE_INVALID priority ' .. ARGV[o + 5] .. ' is not an integer: nothing was changed')
  end
  for _, ms in ipairs({ ARGV[o + 6], ARGV[o + 9], ARGV[o + 11], ARGV[o + 12], ARGV[o + 15] }) do
    if #ms > 15 or not string.match(ms, '^%d+$') then
      return redis.error_reply('PALISADE_INVALID delay, ttl or period ' .. ms
        .. ' is not a number of ms: nothing was changed')
    end
  end
  jobs[#jobs + 1] = base .. 'job:' .. id
  want[base .. 'q:' .. queue .. ':kinds'] = 'set'
  want[ready_key(base, queue, kind)] = 'zset'
  if ARGV[o + 13] ~= '' then
    place_keys(base, want, scoped, queue, kind, ARGV[o + 13])
  end
  if tonumber(ARGV[o + 6]) > 0 then
    want[base .. 'q:' .. queue .. ':delayed'] = 'zset'
  elseif scope ~= '' then
    want[base .. 'head'] = 'hash'
    want[base .. 'wait:' .. scope] = 'zset'
    scoped[base .. 'q:' .. queue .. ':stats'] = true
  end
  if ARGV[o + 8] ~= '' then
    want[base .. 'unique:' .. ARGV[o + 8]] = 'string'
  end
  if ARGV[o + 15] ~= '0' then
    want[base .. 'unique:id:' .. id] = 'string'
  end
  if ARGV[o + 10] ~= '' then
    want[base .. 'debounce:' .. ARGV[o + 10]] = 'string'
    want[base .. 'q:' .. queue .. ':delayed'] = 'zset'
  end
end
for stats in pairs(scoped) do
  want[stats] = 'hash'
end
-- Job records are new keys: one EXISTS per 500 instead of a TYPE each.
local existing = 0
for i = 1, #jobs, 500 do
  existing = existing + redis.call('EXISTS', unpack(jobs, i, math.min(i + 499, #jobs)))
end
if existing > 0 then
  for _, job in ipairs(jobs) do
    want[job] = 'hash'
  end
end
local wrong = mistyped(want)
if not wrong then
  if not countable(redis.call('GET', base .. 'seq')) then
    wrong = base .. 'seq is not an integer'
  end
  if want[base .. 'turn'] and not countable(redis.call('GET', base .. 'turn')) then
    wrong = wrong or (base .. 'turn is not an integer')
  end
  for stats in pairs(scoped) do
    wrong = wrong or uncountable(stats, { 'waiting', 'grouped' })
  end
end
if wrong then
  return corrupt(wrong)
end
-- Then, still read-only, job by job in batch order: which jobs a unique key turns away, and
-- which a debounce key folds into the pending job holding it — one that waits out its quiet
-- period and never started (delayed, no attempt, no snooze). A folded job's unique key (its
-- id's) is held by the job it folded into. (The client refuses two jobs of one batch under
-- one debounce key; from another client the later one replaces what the earlier wrote, as
-- two enqueues would.)
-- An idempotency key (or id) sent with a fingerprint and held by a job whose record (live or
-- completed) keeps another one refuses the batch: a reused key must not hide a different
-- request. A holder with no fingerprint kept (a plain key, a record gone, a job an earlier
-- release enqueued) turns the job away as before.
local function kept_fingerprint(holder)
  for _, key in ipairs({ base .. 'job:' .. holder, base .. 'done:' .. holder }) do
    local fp = redis.pcall('HGET', key, 'fp')
    if type(fp) == 'string' then
      return fp
    end
  end
  return nil
end
local out, held, folded, held_fp = {}, {}, {}, {}
for i = 0, n - 1 do
  local o = 1 + i * F
  local ukey, fp = ARGV[o + 8], ARGV[o + 14]
  if ukey ~= '' then
    local holder = held[ukey] or redis.call('GET', base .. 'unique:' .. ukey)
    -- A job's own id key lapses with its ttl while the job may still be known (below): the
    -- key `id:<x>` of another job is held while job x's record is, as the memory store holds it.
    local named = not holder and string.sub(ukey, 1, 3) == 'id:' and string.sub(ukey, 4)
    if named and named ~= ARGV[o + 1] and redis.call('EXISTS', base .. 'job:' .. named) == 1 then
      holder = named
    end
    if holder then
      local kept = held_fp[ukey]
      if kept == nil and not held[ukey] then
        kept = kept_fingerprint(holder)
      end
      if fp ~= '' and kept and kept ~= '' and kept ~= fp then
        return redis.error_reply('PALISADE_CONFLICT unique key ' .. ukey .. ' is held by job '
          .. (held[ukey] and 'an earlier one of this batch' or holder)
          .. ', enqueued with a different request: nothing was changed (send a new key for a new request)')
      end
      out[i + 1] = '=' .. holder
    end
  end
  -- A producer-chosen id beside a key of another name: its own id key, held, turns it away.
  if not out[i + 1] and ARGV[o + 15] ~= '0' then
    local holder = redis.call('GET', base .. 'unique:id:' .. ARGV[o + 1])
    if holder then
      local kept = kept_fingerprint(holder)
      if fp ~= '' and kept and kept ~= fp then
        return redis.error_reply('PALISADE_CONFLICT job id ' .. ARGV[o + 1]
          .. ' is held by a job enqueued with a different request: nothing was changed')
      end
      out[i + 1] = '=' .. holder
    end
  end
  -- A producer-chosen id (NewJob::with_id) whose job is still known adds nothing.
  if not out[i + 1] and existing > 0 and redis.call('EXISTS', jobs[i + 1]) == 1 then
    local kept = kept_fingerprint(ARGV[o + 1])
    if fp ~= '' and kept and kept ~= fp then
      return redis.error_reply('PALISADE_CONFLICT job id ' .. ARGV[o + 1]
        .. ' is held by a job enqueued with a different request: nothing was changed')
    end
    out[i + 1] = '=' .. ARGV[o + 1]
  end
  local dkey = ARGV[o + 10]
  if dkey ~= '' and not out[i + 1] then
    local holder = redis.call('GET', base .. 'debounce:' .. dkey)
    local h = holder and fields(base .. 'job:' .. holder, 'queue', 'kind', 'scope', 'attempt',
      'snoozes', 'until', 'group') or {}
    local due = h[1] and redis.pcall('ZSCORE', base .. 'q:' .. h[1] .. ':delayed', holder)
    if type(due) == 'string' and count_of(h[4]) == 0 and count_of(h[5]) == 0 then
      local queue, kind, scope = ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
      if h[1] ~= queue or h[2] ~= kind or (h[3] or '') ~= scope or (h[7] or '') ~= ARGV[o + 13] then
        return redis.error_reply('PALISADE_INVALID debounce key ' .. dkey .. ' is held by pending job '
          .. holder .. ' of queue ' .. h[1] .. ', kind ' .. tostring(h[2]) .. ', scope '
          .. (h[3] or '(its own)') .. ', group ' .. (h[7] or '(none)')
          .. '; a job under it must name the same: nothing was changed')
      end
      -- (A due time or a latest start another program wrote oddly reads as now.)
      local at = tonumber(due)
      folded[i + 1] = { holder, h[6] and count_of(h[6]) or now, finite(at) and at or now }
      out[i + 1] = '~' .. holder
    end
  end
  if ukey ~= '' and not out[i + 1] then
    held[ukey] = ARGV[o + 1]
    held_fp[ukey] = fp
  elseif ukey ~= '' and folded[i + 1] and tonumber(ARGV[o + 9]) > 0 then
    held[ukey] = folded[i + 1][1]
  end
end
local last = redis.call('INCRBY', base .. 'seq', n)
local queues = {}
local kinds = {}
local ready = {} -- ready set -> {score, id, ...} of the batch's default-scoped jobs
local grouped = {} -- "queue TAB kind TAB group" -> {score, id, ...} of its grouped ones
for i = 0, n - 1 do
  local o = 1 + i * F
  local id, queue, kind, scope = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  local fold = folded[i + 1]
  if fold then
    -- The pending job takes this one's meta (payload and options) and starts a quiet period
    -- after now, but no later than its first enqueue's maximum wait (`until`); one due
    -- already (overdue, or run now by an operator) keeps its due time.
    local holder, latest, due = fold[1], fold[2], fold[3]
    local start = math.min(now + tonumber(ARGV[o + 11]), latest)
    if due <= now then
      start = due
    end
    redis.call('HSET', base .. 'job:' .. holder, 'meta', ARGV[o + 7], 'at', start)
    redis.call('ZADD', base .. 'q:' .. queue .. ':delayed', start, holder)
    redis.call('SET', base .. 'debounce:' .. ARGV[o + 10], holder, 'PX', math.floor(math.max(start - now, 0)) + DEBOUNCE_KEPT_MS)
    -- Its own id stays taken, by the job it folded into: a retry of this enqueue (its reply
    -- lost) answers that job instead of adding one once the job started.
    if ARGV[o + 8] ~= '' and tonumber(ARGV[o + 9]) > 0 then
      redis.call('SET', base .. 'unique:' .. ARGV[o + 8], holder, 'PX', tonumber(ARGV[o + 9]))
    end
  elseif not out[i + 1] then -- not turned away
    out[i + 1] = id
    local priority, delay = tonumber(ARGV[o + 5]), tonumber(ARGV[o + 6])
    local at = now + math.max(delay, 0) -- claimable from (the oldest-ready gauge)
    local group = ARGV[o + 13] ~= '' and ARGV[o + 13] or nil
    if group then
      redis.call('HSET', base .. 'job:' .. id, 'group', group)
    end
    -- One HSET for the record: its scope and fingerprint only when it has them.
    local record = { 'meta', ARGV[o + 7], 'queue', queue, 'kind', kind, 'at', at, 'enq', now }
    if scope == '' then
      scope = nil
    else
      table.insert(record, 'scope')
      table.insert(record, scope)
    end
    if ARGV[o + 14] ~= '' then
      table.insert(record, 'fp')
      table.insert(record, ARGV[o + 14])
    end
    redis.call('HSET', base .. 'job:' .. id, unpack(record))
    local score = last - n + i + 1 - priority * PRIORITY_SPAN
    if delay > 0 then
      redis.call('ZADD', base .. 'q:' .. queue .. ':delayed', now + delay, id)
    elseif scope == nil and group then
      -- Ready in its group: with the batch's others of its group below.
      local key = queue .. '\t' .. kind .. '\t' .. group
      grouped[key] = grouped[key] or {}
      table.insert(grouped[key], score)
      table.insert(grouped[key], id)
    elseif scope == nil then
      -- Always ready: added with the batch's others of its kind in one ZADD below.
      local key = ready_key(base, queue, kind)
      local entries = ready[key]
      if not entries then
        entries = {}
        ready[key] = entries
      end
      entries[#entries + 1] = score
      entries[#entries + 1] = id
    else
      enter(base, id, queue, kind, scope, score, true, group)
    end
    if ARGV[o + 10] ~= '' then
      -- Its latest start (`until`), and the key, kept a day past its due time: a job still
      -- not claimed then (a queue paused that long) takes no more updates.
      redis.call('HSET', base .. 'job:' .. id, 'until', now + tonumber(ARGV[o + 12]))
      redis.call('SET', base .. 'debounce:' .. ARGV[o + 10], id, 'PX', tonumber(ARGV[o + 11]) + DEBOUNCE_KEPT_MS)
    end
    if ARGV[o + 8] == 'id:' .. id then
      -- The job's own id (NewJob::with_id; every client-made job has one): while the job is
      -- known its record turns a second enqueue away (EXISTS above), so the key only has to
      -- outlast the record by the ttl from now. It expires on its own and the job's end does
      -- not touch it: a settlement saves a GET and a PEXPIREAT a job. (PX 0 is refused, and
      -- another client may send "00".)
      if tonumber(ARGV[o + 9]) > 0 then
        redis.call('SET', base .. 'unique:' .. ARGV[o + 8], id, 'PX', fmt(tonumber(ARGV[o + 9])))
      end
    elseif ARGV[o + 8] ~= '' then
      redis.call('SET', base .. 'unique:' .. ARGV[o + 8], id)
      redis.call('HSET', base .. 'job:' .. id, 'unique', ARGV[o + 8],
        'unique_until', now + tonumber(ARGV[o + 9]))
      -- A producer-chosen id stays taken by its own key as well, as `with_id` promises:
      -- else, once this job's record is gone, another job under the id would be added.
      if tonumber(ARGV[o + 15]) > 0 then
        redis.call('SET', base .. 'unique:id:' .. id, id, 'PX', fmt(tonumber(ARGV[o + 15])))
      end
    end
    queues[queue] = (queues[queue] or 0) + 1
    kinds[queue .. '\t' .. kind] = true
  end
end
for key, entries in pairs(ready) do
  bulk('ZADD', key, entries)
end
for key, entries in pairs(grouped) do
  local queue, kind, group = string.match(key, '^([^\t]*)\t([^\t]*)\t(.*)$')
  ready_grouped(base, queue, kind, group, entries)
end
for queue, added in pairs(queues) do
  redis.call('SADD', base .. 'queues', queue)
  -- Jobs ever enqueued to the queue, whoever enqueued them, for the sampler to export.
  -- Counted only where it can be (pcall): a stats hash written over must not fail the
  -- enqueue after its jobs are in.
  local stats = base .. 'q:' .. queue .. ':stats'
  local before = redis.pcall('HGET', stats, 'enqueued')
  if type(before) ~= 'table' and countable(before) then
    redis.pcall('HINCRBY', stats, 'enqueued', added)
  end
end
for pair in pairs(kinds) do
  local queue, kind = string.match(pair, '^(.*)\t(.*)$')
  redis.call('SADD', base .. 'q:' .. queue .. ':kinds', kind)
end
return out
