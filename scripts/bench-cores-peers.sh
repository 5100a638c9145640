#!/usr/bin/env bash
# Scaling across cores beside the peers, one run (#62 goal 4): each server with one and
# with two runtime threads (TOKIO_WORKER_THREADS), on one hot key and on 100 000 distinct
# keys, in turn within each round:
#   cellrate-1, cellrate-2   cellrate's Envoy RLS (memory store)
#   limitador                limitador-server as it ships (its gRPC runs on actix's one
#                            runtime thread: there is no second thread to give it)
#   check-1, check-2         cellrate's native `Check`
#   crab-1, crab-2           throttlecrab-server 0.4.40's gRPC `Throttle` (one actor task
#                            owns its store: every decision goes through it)
#
#   scripts/bench-cores-peers.sh [rounds] [seconds]        (default 3 rounds of 5 s)
#
# Nothing is pinned: a two-thread server needs both cores, and the load generator (one
# thread, 4 connections x 64 streams) shares them, so requests per second cannot show what
# two free cores would give. What is measured is each server's CPU per request (its
# inverse is decisions per CPU-second: equal at one and two threads means two free cores
# decide twice as much; higher at two threads is work lost to contention, the shard lock
# on one hot key among it) and how its CPU splits over its threads (`busiest`: the share
# of the busiest thread, from /proc/PID/task/*/schedstat in ns; a server whose busiest
# thread does nearly all the work cannot use a second core).
#
# Builds: limitador as scripts/bench-peers.sh does (LIMITADOR_SRC, about 40 min the first
# time on 2 cores), throttlecrab as scripts/bench-peers-native.sh does (about 3 min).
# Prints one row per run, then per server two threads / one and hot / distinct.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
seconds=${2:-5}
peers=$PWD/target/peers

limitador=$peers/limitador/target/release/limitador-server
if [ ! -x "$limitador" ]; then
  echo "limitador is not built: run scripts/bench-peers.sh once (it builds it into $peers)" >&2
  exit 1
fi
cargo build --profile release-lto --quiet --bin cellrate --example loadgen
bin=target/release-lto
. scripts/bench-lib.sh
crab=$(throttlecrab_server)
work=$(mktemp -d)

side_by_side
declare -A rpc=([check-1]=check [check-2]=check [crab-1]=throttlecrab [crab-2]=throttlecrab)
start() { # name: starts a server with no buckets
  local p threads=${1##*-}; p=$(free_port)
  [ "$threads" = limitador ] && threads=1
  case $1 in
    cellrate-* | check-*) TOKIO_WORKER_THREADS=$threads "$bin/cellrate" serve --listen "127.0.0.1:$p" \
      --admin-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 & ;;
    limitador) "$limitador" -b 127.0.0.1 -p "$p" -B 127.0.0.1 -P "$(free_port)" \
      benches/grpc/limitador.yaml memory >/dev/null 2>&1 & ;;
    crab-*) TOKIO_WORKER_THREADS=$threads "$crab" --grpc --grpc-host 127.0.0.1 --grpc-port "$p" \
      --log-level error >/dev/null 2>&1 & ;;
  esac
  pid[$1]=$!; port[$1]=$p
}
servers="cellrate-1 cellrate-2 limitador check-1 check-2 crab-1 crab-2"
for name in $servers; do start "$name"; done
sleep 1

# thread_ns PID: "total busiest" ns on CPU over the process's threads.
thread_ns() {
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{t += $1; if ($1 > m) m = $1} END {print t, m}'
}

results="$work/results"
printf '%-6s %-9s %-11s %10s %12s %8s\n' round scenario server req/s cpu_us/req busiest
for round in $(seq "$rounds"); do
  for scenario in hot distinct; do
    for target in $servers; do
      # Per-thread CPU over the run alone: each thread's ns before and after.
      declare -A before=()
      for task in /proc/"${pid[$target]}"/task/*; do
        before[${task##*/}]=$(awk '{print $1}' "$task/schedstat" 2>/dev/null || echo 0)
      done
      out=$("$bin/examples/loadgen" "127.0.0.1:${port[$target]}" "${rpc[$target]:-envoy}" \
        "$scenario" 4 64 "$seconds" "${pid[$target]}")
      split=$(for task in /proc/"${pid[$target]}"/task/*; do
        now=$(awk '{print $1}' "$task/schedstat" 2>/dev/null || echo 0)
        echo $((now - ${before[${task##*/}]:-0}))
      done | awk '{t += $1; if ($1 > m) m = $1} END {if (t > 0) printf "%.2f", m / t; else print 0}')
      unset before
      printf '%-6s %-9s %-11s %10s %12s %8s\n' "$round" "$scenario" "$target" \
        "$(echo "$out" | field rps)" "$(echo "$out" | field cpu_us_per_req)" "$split"
      echo "$round $scenario $target $out busiest=$split" >> "$results"
    done
  done
done

echo
for pair in "cellrate-2 cellrate-1" "check-2 check-1" "crab-2 crab-1" "limitador cellrate-1" \
  "limitador cellrate-2" "crab-1 check-1" "crab-2 check-2"; do
  set -- $pair
  echo "$1 / $2, min - max [median] over $rounds rounds:"
  python3 scripts/ratios.py "$results" "$1" "$2" hot distinct
done
echo
echo "hot / distinct, CPU per request (the cost of one key shared by every stream):"
python3 - "$results" <<'EOF'
import sys, re, statistics
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    cpu = re.search(r"cpu_us_per_req=([0-9.]+)", line)
    if cpu:
        rows.setdefault((f[2], f[1]), []).append(float(cpu.group(1)))
for server in sorted({s for s, _ in rows}):
    hot, distinct = rows.get((server, "hot")), rows.get((server, "distinct"))
    if hot and distinct:
        print(f"  {server:11s} {statistics.median(hot) / statistics.median(distinct):.2f}")
EOF
