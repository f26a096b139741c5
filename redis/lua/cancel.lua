-- cancel.lua: cancels one job. A queued job (ready, waiting its scope's turn, or delayed) goes
-- to its queue's dead letters with the reason; a running job's lease is revoked at once (its
-- renewal fails, its settlement is refused, the watermark passes its token) and the job goes
-- to the dead letters too — so nothing vanishes, and `dead retry` can bring it back.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  job id, ARGV[2] reason, ARGV[3] dead-letter records kept per queue
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  {outcome, watermark}: outcome "removed" (was queued), "revoked" (was running), or
--          "missing" (no such job: never enqueued, done, dead already); the low watermark
--          after it as "w:<epoch>:<counter>" (or "w:"), as settle.lua returns it
-- Errors   "PALISADE_CORRUPT ..." when a key it would write holds another type or a count it
--          changes is not an integer (the queue's stats, `cancelled` among them): raised
--          before anything changed
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, id, reason, keep = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local job = base .. 'job:' .. id
local f = fields(job, 'queue', 'kind', 'scope', 'lease', 'group')
local function answer(outcome)
  local w = watermark(base)
  return { outcome, w and ('w:' .. fmt(w[1]) .. ':' .. fmt(w[2])) or 'w:' }
end
if not f[1] then
  return answer('missing')
end
local queue, kind, scope, lease, group = f[1], f[2], f[3], f[4], f[5]
-- A job record keeps the id of its last lease; the lease is live only if it still names it.
local entry = lease and redis.call('HGET', base .. 'lease_job', lease)
-- Read-only first: every key it may write has its type.
local want, counted = {}, {}
settle_keys(base, want, counted, id, { queue, scope, kind, group }, false, false, true,
  entry and job_of(entry) == id and entry)
want[base .. 'q:' .. queue .. ':delayed'] = 'zset'
if kind then
  want[ready_key(base, queue, kind)] = 'zset'
  if group then
    place_keys(base, want, counted, queue, kind, group)
  end
end
local wrong = unsafe(base, want, counted)
  or uncountable(base .. 'q:' .. queue .. ':stats', { 'cancelled' })
if wrong then
  return corrupt(wrong)
end
-- Counted here, where every cancel passes, whichever process asked: the sampler exports it.
redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'cancelled', 1)
if entry and job_of(entry) == id then
  release(base, lease, id, entry)
  bury(base, id, reason, keep)
  return answer('revoked')
end
if kind then
  redis.call('ZREM', ready_key(base, queue, kind), id)
  -- A ready grouped job leaves its group's counts, and its group the rotation with its last
  -- ready job of the kind.
  if group and redis.call('ZREM', group_key(base, queue, kind, group), id) == 1 then
    if redis.call('EXISTS', group_key(base, queue, kind, group)) == 0 then
      redis.call('ZREM', rotation_key(base, queue, kind), group)
    end
    local q = base .. 'q:' .. queue
    redis.call('HINCRBY', q .. ':stats', 'grouped', -1)
    if tonumber(redis.call('ZINCRBY', q .. ':groups', 1, group)) >= 0 then
      redis.call('ZREM', q .. ':groups', group)
    end
  end
end
redis.call('ZREM', base .. 'q:' .. queue .. ':delayed', id)
if scope and redis.call('ZREM', base .. 'wait:' .. scope, id) == 1 then
  redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'waiting', -1)
end
bury(base, id, reason, keep)
return answer('removed')
