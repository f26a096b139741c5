-- claim.lua: claims up to n ready jobs of one queue in one round trip.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  queue, ARGV[2] worker name, ARGV[3] lease ttl (ms), ARGV[4] most due delayed jobs
--          to make ready in this call, ARGV[5] k, ARGV[6..5+k] the kinds the worker handles
--          (k = 0: every kind), then one fresh random lease id per job wanted
--          (n = #ARGV - 6 - k)
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  one array per claim: {job id, lease id, epoch, counter, meta, attempt, stalls,
--          snoozes};
--          none while the queue is paused ({prefix}:paused), at most the whole tokens of its
--          rate bucket when it is rate-limited. Grouped jobs rotate by group (core/src/group.rs: the
--          memory store runs the same rules; common.lua has the keys).
-- Errors   "PALISADE_EPOCH ..." when the counters cannot be proven intact (fresh, flushed or
--          restarted Redis, counter key lost, counter nearly exhausted): the client must move
--          to a new epoch (establish_epoch.lua) and retry. Raised before any change; no token
--          is minted before that. "PALISADE_CORRUPT ..." when a key it would write holds
--          another type or a count it increments is not an integer: raised before any change.
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base, queue, worker, ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local k = tonumber(ARGV[5])
local first_lease = 6 + k
local n = #ARGV - first_lease -- (the last ARGV is the layout generation)
-- A paused queue hands out nothing (and promotes nothing): its jobs wait where they are.
if redis.call('SISMEMBER', base .. 'paused', queue) == 1 then
  return {}
end
local epoch, stored_counter = epoch_intact(base)
if not epoch then
  return redis.error_reply('PALISADE_EPOCH token counters are not proven intact')
end
local now = now_ms()

-- A rate-limited queue ({prefix}:q:<queue>:rate, `palisade limit`) hands out at most the
-- whole tokens of its bucket, which refills at jobs/per_ms up to jobs: shared by every worker,
-- decided here, so the fleet never claims more than the limit.
local rate_key = base .. 'q:' .. queue .. ':rate'
local rate = redis.call('HMGET', rate_key, 'jobs', 'per_ms', 'tokens', 'at')
local tokens = nil
-- (A limit another program wrote oddly: one that is not a finite positive number is no
-- limit; a bucket count or stamp that is not finite reads as a full bucket counted from now,
-- so no NaN reaches the claim below.)
local jobs, per = tonumber(rate[1]), tonumber(rate[2])
if finite(jobs) and finite(per) and jobs >= 0 and per > 0 then
  local before, at = tonumber(rate[3] or rate[1]), tonumber(rate[4] or now)
  if not finite(before) or not finite(at) then
    before, at = jobs, now
  end
  tokens = math.min(jobs, before + math.max(0, now - at) * jobs / per)
  n = math.min(n, math.floor(tokens))
  if n <= 0 then
    if at > now then
      -- The clock went back: count from now, or the bucket stays frozen until it catches up.
      redis.call('HSET', rate_key, 'tokens', tokens, 'at', now)
    end
    return {}
  end
end

-- Kinds with a fleet-wide concurrency cap ({prefix}:caps, `palisade cap`): how many more of
-- each may start. A job counted against its cap carries `capped` (its kind) until its lease
-- ends (settle, reap, cancel: `uncap` in common.lua).
-- Read before any write (a key of the wrong type fails here, changing nothing); a cap that is
-- not a number is ignored, a count that is not one is read as 0.
local room, running = {}, {}
local caps = redis.call('HGETALL', base .. 'caps')
for i = 1, #caps, 2 do
  local cap = tonumber(caps[i + 1])
  if cap then
    running[caps[i]] = tonumber(redis.call('HGET', base .. 'running', caps[i]) or '0') or 0
    room[caps[i]] = cap - running[caps[i]]
  end
end

-- Due delayed jobs become ready, a bounded number per call (the rest next time), so a burst
-- of due jobs never blocks Redis for long.
local delayed = base .. 'q:' .. queue .. ':delayed'
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))

-- Read-only before the first write: every key this claim may write has its type (a key
-- another program wrote over fails the call whole, changing nothing). The kinds' ready sets
-- are checked as they are known now; a promoted job's below.
-- The keys of named scopes and of groups and rate limits are apart: a queue that does not use
-- a feature has none of its keys, and one EXISTS tells that for all of them (unsafe_if_any)
-- where a TYPE each cost a claim a command per key (docs/performance-log.md).
local stats = base .. 'q:' .. queue .. ':stats'
local want = { [base .. 'leases'] = 'zset', [base .. 'lease_job'] = 'hash',
  [base .. 'tokens:' .. epoch] = 'zset', [base .. 'token_epochs'] = 'zset',
  [base .. 'q:' .. queue .. ':kinds'] = 'set', [stats] = 'hash' }
