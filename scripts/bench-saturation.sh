#!/usr/bin/env bash
# Past saturation: what cellrate does when offered several times the load it can answer.
#
#   scripts/bench-saturation.sh [seconds] [multiple]      (defaults: 10 s, 4x)
#
# 1. cellrate alone (memory store, benches/grpc/limits), ShouldRateLimit on one key limited
#    to 1 000 a second with a burst of 1 000 (BenchSaturate), driven by loadgen:
#    capacity   closed loop, 4 connections x 64 streams: the most it answers (C req/s);
#    reference  open loop at C/2 over 16 x 16 streams: latency unsaturated;
#    saturated  open loop at `multiple` x C over 64 connections x 100 streams (6 400 at
#               once, above --max-in-flight's 4 096): every request is sent when due
#               whether or not earlier ones were answered, and its latency counts from then.
#    Reported: answers by grpc-status (0 answered, 14 UNAVAILABLE "overloaded" shed at
#    once, 4 DEADLINE_EXCEEDED, `none` a stream reset), latency of the answered against
#    the reference, the server's peak RSS against the documented budget, and exactness:
#    the decisions cellrate allowed on the key over the whole run (its metric) against the
#    most the limit admits in that time (1 000 + 1 000 a second).
# 2. Behind the real Envoy (examples/envoy/envoy.yaml as the end-to-end tests render it,
#    one worker, RLS timeout 100 ms, failure_mode_deny): h2load on /orders for account 3
#    (1 000 a second, burst 1 000), 4 x 8 streams (reference) and 64 x 100 (saturated).
#    Reported: 200/429/503 counts, latency, and the 200s against the most the limit admits.
# Each phase runs once per round, side by side; PROFILE picks the build (default
# release-lto, what the image ships).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
multiple=${2:-4}
profile=${PROFILE:-release-lto}

source scripts/envoy-lib.sh
envoy_tools
cargo build --profile "$profile" --quiet --bin cellrate --example loadgen
bin=target/$profile
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" | head -1; }

# The memory budget of requests being handled (docs/operations.md): --max-in-flight x
# (64 KiB + a few KiB), beside the process's own ~30 MiB.
budget_kib=$(((4096 * 68 + 30 * 1024)))

# --- 1. cellrate alone -------------------------------------------------------------------
port=$(free_port); mport=$(free_port)
"$bin/cellrate" serve --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 \
  --metrics-listen "127.0.0.1:$mport" --config benches/grpc/limits >"$work/alone.log" 2>&1 &
pid=$!; pids+=("$pid")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null && break; sleep 0.1; done
allowed() {
  curl -s "http://127.0.0.1:$1/metrics" \
    | sed -n "s/^cellrate_decisions_total{api=\"envoy\",limit=\"$2\",result=\"allowed\"} //p"
}

started=$(date +%s.%N)
capacity=$("$bin/examples/loadgen" "127.0.0.1:$port" envoy saturate 4 64 "$seconds" "$pid" | tr '\n' ' ')
rps=$(echo "$capacity" | field rps)
echo "alone capacity   $capacity"
reference=$(LOADGEN_OPEN=1 "$bin/examples/loadgen" "127.0.0.1:$port" envoy saturate 16 16 \
  "$seconds" "$pid" "$((rps / 2))" | tr '\n' ' ')
echo "alone reference  $reference (offered $((rps / 2))/s)"
offered=$((rps * multiple))
saturated=$(LOADGEN_OPEN=1 "$bin/examples/loadgen" "127.0.0.1:$port" envoy saturate 64 100 \
  "$seconds" "$pid" "$offered" | tr '\n' ' ')
echo "alone saturated  $saturated (offered $offered/s)"
ended=$(date +%s.%N)
admitted=$(allowed "$mport" BenchSaturate)
echo "alone exactness  allowed=$admitted most=$("$py" -c "import math; print(1000 + math.ceil(1000 * ($ended - $started)))")"
echo "alone memory     max_rss_kib=$(echo "$saturated" | field max_rss_kib) budget_kib=$budget_kib"
kill "$pid"

# --- 2. behind Envoy ---------------------------------------------------------------------
cr_port=$(free_port); cr_metrics=$(free_port)
"$bin/cellrate" serve --listen "127.0.0.1:$cr_port" --admin-listen 127.0.0.1:0 \
  --metrics-listen "127.0.0.1:$cr_metrics" --config benches/envoy/limits >"$work/cellrate.log" 2>&1 &
cr_pid=$!; pids+=("$cr_pid")
start_envoy cellrate "$cr_port" examples/envoy/envoy.yaml
envoy_port=$ENVOY_PORT; envoy_admin=$ENVOY_ADMIN

# h2load C M -> codes and latency of one run of `seconds` on account 3
h2() {
  local log="$work/h2load-$1-$2.log" out
  rm -f "$log"
  out=$(h2load -c "$1" -m "$2" -D "$seconds" -H "x-account-id: 3" --log-file "$log" \
    "http://127.0.0.1:$envoy_port/orders" 2>&1)
  h2load_summary "$log" "$out"
}
started=$(date +%s.%N)
reference=$(h2 4 8)
echo "envoy reference  $reference"
saturated=$(h2 64 100)
echo "envoy saturated  $saturated"
ended=$(date +%s.%N)
ok=$(($(echo "$reference" | field s200) + $(echo "$saturated" | field s200)))
echo "envoy exactness  admitted=$ok most=$("$py" -c "import math; print(1000 + math.ceil(1000 * ($ended - $started)))") cellrate_allowed=$(allowed "$cr_metrics" NewOrdersPerAccount)"
echo "envoy rls        $(curl -s "http://$envoy_admin/stats?filter=cluster\.backend\.ratelimit\.|cluster\.cellrate\.upstream_rq_(timeout|time)" | tr '\n' ' ')"
echo "envoy memory     cellrate_max_rss_kib=$(awk '/VmHWM/ {print $2}' "/proc/$cr_pid/status") budget_kib=$budget_kib"
