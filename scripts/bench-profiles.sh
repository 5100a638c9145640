#!/usr/bin/env bash
# The two build profiles side by side: cellrate built with `release` (the quick start's:
# cargo's defaults) and with `release-lto` (fat LTO, one codegen unit: images and
# benchmarks), the same load on each in turn (A B A B), one run.
#
#   scripts/bench-profiles.sh [rounds] [seconds]
#
# Scenarios as in scripts/bench-grpc.sh: `hot` (ShouldRateLimit, one key, 4 connections x
# 64 streams) and `latency` (one stream). Prints req/s, p50/p99 and server CPU µs per
# request per run, then the release / release-lto ratios (min-max over rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-4}

cargo build --release --quiet --bin cellrate
cargo build --profile release-lto --quiet --bin cellrate --example loadgen
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
declare -A port pid
for profile in release release-lto; do
  port[$profile]=$(free_port)
  "target/$profile/cellrate" serve --listen "127.0.0.1:${port[$profile]}" --admin-listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 &
  pid[$profile]=$!
  pids+=("$!")
done
sleep 1

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
results=$(mktemp)
printf '%-6s %-8s %-12s %10s %8s %8s %12s\n' round scenario profile req/s p50_us p99_us cpu_us/req
for round in $(seq "$rounds"); do
  for scenario in hot latency; do
    conns=4; streams=64
    [ "$scenario" = latency ] && conns=1 && streams=1
    for profile in release release-lto; do
      out=$(target/release-lto/examples/loadgen "127.0.0.1:${port[$profile]}" envoy hot \
        "$conns" "$streams" "$seconds" "${pid[$profile]}")
      printf '%-6s %-8s %-12s %10s %8s %8s %12s\n' "$round" "$scenario" "$profile" \
        "$(echo "$out" | field rps)" "$(echo "$out" | field p50_us)" \
        "$(echo "$out" | field p99_us)" "$(echo "$out" | field cpu_us_per_req)"
      echo "$round $scenario $profile $out" >>"$results"
    done
  done
done

echo
echo "release / release-lto, min - max over $rounds rounds:"
python3 scripts/ratios.py "$results" release release-lto hot latency
rm -f "$results"
