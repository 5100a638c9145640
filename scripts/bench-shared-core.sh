#!/usr/bin/env bash
# Where a server's cycles go when it shares its cores with the load (#62 goal 3): the
# servers unpinned, the load generator beside them, and per request besides CPU time the
# server's context switches (voluntary: a worker parked for want of work and woken again;
# involuntary: a worker preempted by the load generator or another worker), read from
# /proc/PID/task/*/status around each run.
#
#   scripts/bench-shared-core.sh [rounds] [seconds] [scenarios]
#                                          (default 3, 5, "ip hot"; limitador if built)
#
# Servers: baseline (benches/grpc/baseline.rs `shaped`), cellrate (two tokio workers, as on
# a 2-core machine by default), cellrate-1 (one worker: TOKIO_WORKER_THREADS=1) and
# limitador (target/peers/limitador, built by scripts/bench-peers.sh; left out if absent).
# Prints one row per run, then per server the medians of CPU and switches per request.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-5}
scenarios=${3:-ip hot}
limitador=target/peers/limitador/target/release/limitador-server
cargo build --profile release-lto --quiet --bin cellrate --example baseline --example loadgen
bin=target/release-lto
. scripts/bench-lib.sh
work=$(mktemp -d)
side_by_side
start() { # name
  local p; p=$(free_port)
  case $1 in
    baseline) "$bin/examples/baseline" "127.0.0.1:$p" shaped 2>/dev/null & ;;
    cellrate) "$bin/cellrate" serve --listen "127.0.0.1:$p" --admin-listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 & ;;
    cellrate-1) TOKIO_WORKER_THREADS=1 "$bin/cellrate" serve --listen "127.0.0.1:$p" \
      --admin-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --config benches/grpc/limits \
      >/dev/null 2>&1 & ;;
    limitador) "$limitador" -b 127.0.0.1 -p "$p" -B 127.0.0.1 -P "$(free_port)" \
      benches/grpc/limitador.yaml memory >/dev/null 2>&1 & ;;
  esac
  pid[$1]=$!; port[$1]=$p
}
servers="baseline cellrate cellrate-1"
[ -x "$limitador" ] && servers="$servers limitador"
for name in $servers; do start "$name"; done
sleep 1

# switches PID: voluntary and involuntary context switches so far, over its threads.
switches() {
  cat /proc/"$1"/task/*/status | awk '/^voluntary_ctxt_switches/ {v += $2}
    /^nonvoluntary_ctxt_switches/ {n += $2} END {printf "%.0f %.0f\n", v, n}'
}

results="$work/results"
printf '%-6s %-9s %-11s %10s %11s %11s %11s\n' round scenario server req/s cpu_us/req vol/req invol/req
for round in $(seq "$rounds"); do
  for scenario in $scenarios; do
    for name in $servers; do
      read -r v0 n0 < <(switches "${pid[$name]}")
      out=$("$bin/examples/loadgen" "127.0.0.1:${port[$name]}" envoy "$scenario" 4 64 "$seconds" "${pid[$name]}")
      read -r v1 n1 < <(switches "${pid[$name]}")
      rps=$(echo "$out" | field rps)
      cpu=$(echo "$out" | field cpu_us_per_req)
      python3 -c "
n = $rps * $seconds
print(f'%-6s %-9s %-11s %10s %11s %11.3f %11.3f' % ('$round', '$scenario', '$name', '$rps', '$cpu', ($v1 - $v0) / n, ($n1 - $n0) / n))" |
        tee -a "$results"
    done
  done
done

echo
echo "medians over $rounds rounds:"
python3 - "$results" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    _, scenario, server, rps, cpu, vol, invol = line.split()
    rows.setdefault((scenario, server), []).append((float(cpu), float(vol), float(invol)))
for (scenario, server), values in sorted(rows.items()):
    cpu, vol, invol = (statistics.median(v[i] for v in values) for i in range(3))
    print(f"  {scenario:9s} {server:11s} cpu_us/req {cpu:6.2f}  voluntary/req {vol:.3f}  involuntary/req {invol:.3f}")
EOF
