#!/usr/bin/env bash
# Starts a private Redis Cluster for the throughput harness: 3 masters on ports BASE..BASE+2,
# each with one replica on BASE+3..BASE+5, nothing on disk, files under /tmp/palisade-cluster-BASE.
#   bash benches/cluster.sh 7000          # start
#   bash benches/cluster.sh 7000 stop     # stop (by pid) and remove the files
#   bash benches/cluster.sh 7000 1        # start 1 master with 1 replica (the one-Redis baseline)
set -euo pipefail
base=${1:-7000}
what=${2:-3}
dir=/tmp/palisade-cluster-$base
if [[ $what == stop ]]; then
  for pid in "$dir"/*.pid; do [[ -e $pid ]] && kill "$(cat "$pid")" 2>/dev/null || true; done
  rm -rf "$dir"
  exit 0
fi
masters=$what
mkdir -p "$dir"
nodes=()
for ((i = 0; i < 2 * masters; i++)); do
  port=$((base + i))
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$port" --save "" --appendonly no \
    --cluster-enabled yes --cluster-node-timeout 2000 --daemonize yes \
    --pidfile "$dir/$port.pid" --logfile "$dir/$port.log"
  nodes+=("127.0.0.1:$port")
done
for n in "${nodes[@]}"; do
  until redis-cli -p "${n#*:}" ping >/dev/null 2>&1; do sleep 0.1; done
done
if ((masters == 1)); then
  # redis-cli refuses a one-master cluster: give it every slot by hand.
  redis-cli -p "$base" cluster addslotsrange 0 16383 >/dev/null
  redis-cli -p $((base + 1)) cluster meet 127.0.0.1 "$base" >/dev/null
  sleep 1
  redis-cli -p $((base + 1)) cluster replicate "$(redis-cli -p "$base" cluster myid)" >/dev/null
else
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
fi
until redis-cli -p "$base" cluster info | grep -q cluster_state:ok; do sleep 0.2; done
echo "cluster up: redis://127.0.0.1:$base ($masters master(s), $masters replica(s))"
