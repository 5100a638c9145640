#!/usr/bin/env bash
# Envoy RLQS under load: two real Envoys running examples/envoy/rlqs.yaml (the
# rate_limit_quota filter), driven by h2load for one account whose limit is 1000/s (burst
# 1000, benches/rlqs/limits): Envoy A as fast as 4 connections go, Envoy B at 200 requests a
# second. Both Envoys on one cellrate (mode `one`), or each on its own cellrate replica, the
# two sharing a redis-server started here (mode `redis`).
#
#   scripts/bench-rlqs.sh [one|redis] [seconds]
#
# After a 12 s warm-up (Envoy 1.40 reports every 5 s), prints for the measured window: the
# requests each Envoy admitted and limited, the total admitted against the limit (rate x T +
# burst), the share of the limit used, and each Envoy's admitted rate against its fair share
# (B its demand, A the rest).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-one}
seconds=${2:-30}
rate=1000
burst=1000
light=200

source scripts/envoy-lib.sh
envoy_bench_start
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_cellrate EXTRA...: sets CR_PORT.
start_cellrate() {
  CR_PORT=$(free_port)
  "$bin/cellrate" serve --listen "127.0.0.1:$CR_PORT" --admin-listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --config benches/rlqs/limits "$@" >"$work/cellrate-$CR_PORT.log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 200); do
    grep -q "cellrate serving" "$work/cellrate-$CR_PORT.log" 2>/dev/null && break
    sleep 0.05
  done
}
case $mode in
  one)
    start_cellrate; rls_a=$CR_PORT; rls_b=$CR_PORT ;;
  redis)
    command -v redis-server >/dev/null || { echo "redis-server is needed for mode redis" >&2; exit 1; }
    redis_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
    pids+=("$!")
    sleep 0.3
    redis=(--store redis --redis-url "redis://127.0.0.1:$redis_port" --redis-timeout-ms 100)
    start_cellrate "${redis[@]}"; rls_a=$CR_PORT
    start_cellrate "${redis[@]}"; rls_b=$CR_PORT ;;
  *) echo "mode: one or redis" >&2; exit 64 ;;
esac

start_envoy a "$rls_a" examples/envoy/rlqs.yaml; port_a=$ENVOY_PORT
start_envoy b "$rls_b" examples/envoy/rlqs.yaml; port_b=$ENVOY_PORT

# load SECONDS OUT: both Envoys at once; h2load's summaries in OUT.a and OUT.b.
load() {
  h2load -c 4 -m 4 -D "$1" -H "x-account-id: 7" "http://127.0.0.1:$port_a/" >"$2.a" 2>&1 &
  local pa=$!
  h2load -c 1 -m 1 --rps "$light" -D "$1" -H "x-account-id: 7" "http://127.0.0.1:$port_b/" >"$2.b" 2>&1 &
  local pb=$!
  wait "$pa" "$pb"
}
echo "mode $mode: warming up 12 s, then $seconds s measured" >&2
load 12 "$work/warm"
load "$seconds" "$work/run"
"$py" - "$work/run" "$seconds" "$rate" "$burst" "$light" "$mode" <<'PY'
import re, sys
run, seconds, rate, burst, light, mode = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
def codes(path):
    text = open(path).read()
    m = re.search(r'status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx', text)
    return int(m.group(1)), int(m.group(3))
(a_ok, a_429), (b_ok, b_429) = codes(run + '.a'), codes(run + '.b')
total = a_ok + b_ok
ceiling = rate * seconds + burst
b_asked = b_ok + b_429
fair_b = min(b_asked / seconds, light)
fair_a = rate - fair_b
print(f"mode={mode} seconds={seconds} limit={rate}/s burst={burst}")
print(f"  A admitted {a_ok} ({a_ok / seconds:.0f}/s), limited {a_429}")
print(f"  B admitted {b_ok} ({b_ok / seconds:.0f}/s) of {b_asked} asked, limited {b_429}")
print(f"  total admitted {total}: {total / (rate * seconds):.3f} of rate x T; ceiling rate x T + burst = {ceiling}, "
      f"overshoot {max(0, total - ceiling)}")
print(f"  A {a_ok / seconds / fair_a:.3f} of its fair share ({fair_a:.0f}/s), "
      f"B {b_ok / seconds / fair_b:.3f} of its fair share ({fair_b:.0f}/s)")
PY
