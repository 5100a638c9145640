#!/usr/bin/env bash
# What RLQS saves (#37 goal 6): the same Envoy traffic, one account at a limit of 1000/s
# (benches/rlqs/limits), through two real Envoys, each on a cellrate of its own:
#   rls   examples/envoy/envoy.yaml, the ratelimit filter: one ShouldRateLimit per request
#   rlqs  examples/envoy/rlqs.yaml, the rate_limit_quota filter: a report per bucket every 5 s
# h2load drives each in turn (4 connections x 4 streams, `/orders`, `x-account-id: 7`);
# the server's CPU (utime+stime from /proc, in clock ticks: 10 ms, so the windows are long)
# over the measured window is divided by the requests Envoy admitted (2xx).
#
#   scripts/bench-rlqs-cost.sh [rounds] [seconds]     (default 3 rounds of 30 s)
#
# Prints, per round and filter: requests, admitted, limited, server CPU (ms) and µs per
# admitted request; then the ratio rls / rlqs of CPU per admitted request per round (a
# bound when the RLQS side spent less than one tick).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-30}

source scripts/envoy-lib.sh
envoy_bench_start
. scripts/bench-lib.sh

# start_cellrate NAME: sets CR_PORT and CR_PID.
start_cellrate() {
  CR_PORT=$(free_port)
  "$bin/cellrate" serve --listen "127.0.0.1:$CR_PORT" --admin-listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --config benches/rlqs/limits >"$work/cellrate-$1.log" 2>&1 &
  CR_PID=$!; pids+=("$CR_PID")
  for _ in $(seq 200); do
    grep -q "cellrate serving" "$work/cellrate-$1.log" 2>/dev/null && break
    sleep 0.05
  done
}

# cpu_ns PID: CPU time of PID so far, in ns (utime+stime; per-thread schedstat undercounts
# threads that run without being switched out).
tick_ns=$((1000000000 / $(getconf CLK_TCK)))
cpu_ns() { echo $(( $(awk '{ print $14 + $15 }' /proc/"$1"/stat) * tick_ns )); }

declare -A server port
for filter in rls rlqs; do
  start_cellrate "$filter"; server[$filter]=$CR_PID
  example=examples/envoy/envoy.yaml; [ "$filter" = rlqs ] && example=examples/envoy/rlqs.yaml
  start_envoy "$filter" "$CR_PORT" "$example"; port[$filter]=$ENVOY_PORT
done

load() { # filter seconds out
  h2load -c 4 -m 4 -D "$2" -H "x-account-id: 7" "http://127.0.0.1:${port[$1]}/orders" >"$3" 2>&1
}
echo "warming up each Envoy 6 s (RLQS reports every 5 s)" >&2
for filter in rls rlqs; do load "$filter" 6 "$work/warm"; done

results="$work/results"
printf '%-6s %-5s %9s %9s %9s %9s %14s\n' round filter requests admitted limited cpu_ms cpu_us/admitted
for round in $(seq "$rounds"); do
  for filter in rls rlqs; do
    before=$(cpu_ns "${server[$filter]}")
    load "$filter" "$seconds" "$work/run"
    after=$(cpu_ns "${server[$filter]}")
    "$py" - "$work/run" "$before" "$after" "$round" "$filter" <<'PY' | tee -a "$results"
import re, sys
path, before, after, rnd, flt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
m = re.search(r'status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx', open(path).read())
ok, limited = int(m.group(1)), int(m.group(3))
cpu = after - before
print(f"{rnd:6s} {flt:5s} {ok + limited:9d} {ok:9d} {limited:9d} {cpu / 1e6:9.1f} {cpu / 1e3 / max(ok, 1):14.3f}")
PY
  done
done
"$py" - "$results" "$tick_ns" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    rnd, flt, requests, admitted, limited, cpu_ms, per = line.split()
    rows.setdefault(rnd, {})[flt] = (float(per), int(admitted))
tick_us = int(sys.argv[2]) / 1e3
parts = []
for rnd, r in sorted(rows.items()):
    if 'rls' not in r or 'rlqs' not in r:
        continue
    if r['rlqs'][0] > 0:
        parts.append(f"{r['rls'][0] / r['rlqs'][0]:.0f}x")
    else:  # under one tick: bounded by one tick's worth
        parts.append(f">{r['rls'][0] / (tick_us / max(r['rlqs'][1], 1)):.0f}x")
print(f"\nserver CPU per admitted request, rls / rlqs, per round: {' '.join(parts)}")
PY
