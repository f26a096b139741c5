-- fenced_write.lua: the admission rule (DESIGN.md §4) and the mutation, in one atomic step.
-- KEYS[1]  fence hash of the scope: token (20-digit zero-padded decimal), lease
-- KEYS[2]  idempotency zset of the scope: keys of applied writes -> apply time (ms). Kept
--          across generations (a re-run of a job under a newer token that repeats an applied
--          write is a duplicate), bounded by retention time and count.
-- ARGV[1]  presented token (20-digit zero-padded, so string order is numeric order and no
--          precision is lost to Lua's doubles), ARGV[2] presented lease id,
-- ARGV[3]  idempotency key, ARGV[4] key retention (ms), ARGV[5] most keys kept per scope,
-- ARGV[6]  data key prefix, ARGV[7] mutations as JSON (palisade::Mutation, serde-encoded)
-- Returns  {"applied"} | {"duplicate"} | {"stale", highest token, its lease} |
--          {"conflict", token, lease holding it}
-- Errors   "PALISADE_MUTATION ..." when a mutation does not fit the stored data; checked
--          before anything is written, because Redis does not roll a script back.
local token, lease, key = ARGV[1], ARGV[2], ARGV[3]
local h = redis.call('HMGET', KEYS[1], 'token', 'lease')
if h[1] then
  if token < h[1] then
    return { 'stale', h[1], h[2] }
  end
  if token == h[1] and lease ~= h[2] then
    return { 'conflict', h[1], h[2] }
  end
end
local advance = not h[1] or token > h[1]
if redis.call('ZSCORE', KEYS[2], key) then
  -- Still fence in the newer generation, so every older one is refused from now on.
  if advance then
    redis.call('HSET', KEYS[1], 'token', token, 'lease', lease)
  end
  return { 'duplicate' }
end

local prefix = ARGV[6]
local mutations = cjson.decode(ARGV[7])
local function kind_of(k)
  return redis.call('TYPE', prefix .. k).ok
end
for _, m in ipairs(mutations) do
  if m.HashIncr then
    -- One HGET checks both the key's type (WRONGTYPE) and the field's value.
    local v = redis.pcall('HGET', prefix .. m.HashIncr.key, m.HashIncr.field)
    if type(v) == 'table' and v.err then
      return redis.error_reply('PALISADE_MUTATION ' .. m.HashIncr.key .. ' is not a hash')
    end
    if v and not string.match(v, '^%-?%d+$') then
      return redis.error_reply('PALISADE_MUTATION ' .. m.HashIncr.key .. '.' .. m.HashIncr.field .. ' = ' .. v .. ' is not an integer')
    end
  else
    local key = (m.Set or m.HashSet).key
    local want = m.Set and 'string' or 'hash'
    local t = kind_of(key)
    if t ~= 'none' and t ~= want then
      return redis.error_reply('PALISADE_MUTATION ' .. key .. ' holds a ' .. t .. ', not a ' .. want)
    end
  end
end
for _, m in ipairs(mutations) do
  if m.Set then
    redis.call('SET', prefix .. m.Set.key, m.Set.value)
  elseif m.HashSet then
    for _, pair in ipairs(m.HashSet.fields) do
      redis.call('HSET', prefix .. m.HashSet.key, pair[1], pair[2])
    end
  else
    redis.call('HINCRBY', prefix .. m.HashIncr.key, m.HashIncr.field, string.format('%d', m.HashIncr.by))
  end
end

if advance then
  redis.call('HSET', KEYS[1], 'token', token, 'lease', lease)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention, most = tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZADD', KEYS[2], now, key)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - retention)
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(most + 1))
redis.call('PEXPIRE', KEYS[2], retention)
return { 'applied' }
