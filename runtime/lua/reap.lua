-- reap.lua: turns expired leases into stalls: the job is ready again, or dead after max_stalls.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  most leases to reap in this call, ARGV[2] dead-letter records kept per queue
-- Returns  flat triples {job id, queue, "1" if now dead else "0", ...}
-- Errors   none (a lease whose keys another program wrote over is skipped, and logged)
local base = KEYS[1]
local now = now_ms()
local out = {}
local due = redis.call('ZRANGEBYSCORE', base .. 'leases', '-inf', now, 'LIMIT', 0,
  tonumber(ARGV[1]))
for _, lease in ipairs(due) do
  local entry = redis.call('HGET', base .. 'lease_job', lease)
  local id = job_of(entry)
  if not id then
    redis.call('ZREM', base .. 'leases', lease)
  else
    -- Read-only first, per lease: every key this stall may write has its type. A lease whose
    -- keys another program wrote over is left as it is (and said in the Redis log), so one
    -- bad record never stops the reaping of the others.
    local want, counted = {}, {}
    settle_keys(base, want, counted, id, fields(base .. 'job:' .. id, 'queue', 'scope', 'kind'),
      true, false, true, entry)
    local wrong = unsafe(base, want, counted)
    if wrong then
      redis.log(redis.LOG_WARNING, 'palisade: expired lease ' .. lease .. ' not reaped: ' .. wrong)
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
end
return out
