-- claim.lua: claims up to n ready jobs of one queue in one round trip.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] worker name, ARGV[3] lease ttl (ms), ARGV[4] most due delayed jobs
--          to make ready in this call, ARGV[5..] one fresh random lease id per job wanted
--          (n = #ARGV - 4)
-- Returns  one array per claim: {job id, lease id, epoch, counter, meta, attempt, stalls}
-- Errors   "PALISADE_EPOCH ..." when the counters cannot be proven intact (fresh, flushed or
--          restarted Redis, counter key lost, counter nearly exhausted): the client must move
--          to a new epoch (establish_epoch.lua) and retry. Raised before any change; no token
--          is minted before that.
local base, queue, worker, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = #ARGV - 4
local epoch = epoch_intact(base)
if not epoch then
  return redis.error_reply('PALISADE_EPOCH token counters are not proven intact')
end
local now = now_ms()

-- Due delayed jobs become ready, a bounded number per call (the rest next time), so a burst
-- of due jobs never blocks Redis for long.
local delayed = base .. 'q:' .. queue .. ':delayed'
local ready = base .. 'q:' .. queue .. ':ready'
for _, id in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))) do
  redis.call('ZREM', delayed, id)
  park(base, id, now, now)
end

-- Of a named scope only its head is ever ready (enter/leave in common.lua), so the first n
-- ready jobs are claimable however many jobs of held scopes exist. The live-lease check
-- stays as a guard for invariant 3: a job whose scope is held anyway waits aside instead of
-- getting a second live lease.
local counter = tonumber(redis.call('GET', base .. 'counter'))
local out, taken, picked, expiries, owners = {}, {}, {}, {}, {}
local head = redis.call('ZRANGE', ready, 0, n * 2 + 15, 'WITHSCORES')
for i = 1, #head, 2 do
  if #out >= n then
    break
  end
  local id, score = head[i], head[i + 1]
  local job = base .. 'job:' .. id
  local f = redis.call('HMGET', job, 'meta', 'scope', 'attempt', 'stalls')
  local scope = f[2] or ('job:' .. id)
  picked[#picked + 1] = id
  if not f[1] then
    -- a ready entry without its job: dropped
  elseif taken[scope] or (f[2] and redis.call('HEXISTS', base .. 'live', scope) == 1) then
    redis.call('ZADD', base .. 'wait:' .. scope, score, id)
    redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'waiting', 1)
  else
    taken[scope] = true
    local lease = ARGV[4 + #out + 1]
    counter = counter + 1
    local attempt = fmt(tonumber(f[3] or '0') + 1)
    redis.call('HSET', job, 'attempt', attempt, 'lease', lease)
    if f[2] then
      redis.call('HSET', base .. 'head', scope, id)
      redis.call('HSET', base .. 'live', scope, lease)
      redis.call('HSET', base .. 'last', scope, epoch .. ':' .. fmt(counter))
    end
    expiries[#expiries + 1] = now + ttl
    expiries[#expiries + 1] = lease
    owners[#owners + 1] = lease
    owners[#owners + 1] = id .. '\t' .. epoch .. '\t' .. fmt(counter) .. '\t' .. fmt(now) .. '\t' .. worker
    out[#out + 1] = { id, lease, epoch, fmt(counter), f[1], attempt, f[4] or '0' }
  end
end
if #picked > 0 then
  bulk('ZREM', ready, picked)
end
if #out > 0 then
  redis.call('SET', base .. 'counter', counter)
  bulk('ZADD', base .. 'leases', expiries)
  bulk('HSET', base .. 'lease_job', owners)
  redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'leased', #out)
end
return out
