#!/usr/bin/env bash
# End-to-end gRPC benchmark: cellrate against the constant-answer baseline server (the
# physical limit of tonic + tokio on this machine), alternating A B A B in one run.
#
#   scripts/bench-grpc.sh [rounds] [seconds]
#
# Scenarios (ShouldRateLimit unless noted; loadgen on one thread, 4 connections x 64
# streams for saturation, 1 x 1 for latency):
#   hot       one key, every request allowed
#   distinct  100 000 keys in turn, allowed
#   denied    one key, every request denied
#   check     the native Check, one key, allowed
#   latency   one stream, hot key: p50/p99 of a lone caller
# Prints requests/s, p50/p99 latency (µs), server CPU µs per request and RSS, per round,
# then the min-max over rounds of each cellrate/baseline ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-5}

cargo build --profile release-lto --quiet --bin cellrate --example baseline --example loadgen
bin=target/release-lto
. scripts/bench-lib.sh

base_port=$(free_port)
"$bin/examples/baseline" "127.0.0.1:$base_port" 2>/dev/null &
base_pid=$!
cr_port=$(free_port)
"$bin/cellrate" serve --listen "127.0.0.1:$cr_port" --admin-listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 &
cr_pid=$!
trap 'kill $base_pid $cr_pid 2>/dev/null' EXIT
sleep 1

run() { # target scenario -> loadgen output
  local port pid rpc scenario conns streams
  if [ "$1" = baseline ]; then port=$base_port; pid=$base_pid; else port=$cr_port; pid=$cr_pid; fi
  rpc=envoy; scenario=$2; conns=4; streams=64
  case $2 in
    check) rpc=check; scenario=hot ;;
    latency) scenario=hot; conns=1; streams=1 ;;
  esac
  "$bin/examples/loadgen" "127.0.0.1:$port" "$rpc" "$scenario" "$conns" "$streams" "$seconds" "$pid"
}

results=$(mktemp)
header
for round in $(seq "$rounds"); do
  for scenario in hot distinct denied check latency; do
    for target in baseline cellrate; do
      out=$(run "$target" "$scenario")
      row "$round" "$scenario" "$target" "$out" "$results"
    done
  done
done

echo
echo "cellrate / baseline, min - max over $rounds rounds:"
python3 scripts/ratios.py "$results" cellrate baseline hot distinct denied check latency
rm -f "$results"
