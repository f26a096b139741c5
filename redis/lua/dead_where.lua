-- dead_where.lua: one bounded step of a whole-set retry or purge of a queue's dead letters:
-- reads at most ARGV[4] records from index ARGV[3] (0: the oldest) and retries or deletes
-- those the filter takes, until ARGV[5] are done.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] "retry" or "purge", ARGV[3] index to start at, ARGV[4] most records
--          to read, ARGV[5] most to retry or delete,
--          ARGV[6] kind ("": any), ARGV[7] text the reason contains ("": any),
--          ARGV[8] died before this Unix ms ("": any age), ARGV[9] the anchor: the last record
--          the previous step read and left ("": none), expected just before ARGV[3]
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  {done, kept, read, next, anchor}: retried or deleted; taken by the filter but left
--          (a retry whose id names a live job again, or whose record cannot be revived);
--          records read; the index to go on from in the list as it is now, -1 once its end was
--          read; the anchor for the next step.
-- Between two steps the list may change ahead of the index (bury trims its head, another
-- sweep or a one-job retry removes records): the anchor is looked for where it was, else
-- anywhere (LPOS), else, gone with the trimmed head, the step starts from the head again, so
-- no record is passed over unread. (Read again, a record left before is left again.)
-- Errors   none but "PALISADE_LAYOUT ..." (before anything) for a caller of another layout
--          generation. A dead list of another type reads as empty. A record that does not
--          read as one bury wrote is never taken (what cannot be decoded is not deleted).
-- The filter's rule is DeadFilter::matches in palisade-core, word for word (a differential
-- test runs both): kind equal; reason containing the text, byte for byte; a time of death
-- that is a number below the bound.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, queue, action = KEYS[1], ARGV[1], ARGV[2]
local from, budget, limit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local kind, text, before, anchor = ARGV[6], ARGV[7], tonumber(ARGV[8]), ARGV[9]
local dead = base .. 'q:' .. queue .. ':dead'
if (action ~= 'retry' and action ~= 'purge') or redis.call('TYPE', dead).ok ~= 'list'
  or not from or not budget or not limit or budget < 1 then
  return { 0, 0, 0, -1, '' }
end
if anchor ~= '' and from > 0 and redis.call('LINDEX', dead, from - 1) ~= anchor then
  local at = redis.call('LPOS', dead, anchor)
  from = at and at + 1 or 0
end
-- Whether `d` (a record dead_record read) is one palisade-redis's DeadRecord decodes, field
-- by field: what the Rust side could not read is never taken, so a purge never deletes what
-- `dead list` cannot show. (A differential test pushes malformed records through both.)
local function optional(x)
  return x == nil or x == cjson.null
end
local UUID = '^' .. string.rep('%x', 8) .. '%-' .. string.rep('%x', 4) .. '%-'
  .. string.rep('%x', 4) .. '%-' .. string.rep('%x', 4) .. '%-' .. string.rep('%x', 12) .. '$'
local function decodable(d)
  return string.match(d.id, UUID) and type(d.reason) == 'string'
    and whole(d.attempt, U32) and whole(d.stalls, U32)
    and (optional(d.died) or whole(d.died, 1e15))
    and (optional(d.snoozes) or whole(d.snoozes, U32))
    and (optional(d.max_snoozes) or whole(d.max_snoozes, U32))
    and (optional(d.timeout_ms) or whole(d.timeout_ms, 1e15))
    and (optional(d.deadline_ms) or whole(d.deadline_ms, 1e15))
    and (optional(d.group) or type(d.group) == 'string')
    and (optional(d.tick) or (type(d.tick) == 'table' and type(d.tick.schedule) == 'string'
      and finite(d.tick.at_ms) and d.tick.at_ms % 1 == 0))
end

-- Marks the records taken, then removes the marks at once: one pass, whatever the list's
-- length. (Not JSON, so never a record bury wrote; LSET and LREM on a list cannot fail, so no
-- error follows a change.)
local MARK = '\0palisade:taken\0'
local records = redis.call('LRANGE', dead, from, from + budget - 1)
local now = now_ms()
local done, kept, read = 0, 0, 0
for i, raw in ipairs(records) do
  if done >= limit then
    break
  end
  read = i
  local left = true
  local d = dead_record(raw)
  if d and decodable(d)
    and (kind == '' or d.kind == kind)
    and (text == '' or string.find(d.reason, text, 1, true))
    and (not before or (finite(d.died) and d.died < before)) then
    if action == 'purge' or revive(base, raw, now) then
      redis.call('LSET', dead, from + i - 1, MARK)
      done = done + 1
      left = false
    else
      kept = kept + 1
    end
  end
  if left then
    anchor = raw
  end
end
if done > 0 then
  redis.call('LREM', dead, 0, MARK)
end
local next = from + read - done
if done < limit and #records < budget then
  next = -1
end
return { done, kept, read, next, anchor }
