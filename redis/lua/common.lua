-- common.lua: helpers prepended to every coordinator script (not a script of its own).
--
-- Key layout, all under the base KEYS[1] = "{prefix}:" so every key of one coordinator shares a
-- hash tag (one Redis Cluster slot; scripts build the other key names from the base):
--   epoch                 hash  epoch, run (Redis run_id that epoch was proven on), floor
--   counter               string, the per-epoch token counter (token = epoch << 40 | counter)
--   seq                   string, enqueue order
--   job:<id>              hash  meta (JSON written by the client: kind payload queue scope
--                               priority max_attempts max_stalls, decoded here only on rare
--                               paths), queue, scope (only for a named scope, which other
--                               jobs may share; a job in its default scope "job:<id>" has
--                               none and needs no turn-taking), kind, attempt, stalls, lease,
--                               error (the reason of its last retried attempt)
--   q:<queue>\t<kind>    zset  ready jobs of one kind: job id -> seq - priority * 2^40
--                               (lowest first). One set per kind, so a worker claims only
--                               kinds it has handlers for (a tab cannot occur in validated
--                               names, so the key is unambiguous). Of a named scope only its
--                               head is ever ready, so every entry is claimable.
--   q:<queue>:kinds       set   kinds that have had a ready set in the queue
--   q:<queue>:delayed     zset  job id -> not-before time (ms, Redis clock)
--   q:<queue>:stats       hash  leased, waiting, completed, cancelled (jobs cancel.lua cancelled),
--                               died (jobs ever dead-lettered), enqueued (jobs enqueue.lua
--                               ever added), stalled (stalls reap.lua ever reaped)
--   q:<queue>:dead        list  JSON dead-letter records, oldest first, trimmed to retention
--                               (id queue kind payload scope attempt stalls max_attempts
--                               max_stalls reason died: ms, Redis clock; priority, and under
--                               `kept` the meta fields `bury`'s release does not read, which
--                               `revive` puts back)
--   queues                set   every queue that has had a job
--   head                  hash  named scope -> the one job of it that may be ready or leased
--   wait:<scope>          zset  the scope's other ready jobs -> their ready score; the lowest
--                               becomes head (and ready) when the head completes, dies or is
--                               delayed, so a held scope blocks only itself
--   live                  hash  named scope -> lease id holding it
--   last                  hash  named scope -> "epoch:counter" of the newest token granted
--                               (dropped with the head when the scope goes idle)
--   leases                zset  lease id -> expiry (ms, Redis clock); and SKIPLIST -> +inf
--   tokens:<epoch>        zset  live lease id -> its token's counter, per epoch (scores stay
--                               exact: counters are below 2^40)
--   token_epochs          zset  epochs with live leases (epoch -> epoch)
--   watermark             hash  epoch, counter: the low watermark last published (only grows)
--   lease_job             hash  lease id -> "job id \t epoch \t counter \t claimed ms \t worker"
--                               and, for a named scope or a capped kind, "\t scope \t capped
--                               kind" (either may be empty): so the scope's turn and the cap's
--                               slot are given back even when the job record was written over
--                               (an entry of an earlier version has neither field)
--   result:<job id>       string the result JSON of an accepted completion (PX: retention)
--   then:<job id>         string an accepted completion's follow-up jobs (JSON), until the
--                               coordinator enqueued them
--   thens                 zset  job id -> when its follow-ups were kept (ms, Redis clock)
--   workers, workers:seen hash, zset  worker heartbeats (redis/src/lease/control.rs, not
--                               read by these scripts): name -> "ms TAB JSON", name -> expiry
--   history               list  the console's samples of the fleet's counts, newest first
-- Groups (NewJob::with_group; the rules in core/src/group.rs, which the memory store runs):
--   job:<id> field group  the job's group
--   g:<queue>\t<kind>\t<group> zset the group's ready jobs of one kind (scores as in the
--                               kind's ready set, which holds none of them)
--   r:<queue>\t<kind>     zset  the rotation: groups with ready jobs of the kind -> turn (the
--                               claim that last served it, or one past the last claim when it
--                               joined)
--   turn                  string twice the number of claims that looked at groups
--   q:<queue>:groups      zset  group -> minus its ready jobs in the queue (most first, ties
--                               by name), for the depth sampler's top groups
--   q:<queue>:stats       field grouped: the queue's ready grouped jobs
--   group:<group>         hash  running (its leased jobs), cap, jobs + per_ms (rate limit),
--                               tokens + at (its rate bucket), paused, parked (out of every
--                               rotation until it can run)
--   gparked:<group>       zset  "<queue>\t<kind>" -> the turn it had in each rotation it left
--   gwake                 zset  parked group -> when its rate bucket holds a whole token
--   glimited              zset  groups with a cap, a rate limit or a pause -> 0 (listed by name):
--                               only they have a record a claim reads
--   lease_job entry       an eighth field: the capped group its lease counts in
-- Flows (core/src/store/flows.rs). In a job's partition:
--   job:<id> field flow   "<flow id> TAB <step>" of a flow step's job (and field delay, ms)
--   held                  zset  flow step jobs written and not released -> when written
--   stepend               hash  job id -> "<flow id> TAB <step> TAB completed|dead": a flow
--                               step that ended, until its flow's home recorded it
--   stepends              zset  the same job ids -> when they ended
--   ended:<job id>        string completed | dead | skipped: a flow step's job that ended, for
--                               FLOW_RETENTION (hold.lua never writes it held again)
-- At a flow's home:
--   flow:<id>             hash  steps (count), created (ms)
--   flow:<id>:steps       hash  step -> JSON {job, scope, after: [[step, fail|skip|run]], next}
--   flow:<id>:left        hash  step -> its dependencies not ended yet
--   flow:<id>:ends        hash  step -> completed | dead | skipped (each set once)
--   flow:<id>:decided     hash  step -> run | skip | fail:<reason> (each set once)
--   flow:<id>:out         set   steps decided and not confirmed released yet
--   flows:out             zset  flow id -> when its unconfirmed releases were decided
--
-- Every argument a script passes to Redis has a cost of its own (docs/performance.md, "Memory
-- model"), so the hot paths (enqueue, claim, settle) touch few fields per job and do per-batch
-- work (token counter, sorted sets, counts) once per call.

local PRIORITY_SPAN = 1099511627776 -- 2^40: priority dominates enqueue order in ready scores

-- The format levels this build reads and writes (core/src/format.rs, `LEVELS`; a test holds
-- the two together). `palisade upgrade finalize` records an installation's level under every
-- base of its layout (`format`; absent: level 1, release 0.1.0's format), and moves of the
-- layout carry it. A process whose window leaves the level out — a release too old to read
-- the records the installation may now hold — is refused before any change by every script
-- that checks the layout generation (one GET in the same script: no extra command).
local FORMAT_LOWEST, FORMAT_HIGHEST = 1, 1

local function wrong_format(base)
  local level = redis.pcall('GET', base .. 'format')
  if level == false then
    return nil
  end
  local n = nil
  if type(level) == 'string' and string.match(level, '^%d+$') and #level <= 9 then
    n = tonumber(level)
  else
    level = '(unreadable)'
  end
  if n == nil or n < FORMAT_LOWEST or n > FORMAT_HIGHEST then
    return redis.error_reply('PALISADE_FORMAT this process reads and writes format levels '
      .. FORMAT_LOWEST .. ' to ' .. FORMAT_HIGHEST .. ', the installation is at level ' .. level
      .. ' (' .. base .. 'format; `palisade upgrade plan`): run a release that reads it;'
      .. ' nothing was changed')
  end
  return nil
end

-- The layout generation. `palisade partitions` moves an installation to another number of
-- partitions and bumps its generation, writing the new one to `layout` under every base of the
-- old layout and of the new one (absent: generation 0). A process that started before (it
-- may have been paused, so no liveness check can tell it from a dead one) still runs the old
-- generation: every script that claims, enqueues, renews, settles, reaps, cancels or retries
-- takes the caller's generation as its LAST argument and refuses to act on a base of another
-- generation — so an old-layout worker cannot run, or enqueue a schedule tick into, a layout
-- that is no longer the installation's. Checked before anything else, so nothing changes; the
-- format level (above) is checked with it.
local function wrong_layout(base)
  local mine = ARGV[#ARGV]
  local theirs = redis.pcall('GET', base .. 'layout')
  if theirs == false then
    theirs = '0'
  elseif type(theirs) ~= 'string' then
    theirs = '(unreadable)'
  end
  if theirs ~= mine then
    return redis.error_reply('PALISADE_LAYOUT this process runs layout generation ' .. tostring(mine)
      .. ' of ' .. base .. ', the installation is at generation ' .. theirs
      .. ' (moved by `palisade partitions`): restart it with the installation\'s --partitions;'
      .. ' nothing was changed')
  end
  return wrong_format(base)
end

-- A member `leases` carries, scored +inf (after every real entry, never due). Redis keeps a
-- sorted set of up to 128 members of up to 64 bytes as a listpack, where every ZADD, ZREM and
-- ZMSCORE scans the whole set: with the tens of leases a worker holds live that cost Redis
-- CPU on every claim and settlement, and it made 3 partitions cost more per job than 1
-- (each partition's sets stayed small). One member longer than 64 bytes keeps a set in its
-- hash table and skiplist for good (docs/performance.md). Lease ids are UUIDs, so it is never
-- mistaken for one, and every script reads `leases` by member or by due time only, so scripts
-- of earlier versions (a rolling deploy, a rollback) never see it either. `tokens:<epoch>`
-- does not keep it: an earlier version's watermark reads that set's lowest entry and drops
-- the set only when it is empty. claim.lua adds it there and removes it in the same call:
-- the set stays a skiplist (Redis 7 does not turn one back as members go), and no script
-- ever sees the member.
local SKIPLIST = '~palisade: a member longer than zset-max-listpack-value, so that this sorted set is never a listpack (common.lua)~'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%d', n)
end

-- A number argument for redis.call, as Redis would read it, made cheaply: Redis 7.0 turns a
-- Lua number into text with printf's "%.17g", several times the cost of "%d"
-- (benches/callgrind.sh), so a whole number a double holds exactly goes as "%d". Anything
-- else (a fraction, a huge or infinite value) goes as it is, read by Redis as before.
local function arg_of(x)
  if x == math.floor(x) and x > -9007199254740992 and x < 9007199254740992 then
    return fmt(x)
  end
  return x
end

-- A job's meta record, decoded. Written by our client, but a record another program
-- overwrote must not make a script fail halfway (Redis does not roll back): it decodes to
-- defaults that send the job to the dead letters with its raw meta as the payload.
-- (cjson decodes NaN and 1e999, which ZADD and cjson.encode then refuse: numbers must be
-- finite, and the kind a string, or a ready-set name cannot be built.)
local function finite(x)
  return type(x) == 'number' and x == x and x > -1e15 and x < 1e15
end

local function meta_of(raw)
  local ok, meta = pcall(cjson.decode, raw or '')
  if ok and type(meta) == 'table' and finite(meta.priority) and finite(meta.max_stalls)
    and finite(meta.max_attempts) and type(meta.kind) == 'string' then
    return meta, true
  end
  -- (The second value tells a record read from one made up: a field of a later release may
  -- have any name, so no field can mark this one.)
  return { kind = '', payload = raw or '', priority = 0, max_attempts = 1, max_stalls = 0 }, false
end

-- Checks a script makes before its first write (Redis does not roll a script back): every key
-- it may write has the type it needs or does not exist yet, and every number it increments is
-- an integer. A key another program wrote under our prefix then fails the call whole, naming
-- the key, with nothing changed.
local function corrupt(what)
  return redis.error_reply('PALISADE_CORRUPT ' .. what .. ': nothing was changed')
end

local COUNTS = {} -- memo's table of `unsafe`'s verdicts on counts (a key no string equals)

-- `want`: key -> the type the script needs. The complaint about the first key of another
-- type, or nil. `memo` (optional) keeps the types already asked for, so a batch that checks
-- each of its entries on its own asks Redis once per key.
local function mistyped(want, memo)
  for key, t in pairs(want) do
    local is = memo and memo[key]
    if not is then
      is = redis.call('TYPE', key).ok
      if memo then
        memo[key] = is
      end
    end
    if is ~= 'none' and is ~= t then
      return key .. ' is a ' .. is .. ', not a ' .. t
    end
  end
  return nil
end

-- Whether `v` (a reply) is absent or an integer INCRBY/HINCRBY accept and cannot overflow.
-- (Redis' own integer form only: "007", "-0" and "+1" are numbers to Lua but not to INCRBY.)
local function countable(v)
  return not v or v == '0' or (string.match(v, '^-?[1-9]%d*$') ~= nil and #v < 16)
end

-- A count field (attempt, stalls, a time in ms) as a number: a non-negative integer below
-- 10^15, anything else (absent, "nan", "inf", "1e999", "1.5", another program's text) 0.
local function count_of(v)
  if type(v) == 'string' and #v < 16 and string.find(v, '^%d+$') then
    return tonumber(v)
  end
  return 0
end

-- The complaint about the first of `fields` of hash `key` that is not countable, or nil.
local function uncountable(key, fields)
  local got = redis.call('HMGET', key, unpack(fields))
  for i, field in ipairs(fields) do
    if not countable(got[i]) then
      return key .. ' field ' .. field .. ' is not an integer'
    end
  end
  return nil
end

-- The ready set of one kind of one queue.
local function ready_key(base, queue, kind)
  return base .. 'q:' .. queue .. '\t' .. kind
end

-- A job record's fields, or none when the key holds another type (a record another program
-- wrote over is treated as gone, so one bad record never fails a whole batch).
local function fields(key, ...)
  local f = redis.pcall('HMGET', key, ...)
  if f.err then
    return {}
  end
  return f
end

-- Calls a variadic command on `args` in chunks (Lua's unpack has a stack limit).
local function bulk(command, key, args)
  for i = 1, #args, 500 do
    redis.call(command, key, unpack(args, i, math.min(i + 499, #args)))
  end
end

-- Whether string `a` sorts before `b` byte by byte, as Rust and Redis compare them (Lua's `<`
-- follows the server's locale).
local function bytes_before(a, b)
  if a == b then
    return false
  end
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

-- Field `n` (1-based) of a lease_job entry ("job id TAB epoch TAB counter TAB claimed TAB
-- worker [TAB scope TAB capped kind [TAB group]]"): the text between its tabs, maybe empty;
-- nil for an entry with fewer fields (or none). Plain finds, not patterns: a settlement reads
-- the job id, the epoch (twice) and the group of every lease it ends, and Lua's matcher walks
-- an entry character by character (a pattern for a field an entry lacks, as the group mostly
-- is, backtracks through every one before it): docs/performance-log.md has what they cost.
local function field_of(entry, n)
  if not entry then
    return nil
  end
  local at = 1
  for _ = 2, n do
    local tab = string.find(entry, '\t', at, true)
    if not tab then
      return nil
    end
    at = tab + 1
  end
  local tab = string.find(entry, '\t', at, true)
  return string.sub(entry, at, tab and tab - 1 or -1)
end

-- Field `n` of a lease_job entry when it holds something, else nil.
local function filled(entry, n)
  local field = field_of(entry, n)
  if field == '' then
    return nil
  end
  return field
end

-- The job id of a lease_job entry (the part before the first tab).
local function job_of(entry)
  return filled(entry, 1)
end

-- The epoch of a lease_job entry (its second field, maybe empty).
local function epoch_of(entry)
  return field_of(entry, 2)
end

-- job_of and epoch_of at once, the entry walked once (a settlement reads both of every
-- lease it ends), and where its second tab is (for holds_more), if it has one.
local function job_and_epoch(entry)
  if not entry then
    return nil, nil, nil
  end
  local first = string.find(entry, '\t', 1, true)
  if not first then
    return entry ~= '' and entry or nil, nil, nil
  end
  local second = string.find(entry, '\t', first + 1, true)
  return first > 1 and string.sub(entry, 1, first - 1) or nil,
    string.sub(entry, first + 1, second and second - 1 or -1), second
end

-- Whether a lease_job entry holds more than its job, token, claim time and worker: a scope,
-- a capped kind or a group (its sixth field on). `second`: its second tab's position
-- (job_and_epoch); three finds where group_of walks the whole entry.
local function holds_more(entry, second)
  local third = second and string.find(entry, '\t', second + 1, true)
  local fourth = third and string.find(entry, '\t', third + 1, true)
  return fourth ~= nil and string.find(entry, '\t', fourth + 1, true) ~= nil
end

-- The named scope of a lease_job entry (its sixth field), or nil (a default scope, or an entry
-- of an earlier version).
local function scope_of(entry)
  return filled(entry, 6)
end

-- The capped kind of a lease_job entry (its seventh field), or nil.
local function capped_of(entry)
  return filled(entry, 7)
end

-- The group of a lease_job entry (its eighth field), or nil.
local function group_of(entry)
  return filled(entry, 8)
end

-- A group's ready set of one kind, and its kind's rotation.
local function group_key(base, queue, kind, group)
  return base .. 'g:' .. queue .. '\t' .. kind .. '\t' .. group
end

local function rotation_key(base, queue, kind)
  return base .. 'r:' .. queue .. '\t' .. kind
end

-- The fields of group:<group> the rules read, in this order.
local GROUP_FIELDS = { 'running', 'cap', 'jobs', 'per_ms', 'tokens', 'at', 'paused', 'parked' }

-- A group's rate bucket as of `now` (core/src/group.rs `refill`), or nil without a rate limit: `g` is
-- its GROUP_FIELDS. (A limit another program wrote oddly is no limit; a bucket that is not
-- finite reads as full, counted from now.)
local function group_tokens(g, now)
  local jobs, per = tonumber(g[3]), tonumber(g[4])
  if not (finite(jobs) and finite(per) and jobs >= 1 and per > 0) then
    return nil
  end
  local before, at = tonumber(g[5] or g[3]), tonumber(g[6] or now)
  if not finite(before) or not finite(at) then
    before, at = jobs, now
  end
  return math.min(jobs, before + math.max(0, now - at) * jobs / per)
end

-- core/src/group.rs `room`, word for word: how many of a group's jobs a claim may take now, for a
-- lane that offers at most `share`; 0 when it must leave the rotation, with the ms until its
-- rate bucket holds a whole token (nil: until an operator or a lease's end lets it run).
local function group_room(g, share, now)
  if g[7] then
    return 0, nil
  end
  local take = share
  local cap = tonumber(g[2])
  if finite(cap) then
    local left = cap - count_of(g[1])
    if left <= 0 then
      return 0, nil
    end
    take = math.min(take, left)
  end
  local tokens = group_tokens(g, now)
  if tokens then
    local whole = math.floor(tokens)
    if whole < 1 then
      return 0, math.max(1, math.ceil((1 - tokens) * tonumber(g[4]) / tonumber(g[3])))
    end
    take = math.min(take, whole)
  end
  return take, nil
end

-- `a .. b`, made once per call: a settlement names the same few keys for every job of its
-- batch, and a concatenation makes and hashes a new string each time where two table reads
-- find the one made before (docs/performance-log.md). (`joined(joined(a, b), c)` for three.)
local joins = {}
local function joined(a, b)
  local by_a = joins[a]
  if not by_a then
    by_a = {}
    joins[a] = by_a
  end
  local key = by_a[b]
  if not key then
    key = a .. b
    by_a[b] = key
  end
  return key
end

-- The keys that making a job of `queue` and `kind` (and `group`) ready writes (its kind
-- listed, its ready set, its queue's counts; a group's set, rotation and records), added to
-- `want` and `counted` (see `settle_keys`).
local function place_keys(base, want, counted, queue, kind, group)
  local q = joined(joined(base, 'q:'), queue)
  local stats = joined(q, ':stats')
  want[q .. ':kinds'] = 'set'
  want[ready_key(base, queue, kind)] = 'zset'
  want[stats] = 'hash'
  counted[stats] = true
  if group then
    want[group_key(base, queue, kind, group)] = 'zset'
    want[rotation_key(base, queue, kind)] = 'zset'
    want[q .. ':groups'] = 'zset'
    want[base .. 'group:' .. group] = 'hash'
    want[base .. 'gparked:' .. group] = 'zset'
    want[base .. 'turn'] = 'string'
  end
end

-- What settling, reaping or cancelling a job may write, added to `want` (key -> type) and
-- `counted` (hashes whose counts it increments), for `unsafe` to check before the script's
-- first write. `f` is the job record's {queue, scope, kind, group} (queue nil: no readable record,
-- so nothing of it is written); `parks` (and `delayed`) and `buries` say where it may go;
-- `entry`, its lease's lease_job entry if it has a lease to end (its token set is written).
local function settle_keys(base, want, counted, id, f, parks, delayed, buries, entry)
  local epoch = epoch_of(entry)
  if epoch then
    want[joined(base, 'token_epochs')] = 'zset'
    want[joined(joined(base, 'tokens:'), epoch)] = 'zset'
  end
  local queue, scope, kind = f[1], f[2], f[3]
  if not queue then
    -- No readable record: nothing of the job is written, but a lease of a named scope still
    -- hands the scope's turn on (the scope comes from the lease entry), or it would wedge.
    scope, parks, delayed, buries = scope_of(entry), false, false, false
  end
  local q = queue and joined(joined(base, 'q:'), queue)
  if q then
    local stats = joined(q, ':stats')
    want[stats] = 'hash'
    counted[stats] = true
  end
  if scope then
    want[base .. 'live'] = 'hash'
    want[base .. 'head'] = 'hash'
    want[base .. 'last'] = 'hash'
    want[base .. 'wait:' .. scope] = 'zset'
    -- The scope's next job becomes ready when the turn is handed on (done, dead, delayed:
    -- leave); then its queue's keys are written. A job parked at once keeps the turn.
    local next = ((not parks) or delayed or buries) and redis.pcall('ZRANGE', base .. 'wait:' .. scope, 0, 0) or {}
    local g = type(next[1]) == 'string' and fields(base .. 'job:' .. next[1], 'queue', 'kind', 'group') or {}
    if g[1] and g[2] then
      place_keys(base, want, counted, g[1], g[2], g[3])
    end
  end
  if not q then
    return
  end
  if parks then
    want[base .. 'seq'] = 'string'
    place_keys(base, want, counted, queue,
      kind or meta_of(redis.call('HGET', base .. 'job:' .. id, 'meta')).kind, f[4])
    if delayed then
      want[q .. ':delayed'] = 'zset'
    end
  end
  if buries then
    want[q .. ':dead'] = 'list'
  end
end

-- The complaint about the first key of `want` of another type, or of a count that is not an
-- integer (the `seq` counter, the counts of the `counted` stats hashes); nil when it is safe
-- to write. `memo` as for `mistyped` (it keeps the counts' verdicts too).
local function unsafe(base, want, counted, memo)
  local wrong = mistyped(want, memo)
  if wrong then
    return wrong
  end
  local seq, turn = joined(base, 'seq'), joined(base, 'turn')
  if want[seq] and not countable(redis.call('GET', seq)) then
    return seq .. ' is not an integer'
  end
  if want[turn] and not countable(redis.call('GET', turn)) then
    return turn .. ' is not an integer'
  end
  -- (The counts' verdicts are kept in memo by the stats key's name under COUNTS.)
  local verdicts = memo and memo[COUNTS]
  if memo and not verdicts then
    verdicts = {}
    memo[COUNTS] = verdicts
  end
  for stats in pairs(counted) do
    if not wrong then
      local verdict = verdicts and verdicts[stats]
      if verdict == nil then
        verdict = uncountable(stats, { 'leased', 'waiting', 'completed', 'grouped' }) or false
        if verdicts then
          verdicts[stats] = verdict
        end
      end
      wrong = verdict or nil
    end
  end
  return wrong
end

-- `unsafe` for keys that seldom exist (those of a feature a queue does not use): one EXISTS
-- answers for them all when none does; when one does, each is checked as `unsafe` checks.
-- (No counted hashes among them.)
local function unsafe_if_any(base, want)
  local keys = {}
  for key in pairs(want) do
    keys[#keys + 1] = key
  end
  for i = 1, #keys, 500 do
    if redis.call('EXISTS', unpack(keys, i, math.min(i + 499, #keys))) > 0 then
      return unsafe(base, want, {})
    end
  end
  return nil
end

-- Grouped jobs of one queue, kind and group become ready (`entries`: score, id, ...): into
-- the group's set; the group joins the kind's rotation one turn past the last claim (or,
-- parked, the rotations it will come back to). (Callers check the keys: place_keys.)
local function ready_grouped(base, queue, kind, group, entries)
  local q = base .. 'q:' .. queue
  bulk('ZADD', group_key(base, queue, kind, group), entries)
  redis.call('ZINCRBY', q .. ':groups', -#entries / 2, group)
  redis.call('HINCRBY', q .. ':stats', 'grouped', #entries / 2)
  local turn = count_of(redis.call('GET', base .. 'turn')) + 1
  if redis.call('HEXISTS', base .. 'group:' .. group, 'parked') == 1 then
    redis.call('ZADD', base .. 'gparked:' .. group, 'NX', turn, queue .. '\t' .. kind)
  else
    redis.call('ZADD', rotation_key(base, queue, kind), 'NX', turn, group)
  end
end

-- A job becomes ready: into its queue's set for its kind (or its group's), or aside into its
-- scope's waiting set when another job holds the scope's turn (`scope` is nil for a default
-- scope: always ready). `listed` says the caller already added the kind to the queue's kinds.
local function enter(base, id, queue, kind, scope, score, listed, group)
  if scope then
    local head = redis.call('HGET', base .. 'head', scope)
    if head and head ~= id then
      redis.call('ZADD', base .. 'wait:' .. scope, score, id)
      redis.call('HINCRBY', base .. 'q:' .. queue .. ':stats', 'waiting', 1)
      return
    end
    if not head then
      redis.call('HSET', base .. 'head', scope, id)
    end
  end
  if not listed then
    redis.call('SADD', base .. 'q:' .. queue .. ':kinds', kind)
  end
  if group then
    ready_grouped(base, queue, kind, group, { score, id })
  else
    redis.call('ZADD', ready_key(base, queue, kind), score, id)
  end
end

-- Job `id` gives up its scope's turn (completed, dead or delayed): the scope's first waiting
-- job becomes head and ready, or the idle scope's head and last token go.
local function leave(base, id, scope)
  if not scope or redis.call('HGET', base .. 'head', scope) ~= id then
    return
  end
  local wait = base .. 'wait:' .. scope
  while true do
    local first = redis.call('ZRANGE', wait, 0, 0, 'WITHSCORES')
    if #first == 0 then
      redis.call('HDEL', base .. 'head', scope)
      redis.call('HDEL', base .. 'last', scope)
      return
    end
    redis.call('ZREM', wait, first[1])
    local f = fields(base .. 'job:' .. first[1], 'queue', 'kind', 'group')
    local want, counted = {}, {}
    if f[1] and f[2] then
      place_keys(base, want, counted, f[1], f[2], f[3])
    end
    -- (A waiting entry without a readable job is dropped; so is one whose queue's keys
    -- another program wrote over — it cannot be placed, and this runs after other writes —
    -- said in the Redis log. Callers check the first waiting job's keys before writing.)
    local wrong = f[1] and f[2] and unsafe(base, want, counted)
    if wrong then
      redis.log(redis.LOG_WARNING, 'palisade: waiting job ' .. first[1] .. ' of scope ' .. scope
        .. ' dropped: ' .. wrong)
    end
    if f[1] and f[2] and not wrong then
      redis.call('HSET', base .. 'head', scope, first[1])
      redis.call('HINCRBY', base .. 'q:' .. f[1] .. ':stats', 'waiting', -1)
      enter(base, first[1], f[1], f[2], nil, first[2], false, f[3])
      return
    end
  end
end

-- Puts a job back where its next claim finds it: ready now (keeping its scope's turn if it
-- has it), or delayed until `at` (giving the turn up meanwhile).
local function park(base, id, at, now)
  local job = base .. 'job:' .. id
  local f = fields(job, 'queue', 'meta', 'scope', 'kind', 'group')
  if not f[1] then
    return -- a job record that vanished (or lost its queue): nothing to park
  end
  -- 'at': when the job became claimable (the oldest-ready gauge); a requeued job keeps it.
  if at <= now then
    redis.call('HSETNX', job, 'at', at)
    local seq = redis.call('INCR', base .. 'seq')
    local meta = meta_of(f[2])
    enter(base, id, f[1], f[4] or meta.kind, f[3], seq - meta.priority * PRIORITY_SPAN, false, f[5])
  else
    leave(base, id, f[3])
    redis.call('HSET', job, 'at', at)
    redis.call('ZADD', base .. 'q:' .. f[1] .. ':delayed', at, id)
  end
end

-- A job record's attempt history ('tries'): a JSON array of [attempt, started ms (0:
-- unknown), ended ms, outcome, error], oldest first, for the job page and the records a
-- completion or a burial keeps; 'ntries' counts its entries. An attempt that ends is appended
-- (`note_try`); the history keeps the newest MAX_TRIES (JobDetails::attempts,
-- MAX_ATTEMPTS_KEPT in Rust), each error clipped to TRY_ERROR_BYTES, so a record stays small
-- whatever a handler's errors say. The attempt running now is not in it: its start is the
-- record's 'start' (claim.lua).
local MAX_TRIES, TRY_ERROR_BYTES = 32, 480

-- `s` cut to at most `n` bytes on a UTF-8 character boundary, marked with "..." (an error is a
-- Rust string: a cut inside a character would make the history unreadable).
local function clip(s, n)
  if #s <= n then
    return s
  end
  local cut = n
  while cut > 0 and string.byte(s, cut + 1) >= 0x80 and string.byte(s, cut + 1) < 0xC0 do
    cut = cut - 1
  end
  return string.sub(s, 1, cut) .. '...'
end

-- Appends the attempt of job record `job` that ended `now` with `outcome` (and `err`) to its
-- history. Its number and start come from the record. A history another program wrote (not
-- an array of ours) is left as it is: never rewritten from what cannot be read.
local function note_try(job, outcome, now, err)
  local f = fields(job, 'attempt', 'start', 'tries', 'ntries')
  local tries, n = f[3], count_of(f[4])
  if tries and (string.sub(tries, 1, 1) ~= '[' or string.sub(tries, -1) ~= ']') then
    return
  end
  local entry = '[' .. fmt(count_of(f[1])) .. ',' .. fmt(count_of(f[2])) .. ',' .. fmt(now)
    .. ',"' .. outcome .. '",' .. cjson.encode(clip(err or '', TRY_ERROR_BYTES)) .. ']'
  if not tries or tries == '[]' then
    tries, n = '[' .. entry .. ']', 1
  else
    tries, n = string.sub(tries, 1, -2) .. ',' .. entry .. ']', n + 1
  end
  if n > MAX_TRIES then
    -- The oldest go: re-read as entries (ours, so they read back), the newest kept.
    local ok, all = pcall(cjson.decode, tries)
    if not ok or type(all) ~= 'table' then
      return
    end
    local kept = {}
    for i = math.max(1, #all - MAX_TRIES + 1), #all do
      -- (pcall: an entry another program wrote that cjson cannot write back, such as a
      -- number it read as infinity, is dropped rather than failing the script halfway.)
      local fine, entry = pcall(cjson.encode, all[i])
      if fine then
        kept[#kept + 1] = entry
      end
    end
    tries, n = '[' .. table.concat(kept, ',') .. ']', #kept
  end
  redis.call('HSET', job, 'tries', tries, 'ntries', n)
end

-- The history `tries` holds, decoded, for a record that keeps it as JSON (a burial's); nil
-- for none or one that does not read as an array.
local function tries_of(tries)
  if type(tries) ~= 'string' then
    return nil
  end
  local ok, all = pcall(cjson.decode, tries)
  if not ok or type(all) ~= 'table' then
    return nil
  end
  -- Only entries of our shape, which cjson can write back (another program's, or a number
  -- read as infinity, would fail the burial's encode after its first write).
  local good = {}
  for _, e in ipairs(all) do
    if type(e) == 'table' and #e == 5 and finite(e[1]) and finite(e[2]) and finite(e[3])
        and type(e[4]) == 'string' and type(e[5]) == 'string' then
      good[#good + 1] = e
    end
  end
  if #good > 0 then
    return good
  end
  return nil
end

-- A job that is done (completed or dead) gives its unique key up: the key stays held until
-- the ttl given at enqueue ends, then goes. A key some other job holds now is left alone.
-- (`now`: the caller's clock reading, if it has one: a settlement of many jobs reads TIME
-- once, not once a job.)
local function release_unique_key(base, id, unique, unique_until, now)
  if not unique then
    return
  end
  local key = base .. 'unique:' .. unique
  -- pcall: GET fails on a key of another type (an error table here, never equal to the id),
  -- and this runs after changes.
  if redis.pcall('GET', key) ~= id then
    return
  end
  local until_ms = count_of(unique_until)
  if until_ms > (now or now_ms()) then
    -- (Our client writes the time as a plain decimal, which goes as it is; one with leading
    -- zeros, which PEXPIREAT would refuse after this script's first write, goes remade.)
    redis.call('PEXPIREAT', key, string.byte(unique_until) ~= 48 and unique_until or fmt(until_ms))
  else
    redis.call('DEL', key)
  end
end

-- `release_unique_key` for a job whose unique fields the caller has not read.
local function release_unique(base, id)
  local u = fields(base .. 'job:' .. id, 'unique', 'unique_until')
  release_unique_key(base, id, u[1], u[2])
end

-- Adds `by` to a job record's count `field` (attempt, stalls) without HINCRBY, which fails on
-- a field another program wrote over (a count that is not a number reads as 0, and none
-- goes below 0); returns the new count.
local function bump(job, field, by)
  local n = math.max(count_of(redis.call('HGET', job, field)) + by, 0)
  redis.call('HSET', job, field, n)
  return n
end

-- How long a flow step's job that ended is remembered ("ended:<id>"), so that a creation of
-- its flow done again does not write it held again: a day, core/src/flow.rs' FLOW_RETENTION.
local STEP_TOMBSTONE_MS = 86400000

-- A flow step's job ended (`tag`: its record's "flow" field, "<flow id> TAB <step>";
-- `end_`: completed or dead): kept in `stepend`/`stepends` until the flow's home recorded it
-- (core/src/store/flows.rs). Runs after other writes, so it checks its own keys' types and, if another
-- program wrote over them, says so in the Redis log instead of failing halfway.
local function note_step_end(base, id, tag, end_, added, result)
  if not tag then
    return
  end
  local record = tag .. '\t' .. end_
  if (added and added ~= '') or (result and result ~= '') then
    -- The steps its completion added (JSON, which holds no raw tab) and its result, which
    -- the flow's home keeps for as long as the flow (read last: it may hold anything).
    record = record .. '\t' .. (added or '') .. '\t' .. (result or '')
  end
  local wrong = mistyped({ [base .. 'stepend'] = 'hash', [base .. 'stepends'] = 'zset' })
  if wrong then
    redis.log(redis.LOG_WARNING, 'palisade: end of flow step job ' .. id .. ' not kept: ' .. wrong)
    return
  end
  if redis.call('HSETNX', base .. 'stepend', id, record) == 1 then
    redis.call('ZADD', base .. 'stepends', now_ms(), id)
  end
  -- (SET replaces a key of any type: it cannot fail here.)
  redis.call('SET', base .. 'ended:' .. id, end_, 'PX', STEP_TOMBSTONE_MS)
end

-- Moves a job to its queue's dead-letter list with the reason, as JSON, keeping the newest
-- `keep` records of the queue, and hands its scope's turn on.
-- A job's tick as our client writes it ({schedule = name, at_ms = integer below 10^14}), or
-- nil for anything else: a record never carries a tick cjson could not write back exactly.
local function tick_of(t)
  if type(t) == 'table' and type(t.schedule) == 'string' and finite(t.at_ms) and t.at_ms >= 0
    and t.at_ms < 1e14 and t.at_ms % 1 == 0 then
    return { schedule = t.schedule, at_ms = t.at_ms + 0 } -- (-0 as 0, as in priority_of)
  end
  return nil
end

-- A job's trace as our client writes it, or nil for anything else — the rule of
-- TraceContext::from_w3c on a stored (version 00) context, word for word (a differential test
-- runs both): traceparent "00-<32 hex>-<16 hex>-<2 hex>", lower case, neither id all zeros;
-- a tracestate of 1 to 512 printable ASCII characters in at most 32 members, else none.
local function trace_of(t)
  if type(t) ~= 'table' or type(t.traceparent) ~= 'string' then
    return nil
  end
  local trace, parent = string.match(t.traceparent, '^00%-(' .. string.rep('[0-9a-f]', 32)
    .. ')%-(' .. string.rep('[0-9a-f]', 16) .. ')%-[0-9a-f][0-9a-f]$')
  if not trace or not string.find(trace, '[1-9a-f]') or not string.find(parent, '[1-9a-f]') then
    return nil
  end
  local state = t.tracestate
  if type(state) ~= 'string' or #state == 0 or #state > 512
    or string.find(state, '[^\032-\126]') or select(2, string.gsub(state, ',', ',')) > 31 then
    state = nil
  end
  return { traceparent = t.traceparent, tracestate = state }
end

-- A whole number of a record as our client writes it (0 up to `max`), or nil: a count or a time
-- in ms another program wrote oddly is dropped, never carried on in a form cjson or the
-- client could not read back.
local function whole(x, max)
  if finite(x) and x >= 0 and x < max and x % 1 == 0 then
    return x + 0 -- (-0 as 0, as in priority_of)
  end
  return nil
end

local U32 = 4294967296 -- (exclusive bounds)
local MS = 100000000000000 -- 10^14: deadlines and timeouts are validated below it

-- The fields of a job's meta this release reads. `bury` keeps every other field in the dead
-- record's `kept` and `revive` puts them back: a job a later release enqueued with fields of
-- its own keeps them through a burial and a revival by this one (a rolling deploy runs both).
-- What cjson cannot write back as it read it is the one limit, so a field a later release
-- adds to meta holds strings, booleans, integers below 10^14 or tables of those, never an
-- empty array (cjson writes it back as {}).
local META_FIELDS = { kind = true, payload = true, queue = true, scope = true, priority = true,
  max_attempts = true, max_stalls = true, flow = true, tick = true, trace = true,
  max_snoozes = true, timeout_ms = true, deadline_ms = true, group = true }

-- The fields of `t` (a decoded meta or a dead record's `kept`) this release does not read,
-- or nil when there are none.
local function unknown_fields(t)
  local kept
  if type(t) ~= 'table' then
    return nil
  end
  for k, v in pairs(t) do
    if type(k) == 'string' and not META_FIELDS[k] then
      kept = kept or {}
      kept[k] = v
    end
  end
  return kept
end

-- A priority as Rust's i32 reads it, or 0 (a record an earlier version wrote has none).
local function priority_of(p)
  if finite(p) and p % 1 == 0 and p >= -2147483648 and p <= 2147483647 then
    return p + 0 -- (-0 as 0: cjson writes -0, which Rust reads as a float, not an i32)
  end
  return 0
end

local function bury(base, id, reason, keep)
  local job = base .. 'job:' .. id
  release_unique(base, id)
  local f = fields(job, 'meta', 'queue', 'scope', 'attempt', 'stalls', 'flow', 'snoozes', 'group',
    'tries', 'enq')
  if not f[2] then
    return -- (no readable record: callers check first)
  end
  note_step_end(base, id, f[6], 'dead')
  -- Jobs that ever died in the queue, for the console's history. Counted only where it can
  -- be (pcall): a stats hash written over must not fail the burial halfway.
  local died = redis.pcall('HGET', base .. 'q:' .. f[2] .. ':stats', 'died')
  if type(died) ~= 'table' and countable(died) then
    redis.pcall('HINCRBY', base .. 'q:' .. f[2] .. ':stats', 'died', 1)
  end
  if f[6] and redis.call('TYPE', base .. 'held').ok == 'zset' then
    redis.call('ZREM', base .. 'held', id) -- (a held step cancelled before its release)
  end
  local meta, read = meta_of(f[1])
  local dead = base .. 'q:' .. f[2] .. ':dead'
  local record = { id = id, queue = f[2], kind = meta.kind, payload = meta.payload,
    scope = f[3] or ('job:' .. id), attempt = count_of(f[4]), stalls = count_of(f[5]),
    max_attempts = meta.max_attempts, max_stalls = meta.max_stalls, reason = reason,
    died = now_ms(), tick = tick_of(meta.tick), trace = trace_of(meta.trace),
    snoozes = count_of(f[7]), max_snoozes = whole(meta.max_snoozes, U32),
    timeout_ms = whole(meta.timeout_ms, MS), deadline_ms = whole(meta.deadline_ms, MS),
    group = f[8] or nil, priority = priority_of(meta.priority),
    attempts = tries_of(f[9]), enqueued = count_of(f[10]) > 0 and count_of(f[10]) or nil,
    kept = read and unknown_fields(meta) or nil }
  local ok, json = pcall(cjson.encode, record)
  if not ok and record.kept then
    -- (Kept fields cjson cannot write back, such as a number it read as infinity: dropped,
    -- the job's own payload kept.)
    record.kept = nil
    ok, json = pcall(cjson.encode, record)
  end
  if not ok then
    -- (A payload cjson cannot write back: kept as the raw meta. The tick and trace are ones
    -- cjson can always write: tick_of, trace_of; the attempts are checked by tries_of.)
    record.payload = f[1] or ''
    json = cjson.encode(record)
  end
  redis.call('RPUSH', dead, json)
  redis.call('LTRIM', dead, -keep, -1)
  leave(base, id, f[3])
  redis.call('DEL', job)
  -- An earlier run's completed record under this id is older than this death: a lookup by
  -- id finds the newest end (the reads look for a completed record before a dead letter).
  redis.call('DEL', base .. 'done:' .. id)
  if redis.call('TYPE', base .. 'done').ok == 'zset' then
    redis.call('ZREM', base .. 'done', id)
  end
end

-- Leases of one epoch are no longer live: their tokens leave the watermark's reckoning.
local function untrack(base, epoch, leases)
  local key = base .. 'tokens:' .. epoch
  bulk('ZREM', key, leases)
  if redis.call('ZCARD', key) == 0 then
    redis.call('ZREM', base .. 'token_epochs', epoch)
  end
end

-- The low watermark (ARCHITECTURE.md §5.3): the smallest token among live leases, or the next token
-- to grant when none is live; never lower than one published before. Returns {epoch, counter}
-- (the counter may be 2^40 when the epoch is spent: the token is then the next epoch's 0).
local function compute_watermark(base)
  local first_epoch = redis.call('ZRANGE', base .. 'token_epochs', 0, 0)[1]
  local e, c
  if first_epoch then
    local first = redis.call('ZRANGE', base .. 'tokens:' .. first_epoch, 0, 0, 'WITHSCORES')
    e, c = tonumber(first_epoch), tonumber(first[2])
  else
    local cur, counter = redis.call('HGET', base .. 'epoch', 'epoch'), redis.call('GET', base .. 'counter')
    if not cur or not counter then
      return nil
    end
    e, c = tonumber(cur), (tonumber(counter) or -2) + 1
  end
  -- Only a watermark a client can read: epoch and counter whole numbers in range (a record
  -- another program wrote — inf, NaN, a fraction, out of range — gives none this time; a
  -- stored one that is not readable counts as absent).
  local function token(ep, co)
    return finite(ep) and finite(co) and ep == math.floor(ep) and co == math.floor(co)
      and ep >= 0 and ep <= 8388607 and co >= 0 and co <= 1099511627776
  end
  if not token(e, c) then
    return nil
  end
  local was = redis.call('HMGET', base .. 'watermark', 'epoch', 'counter')
  local we, wc = tonumber(was[1] or '-1'), tonumber(was[2] or '0')
  if not token(we, wc) then
    we, wc = -1, 0
  end
  if we > e or (we == e and wc >= c) then
    return { we, wc }
  end
  redis.call('HSET', base .. 'watermark', 'epoch', fmt(e), 'counter', fmt(c))
  return { e, c }
end

-- `compute_watermark`, but never an error: a record it cannot read (another program writing
-- under our prefix) means "no watermark this time" — it runs last, after the caller's changes,
-- and Redis does not roll a script back.
local function watermark(base)
  local ok, w = pcall(compute_watermark, base)
  if ok and w and w[1] and w[2] then
    return w
  end
  return nil
end

-- Drops a lease and its hold on the scope (one at a time; settle.lua does this in bulk).
-- A job counted against its kind's concurrency cap (`capped` holds the kind) stops counting.
-- Runs after writes, so nothing here may fail: a `running` of the wrong type is left alone, a
-- count that is not a number is read as 0, and no count goes below 0.
local function uncap(base, id, kind)
  if kind then
    local running = base .. 'running'
    if redis.call('TYPE', running).ok == 'hash' then
      local n = tonumber(redis.call('HGET', running, kind) or '0') or 0
      redis.call('HSET', running, kind, math.max(n - 1, 0))
    end
    local job = base .. 'job:' .. id
    if redis.call('TYPE', job).ok == 'hash' then
      redis.call('HDEL', job, 'capped')
    end
  end
end

-- A lease whose job record is gone (written over by another program) still gives up what its
-- lease entry says it holds — its named scope's turn, handed to the scope's next job, and its
-- slot under its kind's concurrency cap — so one bad record never wedges a scope or a kind.
-- (Callers check the keys with settle_keys.)
local function let_go(base, lease, id, entry)
  uncap(base, id, capped_of(entry))
  local scope = scope_of(entry)
  if not scope then
    return
  end
  if redis.call('HGET', base .. 'live', scope) == lease then
    redis.call('HDEL', base .. 'live', scope)
  end
  leave(base, id, scope)
end


-- A parked group comes back to every rotation it left, at the turn it had there, when
-- nothing holds it any more (core/src/group.rs `room` allows one job); still out of rate tokens, it is
-- woken when it has one. Runs after writes: keys of another type are left alone (and said in
-- the Redis log), so nothing here can fail.
local function unpark(base, group, now)
  local key = base .. 'group:' .. group
  local g = fields(key, unpack(GROUP_FIELDS))
  if not g[8] then
    return -- (not parked, or a record of another type)
  end
  local take, wake = group_room(g, 1, now)
  if take == 0 then
    if wake and not mistyped({ [base .. 'gwake'] = 'zset' }) then
      redis.call('ZADD', base .. 'gwake', now + wake, group)
    end
    return
  end
  local parked = base .. 'gparked:' .. group
  if redis.call('TYPE', parked).ok == 'zset' then
    local got = redis.call('ZRANGE', parked, 0, -1, 'WITHSCORES')
    for i = 1, #got, 2 do
      local queue, kind = string.match(got[i], '^([^\t]*)\t(.*)$')
      local rotation = queue and rotation_key(base, queue, kind)
      if rotation and redis.call('TYPE', group_key(base, queue, kind, group)).ok == 'zset' then
        if mistyped({ [rotation] = 'zset' }) then
          redis.log(redis.LOG_WARNING, 'palisade: group ' .. group .. ' not back in ' .. rotation
            .. ': the key holds another type')
        else
          -- (NX: a rotation the group never left, one a claim never looked at while it was
          -- parked, keeps its turn.)
          redis.call('ZADD', rotation, 'NX', got[i + 1], group)
        end
      end
    end
    redis.call('DEL', parked)
  end
  redis.call('HDEL', key, 'parked')
end

-- A lease that counted among its group's running jobs (the group in its lease_job entry)
-- ended: one fewer, and the group back in its rotations if its cap was what held it. Never
-- fails (see unpark); the count never goes below 0 and is dropped at 0.
local function unhold_group(base, entry, now)
  local group = group_of(entry)
  if not group then
    return
  end
  local key = base .. 'group:' .. group
  if redis.call('TYPE', key).ok ~= 'hash' then
    return
  end
  local running = count_of(redis.call('HGET', key, 'running')) - 1
  if running > 0 then
    redis.call('HSET', key, 'running', running)
  else
    redis.call('HDEL', key, 'running')
  end
  unpark(base, group, now)
end

local function release(base, lease, id, entry)
  unhold_group(base, entry, now_ms())
  redis.call('ZREM', base .. 'leases', lease)
  redis.call('HDEL', base .. 'lease_job', lease)
  local epoch = epoch_of(entry)
  if epoch then
    untrack(base, epoch, { lease })
  end
  local f = fields(base .. 'job:' .. id, 'queue', 'scope', 'capped')
  if f[1] then
    if f[2] and redis.call('HGET', base .. 'live', f[2]) == lease then
      redis.call('HDEL', base .. 'live', f[2])
    end
    redis.call('HINCRBY', base .. 'q:' .. f[1] .. ':stats', 'leased', -1)
    uncap(base, id, f[3])
  else
    let_go(base, lease, id, entry)
  end
  return f[1]
end


-- The Redis run id: it changes on every restart, even one that reloads persisted data.
local function run_id()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
end

-- Whether the token counters provably survived since the epoch was established: the epoch
-- record exists, was written by this very Redis run, and the counter is present and not
-- close to running out. Returns the epoch and the counter (as stored), or nil.
local function epoch_intact(base)
  local e = redis.call('HMGET', base .. 'epoch', 'epoch', 'run')
  local counter = redis.call('GET', base .. 'counter')
  -- (Both must be plain integers: a counter of "nan" passes every comparison, and an epoch
  -- that is not a number fails the claim's last ZADD, after its leases were written.)
  if not e[1] or not e[2] or not counter or not string.match(e[1], '^%d+$')
    or #e[1] > 7 or tonumber(e[1]) > 8388607 or not string.match(counter, '^%d+$') then
    return nil
  end
  -- A plain search for this run's id line, not run_id()'s pattern match: every claim runs
  -- this, and the match was a visible part of a claim's fixed cost (docs/performance-log.md).
  -- (The id is 40 hex digits followed by a line end, so a prefix of another id cannot match.)
  if not string.find(redis.call('INFO', 'server'), 'run_id:' .. e[2] .. '\r\n', 1, true) then
    return nil
  end
  if #counter > 13 or tonumber(counter) > 1099511627775 - 1000000 then
    return nil
  end
  return e[1], counter
end


-- Brings a dead-letter record `raw` back to ready with fresh attempts and stalls; false
-- (nothing changed) for a record we did not write, whose id names a live job again (reviving
-- it would write over that job), whose keys another program wrote over, or which cjson cannot
-- write back (NaN or 1e999 in it). Checks everything before its first write.
-- A dead-letter record `raw` decoded, when it reads as one bury wrote (what revive and
-- dead_where.lua take); nil for anything else.
local function dead_record(raw)
  local ok, d = pcall(cjson.decode, raw)
  if not ok or type(d) ~= 'table' or type(d.id) ~= 'string' or type(d.queue) ~= 'string'
    or type(d.scope) ~= 'string' or type(d.kind) ~= 'string' or type(d.payload) ~= 'string'
    or not string.match(d.id, '^%x+%-%x+%-%x+%-%x+%-%x+$')
    or not (finite(d.max_attempts) and d.max_attempts >= 0 and d.max_attempts % 1 == 0
      and d.max_attempts <= 4294967295)
    or not (finite(d.max_stalls) and d.max_stalls >= 0 and d.max_stalls % 1 == 0
      and d.max_stalls <= 4294967295) then
    return nil
  end
  return d
end

local function revive(base, raw, now)
  local d = dead_record(raw)
  if not d then
    -- Not a record we wrote: revived, a claim could not read it back.
    return false
  end
  local job = base .. 'job:' .. d.id
  if redis.call('EXISTS', job) == 1 then
    return false
  end
  -- (A group that is no name we would write is dropped: it could not be a key's part.)
  local group = type(d.group) == 'string' and d.group ~= '' and not string.find(d.group, '%c')
    and d.group or nil
  local want, counted = { [job] = 'hash' }, {}
  settle_keys(base, want, counted, d.id,
    { d.queue, d.scope ~= 'job:' .. d.id and d.scope or nil, d.kind, group }, true, false, false)
  if unsafe(base, want, counted) then
    return false
  end
  -- The fields this release does not read first, so that none of them can stand in for one
  -- it does.
  local fresh = unknown_fields(d.kept) or {}
  fresh.kind, fresh.payload, fresh.queue, fresh.scope = d.kind, d.payload, d.queue, d.scope
  fresh.priority, fresh.max_attempts = priority_of(d.priority), d.max_attempts + 0
  fresh.max_stalls, fresh.tick, fresh.trace = d.max_stalls + 0, tick_of(d.tick), trace_of(d.trace)
  fresh.max_snoozes, fresh.timeout_ms = whole(d.max_snoozes, U32), whole(d.timeout_ms, MS)
  fresh.group = group
  -- (Fresh attempts, stalls and snoozes, and no deadline: an operator asked for it to run.)
  local encoded, meta = pcall(cjson.encode, fresh)
  if not encoded then
    return false
  end
  redis.call('HSET', job, 'meta', meta, 'queue', d.queue, 'kind', d.kind, 'attempt', 0, 'stalls', 0,
    'enq', now)
  if d.scope ~= 'job:' .. d.id then
    redis.call('HSET', job, 'scope', d.scope)
  end
  if group then
    redis.call('HSET', job, 'group', group)
  end
  park(base, d.id, now, now)
  return true
end

-- The newest dead-letter record of job `id` among the newest `within` of list `dead`, or nil:
-- a plain search for the id as cjson writes it, confirmed by decoding, newest first and 500
-- records at a time (one click never copies a whole list of 10,000 payloads into Lua).
local function find_dead(dead, id, within)
  local needle = '"id":"' .. id .. '"'
  local step = 500
  for from = 0, within - 1, step do
    local last = math.min(from + step, within)
    local records = redis.call('LRANGE', dead, -last, -from - 1)
    for i = #records, 1, -1 do
      local raw = records[i]
      if string.find(raw, needle, 1, true) then
        local ok, d = pcall(cjson.decode, raw)
        if ok and type(d) == 'table' and d.id == id then
          return raw
        end
      end
    end
    if #records < last - from then
      return nil -- the start of the list
    end
  end
  return nil
end
