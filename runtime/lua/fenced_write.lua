-- fenced_write.lua: the admission rule (DESIGN.md §4) and the mutation, one atomic step per
-- write, for a batch of writes that arrived together (group commit: one round trip for many
-- handlers' writes). Each write is decided and applied on its own; one write's refusal or bad
-- mutation does not affect the others.
-- KEYS     two per write: the scope's fence, a string "token TAB lease" (token as a 20-digit
--          zero-padded decimal), and the scope's idempotency zset (keys of applied writes -> apply time ms,
--          kept across generations, bounded by retention time and count)
-- ARGV[1]  key retention (ms), ARGV[2] most keys kept per scope, ARGV[3] data key prefix,
-- ARGV[4..] four per write: presented token (20-digit zero-padded, so string order is
--          numeric order and Lua's doubles never see it), presented lease id, idempotency key,
--          mutations as JSON (palisade::Mutation, serde-encoded)
-- Returns  one array per write: {"applied"} | {"duplicate"} | {"stale", highest, its lease} |
--          {"conflict", token, lease holding it} | {"mutation", why} (the mutation does not fit
--          the stored data; checked before anything is written, since Redis does not roll a
--          script back)
-- Errors   none of its own
local retention, most, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function check(m)
  if m.HashIncr then
    -- One HGET checks both the key's type (WRONGTYPE) and the field's value.
    local v = redis.pcall('HGET', prefix .. m.HashIncr.key, m.HashIncr.field)
    if type(v) == 'table' and v.err then
      return m.HashIncr.key .. ' is not a hash'
    end
    if v and not string.match(v, '^%-?%d+$') then
      return m.HashIncr.key .. '.' .. m.HashIncr.field .. ' = ' .. v .. ' is not an integer'
    end
  else
    local key = (m.Set or m.HashSet).key
    local want = m.Set and 'string' or 'hash'
    local kind = redis.call('TYPE', prefix .. key).ok
    if kind ~= 'none' and kind ~= want then
      return key .. ' holds a ' .. kind .. ', not a ' .. want
    end
  end
end

local function apply(m)
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

local function write(fence, keys, token, lease, key, mutations)
  local held = redis.call('GET', fence)
  local h = {}
  if held then
    h[1], h[2] = string.match(held, '^([^\t]*)\t(.*)$')
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
  if redis.call('ZSCORE', keys, key) then
    -- Still fence in the newer generation, so every older one is refused from now on.
    if advance then
      redis.call('SET', fence, token .. '\t' .. lease)
    end
    return { 'duplicate' }
  end
  mutations = cjson.decode(mutations)
  for _, m in ipairs(mutations) do
    local why = check(m)
    if why then
      return { 'mutation', why }
    end
  end
  for _, m in ipairs(mutations) do
    apply(m)
  end
  if advance then
    redis.call('SET', fence, token .. '\t' .. lease)
  end
  redis.call('ZADD', keys, now, key)
  redis.call('ZREMRANGEBYSCORE', keys, '-inf', now - retention)
  if redis.call('ZCARD', keys) > most then
    redis.call('ZREMRANGEBYRANK', keys, 0, -(most + 1))
  end
  redis.call('PEXPIRE', keys, retention)
  return { 'applied' }
end

local out = {}
for i = 0, #KEYS / 2 - 1 do
  local a = 4 + i * 4
  out[#out + 1] = write(KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end
return out
