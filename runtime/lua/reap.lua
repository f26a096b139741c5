-- reap.lua: turns expired leases into stalls: the job is ready again, or dead after max_stalls.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  most leases to reap in this call, ARGV[2] dead-letter records kept per queue
-- Returns  flat triples {job id, queue, "1" if now dead else "0", ...}
-- Errors   "PALISADE_CORRUPT ..." when a key it would write holds another type or a count it
--          increments is not an integer: raised before anything changed
local base = KEYS[1]
local now = now_ms()
local out = {}
local due = redis.call('ZRANGEBYSCORE', base .. 'leases', '-inf', now, 'LIMIT', 0,
  tonumber(ARGV[1]))
-- First, read-only: the leases' jobs, and that every key a stall may write has its type.
local entries, want, counted = {}, {}, {}
for k, lease in ipairs(due) do
  local entry = redis.call('HGET', base .. 'lease_job', lease)
  entries[k] = entry
  local id = job_of(entry)
  if id then
    local f = fields(base .. 'job:' .. id, 'queue', 'scope', 'kind')
    settle_keys(base, want, counted, id, f, true, false, true, entry)
  end
end
local wrong = unsafe(base, want, counted)
if wrong then
  return corrupt(wrong)
end
for k, lease in ipairs(due) do
  local entry = entries[k]
  local id = job_of(entry)
  if not id then
    redis.call('ZREM', base .. 'leases', lease)
  else
    local queue = release(base, lease, id, entry)
    if queue then
      local job = base .. 'job:' .. id
      local stalls = bump(job, 'stalls', 1)
      local max = meta_of(redis.call('HGET', job, 'meta')).max_stalls
      if stalls > max then
        bury(base, id, 'lease expired ' .. stalls .. ' times (max_stalls = ' .. max .. ')',
          tonumber(ARGV[2]))
        out[#out + 1] = id; out[#out + 1] = queue; out[#out + 1] = '1'
      else
        park(base, id, now, now)
        out[#out + 1] = id; out[#out + 1] = queue; out[#out + 1] = '0'
      end
    end
  end
end
return out
