#!/usr/bin/env bash
# Sidekiq (Debian's ruby-sidekiq) beside the throughput harness: enqueue N jobs, start one
# Sidekiq process at concurrency C, report jobs/s and Redis CPU per job (INFO deltas).
#   bash benches/peers/sidekiq.sh redis://127.0.0.1:6390 20000 [write]
# Uses the Redis's database 3; run it against a private Redis.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${1:-redis://127.0.0.1:6390}/3
jobs=${2:-20000}
class=NoopJob
[ "${3:-}" = write ] && class=WriteJob
export REDIS_URL=$url
ruby -r "$here/sidekiq_job.rb" -e "
  Sidekiq.redis { |r| r.flushdb }
  (0...$jobs).each_slice(1000) { |s| Sidekiq::Client.push_bulk('class' => $class, 'args' => s.map { [] }, 'queue' => 'hold') }
" 2>/dev/null
# The jobs wait in another queue until Sidekiq has booted, then move in one RENAME.
sidekiq -r "$here/sidekiq_job.rb" -c 50 -q default >/dev/null 2>&1 &
pid=$!
until [ "$(redis-cli -u "$url" scard processes)" -ge 1 ]; do sleep 0.05; done
cpu() { redis-cli -u "$url" info cpu | awk -F: '/used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
cpu0=$(cpu)
t0=$(date +%s.%N)
redis-cli -u "$url" rename queue:hold queue:default >/dev/null
# Each of Sidekiq's 50 threads takes one job at a time (BRPOP), so once the list is empty at
# most 50 jobs are still running: the run ends there (the processed count reaches Redis only
# with the next heartbeat, seconds later; it is checked afterwards).
while [ "$(redis-cli -u "$url" llen queue:default)" != 0 ]; do sleep 0.002; done
t1=$(date +%s.%N)
cpu1=$(cpu)
until [ "$(redis-cli -u "$url" get stat:processed)" = "$jobs" ]; do sleep 0.2; done
kill "$pid"; wait "$pid" 2>/dev/null || true
redis-cli -u "$url" flushdb >/dev/null
echo "Sidekiq $class: $jobs jobs, concurrency 50"
echo "  run $(echo "$jobs / ($t1 - $t0)" | bc) jobs/s"
echo "  Redis CPU per job: run $(echo "scale=1; ($cpu1 - $cpu0) * 1000000 / $jobs" | bc)µs"
