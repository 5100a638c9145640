#!/usr/bin/env bash
# Scaling across cores: the whole gRPC path with one tokio worker thread against two
# (TOKIO_WORKER_THREADS), alternating A B A B in one run, on distinct keys and on one hot
# key from 4 connections x 64 streams; then the memory store alone and governor's keyed
# limiter beside it (criterion, no network), on one and two threads.
#
#   scripts/bench-cores.sh [rounds] [seconds]
#
# On a 2-core machine the load generator takes one core, so a two-thread server cannot
# show its throughput; what it shows is the server's CPU per request, whose inverse is
# decisions per CPU-second: equal figures for one and two threads mean that two threads
# on two free cores would decide twice as much, a higher figure at two threads means work
# lost to contention. Prints per round, then the min-max ratio two / one.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-5}

cargo build --profile release-lto --quiet --bin cellrate --example loadgen
bin=target/release-lto
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # threads port
  TOKIO_WORKER_THREADS=$1 "$bin/cellrate" serve --listen "127.0.0.1:$2" --admin-listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 &
  echo $!
}
one_port=$(free_port); one_pid=$(start 1 "$one_port")
two_port=$(free_port); two_pid=$(start 2 "$two_port")
trap 'kill $one_pid $two_pid 2>/dev/null' EXIT
sleep 1

results=$(mktemp)
for round in $(seq "$rounds"); do
  for scenario in distinct hot; do
    for target in one two; do
      if [ $target = one ]; then port=$one_port; pid=$one_pid; else port=$two_port; pid=$two_pid; fi
      out=$("$bin/examples/loadgen" "127.0.0.1:$port" envoy "$scenario" 4 64 "$seconds" "$pid")
      echo "$round $scenario $target $out" | tee -a "$results"
    done
  done
done
echo
echo "two worker threads / one, min - max over $rounds rounds (cpu_us_per_req: server CPU per request):"
python3 scripts/ratios.py "$results" two one distinct hot
rm -f "$results"

echo
echo "memory store alone and governor's keyed limiter, time per decision with 1 and 2 threads (criterion medians):"
cargo bench --bench decisions -- 'memory_store/check|governor_keyed/check' 2>/dev/null | grep -E '^(memory_store|governor_keyed)|time:' | paste - - |
  sed 's/ \+/ /g'
