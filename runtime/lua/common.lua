-- common.lua: helpers prepended to every coordinator script (not a script of its own).
--
-- Key layout, all under the base KEYS[1] = "{prefix}:" so every key of one coordinator shares a
-- hash tag (one Redis Cluster slot; scripts build the other key names from the base):
--   epoch                 hash  epoch, run (Redis run_id that epoch was proven on), floor
--   counter               string, the per-epoch token counter (token = epoch << 40 | counter)
--   seq                   string, enqueue order
--   job:<id>              hash  queue kind payload scope priority seq attempt stalls max_attempts max_stalls lease
--   q:<queue>:ready       zset  job id -> seq - priority * 2^40 (lowest first)
--   q:<queue>:delayed     zset  job id -> not-before time (ms, Redis clock)
--   q:<queue>:stats       hash  leased, completed
--   q:<queue>:dead        list  JSON dead-letter records, oldest first
--   live                  hash  scope -> lease id holding it
--   last                  hash  scope -> "epoch:counter" of the newest token granted
--   lease:<id>            hash  job scope epoch counter worker claimed (ms)
--   queues                set   every queue that has had a job
--   leases                zset  lease id -> expiry (ms, Redis clock)

local PRIORITY_SPAN = 1099511627776 -- 2^40: priority dominates enqueue order in ready scores

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%d', n)
end

-- Puts a job back where its next claim finds it: ready now, or delayed until `at`.
local function park(base, id, at, now)
  local job = base .. 'job:' .. id
  local f = redis.call('HMGET', job, 'queue', 'priority')
  local seq = redis.call('INCR', base .. 'seq')
  redis.call('HSET', job, 'seq', seq)
  if at <= now then
    redis.call('ZADD', base .. 'q:' .. f[1] .. ':ready', seq - tonumber(f[2]) * PRIORITY_SPAN, id)
  else
    redis.call('ZADD', base .. 'q:' .. f[1] .. ':delayed', at, id)
  end
end

-- Moves a job to its queue's dead-letter list with the reason, as JSON.
local function bury(base, id, reason)
  local job = base .. 'job:' .. id
  local f = redis.call('HMGET', job, 'queue', 'kind', 'payload', 'scope', 'attempt', 'stalls',
    'max_attempts', 'max_stalls')
  redis.call('RPUSH', base .. 'q:' .. f[1] .. ':dead', cjson.encode({
    id = id, queue = f[1], kind = f[2], payload = f[3], scope = f[4],
    attempt = tonumber(f[5]), stalls = tonumber(f[6]),
    max_attempts = tonumber(f[7]), max_stalls = tonumber(f[8]), reason = reason }))
  redis.call('DEL', job)
end

-- Drops a lease and its hold on the scope; returns the job's queue.
local function release(base, lease, id, scope)
  redis.call('ZREM', base .. 'leases', lease)
  redis.call('DEL', base .. 'lease:' .. lease)
  if redis.call('HGET', base .. 'live', scope) == lease then
    redis.call('HDEL', base .. 'live', scope)
  end
  local queue = redis.call('HGET', base .. 'job:' .. id, 'queue')
  if queue then
    redis.call('HDEL', base .. 'job:' .. id, 'lease')
    redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'leased', -1)
  end
  return queue
end

-- The Redis run id: it changes on every restart, even one that reloads persisted data.
local function run_id()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
end

-- Whether the token counters provably survived since the epoch was established: the epoch
-- record exists, was written by this very Redis run, and the counter is present and not
-- close to running out.
local function epoch_intact(base)
  local e = redis.call('HMGET', base .. 'epoch', 'epoch', 'run')
  local counter = redis.call('GET', base .. 'counter')
  if not e[1] or e[2] ~= run_id() or not counter then
    return nil
  end
  if tonumber(counter) > 1099511627775 - 1000000 then
    return nil
  end
  return e[1]
end

