-- retry_dead.lua: moves dead-lettered jobs back to ready with fresh attempts and stalls.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] most jobs to move (oldest first)
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  how many were moved
-- Errors   none (a record whose keys another program wrote over, or whose id names a live job
--          again, stays in the list, at its end)
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, queue = KEYS[1], ARGV[1]
local now = now_ms()
local moved = 0
for _ = 1, tonumber(ARGV[2]) do
  local raw = redis.call('LPOP', base .. 'q:' .. queue .. ':dead')
  if not raw then
    break
  end
  local ok, d = pcall(cjson.decode, raw)
  if not ok or type(d) ~= 'table' or type(d.id) ~= 'string' or type(d.queue) ~= 'string'
    or type(d.scope) ~= 'string' or type(d.kind) ~= 'string' then
    -- Not a record we wrote: keep it (at the end) rather than fail halfway or drop it.
    redis.call('RPUSH', base .. 'q:' .. queue .. ':dead', raw)
    break
  end
  local job = base .. 'job:' .. d.id
  if redis.call('EXISTS', job) == 1 then
    -- Its id names a live job again (re-enqueued with that id, NewJob::with_id): reviving it
    -- would write over that job. The record stays (at the end), unchanged.
    redis.call('RPUSH', base .. 'q:' .. queue .. ':dead', raw)
    break
  end
  local want, counted = { [job] = 'hash' }, {}
  settle_keys(base, want, counted, d.id,
    { d.queue, d.scope ~= 'job:' .. d.id and d.scope or nil, d.kind }, true, false, false)
  if unsafe(base, want, counted) then
    -- A key it would write holds another type: the record stays (at the end), unchanged.
    redis.call('RPUSH', base .. 'q:' .. queue .. ':dead', raw)
    break
  end
  local encoded, meta = pcall(cjson.encode, { kind = d.kind, payload = d.payload,
    queue = d.queue, scope = d.scope, priority = 0, max_attempts = d.max_attempts,
    max_stalls = d.max_stalls })
  if not encoded then
    -- A record cjson cannot write back (NaN or 1e999 in it): it stays (at the end).
    redis.call('RPUSH', base .. 'q:' .. queue .. ':dead', raw)
    break
  end
  redis.call('HSET', job, 'meta', meta, 'queue', d.queue, 'kind', d.kind, 'attempt', 0, 'stalls', 0)
  if d.scope ~= 'job:' .. d.id then
    redis.call('HSET', job, 'scope', d.scope)
  end
  park(base, d.id, now, now)
  moved = moved + 1
end
return moved
