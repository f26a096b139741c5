#!/usr/bin/env bash
# Instructions a private redis-server executes per fenced write (redis/lua/fenced_write.lua),
# and where they go: the script is called CALLS times with WRITES writes each (what the sink
# sends as one batch), each write a default scope's only one — one HashIncr, a fresh scope,
# a growing token — with the watermark two calls behind, so fences are queued and collected
# as in a run. Counted under callgrind (script loading and 20 warm-up calls left out), so the
# figures are work, not time: a run repeats within a fraction of a per cent, and runs differ by
# up to ~2 % with the random scope and lease names (121,462 and 123,343 for one script).
# Each VARIANT is the script with one part taken out, to price it by difference (the variants
# are measurements only: each is wrong as a sink):
#   as-is       the script as shipped
#   no-decode   the mutation list not decoded from JSON (a decoded list stands in)
#   no-collect  fences never queued for collection, so never collected either
#   no-expiry   the scope's key record left without its retention (no PEXPIRE)
#   bash benches/fenced_write.sh PORT [CALLS] [WRITES] [VARIANT…]   # e.g. 6393 300 11
set -euo pipefail
port=$1 calls=${2:-300} writes=${3:-11}
shift $(($# < 3 ? $# : 3))
variants=("$@")
((${#variants[@]})) || variants=(as-is no-decode no-collect no-expiry)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/counted.sh
. "$here/counted.sh"
out=${OUT:-/tmp/palisade-fenced-write}
rm -rf "$out" && mkdir -p "$out"

# One RESP stream of N calls starting at call S (tokens and scopes follow on from S).
cat >"$out/calls.py" <<'EOF'
import sys, uuid
sha, start, calls, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def resp(*a):
    out = [b'*%d\r\n' % len(a)]
    for x in a:
        x = str(x).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(x), x))
    return b''.join(out)
token = 1000 + start * per
stream = []
for _ in range(calls):
    keys = ['s:watermark', 's:collect']
    args = ['86400000', '1000', 's:d:', 's:', '%020d' % max(0, token - 2 * per), '64', '1', str(per)]
    for _ in range(per):
        scope = 'job:%s' % uuid.uuid4()
        keys += ['s:{%s}:fence' % scope, 's:{%s}:keys' % scope]
        args += ['%020d' % token, str(uuid.uuid4()), 'k', '[["I","acct:%d","n","1"]]' % (token % 100)]
        token += 1
    stream.append(resp('EVALSHA', sha, len(keys), *keys, *args))
sys.stdout.buffer.write(b''.join(stream))
EOF

# The script with one part taken out; fails if the part is no longer where it was.
cat >"$out/variant.py" <<'EOF'
import sys
script, variant = open(sys.argv[1]).read(), sys.argv[2]
cuts = {
    'as-is': None,
    'no-decode': ("local ok, mutations = pcall(cjson.decode, encoded)",
                  "local ok, mutations = true, { { 'I', 'acct:1', 'n', '1' } }"),
    'no-collect': ("local function queue_for_collection(fence, token)\n  if not collecting then",
                   "local function queue_for_collection(fence, token)\n  if true then"),
    'no-expiry': ("  redis.call('PEXPIRE', keys, RETENTION)\n", ""),
}
cut = cuts[variant]
if cut:
    assert script.count(cut[0]) == 1, 'the script changed: update benches/fenced_write.sh'
    script = script.replace(cut[0], cut[1])
sys.stdout.write(script)
EOF

for variant in "${variants[@]}"; do
  python3 "$out/variant.py" "$here/../redis/lua/fenced_write.lua" "$variant" >"$out/$variant.lua"
  dir="$out/$variant"
  mkdir -p "$dir"
  counted_redis "$port" "$dir"
  sha=$(redis-cli -p "$port" script load "$(cat "$out/$variant.lua")")
  python3 "$out/calls.py" "$sha" 0 20 "$writes" | redis-cli -p "$port" --pipe >"$dir/warm.txt"
  callgrind_control -d "$pid" >/dev/null 2>&1
  python3 "$out/calls.py" "$sha" 20 "$calls" "$writes" | redis-cli -p "$port" --pipe >"$dir/run.txt"
  grep -q "errors: 0, replies: $calls" "$dir/run.txt" || { echo "$variant: calls failed:"; cat "$dir/run.txt"; exit 1; }
  callgrind_control -d "$pid" >/dev/null 2>&1
  left=$(redis-cli -p "$port" dbsize)
  counted_redis_stop "$port"
  ir=$(awk '/^summary:/ { print $2 }' "$dir/cg.$pid.2")
  printf '%-11s %7.0f instructions a write (%d calls of %d; %s keys left)\n' \
    "$variant" "$(echo "$ir / ($calls * $writes)" | bc -l)" "$calls" "$writes" "$left"
done
