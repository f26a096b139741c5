-- fenced_write.lua: the admission rule (ARCHITECTURE.md §4) and the mutation, one atomic step per
-- write, for a batch of writes that arrived together (group commit: one round trip for many
-- handlers' writes). Each write is decided and applied on its own, exactly as if sent alone:
-- one write's refusal, bad mutation or error does not affect the others.
-- KEYS     the first slot's (the only one's but on a Redis Cluster):
-- KEYS[1]  the sink's low watermark: a string, the largest coordinator watermark seen (20-digit
--          zero-padded token; every lease below it is no longer current)
-- KEYS[2]  the sink's collection queue: a zset, score 0, members "padded token TAB scope" in
--          lexicographic (= token) order, one per fence set
-- KEYS[3..] two per write: the scope's fence, a string "token TAB lease" (token as a 20-digit
--          zero-padded decimal), and the scope's idempotency zset (keys of applied writes ->
--          apply time ms, kept across generations, bounded by retention time and count)
-- ARGV[1]  key retention (ms), ARGV[2] most keys kept per scope, ARGV[3] data key prefix,
-- ARGV[4]  fence key prefix (a swept scope's fence is ARGV[4] .. "{" .. scope .. "}:fence"),
-- ARGV[5]  the watermark the client last heard from the coordinator (padded), ARGV[6] most
--          fences to collect in this call (in each slot),
-- ARGV[7]  S, the slots of this call (1 but on a Redis Cluster, where one call may carry
--          every slot of one master: see the end of this script), ARGV[8..7+S] each slot's
--          count of writes, then the keys of slots 2..S (laid out as KEYS is for slot 1: its
--          watermark, its queue, two per write), then
-- ARGV[..] four per write, slot by slot: presented token (20-digit zero-padded, so string order is
--          numeric order and Lua's doubles never see it), presented lease id, idempotency key,
--          mutations as JSON: a list of {"S", key, value} | {"H", key, {field, value, ...}} |
--          {"I", key, field, by} with `by` a decimal string (never a Lua number) |
--          {"D", key} (removed, whatever it holds); or
--          {"refuse": why}, a write the client already found unfit for its content (on
--          Redis Cluster, a key outside the scope's slot, which this script may not touch):
--          decided for ownership here and refused as "mutation" with that reason
-- First the watermark is raised to ARGV[5] if higher, and at most ARGV[6] fences below it are
-- forgotten (safe: every write they would refuse is below the watermark; keys are kept —
-- core/src/admission.rs has the proof). Then each write is decided; a token below the
-- watermark is stale even where no fence is kept.
-- Returns  one array per write, slot by slot: {"elsewhere"} (not on this node; nothing of
--          it read or changed) | {"applied"} | {"duplicate"} | {"stale", highest, its lease} |
--          {"conflict", token, lease holding it} | {"mutation", why} (the mutation list does
--          not fit: no data changed and no key was recorded, but the write passed the
--          ownership checks, so the fence advanced to its token if that is higher — a
--          refused writer still proves every older lease stale, core/src/admission.rs) |
--          {"error", why} (this write's own keys or arguments are unusable, a malformed
--          mutation list included: a client bug, not a decision; nothing changed) |
--          {"moving", why} (on a Redis Cluster, a data key of this write is on another node
--          already, its slot being moved: not decided, nothing of it changed; try again)
-- Errors   none of its own: every check runs before the first change, because Redis does
--          not roll a script back (a single hash mutation is checked by Redis itself as the
--          one command that applies it, which changes nothing when it refuses). The one error
--          raised is the server's refusal of the script's first write (OOM, READONLY,
--          MISCONF), which Redis makes only before a script changed anything. The rule is the one in
--          core/src/mutation.rs; messages match it word for word (the differential test
--          compares them).
local retention, most, prefix, fences = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The numbers every write passes to Redis, as decimals made once per call: Redis 7.0 turns a
-- Lua number argument into text with printf's "%.17g", a float conversion that cost about as
-- much as a command of its own per argument (benches/callgrind.sh).
local NOW, CUTOFF, RETENTION = string.format('%d', now), string.format('%d', now - retention),
  string.format('%d', retention)

-- Redis keeps a sorted set of up to 128 members of up to 64 bytes as a listpack, where every
-- insert scans the whole set; the collection queue holds the fences of the leases still
-- current, tens to hundreds on one server. A member longer than 64 bytes turns a set into a
-- skiplist, and Redis 7 does not turn it back as members go (loading it again — a restart, a
-- replica's full sync, a reshard — does; the next long call turns it once more): so a call
-- that finds the queue long adds SKIPLIST with its first fence and removes it before it
-- returns. It is never seen outside this script, by this version or another. A short queue (a Redis
-- Cluster slot's, a quiet sink's) stays a listpack: ten times smaller, and cheap to scan.
local SKIPLIST = '~palisade: a member longer than zset-max-listpack-value, so that this sorted set is never a listpack (fenced_write.lua)~'
local MARK_AT = 32 -- queued fences from which a call makes the queue a skiplist

-- Exact signed 64-bit integers without 64-bit arithmetic: a value is {high, low} with
-- value = high * 10^9 + low, both parts carrying the sign, each exact in a double.
local BILLION = 1000000000
local MAX_HIGH, MAX_LOW, MIN_LOW = 9223372036, 854775807, -854775808

-- Redis' string2ll: "0", or an optional '-', a digit 1-9, then digits, within int64. Told
-- without making the value: well_formed asks it of every increment, and the captures,
-- substrings and numbers of making it were instructions every write spent for nothing
-- (docs/performance-log.md).
local function is_int64(s)
  if s == '0' then
    return true
  end
  if not string.find(s, '^%-?[1-9]%d*$') then
    return false
  end
  local negative = string.byte(s) == 45 -- '-'
  local digits = #s - (negative and 1 or 0)
  if digits ~= 19 then
    return digits < 19
  end
  return not (string.sub(s, -19) > (negative and '9223372036854775808' or '9223372036854775807'))
end

-- The value of `s` as {high, low} (see above), or nil when is_int64 refuses it.
local function int64(s)
  if not is_int64(s) then
    return nil
  end
  local k = string.byte(s) == 45 and -1 or 1
  local digits = k < 0 and string.sub(s, 2) or s
  return { k * (tonumber(string.sub(digits, 1, -10)) or 0), k * tonumber(string.sub(digits, -9)) }
end

-- a + b, or nil when the sum leaves int64.
local function add(a, b)
  local high, low = a[1] + b[1], a[2] + b[2]
  if low >= BILLION then
    high, low = high + 1, low - BILLION
  elseif low <= -BILLION then
    high, low = high - 1, low + BILLION
  end
  if high > 0 and low < 0 then
    high, low = high - 1, low + BILLION
  elseif high < 0 and low > 0 then
    high, low = high + 1, low - BILLION
  end
  if high > MAX_HIGH or (high == MAX_HIGH and low > MAX_LOW)
    or high < -MAX_HIGH or (high == -MAX_HIGH and low < MIN_LOW) then
    return nil
  end
  return { high, low }
end

local function decimal(v)
  if v[1] == 0 then
    return string.format('%d', v[2])
  end
  return string.format('%d%09d', v[1], math.abs(v[2]))
end

-- A data key is not among the script's declared keys (they are the scope's records), so on a
-- Redis Cluster whose slot is being moved it may already be on the other node, where Redis
-- refuses to reach it with an error; a raised one would end the script after the writes
-- before this one had changed things. So the reads that meet a data key first are guarded,
-- and such a refusal makes this write NOT_HERE: not decided, nothing of it changed, the
-- client to try it again (the slot's new node serves it once the move is done).
local NOT_HERE = {}
local MOVING = { 'moving', 'a key of this write is on another node now (its slot is being moved)' }

-- Checks the whole list against the stored data and its own earlier steps; returns why not,
-- or nil when every step fits, or NOT_HERE when a data key is on another node (above).
-- `kinds` and `fields` hold the staged effect of earlier steps.
local function check(mutations)
  -- `gone`: keys an earlier Delete of the list removed (their stored fields no longer count).
  local kinds, fields, gone = {}, {}, {}
  for i, m in ipairs(mutations) do
    local op, key = m[1], m[2]
    local data = prefix .. key
    local want = op == 'S' and 'string' or 'hash'
    if not kinds[key] then
      local kind = redis.pcall('TYPE', data)
      if kind.err then
        return NOT_HERE
      end
      kinds[key] = kind.ok
      fields[key] = {}
    end
    if op == 'D' then
      kinds[key], fields[key], gone[key] = 'none', {}, true
      want = 'none'
    end
    local have = kinds[key]
    if have ~= 'none' and have ~= want then
      return 'mutation ' .. (i - 1) .. ': ' .. key .. ' holds a ' .. have .. ', not a ' .. want
    end
    kinds[key] = want
    if op == 'H' then
      if #m[3] == 0 then
        return 'mutation ' .. (i - 1) .. ': HashSet of ' .. key .. ' has no fields'
      end
      for j = 1, #m[3], 2 do
        fields[key][m[3][j]] = m[3][j + 1]
      end
    elseif op == 'I' then
      local field = m[3]
      local current = fields[key][field]
      if current == nil and have == 'hash' and not gone[key] then
        current = redis.pcall('HGET', data, field)
        if type(current) == 'table' then
          return NOT_HERE
        end
      end
      local value = { 0, 0 }
      if current then
        value = int64(current)
        if not value then
          return 'mutation ' .. (i - 1) .. ': ' .. key .. '.' .. field .. ' is not an integer'
        end
      end
      local sum = add(value, int64(m[4]))
      if not sum then
        return 'mutation ' .. (i - 1) .. ': ' .. key .. '.' .. field .. ' = ' .. decimal(value)
          .. ' + ' .. m[4] .. ' overflows i64'
      end
      fields[key][field] = decimal(sum)
    elseif op == 'S' then
      fields[key] = {}
    end
  end
end

local function apply(m)
  local data = prefix .. m[2]
  if m[1] == 'D' then
    redis.call('DEL', data)
  elseif m[1] == 'S' then
    redis.call('SET', data, m[3])
  elseif m[1] == 'H' then
    for j = 1, #m[3], 1000 do
      redis.call('HSET', data, unpack(m[3], j, math.min(j + 999, #m[3])))
    end
  else
    redis.call('HINCRBY', data, m[3], m[4])
  end
end

-- Checks what the client sent, so a malformed list is this write's error, not a script
-- error that would stop the writes after it.
local function well_formed(mutations)
  if type(mutations) ~= 'table' then
    return false
  end
  for _, m in ipairs(mutations) do
    if type(m) ~= 'table' or type(m[2]) ~= 'string' then
      return false
    end
    local op = m[1]
    if op == 'S' then
      if type(m[3]) ~= 'string' then return false end
    elseif op == 'H' then
      if type(m[3]) ~= 'table' or #m[3] % 2 ~= 0 then return false end
      for _, s in ipairs(m[3]) do
        if type(s) ~= 'string' then return false end
      end
    elseif op == 'I' then
      if type(m[3]) ~= 'string' or type(m[4]) ~= 'string' or not is_int64(m[4]) then
        return false
      end
    elseif op ~= 'D' then
      return false
    end
  end
  return true
end

-- A list of one HashIncr, or of one HashSet of at most 1000 fields (one HSET): what Redis
-- refuses as a whole, for the reasons check() gives.
local function single_hash(mutations)
  local m = mutations[1]
  return #mutations == 1
    and (m[1] == 'I' or (m[1] == 'H' and #m[3] >= 2 and #m[3] <= 2000))
end

-- The slot being written (run_slot, below, sets these for each slot of the call): its queue,
-- its watermark, whether that record is corrupt, whether it collects (and how many fences
-- its queue holds), and whether this call made its queue a skiplist.
local QUEUE, watermark, corrupt, collecting, queued, skiplisted

-- The scope a fence key belongs to (fence keys are ARGV[4] .. "{" .. scope .. "}:fence").
local function scope_of(fence)
  return string.sub(fence, #fences + 2, -8)
end

-- Remembers to look at this fence once the watermark passes its token. (In a long queue the
-- call's first one brings SKIPLIST along, removed after the slot's last write.)
local function queue_for_collection(fence, token)
  if not collecting then
    return
  end
  -- (Guarded: on a Redis Cluster slot being moved, a queue this call's collection emptied,
  -- and so removed, is looked for on the other node; that fence then stays uncollected
  -- rather than the script failing after the write's changes.)
  local added
  if skiplisted or queued < MARK_AT then
    added = redis.pcall('ZADD', QUEUE, '0', token .. '\t' .. scope_of(fence))
  else
    added = redis.pcall('ZADD', QUEUE, '0', token .. '\t' .. scope_of(fence), '0', SKIPLIST)
    skiplisted = type(added) == 'number'
  end
  if type(added) == 'number' then
    queued = queued + 1
  end
end

local function write(fence, keys, token, lease, key, encoded)
  if corrupt then
    return { 'error', "the sink's watermark record is corrupt; refusing to write until it is repaired" }
  end
  -- Reads first, each guarded: a fence or key record of the wrong type (another program
  -- writing under our prefix) fails this write alone, before anything changed.
  -- (ZCARD first: it answers 0 for a scope without keys, as every default scope's one write
  -- finds, and then the key need not be looked up, nor the set counted after the ZADD.)
  local held = redis.pcall('GET', fence)
  local kept = redis.pcall('ZCARD', keys)
  local refused = type(held) == 'table' and held.err or type(kept) == 'table' and kept.err
  if refused then
    -- (Or, on a Redis Cluster slot being moved, a record this call's collection or an
    -- earlier write of the scope just removed, which Redis then looks for on the other node.)
    if string.find(refused, 'WRONGTYPE', 1, true) then
      return { 'error', 'the fence or key record of this scope holds the wrong type' }
    end
    return MOVING
  end
  local seen = kept > 0 and redis.call('ZSCORE', keys, key)
  local h = {}
  if held then
    h[1], h[2] = string.match(held, '^(%d+)\t(.*)$')
    if not h[1] or #h[1] ~= 20 then
      return { 'error', 'the fence record of this scope is corrupt' }
    end
  end
  if #token ~= 20 or not string.find(token, '^%d+$') then
    return { 'error', 'the presented token is not a 20-digit decimal' }
  end
  if token < watermark then
    return { 'stale', watermark, '' }
  end
  if h[1] then
    if token < h[1] then
      return { 'stale', h[1], h[2] }
    end
    if token == h[1] and lease ~= h[2] then
      return { 'conflict', h[1], h[2] }
    end
  end
  local advance = not h[1] or token > h[1]
  if seen then
    -- Still fence in the newer generation, so every older one is refused from now on.
    if advance then
      redis.call('SET', fence, token .. '\t' .. lease)
      queue_for_collection(fence, token)
    end
    return { 'duplicate' }
  end
  local ok, mutations = pcall(cjson.decode, encoded)
  local why
  -- Checked here, or (a single hash mutation) by Redis as it is applied, below.
  local checked = true
  if ok and type(mutations) == 'table' and type(mutations.refuse) == 'string' then
    why = mutations.refuse
  elseif not ok or not well_formed(mutations) then
    return { 'error', 'the mutation list is malformed' }
  elseif single_hash(mutations) then
    checked = false
  else
    why = check(mutations)
  end
  if why == nil and not checked then
    -- One hash mutation, the common write: Redis checks it as check() would (the same
    -- string2ll, overflow and type rules) and refuses it whole, so it is tried first and
    -- explained only when refused — two reads fewer per write.
    local m = mutations[1]
    local done
    if m[1] == 'I' then
      done = redis.pcall('HINCRBY', prefix .. m[2], m[3], m[4])
    else
      done = redis.pcall('HSET', prefix .. m[2], unpack(m[3]))
    end
    if type(done) == 'table' and done.err then
      why = check(mutations)
      if not why then
        -- Not this write's content: the server refuses writes now (OOM, READONLY on a
        -- demoted master, MISCONF). It refuses only a script's first write, so nothing has
        -- changed: raise it as it is, for the client to retry or reconnect as for any call.
        error(done)
      end
    end
  end
  if why == NOT_HERE then
    return MOVING
  end
  if why then
    -- Refused for its content, after the ownership checks passed: no data, no key, but the
    -- fence moves up to this token (strictly), so an older holder cannot write after it.
    if advance then
      redis.call('SET', fence, token .. '\t' .. lease)
      queue_for_collection(fence, token)
    end
    return { 'mutation', why }
  end
  if checked then
    for _, m in ipairs(mutations) do
      apply(m)
    end
  end
  if advance then
    redis.call('SET', fence, token .. '\t' .. lease)
    queue_for_collection(fence, token)
  end
  redis.call('ZADD', keys, NOW, key)
  kept = kept + 1 -- (the key was not in the set)
  -- A set of one was created just now (a scope's first write, every default scope's only
  -- one): nothing in it is past retention or over the count.
  if kept > 1 then
    redis.call('ZREMRANGEBYSCORE', keys, '-inf', CUTOFF)
    if kept > most then
      redis.call('ZREMRANGEBYRANK', keys, 0, -(most + 1))
    end
  end
  redis.call('PEXPIRE', keys, RETENTION)
  return { 'applied' }
end

-- One slot's writes, appended to `out`: its watermark and collection queue are keys[at + 1]
-- and keys[at + 2], its writes' fences and key records the n pairs after them, their
-- arguments four each from ARGV[arg + 1].
local function run_slot(keys, at, n, arg, out)
  local WATERMARK = keys[at + 1]
  QUEUE = keys[at + 2]
  skiplisted = false
  -- The watermark only grows. A stored one that is corrupt fails every write of the call
  -- closed (fences below it may have been forgotten: treating it as 0 would let their stale
  -- holders in); a missing one is a fresh sink's 0.
  watermark = redis.pcall('GET', WATERMARK)
  corrupt = false
  if watermark == false then
    watermark = '00000000000000000000'
  elseif type(watermark) ~= 'string' or not string.match(watermark, '^%d+$') or #watermark ~= 20 then
    corrupt = true
    watermark = '99999999999999999999'
  end
  if not corrupt and string.match(ARGV[5], '^%d+$') and #ARGV[5] == 20 and ARGV[5] > watermark then
    watermark = ARGV[5]
    redis.call('SET', WATERMARK, watermark)
  end

  -- Bounded collection: fences whose token is below the watermark. (A queue key of the wrong
  -- type — another program under our prefix — disables collection, never the writes.)
  -- (One read tells both: ZCARD counts a sorted set, answers 0 for none, and fails — here an
  -- error table — on another type.)
  queued = redis.pcall('ZCARD', QUEUE)
  collecting = type(queued) == 'number'
  if not collecting then
    queued = 0
  end
  local due = {}
  if collecting and not corrupt then
    due = redis.call('ZRANGEBYLEX', QUEUE, '-', '(' .. watermark, 'LIMIT', 0, tonumber(ARGV[6]))
  end
  if #due > 0 then
    -- Their fences, read with one MGET and dropped with one DEL per 500 (a call each cost as
    -- much as the rest of a fence's collection: benches/callgrind.sh). MGET reads a key of
    -- another type as nil, so such a fence is left alone, as before.
    -- (Each fence once: a fence set again has a member for each time, and a second DEL of it
    -- would look for a removed key, which Redis refuses in a slot being moved.)
    local named, listed = {}, {}
    for _, member in ipairs(due) do
      -- ("token TAB scope": the scope is what follows the digits' tab.)
      local _, tab = string.find(member, '^%d+\t')
      if tab then
        local fence = fences .. '{' .. string.sub(member, tab + 1) .. '}:fence'
        if not listed[fence] then
          listed[fence] = true
          named[#named + 1] = fence
        end
      end
    end
    -- All are read before any is dropped: on a Redis Cluster whose slot is being moved a fence
    -- may be on the other node already, where Redis refuses to reach it (an error, guarded
    -- here, as NOT_HERE above); then this call collects nothing and leaves the queue as it was.
    local chunks, reachable = {}, true
    for i = 1, #named, 500 do
      local chunk = { unpack(named, i, math.min(i + 499, #named)) }
      local held = redis.pcall('MGET', unpack(chunk))
      if held.err then
        reachable = false
        break
      end
      chunks[#chunks + 1] = { chunk, held }
    end
    if reachable then
      -- The due members are the queue's first ones in order: one range removal takes them all.
      redis.call('ZREMRANGEBYLEX', QUEUE, '-', '[' .. due[#due])
      queued = queued - #due
      for _, c in ipairs(chunks) do
        local gone = {}
        for j, fence in ipairs(c[1]) do
          local token = type(c[2][j]) == 'string' and string.match(c[2][j], '^(%d+)\t')
          if token and #token == 20 and token < watermark then
            gone[#gone + 1] = fence
          end
        end
        if #gone > 0 then
          -- (Guarded all the same: nothing after this call's first change may raise.)
          redis.pcall('DEL', unpack(gone))
        end
      end
    end
  end
  for i = 0, n - 1 do
    local k, a = at + 3 + 2 * i, arg + 1 + 4 * i
    out[#out + 1] = write(keys[k], keys[k + 1], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
  end
  if skiplisted then
    redis.call('ZREM', QUEUE, SKIPLIST)
  end
end

-- The slots of this call: the first one's keys are KEYS (declared, so Redis routes and checks
-- them), the others' (a Redis Cluster master's other slots, one call for all) follow their
-- counts in ARGV. A Redis Cluster refuses a script a key on another node with an error, so
-- an undeclared slot is first probed with one guarded read of all its keys, before it
-- changes anything: a slot that is not here (the client's map of slots is behind a move)
-- answers {"elsewhere"} for each of its writes, for the client to send them to their slot.
local slots = tonumber(ARGV[7])
local counts, undeclared = {}, 0
for g = 1, slots do
  counts[g] = tonumber(ARGV[7 + g])
  if g > 1 then
    undeclared = undeclared + 2 + 2 * counts[g]
  end
end
local out = {}
local at, arg = 7 + slots, 7 + slots + undeclared
for g = 1, slots do
  local n = counts[g]
  if g == 1 then
    run_slot(KEYS, 0, n, arg, out)
  else
    local here = true
    for i = at + 1, at + 2 + 2 * n, 500 do
      here = here and type(redis.pcall('EXISTS', unpack(ARGV, i, math.min(i + 499, at + 2 + 2 * n)))) == 'number'
    end
    if not here then
      for _ = 1, n do
        out[#out + 1] = { 'elsewhere' }
      end
    else
      run_slot(ARGV, at, n, arg, out)
    end
    at = at + 2 + 2 * n
  end
  arg = arg + 4 * n
end
return out
