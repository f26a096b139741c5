# Sourced by the benches that count a private redis-server's instructions under callgrind.
# counted_redis PORT DIR: starts it (dumps DIR/cg.<pid>.N), waits until it answers, and sets
# `pid`; a trap kills it if the caller exits early. counted_redis_stop PORT: stops it and
# waits for its last dump.
counted_redis() {
  valgrind --tool=callgrind --callgrind-out-file="$2/cg.%p" \
    redis-server --port "$1" --save "" --appendonly no >"$2/valgrind.log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true' EXIT
  for _ in $(seq 1 300); do
    redis-cli -p "$1" ping >/dev/null 2>&1 && break
    sleep 0.2
  done
}

counted_redis_stop() {
  redis-cli -p "$1" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" || true
  trap - EXIT
}
