-- settle.lua: completes, retries, dead-letters or reseeds finished jobs, each checked by lease.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  count, then 4 fields per settlement: lease id, action, arg, reason
--          action "complete" | "retry" (arg = delay ms) | "dead" | "fenced" (arg = the epoch
--          of the highest token the sink reported)
-- Returns  one entry per settlement: "ok", "stale" (lease not current: nothing changed), or
--          "reseeded:<epoch>" (a fenced settlement moved the coordinator to that epoch)
-- Errors   none
local base = KEYS[1]
local now = now_ms()
local out = {}
for i = 0, tonumber(ARGV[1]) - 1 do
  local o = 1 + i * 4
  local lease, action, arg, reason = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], ARGV[o + 4]
  local expiry = redis.call('ZSCORE', base .. 'leases', lease)
  local info = redis.call('HMGET', base .. 'lease:' .. lease, 'job', 'scope')
  if not expiry or tonumber(expiry) <= now or not info[1] then
    out[#out + 1] = 'stale'
  else
    local id = info[1]
    local queue = release(base, lease, id, info[2])
    local result = 'ok'
    if not queue then
      result = 'ok' -- the job record is gone; nothing left to settle
    elseif action == 'complete' then
      redis.call('DEL', base .. 'job:' .. id)
      redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'completed', 1)
    elseif action == 'retry' then
      park(base, id, now + tonumber(arg), now)
    elseif action == 'dead' then
      bury(base, id, reason)
    else
      -- A sink holds a token at least as new as this current lease's: the counter regressed.
      -- Move above the sink's epoch now, remember it as a floor for later recoveries, and
      -- run the job again under a fresh token.
      local floor = tonumber(arg) + 1
      local e = redis.call('HMGET', base .. 'epoch', 'epoch', 'floor')
      local cur = tonumber(e[1] or '0')
      if cur < floor then
        redis.call('HSET', base .. 'epoch', 'epoch', floor)
        redis.call('SET', base .. 'counter', 0)
        cur = floor
      end
      if tonumber(e[2] or '0') < floor then
        redis.call('HSET', base .. 'epoch', 'floor', floor)
      end
      park(base, id, now, now)
      result = 'reseeded:' .. fmt(cur)
    end
    out[#out + 1] = result
  end
end
return out
