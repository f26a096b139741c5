-- dead_where.lua: one bounded step of a whole-set retry or purge of a queue's dead letters:
-- reads at most ARGV[4] records from index ARGV[3] (0: the oldest) and retries or deletes
-- those the filter takes, until ARGV[5] are done.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] "retry" or "purge", ARGV[3] index to start at, ARGV[4] most records
--          to read, ARGV[5] most to retry or delete,
--          ARGV[6] kind ("": any), ARGV[7] text the reason contains ("": any),
--          ARGV[8] died before this Unix ms ("": any age)
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  {done, kept, read, next}: retried or deleted; taken by the filter but left (a retry
--          whose id names a live job again, or whose record cannot be revived); records read;
--          the index to go on from in the list as it is now, -1 once its end was read.
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
local kind, text, before = ARGV[6], ARGV[7], tonumber(ARGV[8])
local dead = base .. 'q:' .. queue .. ':dead'
if (action ~= 'retry' and action ~= 'purge') or redis.call('TYPE', dead).ok ~= 'list'
  or not from or not budget or not limit or budget < 1 then
  return { 0, 0, 0, -1 }
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
  local d = dead_record(raw)
  if d and type(d.reason) == 'string'
    and (kind == '' or d.kind == kind)
    and (text == '' or string.find(d.reason, text, 1, true))
    and (not before or (finite(d.died) and d.died < before)) then
    if action == 'purge' or revive(base, raw, now) then
      redis.call('LSET', dead, from + i - 1, MARK)
      done = done + 1
    else
      kept = kept + 1
    end
  end
end
if done > 0 then
  redis.call('LREM', dead, 0, MARK)
end
local next = from + read - done
if done < limit and #records < budget then
  next = -1
end
return { done, kept, read, next }
