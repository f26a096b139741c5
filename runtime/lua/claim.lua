-- claim.lua: claims up to n ready jobs of one queue in one round trip.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] worker name, ARGV[3] lease ttl (ms),
-- ARGV[4..] one fresh random lease id per job wanted (n = #ARGV - 3)
-- Returns  one array per claim:
--          {job id, lease id, epoch, counter, scope, kind, payload, attempt, stalls,
--           max_attempts, max_stalls}
-- Errors   "PALISADE_EPOCH ..." when the counters cannot be proven intact (fresh, flushed or
--          restarted Redis, counter key lost, counter nearly exhausted): the client must move
--          to a new epoch (establish_epoch.lua) and retry. No token is minted before that.
local base, queue, worker, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = #ARGV - 3
local epoch = epoch_intact(base)
if not epoch then
  return redis.error_reply('PALISADE_EPOCH token counters are not proven intact')
end
local now = now_ms()

-- Promote due delayed jobs.
local delayed = base .. 'q:' .. queue .. ':delayed'
local ready = base .. 'q:' .. queue .. ':ready'
for _, id in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', delayed, id)
  park(base, id, now, now)
end

-- Jobs whose scope has a live lease are skipped, so look a little past n.
local out, taken = {}, {}
for _, id in ipairs(redis.call('ZRANGE', ready, 0, n * 4 + 63)) do
  if #out >= n then
    break
  end
  local job = base .. 'job:' .. id
  local scope = redis.call('HGET', job, 'scope')
  if not scope then
    redis.call('ZREM', ready, id) -- a ready entry without its job: drop it
  elseif not taken[scope] and redis.call('HEXISTS', base .. 'live', scope) == 0 then
    taken[scope] = true
    local lease = ARGV[3 + #out + 1]
    local counter = redis.call('INCR', base .. 'counter')
    redis.call('ZREM', ready, id)
    local attempt = redis.call('HINCRBY', job, 'attempt', 1)
    redis.call('HSET', job, 'lease', lease)
    redis.call('HSET', base .. 'live', scope, lease)
    redis.call('HSET', base .. 'last', scope, epoch .. ':' .. fmt(counter))
    redis.call('HSET', base .. 'lease:' .. lease, 'job', id, 'scope', scope, 'epoch', epoch,
      'counter', counter, 'worker', worker, 'claimed', now)
    redis.call('ZADD', base .. 'leases', now + ttl, lease)
    redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'leased', 1)
    local f = redis.call('HMGET', job, 'kind', 'payload', 'stalls', 'max_attempts', 'max_stalls')
    out[#out + 1] = { id, lease, epoch, fmt(counter), scope, f[1], f[2], fmt(attempt), f[3], f[4], f[5] }
  end
end
return out