local scoped = { [base .. 'head'] = 'hash', [base .. 'live'] = 'hash', [base .. 'last'] = 'hash' }
local grouped = { [rate_key] = 'hash', [base .. 'q:' .. queue .. ':groups'] = 'zset',
  [base .. 'gwake'] = 'zset', [base .. 'glimited'] = 'zset' }
local counted = { [stats] = true }
local listed = k == 0 and redis.call('SMEMBERS', base .. 'q:' .. queue .. ':kinds') or {}
for i = 6, 5 + k do
  listed[#listed + 1] = ARGV[i]
end
for _, kind in ipairs(listed) do
  want[ready_key(base, queue, kind)] = 'zset'
  grouped[rotation_key(base, queue, kind)] = 'zset'
end
for _, id in ipairs(due) do
  local f = fields(base .. 'job:' .. id, 'queue', 'scope', 'kind', 'group')
  settle_keys(base, want, counted, id, f, true, false, false)
end
local wrong = unsafe(base, want, counted) or unsafe_if_any(base, scoped)
  or unsafe_if_any(base, grouped)
if not wrong then
  -- The groups' turn counter is never removed (one use of groups keeps it), so it is apart
  -- from the EXISTS: one GET, guarded, tells its type and that it counts.
  local turn = redis.pcall('GET', base .. 'turn')
  if type(turn) == 'table' then
    wrong = base .. 'turn is not a string'
  elseif not countable(turn) then
    wrong = base .. 'turn is not an integer'
  end
end
if wrong then
  return corrupt(wrong)
end

for _, id in ipairs(due) do
  redis.call('ZREM', delayed, id)
  park(base, id, now, now)
end
-- Parked groups whose rate bucket holds a token again come back (a bounded number a call).
for _, group in ipairs(redis.call('ZRANGEBYSCORE', base .. 'gwake', '-inf', now, 'LIMIT', 0, 16)) do
  redis.call('ZREM', base .. 'gwake', group)
  unpark(base, group, now)
end

-- Only kinds the worker handles are looked at: jobs of other kinds wait for a worker that
-- has them (a mixed fleet during a rolling deploy never dead-letters them as unknown). The
-- candidates are the first few of each kind's ready set, merged by score.
local kinds = {}
if k == 0 then
  kinds = redis.call('SMEMBERS', base .. 'q:' .. queue .. ':kinds')
else
  for i = 6, 5 + k do
    kinds[#kinds + 1] = ARGV[i]
  end
end
-- Every ready entry is claimable but for a kind at its cap (or a stray entry), so n plus a
-- little slack per kind is enough; a claim that meets more strays returns fewer jobs, never a
-- wrong one. (Each entry fetched is a Lua string to build: fetching 2n was a measurable cost.)
-- Candidates as parallel arrays, not a table each: building one per entry was a visible
-- share of a claim.
-- Scores only where kinds are merged: Redis writes each with printf's "%.17g", about as
-- dear as a command per candidate (benches/callgrind.sh). One kind's entries come in order,
-- and a candidate set aside reads its score then.
local c_id, c_num, c_score, c_key, c_kind = {}, {}, {}, {}, {}
local scored = #kinds > 1
for _, kind in ipairs(kinds) do
  local key = ready_key(base, queue, kind)
  local got = scored and redis.call('ZRANGE', key, 0, n + 15, 'WITHSCORES')
    or redis.call('ZRANGE', key, 0, n + 15)
  for i = 1, #got, scored and 2 or 1 do
    local at = #c_id + 1
    c_id[at], c_key[at], c_kind[at] = got[i], key, kind
    if scored then
      c_num[at], c_score[at] = tonumber(got[i + 1]), got[i + 1]
    end
  end
end
local order = {}
for i = 1, #c_id do
  order[i] = i
end
-- One kind's entries come sorted already.
if scored then
  table.sort(order, function(a, b) return c_num[a] < c_num[b] end)
end

-- Groups (core/src/group.rs): the n + 16 groups served least recently over the kinds asked for, each
-- offering its share (`room`: within its cap and rate tokens; none parks it). Jobs without a
-- group are one more lane, taken first in each round; candidates go round by round. Only
-- groups with limits (`glimited`) have a record to read, so a lane costs one read of its set.
local lanes = {} -- {turn, group, kind}
local looked_at = n + 16 -- core/src/group.rs lanes_looked_at: room for the lanes a claim parks
local rotations = 0
for _, kind in ipairs(kinds) do
  -- (A kind at its cap offers nothing: its groups would only fill the lanes.)
  -- (Guarded: a kind that a due job just brought had its rotation key checked by no one, and
  -- this runs after writes. One of another type offers no lanes.)
  local got = room[kind] and room[kind] <= 0 and {} or redis.pcall('ZRANGE', rotation_key(base, queue, kind), 0, looked_at - 1, 'WITHSCORES')
  if got.err then
    got = {}
  end
  if #got > 0 then
    rotations = rotations + 1
  end
  for i = 1, #got, 2 do
    lanes[#lanes + 1] = { tonumber(got[i + 1]), got[i], kind }
  end
end
-- Per lane: its candidates' count and how many it had (at most one more than it offers, to
-- tell whether a claim empties it); per group: its record (limited ones), room left, jobs
-- out of its sets, jobs started, tokens before the claim.
local c_lane, fetched, g_state, g_left, g_taken, g_tokens, parked, emptied = {}, {}, {}, {}, {}, {}, {}, {}
if #lanes > 0 then
  -- (One rotation's lanes come in order already: Redis orders by turn, then name byte-wise.)
  if rotations > 1 then
    table.sort(lanes, function(a, b)
      if a[1] ~= b[1] then return a[1] < b[1] end
      if a[2] ~= b[2] then return bytes_before(a[2], b[2]) end
      return bytes_before(a[3], b[3])
    end)
  end
  for i = looked_at + 1, #lanes do
    lanes[i] = nil
  end
  local per = math.ceil(n / (math.min(#lanes, n) + (#c_id > 0 and 1 or 0)))
  local names = {}
  for li, lane in ipairs(lanes) do
    names[li] = lane[2]
  end
  local limited = {}
  for i = 1, #names, 500 do
    local got = redis.call('ZMSCORE', base .. 'glimited', unpack(names, i, math.min(i + 499, #names)))
    for j = 1, #got do
      limited[i + j - 1] = got[j] ~= false
    end
  end
  local rounds = {}
  for r, c in ipairs(order) do
    rounds[c] = r - 1
  end
  local NONE = {}
  for li, lane in ipairs(lanes) do
    local group, kind = lane[2], lane[3]
    local g = g_state[group]
    if not g then
      -- (A group record of another type, written by another program, reads as {}: its
      -- lanes are passed over, nothing of them written.)
      g = limited[li] and fields(base .. 'group:' .. group, unpack(GROUP_FIELDS)) or NONE
      g_state[group] = g
    end
    if g == NONE or #g > 0 then
      if g ~= NONE and g_tokens[group] == nil then
        g_tokens[group] = group_tokens(g, now) or false
      end
      local take, wake = group_room(g, per, now)
      local gkey = group_key(base, queue, kind, group)
      if take == 0 then
        parked[#parked + 1] = { li, wake }
      else
        local heads = redis.pcall('ZRANGE', gkey, 0, take, 'WITHSCORES')
        if type(heads) == 'table' and not heads.err then
          fetched[li] = #heads / 2
          if #heads == 0 then
            emptied[#emptied + 1] = li
          else
            g_left[group] = g_left[group] or take
            for i = 1, math.min(#heads, 2 * take), 2 do
              local at = #c_id + 1
              c_id[at], c_num[at], c_score[at], c_key[at], c_kind[at] = heads[i], tonumber(heads[i + 1]), heads[i + 1], gkey, kind
              c_lane[at] = li
              rounds[at] = (i - 1) / 2
            end
          end
        end
      end
    end
  end
  -- Round by round; in a round the ungrouped lane first, then the groups in rotation order.
  order = {}
  for i = 1, #c_id do
    order[i] = i
  end
  table.sort(order, function(a, b)
    if rounds[a] ~= rounds[b] then return rounds[a] < rounds[b] end
    return (c_lane[a] or 0) < (c_lane[b] or 0)
  end)
end

-- Of a named scope only its head is ever ready (enter/leave in common.lua), so the first n
-- candidates are claimable however many jobs of held scopes exist. The live-lease check
-- stays as a guard for invariant 3: a job whose scope is held anyway waits aside instead of
-- getting a second live lease.
local counter = tonumber(stored_counter) -- (read by epoch_intact; nothing since wrote it)
-- (Each ZADD of the leases brings SKIPLIST along: a no-op once it is there. The token set's
-- brings it too, removed again below.)
local out, taken, picked, expiries, owners = {}, {}, {}, { '+inf', SKIPLIST }, {}
local tracked = { '+inf', SKIPLIST }
-- Numbers go to Redis as decimals made once per claim (common.lua, arg_of).
local expiry, claimed = arg_of(now + ttl), fmt(now)
local served, touched, g_started = {}, {}, {}
for _, c in ipairs(order) do
  if #out >= n then
    break
  end
  local id, score, key, kind = c_id[c], c_score[c], c_key[c], c_kind[c]
  local group = c_lane[c] and lanes[c_lane[c]][2]
  local job = base .. 'job:' .. id
  local f = fields(job, 'meta', 'scope', 'attempt', 'stalls', 'snoozes')
  local scope = f[2] or ('job:' .. id)
  local aside = f[1] and (taken[scope] or (f[2] and redis.call('HEXISTS', base .. 'live', scope) == 1))
  if (room[kind] and room[kind] <= 0) or (group and g_left[group] <= 0)
    or (aside and mistyped({ [base .. 'wait:' .. scope] = 'zset' })) then
    -- its kind is at its cap, its group has no room left in this claim (its lanes of two
    -- kinds share one), or its scope's waiting set is another program's key: it stays ready
    -- for a later claim
  else
    if group then
      -- Out of its group's set either way: set aside, or claimed.
      g_taken[group] = (g_taken[group] or 0) + 1
      fetched[c_lane[c]] = fetched[c_lane[c]] - 1
      touched[c_lane[c]] = true
    end
    picked[key] = picked[key] or {}
    table.insert(picked[key], id)
    if not f[1] then
      -- a ready entry without a readable job: dropped
    elseif aside then
      -- (Still in its ready set: the batch leaves it below. The '0' is for a score that
      -- cannot be missing, so that nothing fails after this claim's first write.)
      score = score or redis.call('ZSCORE', key, id) or '0'
      redis.call('ZADD', base .. 'wait:' .. scope, score, id)
      redis.call('HINCRBY', stats, 'waiting', 1)
    else
      taken[scope] = true
      -- (A group with a cap counts its running jobs; the lease says so, to give it back.)
      local counted = group and finite(tonumber(g_state[group][2])) and group
      if group then
        g_left[group] = g_left[group] - 1
        served[c_lane[c]] = true
        g_started[group] = (g_started[group] or 0) + 1
      end
      local lease = ARGV[first_lease + #out]
      counter = counter + 1
      local token = fmt(counter)
      -- (A first attempt, the common claim, needs no number made.)
      local attempt = f[3] and fmt(count_of(f[3]) + 1) or '1'
      redis.call('HSET', job, 'attempt', attempt, 'lease', lease, 'start', now)
      local capped = room[kind] and kind
      if room[kind] then
        room[kind] = room[kind] - 1
        running[kind] = running[kind] + 1
        redis.call('HSET', job, 'capped', kind)
        redis.call('HSET', base .. 'running', kind, running[kind])
      end
      if f[2] then
        redis.call('HSET', base .. 'head', scope, id)
        redis.call('HSET', base .. 'live', scope, lease)
        redis.call('HSET', base .. 'last', scope, epoch .. ':' .. token)
      end
      expiries[#expiries + 1] = expiry
      expiries[#expiries + 1] = lease
      tracked[#tracked + 1] = token
      tracked[#tracked + 1] = lease
      owners[#owners + 1] = lease
      -- (A named scope and a capped kind ride along, so a settlement or reap gives them back
      -- even if the job record is written over meanwhile: common.lua, let_go.)
      local holds = (f[2] or capped or counted) and ('\t' .. (f[2] or '') .. '\t' .. (capped or '')
        .. (counted and ('\t' .. counted) or '')) or ''
      owners[#owners + 1] = id .. '\t' .. epoch .. '\t' .. token .. '\t' .. claimed .. '\t' .. worker
        .. holds
      out[#out + 1] = { id, lease, epoch, token, f[1], attempt, f[4] or '0', f[5] or '0' }
    end
  end
end
for key, ids in pairs(picked) do
  bulk('ZREM', key, ids)
end
if #lanes > 0 then
  -- Served groups to the back of their rotation; emptied, parked and empty ones out of it (a
  -- group is in a rotation exactly while it has ready jobs of the kind and is not parked);
  -- counts and rate buckets pay for what left the groups' sets. Batched per key.
  local turn = redis.call('INCRBY', base .. 'turn', 2)
  local q = base .. 'q:' .. queue
  local names, moved = {}, 0
  for group, k in pairs(g_taken) do
    names[#names + 1] = group
    moved = moved + k
  end
  if moved > 0 then
    redis.call('HINCRBY', stats, 'grouped', -moved)
    -- (Depths are kept negative: most first, ties by name. One gone to 0 leaves the set.)
    local depth, gone = {}, {}
    for i = 1, #names, 500 do
      local chunk = { unpack(names, i, math.min(i + 499, #names)) }
      local was = redis.call('ZMSCORE', q .. ':groups', unpack(chunk))
      for j, group in ipairs(chunk) do
        local d = (tonumber(was[j]) or 0) + g_taken[group]
        if d >= 0 then
          gone[#gone + 1] = group
        else
          depth[#depth + 1] = d
          depth[#depth + 1] = group
        end
      end
    end
    bulk('ZADD', q .. ':groups', depth)
    bulk('ZREM', q .. ':groups', gone)
  end
  for group, started in pairs(g_started) do
    if finite(tonumber(g_state[group][2])) then
      redis.call('HSET', base .. 'group:' .. group, 'running', count_of(g_state[group][1]) + started)
    end
  end
  for group, tokens in pairs(g_tokens) do
    if tokens then
      redis.call('HSET', base .. 'group:' .. group, 'tokens', tokens - (g_started[group] or 0), 'at', now)
    end
  end
  local back, out_of = {}, {} -- rotation key -> {turn, group, ...} / {group, ...}
  local function leave_rotation(lane)
    local key = rotation_key(base, queue, lane[3])
    out_of[key] = out_of[key] or {}
    table.insert(out_of[key], lane[2])
  end
  for li in pairs(touched) do
    local lane = lanes[li]
    if fetched[li] <= 0 then
      leave_rotation(lane)
    elseif served[li] then
      local key = rotation_key(base, queue, lane[3])
      back[key] = back[key] or {}
      table.insert(back[key], turn)
      table.insert(back[key], lane[2])
    end
  end
  for _, li in ipairs(emptied) do
    leave_rotation(lanes[li])
  end
  for _, p in ipairs(parked) do
    local lane, wake = lanes[p[1]], p[2]
    local group = lane[2]
    -- (A parked-rotations key of another type: the group stays in the rotation, looked at
    -- again by the next claim, and the Redis log says why.)
    local wrong = mistyped({ [base .. 'gparked:' .. group] = 'zset' })
    if wrong then
      redis.log(redis.LOG_WARNING, 'palisade: group ' .. group .. ' not parked: ' .. wrong)
    else
      leave_rotation(lane)
      redis.call('ZADD', base .. 'gparked:' .. group, lane[1], queue .. '\t' .. lane[3])
      redis.call('HSET', base .. 'group:' .. group, 'parked', 1)
      if wake then
        redis.call('ZADD', base .. 'gwake', now + wake, group)
      end
    end
  end
  for key, entries in pairs(back) do
    bulk('ZADD', key, entries)
  end
  for key, groups in pairs(out_of) do
    bulk('ZREM', key, groups)
  end
end
if #out > 0 then
  redis.call('SET', base .. 'counter', counter)
  bulk('ZADD', base .. 'leases', expiries)
  bulk('HSET', base .. 'lease_job', owners)
  -- The live tokens of one epoch: tens of leases, which Redis would keep as a listpack that
  -- every ZADD and ZREM scans (with partitions each set holds a partition's share, so they
  -- made 3 partitions cost more per job than 1: docs/performance.md). SKIPLIST turns it into a
  -- skiplist, which Redis 7 keeps as members go (a reload turns it back; the next claim
  -- turns it again); it is removed at once, so no script of this version or an earlier one
  -- ever sees it (an earlier version's watermark would read it, alone, as the epoch's lowest
  -- token: common.lua, untrack).
  bulk('ZADD', base .. 'tokens:' .. epoch, tracked)
  redis.call('ZREM', base .. 'tokens:' .. epoch, SKIPLIST)
  redis.call('ZADD', base .. 'token_epochs', epoch, epoch)
  redis.call('HINCRBY', stats, 'leased', #out)
end
if tokens then
  redis.call('HSET', rate_key, 'tokens', tokens - #out, 'at', now)
end
return out
