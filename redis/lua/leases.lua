-- leases.lua: live leases for status output, soonest to expire first.
-- KEYS[1]  base "{prefix}:"
-- ARGV[1]  most leases to list
-- Returns  one array per lease: {lease id, job id, scope, epoch, counter, worker,
--          age ms, expires in ms (negative once expired but not yet reaped), queue, kind
--          ("" when the job record is gone)}
-- Errors   none
local base = KEYS[1]
local now = now_ms()
local out = {}
local listed = redis.call('ZRANGE', base .. 'leases', 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
for i = 1, #listed, 2 do
  local lease = listed[i]
  local entry = redis.call('HGET', base .. 'lease_job', lease)
  if entry then
    local id, epoch, counter, claimed, worker =
      string.match(entry, '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)')
    local f = fields(base .. 'job:' .. id, 'scope', 'queue', 'kind', 'meta')
    local scope = scope_of(entry) or f[1] or ('job:' .. id)
    out[#out + 1] = { lease, id, scope, epoch, counter, worker,
      fmt(now - tonumber(claimed)), fmt(tonumber(listed[i + 1]) - now), f[2] or '',
      -- (A record of an earlier version has no kind field: its meta has it.)
      f[3] or (f[4] and meta_of(f[4]).kind) or '' }
  end
end
return out
