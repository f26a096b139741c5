-- hold.lua: writes flow steps' jobs held: known, never claimable until release.lua releases
-- them (core/src/store/flows.rs: written first, released last).
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  job count n, then 7 fields per job: id queue kind scope (empty: the job's default
--          scope) delay_ms meta (JSON, as enqueue.lua's) flow ("<flow id> TAB <step>")
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  the number of jobs written. A job whose id is already known is left as it is, and
--          so is one whose step already ended ("ended:<id>", kept a day): a creation done
--          again (a retried request, two producers racing) never writes a step that ran held
--          again, where a release still being delivered would run it twice.
-- Errors   "PALISADE_CORRUPT ..." when a key it would write holds another type: raised before
--          anything changed; also "PALISADE_LAYOUT ..." (before anything)
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base = KEYS[1]
local now = now_ms()
local n = tonumber(ARGV[1])
local F = 7
local want = { [base .. 'queues'] = 'set', [base .. 'held'] = 'zset' }
local wrong = mistyped(want)
if wrong then
  return corrupt(wrong)
end
local written = 0
for i = 0, n - 1 do
  local o = 1 + i * F
  local id, queue, kind, scope = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  local job = base .. 'job:' .. id
  if redis.call('EXISTS', job, base .. 'ended:' .. id) == 0 then
    if scope == '' then
      redis.call('HSET', job, 'meta', ARGV[o + 6], 'queue', queue, 'kind', kind,
        'flow', ARGV[o + 7], 'delay', ARGV[o + 5], 'enq', now)
    else
      redis.call('HSET', job, 'meta', ARGV[o + 6], 'queue', queue, 'kind', kind,
        'scope', scope, 'flow', ARGV[o + 7], 'delay', ARGV[o + 5], 'enq', now)
    end
    redis.call('ZADD', base .. 'held', now, id)
    redis.call('SADD', base .. 'queues', queue)
    written = written + 1
  end
end
return written
