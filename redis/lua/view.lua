-- view.lua: live jobs and where they are, and completed jobs kept, for operators (read-only).
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  "job" or "done" (ARGV[2] a job id), "delayed" or "ready" (ARGV[2] a queue, ARGV[3]
--          most jobs)
-- Returns  one array per job: {id, meta JSON, queue, attempt, stalls, state, due in ms ("" if
--          not delayed), lease id ("" if not leased), the reason its last attempt was retried
--          ("" if none), snoozes, enqueued at (ms, "" if unknown), its attempt's start (ms, ""
--          if unknown or never claimed), its attempt history (settle.lua's 'tries', "" if none),
--          completed at (ms, "" unless completed), its result ("" if none)}; state is ready,
--          waiting, delayed, completed,
--          leased, held or unplaced. "job" returns at most one (none for a job that is not
--          live); "delayed" the queue's delayed jobs, soonest due first; "ready" its ready jobs
--          of no group, next to be claimed first (by their ready score, across its kinds); "done" the
--          completed job's kept record (settle.lua), at most one.
-- Errors   none: a key of another type reads as empty
local base = KEYS[1]
local now = now_ms()
local function zscore(key, member)
  local s = redis.pcall('ZSCORE', key, member)
  return type(s) == 'string' and s or nil
end
local function view(id)
  local f = fields(base .. 'job:' .. id, 'meta', 'queue', 'kind', 'scope', 'attempt', 'stalls',
    'lease', 'error', 'snoozes', 'group', 'enq', 'start', 'tries')
  if not f[1] or not f[2] then
    return nil
  end
  local extra = { f[11] or '', f[12] or '', f[13] or '', '', '' }
  local state, due, lease = 'unplaced', '', ''
  local entry = f[7] and redis.pcall('HGET', base .. 'lease_job', f[7])
  local at = zscore(base .. 'q:' .. f[2] .. ':delayed', id)
  -- (A record of an earlier version has no kind field: its meta has it.)
  local kind = f[3] or meta_of(f[1]).kind
  if type(entry) == 'string' and job_of(entry) == id then
    state, lease = 'leased', f[7]
  elseif at then
    state = 'delayed'
    if finite(tonumber(at)) then
      due = fmt(math.max(0, tonumber(at) - now))
    end
  elseif zscore(base .. 'held', id) then
    state = 'held'
  elseif kind ~= '' and (zscore(ready_key(base, f[2], kind), id)
      or (f[10] and zscore(group_key(base, f[2], kind, f[10]), id))) then
    state = 'ready'
  elseif f[4] and zscore(base .. 'wait:' .. f[4], id) then
    state = 'waiting'
  end
  return { id, f[1], f[2], fmt(count_of(f[5])), fmt(count_of(f[6])), state, due, lease,
    f[8] or '', fmt(count_of(f[9])), unpack(extra) }
end
-- A completed job's kept record (settle.lua renamed it), with its result if one is kept.
local function done(id)
  local f = fields(base .. 'done:' .. id, 'meta', 'queue', 'attempt', 'stalls', 'error',
    'snoozes', 'enq', 'start', 'tries', 'fin')
  -- When it completed: its score in "done" (a record of an earlier commit has it as 'fin').
  local at = zscore(base .. 'done', id)
  f[10] = (at and string.match(at, '^%d+$')) and at or f[10]
  if not f[1] or not f[2] or not f[10] then
    return nil
  end
  local result = redis.pcall('GET', base .. 'result:' .. id)
  return { id, f[1], f[2], fmt(count_of(f[3])), fmt(count_of(f[4])), 'completed', '', '',
    f[5] or '', fmt(count_of(f[6])), f[7] or '', f[8] or '', f[9] or '', f[10],
    type(result) == 'string' and result or '' }
end
local out = {}
if ARGV[1] == 'job' then
  out[1] = view(ARGV[2])
elseif ARGV[1] == 'done' then
  out[1] = done(ARGV[2])
elseif ARGV[1] == 'ready' then
  local n = tonumber(ARGV[3])
  local kinds = redis.pcall('SMEMBERS', base .. 'q:' .. ARGV[2] .. ':kinds')
  local all = {}
  if type(kinds) == 'table' and not kinds.err then
    for _, kind in ipairs(kinds) do
      local got = redis.pcall('ZRANGE', ready_key(base, ARGV[2], kind), 0, n - 1, 'WITHSCORES')
      if type(got) == 'table' and not got.err then
        for i = 1, #got, 2 do
          all[#all + 1] = { tonumber(got[i + 1]) or 0, got[i] }
        end
      end
    end
  end
  table.sort(all, function(a, b)
    if a[1] ~= b[1] then
      return a[1] < b[1]
    end
    return a[2] < b[2]
  end)
  for i = 1, math.min(n, #all) do
    out[#out + 1] = view(all[i][2])
  end
else
  local ids = redis.pcall('ZRANGE', base .. 'q:' .. ARGV[2] .. ':delayed', 0,
    tonumber(ARGV[3]) - 1)
  if type(ids) == 'table' and not ids.err then
    for _, id in ipairs(ids) do
      out[#out + 1] = view(id)
    end
  end
end
return out
