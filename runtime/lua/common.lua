-- common.lua: helpers prepended to every coordinator script (not a script of its own).
--
-- Key layout, all under the base KEYS[1] = "{prefix}:" so every key of one coordinator shares a
-- hash tag (one Redis Cluster slot; scripts build the other key names from the base):
--   epoch                 hash  epoch, run (Redis run_id that epoch was proven on), floor
--   counter               string, the per-epoch token counter (token = epoch << 40 | counter)
--   seq                   string, enqueue order
--   job:<id>              hash  meta (JSON written by the client: kind payload queue scope
--                               priority max_attempts max_stalls, decoded here only on rare
--                               paths), queue, scope (only when shared with other jobs; a job
--                               scoped to its own id has none, and needs no scope lock),
--                               attempt, stalls, lease (while leased)
--   q:<queue>:ready       zset  job id -> seq - priority * 2^40 (lowest first)
--   q:<queue>:delayed     zset  job id -> not-before time (ms, Redis clock)
--   q:<queue>:stats       hash  leased, completed
--   q:<queue>:dead        list  JSON dead-letter records, oldest first
--   queues                set   every queue that has had a job
--   live                  hash  shared scope -> lease id holding it
--   last                  hash  shared scope -> "epoch:counter" of the newest token granted
--   leases                zset  lease id -> expiry (ms, Redis clock)
--   lease_job             hash  lease id -> "job id \t epoch \t counter \t claimed ms \t worker"
--
-- Every argument a script passes to Redis costs about a microsecond, so the hot paths (enqueue,
-- claim, settle) touch few fields per job and do per-batch work (token counter, sorted sets,
-- counts) once per call.

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
  local f = redis.call('HMGET', job, 'queue', 'meta')
  if at <= now then
    local seq = redis.call('INCR', base .. 'seq')
    local priority = cjson.decode(f[2]).priority
    redis.call('ZADD', base .. 'q:' .. f[1] .. ':ready', seq - priority * PRIORITY_SPAN, id)
  else
    redis.call('ZADD', base .. 'q:' .. f[1] .. ':delayed', at, id)
  end
end

-- The job id of a lease_job entry (the part before the first tab).
local function job_of(entry)
  return entry and string.match(entry, '^[^\t]+')
end

-- Moves a job to its queue's dead-letter list with the reason, as JSON.
local function bury(base, id, reason)
  local job = base .. 'job:' .. id
  local f = redis.call('HMGET', job, 'meta', 'queue', 'scope', 'attempt', 'stalls')
  local meta = cjson.decode(f[1])
  redis.call('RPUSH', base .. 'q:' .. f[2] .. ':dead', cjson.encode({
    id = id, queue = f[2], kind = meta.kind, payload = meta.payload, scope = f[3] or id,
    attempt = tonumber(f[4] or '0'), stalls = tonumber(f[5] or '0'),
    max_attempts = meta.max_attempts, max_stalls = meta.max_stalls, reason = reason }))
  redis.call('DEL', job)
end

-- Drops a lease and its hold on the scope (one at a time; settle.lua does this in bulk).
local function release(base, lease, id)
  redis.call('ZREM', base .. 'leases', lease)
  redis.call('HDEL', base .. 'lease_job', lease)
  local f = redis.call('HMGET', base .. 'job:' .. id, 'queue', 'scope')
  if f[1] then
    if f[2] and redis.call('HGET', base .. 'live', f[2]) == lease then
      redis.call('HDEL', base .. 'live', f[2])
    end
    redis.call('HINCRBY', base .. 'q:' .. f[1] .. ':stats', 'leased', -1)
  end
  return f[1]
end

-- Calls a variadic command on `args` in chunks (Lua's unpack has a stack limit).
local function bulk(command, key, args)
  for i = 1, #args, 500 do
    redis.call(command, key, unpack(args, i, math.min(i + 499, #args)))
  end
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

