#!/usr/bin/env bash
# Envoy in the loop: HTTP load (h2load) through a real Envoy running examples/envoy/envoy.yaml
# (rendered with only addresses, ports and the backend changed, as in the end-to-end tests),
# interleaved in one run:
#
#   none      GET /              a route without rate_limits (Envoy alone)
#   allowed   GET /orders        cellrate answers OK      (x-account-id: 1, never denied)
#   denied    GET /orders        cellrate answers OVER    (x-account-id: 2, denied after one)
#   baseline  GET /orders        the constant-answer RLS server (benches/grpc/baseline.rs)
#
# then the same at one stream (latency). Two Envoys (one per RLS server), one worker thread
# each; cellrate serves benches/envoy/limits on the memory store.
#
#   scripts/bench-envoy.sh [rounds] [seconds] [connections] [streams]
#
# Prints per run: req/s, 2xx/429/5xx, p50/p99 of the requests (µs, from h2load's log), CPU
# µs per request of Envoy and of the RLS server (utime+stime from /proc), then ratios
# (min-max over rounds), and Envoy's own view of the RLS calls (upstream_rq_time percentiles,
# ratelimit.error) at the example's timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-5}
conns=${3:-8}
streams=${4:-8}

source scripts/envoy-lib.sh
envoy_tools
cargo build --profile release-lto --quiet --bin cellrate --example baseline
bin=target/release-lto
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cr_port=$(free_port)
"$bin/cellrate" serve --listen "127.0.0.1:$cr_port" --admin-listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --config benches/envoy/limits >"$work/cellrate.log" 2>&1 &
cr_pid=$!; pids+=("$cr_pid")
base_port=$(free_port)
"$bin/examples/baseline" "127.0.0.1:$base_port" 2>/dev/null &
base_pid=$!; pids+=("$base_pid")

start_envoy cellrate "$cr_port" examples/envoy/envoy.yaml; cr_envoy_pid=$ENVOY_PID; cr_envoy_port=$ENVOY_PORT; cr_envoy_admin=$ENVOY_ADMIN
start_envoy baseline "$base_port" examples/envoy/envoy.yaml; base_envoy_pid=$ENVOY_PID; base_envoy_port=$ENVOY_PORT; base_envoy_admin=$ENVOY_ADMIN

ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)

# run SCENARIO CONNS STREAMS -> one line of key=value
run() {
  local scenario=$1 c=$2 m=$3 port path header rls_pid envoy_pid
  case $scenario in
    none) port=$cr_envoy_port; path=/; header="x-account-id: 1"; envoy_pid=$cr_envoy_pid; rls_pid=$cr_pid ;;
    allowed) port=$cr_envoy_port; path=/orders; header="x-account-id: 1"; envoy_pid=$cr_envoy_pid; rls_pid=$cr_pid ;;
    denied) port=$cr_envoy_port; path=/orders; header="x-account-id: 2"; envoy_pid=$cr_envoy_pid; rls_pid=$cr_pid ;;
    baseline) port=$base_envoy_port; path=/orders; header="x-account-id: 1"; envoy_pid=$base_envoy_pid; rls_pid=$base_pid ;;
  esac
  # One second of warm-up, unmeasured.
  h2load -c "$c" -m "$m" -D 1 -H "$header" "http://127.0.0.1:$port$path" >/dev/null 2>&1
  local e0 r0 e1 r1 out log="$work/h2load.log"
  rm -f "$log" # h2load appends to it
  e0=$(ticks "$envoy_pid"); r0=$(ticks "$rls_pid")
  out=$(h2load -c "$c" -m "$m" -D "$seconds" -H "$header" --log-file "$log" "http://127.0.0.1:$port$path" 2>&1)
  e1=$(ticks "$envoy_pid"); r1=$(ticks "$rls_pid")
  local sum
  sum=$(h2load_summary "$log" "$out")
  "$py" - "$sum" "$e0" "$e1" "$r0" "$r1" "$hz" "$scenario" <<'PY'
