#!/usr/bin/env bash
# Counts the instructions a redis-server executes per job, per phase of the throughput
# harness: a private redis-server on PORT runs under valgrind's callgrind, and the harness
# dumps its counts at each phase boundary (`--phase-hook`). Instructions are work, not time:
# the same binary, inputs and setup count the same whatever else the machine is doing, so
# two setups compare on a busy 2-core machine where `INFO cpu` swings by 30 %.
#   bash benches/callgrind.sh PORT JOBS [harness options…]
#   bash benches/callgrind.sh 6391 2000            # no-op jobs
#   bash benches/callgrind.sh 6391 2000 --sink     # one fenced write each
# Prints "instructions per job: enqueue N, run N" and keeps the dumps in $OUT (default
# /tmp/palisade-callgrind) for `callgrind_annotate --inclusive=yes $OUT/run`.
set -euo pipefail
port=$1 jobs=$2
shift 2
out=${OUT:-/tmp/palisade-callgrind}
harness=${HARNESS:-target/release/throughput}
rm -rf "$out" && mkdir -p "$out"
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
  redis-server --port "$port" --save "" --appendonly no >"$out/valgrind.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.2
done
"$harness" --redis "redis://127.0.0.1:$port" --jobs "$jobs" \
  --phase-hook "callgrind_control -d $server >/dev/null" "$@" >"$out/harness.txt"
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait $server || true
trap - EXIT
# Dumps .1 (start-up, before the enqueue), .2 (the enqueue), .3 (the run); the last is exit.
ir() { awk '/^summary:/ { print $2 }' "$1"; }
mv "$out"/cg.$server.2 "$out/enqueue"
mv "$out"/cg.$server.3 "$out/run"
awk -v e="$(ir "$out/enqueue")" -v r="$(ir "$out/run")" -v n="$jobs" \
  'BEGIN { printf "instructions per job: enqueue %.0f, run %.0f\n", e / n, r / n }'
grep -E "commands per job|round trips per job:" "$out/harness.txt"
