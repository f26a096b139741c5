-- establish_epoch.lua: moves the coordinator to a new epoch when its counters are unproven.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  candidate epoch from the durable epoch source, or 0 without one
-- Returns  {epoch now in force, "1" if this call moved it else "0", "1" if there was no
--          epoch record at all (a first start — or a Redis that lost everything)}
-- Errors   "PALISADE_EPOCH_EXHAUSTED" past the largest epoch (2^23 - 1)
--
-- If another client already re-established the epoch on this Redis run, it is left alone,
-- so many workers noticing the same loss move it once, not once each.
local base = KEYS[1]
local intact = epoch_intact(base)
if intact then
  return { intact, '0', '0' }
end
local e = redis.call('HMGET', base .. 'epoch', 'epoch', 'floor')
-- (An epoch or floor another program wrote that is not a plain integer: which epochs were
-- used is unknown, so nothing is moved; an operator must set it above every epoch used.)
for i = 1, 2 do
  if e[i] and (not string.match(e[i], '^%d+$') or #e[i] > 7) then
    return redis.error_reply('PALISADE_CORRUPT ' .. base .. 'epoch holds ' .. e[i]
      .. ': not an epoch; nothing was changed')
  end
end
local epoch = math.max(tonumber(e[1] or '0') + 1, tonumber(e[2] or '0'), tonumber(ARGV[1]))
if epoch > 8388607 then
  return redis.error_reply('PALISADE_EPOCH_EXHAUSTED no epoch left')
end
redis.call('HSET', base .. 'epoch', 'epoch', epoch, 'run', run_id(), 'floor', epoch)
redis.call('SET', base .. 'counter', 0)
return { fmt(epoch), '1', e[1] and '0' or '1' }