import sys
sum, e0, e1, r0, r1, hz, scenario = sys.argv[1], *map(int, sys.argv[2:7]), sys.argv[7]
f = dict(kv.split('=') for kv in sum.split())
n = int(f['n'])
us = lambda t0, t1: (t1 - t0) * 1e6 / hz / n if n else 0
rls_cpu = us(r0, r1) if scenario != 'none' else 0
ok, over = int(f['s200']), int(f['s429'])
print(f"rps={f['rps']} ok={ok} over={over} other={n - ok - over} p50_us={f['p50_us']} "
      f"p99_us={f['p99_us']} envoy_cpu_us={us(e0, e1):.1f} rls_cpu_us={rls_cpu:.1f}")
PY
}

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
results="$work/results"
printf '%-5s %-8s %-9s %9s %8s %6s %6s %8s %8s %10s %10s\n' round load scenario req/s 2xx 429 other p50_us p99_us envoy_cpu rls_cpu
for round in $(seq "$rounds"); do
  for load in saturated one-stream; do
    if [ "$load" = saturated ]; then c=$conns; m=$streams; else c=1; m=1; fi
    for scenario in none allowed denied baseline; do
      out=$(run "$scenario" "$c" "$m")
      printf '%-5s %-8s %-9s %9s %8s %6s %6s %8s %8s %10s %10s\n' "$round" "${load:0:8}" "$scenario" \
        "$(echo "$out" | field rps)" "$(echo "$out" | field ok)" "$(echo "$out" | field over)" \
        "$(echo "$out" | field other)" "$(echo "$out" | field p50_us)" "$(echo "$out" | field p99_us)" \
        "$(echo "$out" | field envoy_cpu_us)" "$(echo "$out" | field rls_cpu_us)"
      echo "$round $load $scenario $out" >>"$results"
    done
  done
done

echo
echo "ratios, min - max over $rounds rounds:"
"$py" - "$results" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    r, load, scenario, rest = line.split(' ', 3)
    rows[(r, load, scenario)] = {k: float(v) for k, v in (kv.split('=') for kv in rest.split())}
def ratio(load, a, b, key):
    v = [rows[(r, load, a)][key] / rows[(r, load, b)][key]
         for (r, l, s) in rows if l == load and s == a and rows[(r, load, b)][key] > 0]
    return f"{min(v):.2f}-{max(v):.2f}" if v else "n/a"
for load in ('saturated', 'one-stream'):
    print(f"  {load}:")
    print(f"    RLS CPU per request, cellrate allowed / baseline   {ratio(load, 'allowed', 'baseline', 'rls_cpu_us')}")
    print(f"    RLS CPU per request, cellrate denied / baseline    {ratio(load, 'denied', 'baseline', 'rls_cpu_us')}")
    print(f"    req/s, allowed / baseline                          {ratio(load, 'allowed', 'baseline', 'rps')}")
    print(f"    req/s, denied / baseline                           {ratio(load, 'denied', 'baseline', 'rps')}")
    print(f"    req/s, baseline / no rate limit                    {ratio(load, 'baseline', 'none', 'rps')}")
    print(f"    p50, allowed / baseline                            {ratio(load, 'allowed', 'baseline', 'p50_us')}")
    print(f"    p99, allowed / baseline                            {ratio(load, 'allowed', 'baseline', 'p99_us')}")
    print(f"    Envoy CPU per request, allowed / baseline          {ratio(load, 'allowed', 'baseline', 'envoy_cpu_us')}")
    print(f"    Envoy CPU per request, baseline / no rate limit    {ratio(load, 'baseline', 'none', 'envoy_cpu_us')}")
PY

echo
echo "Envoy's view of the RLS calls (cluster cellrate, timeout as in the example):"
for side in cellrate baseline; do
  if [ $side = cellrate ]; then admin=$cr_envoy_admin; else admin=$base_envoy_admin; fi
  echo "  $side:"
  curl -s "http://$admin/stats?filter=cluster\.cellrate\.upstream_rq_time" | sed 's/^/    /'
  curl -s "http://$admin/stats?filter=cluster\.backend\.ratelimit\." | sed 's/^/    /'
done
