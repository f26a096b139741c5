#!/usr/bin/env bash
# Enqueue throughput through the HTTP API (`palisade api`) on a private Redis, with ApacheBench
# (Debian's apache2-utils) as the client: one job per request, and batches of 100, at
# concurrency 50 and 8. Prints jobs/s, and Redis and API-server CPU per job, per run.
#   cargo build --release -p palisade-jobs
#   bash benches/api.sh 3            # three runs of each, interleaved; medians by hand or jq
# Measure on a quiet machine (nothing compiling): two shared cores swing single runs by 30 %.
set -euo pipefail
reps=${1:-3}
port=${REDIS_PORT:-6390}
api_port=${API_PORT:-8091}
bin=${BIN:-target/release/palisade}
command -v ab >/dev/null || { echo "benches/api.sh: needs ab (apt-get install apache2-utils)" >&2; exit 1; }
dir=$(mktemp -d)
redis-server --port "$port" --save "" --appendonly no --daemonize yes --pidfile "$dir/redis.pid" >/dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; kill "$api" 2>/dev/null || true; rm -rf "$dir"' EXIT
sleep 0.5
"$bin" api --redis "redis://127.0.0.1:$port" --prefix apibench --listen "127.0.0.1:$api_port" >/dev/null 2>&1 &
api=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$api_port/healthz" >/dev/null && break; sleep 0.1; done
echo '{"kind":"report.part","payload":{"n":1},"queue":"bench"}' > "$dir/one.json"
python3 -c 'import json; print(json.dumps({"jobs": [{"kind": "report.part", "payload": {"n": i}, "queue": "bench"} for i in range(100)]}))' > "$dir/batch.json"
redis_cpu() { redis-cli -p "$port" info cpu | awk -F: '/used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
api_cpu() { awk '{printf "%.6f", ($14 + $15) / 100}' "/proc/$api/stat"; }
run() { # label requests concurrency body jobs-per-request
  local r0 a0 t0 r1 a1 t1 jobs
  r0=$(redis_cpu); a0=$(api_cpu); t0=$(date +%s.%N)
  ab -q -n "$2" -c "$3" -p "$4" -T application/json "http://127.0.0.1:$api_port/api/v1/jobs$6" > "$dir/ab.out"
  t1=$(date +%s.%N); r1=$(redis_cpu); a1=$(api_cpu)
  grep -q "^Failed requests: *0" "$dir/ab.out" || { cat "$dir/ab.out"; exit 1; }
  jobs=$(($2 * $5))
  python3 -c "print(f'$1: {$jobs / ($t1 - $t0):.0f} jobs/s, Redis {($r1 - $r0) / $jobs * 1e6:.1f} µs/job, API server {($a1 - $a0) / $jobs * 1e6:.1f} µs/job')"
  redis-cli -p "$port" flushall >/dev/null
}
for _ in $(seq 1 "$reps"); do
  run "one job per request, c=50" 20000 50 "$dir/one.json" 1 ""
  run "100 jobs per request, c=8" 500 8 "$dir/batch.json" 100 "/batch"
done
