-- reap.lua: turns expired leases into stalls: the job is ready again, or dead after max_stalls.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  most leases to reap in this call, ARGV[2] dead-letter records kept per queue
-- Returns  flat triples {job id, queue, "1" if now dead else "0", ...}
-- Errors   none
local base = KEYS[1]
local now = now_ms()
local out = {}
for _, lease in ipairs(redis.call('ZRANGEBYSCORE', base .. 'leases', '-inf', now, 'LIMIT', 0,
  tonumber(ARGV[1]))) do
  local entry = redis.call('HGET', base .. 'lease_job', lease)
  local id = job_of(entry)
  if not id then
    redis.call('ZREM', base .. 'leases', lease)
  else
    local queue = release(base, lease, id, entry)
    if queue then
      local job = base .. 'job:' .. id
      local stalls = redis.call('HINCRBY', job, 'stalls', 1)
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
