-- dead_job.lua: retries or deletes one dead-lettered job, found by its id.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] job id, ARGV[3] "retry" or "purge", ARGV[4] how many of the newest
--          records to search
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  1 if done, 0 if nothing changed: no record of the job among the newest ARGV[4]
--          dead letters of the queue, an unknown action, or (retry) the record cannot be
--          revived (see `revive` in common.lua). Of two records of one id (a job enqueued
--          again with its id that died again) the newest is the one acted on.
-- Errors   none but "PALISADE_LAYOUT ..." (before anything) for a caller of another layout
--          generation. A dead list of another type reads as empty.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, queue, id, action = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local dead = base .. 'q:' .. queue .. ':dead'
if (action ~= 'retry' and action ~= 'purge') or redis.call('TYPE', dead).ok ~= 'list' then
  return 0
end
local raw = find_dead(dead, id, tonumber(ARGV[4]))
if not raw then
  return 0
end
if action == 'retry' and not revive(base, raw, now_ms()) then
  return 0
end
-- (Revived first, then removed: LREM on a list cannot fail, so no error follows a change.
-- From the tail: the newest copy, should two records be byte for byte the same.)
redis.call('LREM', dead, -1, raw)
return 1
