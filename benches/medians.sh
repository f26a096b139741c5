#!/usr/bin/env bash
# Runs each setup REPS times, interleaved (setup 1, 2, …, then again), and prints the median
# and range of every figure the throughput harness reports as "<name> <number>".
#   bash benches/medians.sh 3 'no-op=target/release/throughput --redis redis://127.0.0.1:6390 --jobs 20000' \
#                             'sink=target/release/throughput --redis redis://127.0.0.1:6390 --jobs 20000 --sink'
# Measure on a quiet machine (nothing compiling): two shared cores swing single runs by 30 %.
set -euo pipefail
reps=$1
shift
out=$(mktemp -d)
for rep in $(seq 1 "$reps"); do
  i=0
  for setup in "$@"; do
    i=$((i + 1))
    bash -c "${setup#*=}" > "$out/$i.$rep" 2>&1 || { echo "setup ${setup%%=*} failed:"; cat "$out/$i.$rep"; exit 1; }
  done
done
i=0
for setup in "$@"; do
  i=$((i + 1))
  echo "== ${setup%%=*} (median (range) of $reps)"
  # One line per figure: "label: value" pairs pulled from the harness's output.
  cat "$out/$i".* | python3 -c '
import re, sys, statistics, collections
figures = collections.OrderedDict()
patterns = [
    ("jobs/s", r"^\s*run\s+([\d.]+) jobs/s"),
    ("round trips/job", r"claim\+complete ([\d.]+)"),
    ("with sink", r"with sink ([\d.]+)"),
    ("commands/job (run)", r"run ([\d.]+), total"),
    ("Redis CPU/job µs", r"Redis CPU per job: run ([\d.]+)"),
    ("of it kernel µs", r"Redis kernel CPU per job \(of the above\): run ([\d.]+)"),
    ("Redis bytes/job", r"network bytes per job .*: run ([\d.]+)"),
    ("Postgres CPU/job µs", r"Postgres CPU per job ([\d.]+)"),
    ("writing tx/job", r"writing transactions per job ([\d.]+)"),
    ("enqueue->start p50 ms", r"enqueue->start\s+p50 ([\d.]+)"),
    ("enqueue->start p99 ms", r"enqueue->start\s+p50 [\d.]+ms\s+p99 ([\d.]+)"),
    ("enqueue->end p50 ms", r"enqueue->handler end p50 ([\d.]+)"),
    ("enqueue->end p99 ms", r"enqueue->handler end p50 [\d.]+ms\s+p99 ([\d.]+)"),
    ("settle wait p50 ms", r"settle wait.*p50 ([\d.]+)"),
    ("settle wait p99 ms", r"settle wait.*p99 ([\d.]+)"),
    ("this process CPU/job µs", r"this process.s CPU per job .*: run ([\d.]+)"),
    ("bound from CPU, jobs/s", r"at most (\d+) jobs/s on"),
    ("Redis thread bound, jobs/s", r"command thread alone.*: at most (\d+) jobs/s"),
    ("Redis thread busy %", r"kept it (\d+) % busy"),
]
for line in sys.stdin:
    for name, pattern in patterns:
        m = re.search(pattern, line)
        if m:
            figures.setdefault(name, []).append(float(m.group(1)))
for name, values in figures.items():
    print(f"  {name:24} {statistics.median(values):>10.3f}  ({min(values):.3f}-{max(values):.3f})")
'
done
rm -rf "$out"
