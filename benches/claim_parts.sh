#!/usr/bin/env bash
# A claim's own cost, the part every call pays whatever its size, by part: a claim for
# nothing in an empty queue (epoch intact) is called CALLS times under callgrind, first as
# shipped, then cut short before each part (the cut script returns {} there), so each part
# costs the difference between two cuts. Script loading and 10 warm-up calls are left out.
#   bash benches/claim_parts.sh PORT [CALLS]      # e.g. 6393 200
set -euo pipefail
port=$1 calls=${2:-200}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=benches/counted.sh
. "$here/counted.sh"
out=${OUT:-/tmp/palisade-claim-parts}
rm -rf "$out" && mkdir -p "$out"

# The scripts: `common.lua` and a body (as scripts.rs joins them), the claim cut before each
# anchor, and the two ends: a body that returns at once, and the helpers alone.
python3 - "$here/../redis/lua" "$out" <<'EOF'
import sys
lua, out = sys.argv[1], sys.argv[2]
common, claim = open(lua + '/common.lua').read(), open(lua + '/claim.lua').read()
cuts = [
    ('layout and pause', "local epoch, stored_counter = epoch_intact(base)"),
    ('the epoch proven', "local now = now_ms()"),
    ('clock, rate limit, caps', "local delayed = base .. 'q:' .. queue .. ':delayed'"),
    ('due delayed jobs', "local stats = base .. 'q:' .. queue .. ':stats'"),
    ('key types checked', "for _, id in ipairs(due) do\n  redis.call('ZREM', delayed, id)"),
]
open(out + '/0.lua', 'w').write('return 1')
open(out + '/1.lua', 'w').write(common + 'return 1')
for i, (name, anchor) in enumerate(cuts):
    assert claim.count(anchor) == 1, 'claim.lua changed: update benches/claim_parts.sh'
    at = claim.index(anchor)
    open('%s/%d.lua' % (out, i + 2), 'w').write(common + claim[:at] + 'do return {} end\n' + claim[at:])
open('%s/%d.lua' % (out, len(cuts) + 2), 'w').write(common + claim)
names = ['the call itself', "common.lua's helpers"] + [c[0] for c in cuts] + ['the rest']
open(out + '/names', 'w').write('\n'.join(names) + '\n')
EOF

# One RESP stream of N claims of nothing from queue "default" of base "{p}:".
calls_of() {
  python3 - "$1" "$2" <<'EOF'
import sys
sha, n = sys.argv[1], int(sys.argv[2])
args = ['EVALSHA', sha, '1', '{p}:', 'default', 'w1', '30000', '64', '0', '0']
one = b'*%d\r\n' % len(args) + b''.join(b'$%d\r\n%s\r\n' % (len(a), a.encode()) for a in args)
sys.stdout.buffer.write(one * n)
EOF
}

counted_redis "$port" "$out"
run_id=$(redis-cli -p "$port" info server | awk -F: '/^run_id:/ { print $2 }' | tr -d '\r')
redis-cli -p "$port" hset '{p}:epoch' epoch 1 run "$run_id" >/dev/null
redis-cli -p "$port" set '{p}:counter' 0 >/dev/null
dumps=0
costs=()
for script in $(seq 0 $(($(wc -l <"$out/names") - 1))); do
  sha=$(redis-cli -p "$port" script load "$(cat "$out/$script.lua")")
  calls_of "$sha" 10 | redis-cli -p "$port" --pipe >/dev/null
  callgrind_control -d "$pid" >/dev/null 2>&1
  calls_of "$sha" "$calls" | redis-cli -p "$port" --pipe >"$out/run.txt"
  grep -q "errors: 0, replies: $calls" "$out/run.txt" || { echo "script $script failed:"; cat "$out/run.txt"; exit 1; }
  callgrind_control -d "$pid" >/dev/null 2>&1
  dumps=$((dumps + 2))
  costs+=($(($(awk '/^summary:/ { print $2 }' "$out/cg.$pid.$dumps") / calls)))
done
counted_redis_stop "$port"
previous=0
i=0
while read -r name; do
  printf '%-24s %7d instructions a call\n' "$name" $((costs[i] - previous))
  previous=${costs[i]}
  i=$((i + 1))
done <"$out/names"
printf '%-24s %7d instructions a call\n' "the claim, whole" "$previous"
