-- release.lua: releases held flow step jobs (hold.lua) as their flow's home decided: ready
-- (after the delay kept with them), dead with a reason, or forgotten. A job that is not held
-- — released before, ended, never written — is left alone, so a release delivered twice does
-- nothing the second time (core/src/store/flows.rs).
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  count n, ARGV[2] dead-letter records kept per queue, then 3 fields per release:
--          job id, action ("run" | "fail" | "skip"), reason (for "fail")
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  the ids of the jobs left held because a key their release writes holds another type
-- Errors   none of its own after the first write: each release's keys are checked before it
--          changes anything, and one whose keys another program wrote over is skipped (said in
--          the Redis log; it stays held, and the home keeps it decided); also
--          "PALISADE_LAYOUT ..." (before anything)
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base = KEYS[1]
local now = now_ms()
local n, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local left = {}
for i = 0, n - 1 do
  local o = 2 + i * 3
  local id, action, reason = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3]
  local held = redis.pcall('ZSCORE', base .. 'held', id)
  local job = base .. 'job:' .. id
  local f = type(held) == 'string' and fields(job, 'queue', 'scope', 'kind', 'delay') or {}
  if type(held) == 'string' then
    local want, counted = {}, {}
    local delay = count_of(f[4])
    if f[1] then
      settle_keys(base, want, counted, id, { f[1], f[2], f[3] }, action == 'run',
        action == 'run' and delay > 0, action == 'fail', nil)
    end
    local wrong = unsafe(base, want, counted)
    if wrong then
      redis.log(redis.LOG_WARNING, 'palisade: flow step job ' .. id .. ' not released: ' .. wrong)
      left[#left + 1] = id
    else
      redis.call('ZREM', base .. 'held', id)
      if not f[1] then
        redis.call('DEL', job)
      elseif action == 'run' then
        redis.call('HDEL', job, 'delay')
        park(base, id, now + delay, now)
      elseif action == 'fail' then
        bury(base, id, reason, keep)
      else
        redis.call('DEL', job)
        redis.call('SET', base .. 'ended:' .. id, 'skipped', 'PX', STEP_TOMBSTONE_MS)
      end
    end
  end
end
return left
