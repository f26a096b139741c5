#!/usr/bin/env bash
# Instructions a private redis-server executes per job in a claim and in a settlement, apart
# (the `split` harness: claims of BATCH jobs, then settlements of BATCH), under callgrind.
# Loading the scripts (SCRIPT LOAD, once per server: the first call of each) is left out, as
# in benches/callgrind.sh.
#   bash benches/split.sh PORT BATCH       # e.g. 6394 24; try 4, 24 and 48 for the per-job part
# Then `python3 benches/regions.py $OUT/cg.<pid>.3` splits a phase into Lua, Redis and the rest.
set -euo pipefail
port=$1 batch=$2
out=${OUT:-/tmp/palisade-split}
harness=${HARNESS:-target/release/split}
rm -rf "$out" && mkdir -p "$out"
# shellcheck source=benches/counted.sh
. "$(dirname "$0")/counted.sh"
counted_redis "$port" "$out"
"$harness" --redis "redis://127.0.0.1:$port" --batch "$batch" --phase-hook "callgrind_control -d $pid >/dev/null 2>&1" >"$out/harness.txt"
counted_redis_stop "$port"
jobs=$(awk '/^jobs/ { print $2 }' "$out/harness.txt")
# Dumps: .1 the enqueue, .2 the claims, .3 the settlements.
ir() {
  local f="$out/cg.$pid.$1" all load
  all=$(awk '/^summary:/ { print $2 }' "$f")
  load=$(callgrind_annotate --inclusive=yes --auto=no --threshold=100 "$f" 2>/dev/null \
    | awk '/:scriptCommand / { gsub(",", "", $1); print $1; exit }')
  echo $((all - ${load:-0}))
}
echo "instructions per job: claim $(($(ir 2) / jobs)), settle $(($(ir 3) / jobs)) (batch $batch)"
