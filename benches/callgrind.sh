#!/usr/bin/env bash
# Counts the instructions a redis-server executes per job, per phase of the throughput
# harness: a private redis-server on PORT runs under valgrind's callgrind, and the harness
# dumps its counts at each phase boundary (`--phase-hook`). Instructions are work, not time:
# the same binary, inputs and setup count the same whatever else the machine is doing, so
# two setups compare on a busy 2-core machine where `INFO cpu` swings by 30 %.
#   bash benches/callgrind.sh PORT JOBS [harness options…]
#   bash benches/callgrind.sh 6391 2000            # no-op jobs
#   bash benches/callgrind.sh 6391 2000 --sink     # one fenced write each
#   MASTERS=3 bash benches/callgrind.sh 7200 2000 --partitions 3   # a 3-master cluster
# Prints "instructions per job: enqueue N, run N" (summed over a cluster's masters) and keeps
# the dumps in $OUT (default /tmp/palisade-callgrind: cg.<pid>.2 the enqueue, .3 the run) for
# `callgrind_annotate --inclusive=yes`.
set -euo pipefail
port=$1 jobs=$2
shift 2
out=${OUT:-/tmp/palisade-callgrind}
harness=${HARNESS:-target/release/throughput}
masters=${MASTERS:-0}
read -r -a server_args <<<"${SERVER_ARGS:-}" # more redis-server options, e.g. "--zset-max-listpack-entries 16"
rm -rf "$out" && mkdir -p "$out"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
if ((masters == 0)); then
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
    redis-server --port "$port" --save "" --appendonly no "${server_args[@]}" >"$out/valgrind.log" 2>&1 &
  pids+=($!)
  url="redis://127.0.0.1:$port"
  cluster=()
else
  # MASTERS=3: a cluster of that many masters on PORT.., no replicas, each under callgrind
  # counting only what serves clients (readQueryFromClient: reading, running and answering
  # commands), not the cluster bus or the timers, whose share grows with the run's length.
  for ((i = 0; i < masters; i++)); do
    p=$((port + i))
    mkdir -p "$out/node-$p"
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" --toggle-collect=readQueryFromClient \
      redis-server --port "$p" --dir "$out/node-$p" --save "" --appendonly no \
      --cluster-enabled yes --cluster-node-timeout 60000 "${server_args[@]}" >"$out/valgrind-$p.log" 2>&1 &
    pids+=($!)
  done
  url=$(for ((i = 0; i < masters; i++)); do printf 'redis://127.0.0.1:%d,' $((port + i)); done)
  url=${url%,}
  cluster=(--cluster)
fi
for ((i = 0; i < ${#pids[@]}; i++)); do
  for _ in $(seq 1 300); do
    redis-cli -p $((port + i)) ping >/dev/null 2>&1 && break
    sleep 0.2
  done
done
if ((masters > 0)); then
  nodes=$(for ((i = 0; i < masters; i++)); do printf '127.0.0.1:%d ' $((port + i)); done)
  # shellcheck disable=SC2086
  redis-cli --cluster create $nodes --cluster-yes >/dev/null
  until redis-cli -p "$port" cluster info | grep -q cluster_state:ok; do sleep 0.5; done
fi
dump=$(printf 'callgrind_control -d %s >/dev/null && ' "${pids[@]}")
"$harness" --redis "$url" "${cluster[@]}" --jobs "$jobs" --phase-hook "${dump% && }" "$@" >"$out/harness.txt"
for ((i = 0; i < ${#pids[@]}; i++)); do
  redis-cli -p $((port + i)) shutdown nosave >/dev/null 2>&1 || true
done
wait "${pids[@]}" || true
trap - EXIT
# Dumps .1 (start-up, before the enqueue), .2 (the enqueue), .3 (the run) of each server;
# the last is its exit. Summed over the servers.
# Loading the scripts (SCRIPT LOAD, once per server and process: a worker's first call of
# each) is left out: it is paid once, not per job.
ir() {
  local total=0 f all load
  for f in "$@"; do
    all=$(awk '/^summary:/ { print $2 }' "$f")
    load=$(callgrind_annotate --inclusive=yes --auto=no --threshold=100 "$f" 2>/dev/null \
      | awk '/:scriptCommand / { gsub(",", "", $1); print $1; exit }')
    total=$((total + all - ${load:-0}))
  done
  echo "$total"
}
enqueue=() run=()
for pid in "${pids[@]}"; do
  enqueue+=("$out/cg.$pid.2") run+=("$out/cg.$pid.3")
done
awk -v e="$(ir "${enqueue[@]}")" -v r="$(ir "${run[@]}")" -v n="$jobs" \
  'BEGIN { printf "instructions per job: enqueue %.0f, run %.0f\n", e / n, r / n }'
if ((${#pids[@]} > 1)); then
  for pid in "${pids[@]}"; do
    printf '  server %s: run %.0f per job\n' "$pid" "$(echo "$(ir "$out/cg.$pid.3") / $jobs" | bc -l)"
  done
fi
grep -E "commands per job|round trips per job:" "$out/harness.txt"
