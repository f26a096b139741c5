-- reap.lua: turns expired leases into stalls: the job is ready again, or dead after max_stalls.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  most leases to reap in this call, ARGV[2] dead-letter records kept per queue
--          ARGV[#ARGV] (last) the caller's layout generation (common.lua, wrong_layout)
-- Returns  flat 7-tuples {job id, queue, "1" if now dead else "0", lease id, its lease_job entry,
--          the job's traceparent, its tracestate (both "" if none), ...}
-- Errors   none (a lease whose keys another program wrote over is skipped, and logged)
--          Also "PALISADE_LAYOUT ..." (before anything) for a caller of another layout generation.
do
  local refused = wrong_layout(KEYS[1])
  if refused then
    return refused
  end
end
local base = KEYS[1]
local now = now_ms()
local out = {}
-- Skipped leases stay first in line (their expiry is kept: moving it would revive them), so
-- each round looks past the ones skipped so far; at most 10 rounds' worth in all.
local max, skipped, looked = tonumber(ARGV[1]), 0, 0
local done = 0
while done < max and looked < 10 * max do
  local due = redis.call('ZRANGEBYSCORE', base .. 'leases', '-inf', now, 'LIMIT', skipped,
    max - done)
  if #due == 0 then
    break
  end
  looked = looked + #due
  for _, lease in ipairs(due) do
    local entry = redis.call('HGET', base .. 'lease_job', lease)
    local id = job_of(entry)
    if not id then
      done = done + 1
      redis.call('ZREM', base .. 'leases', lease)
    else
      -- Read-only first, per lease: every key this stall may write has its type. A lease whose
      -- keys another program wrote over is left as it is (and said in the Redis log), so one
      -- bad record never stops the reaping of the others.
      local want, counted = {}, {}
      settle_keys(base, want, counted, id, fields(base .. 'job:' .. id, 'queue', 'scope', 'kind', 'group'),
        true, false, true, entry)
      local wrong = unsafe(base, want, counted)
      if wrong then
        skipped = skipped + 1
        redis.log(redis.LOG_WARNING, 'palisade: expired lease ' .. lease .. ' not reaped: ' .. wrong)
      else
        done = done + 1
        local queue = release(base, lease, id, entry)
        if queue then
          local job = base .. 'job:' .. id
          note_try(job, 'stalled', now, '')
          local stalls = bump(job, 'stalls', 1)
          -- Stalls ever reaped in the queue, whichever process reaped them, for the sampler
          -- to export (pcall: a stats hash written over must not fail the reap halfway).
          local stats = base .. 'q:' .. queue .. ':stats'
          local before = redis.pcall('HGET', stats, 'stalled')
          if type(before) ~= 'table' and countable(before) then
            redis.pcall('HINCRBY', stats, 'stalled', 1)
          end
          local meta = meta_of(redis.call('HGET', job, 'meta'))
          local max_stalls = meta.max_stalls
          local trace = trace_of(meta.trace) or {}
          local dead = '0'
          if stalls > max_stalls then
            bury(base, id, 'lease expired ' .. stalls .. ' times (max_stalls = ' .. max_stalls .. ')',
              tonumber(ARGV[2]))
            dead = '1'
          else
            park(base, id, now, now)
          end
          for _, v in ipairs({ id, queue, dead, lease, entry, trace.traceparent or '',
            trace.tracestate or '' }) do
            out[#out + 1] = v
          end
        end
      end
    end
  end
end
return out
