#!/usr/bin/env bash
# The Redis protocol side by side, one run (#62): four servers answer the same load from
# redis-benchmark, taking turns within each round (A B C D A B C D):
#   floor         benches/resp/floor.rs: cellrate's RESP parser and a constant answer, no
#                 decision (the floor of this protocol on this stack)
#   cellrate      cellrate's Redis-protocol listener, memory store, `CL.THROTTLE`
#   redis-cell    redis-server (Debian's) with redis-cell 0.2.2 loaded, `CL.THROTTLE`
#                 (built from crates.io as the differential tests build it: target/redis-cell)
#   throttlecrab  throttlecrab-server 0.4.40 (crates.io, `cargo install --locked` into
#                 target/peers/throttlecrab), its RESP transport, `THROTTLE` with the same
#                 parameters (key, burst, count per period, period)
#
#   scripts/bench-peers-resp.sh [rounds] [requests] [clients] [pipelines]
#                                                    (default 5, 300 000, 50, "1 16")
# Each scenario is run at each pipeline depth (redis-benchmark -P): 1, as throttlecrab's
# own benchmark runs, and 16, as a busy client pipelines (throttlecrab writes each answer
# on its own without TCP_NODELAY, so that its pipelined answers wait on Nagle's
# algorithm: a property of the server, reported as measured).
# Scenarios: hot (one key, never denied: burst 999 999 (cellrate's bound on a caller-given
# burst) and 10^9 a second), distinct (100 000
# keys at random, 100 a second each), denied (one key, burst 1, one an hour: all but the first two
# denied). BENCH_PIN=1 runs the servers on CPU 0 and redis-benchmark on CPU 1 (taskset).
# CELLRATE_BIN=<binary> runs that cellrate instead of target/release-lto's (the
# profile-guided one of scripts/build-pgo.sh: target/pgo-use/release-lto/cellrate).
# Prints requests/s, p50/p99 (redis-benchmark's, in µs), server CPU per call (the
# server's threads' run time from /proc/PID/task/*/schedstat, in ns, over the whole run
# of `requests` calls, five times as many pipelined) and RSS, then the
# min-max and median of each server over the floor and each peer over cellrate, then RSS
# per live key after 3 000 000 calls over 10^6 keys kept an hour (about 950 000 live).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
requests=${2:-300000}
clients=${3:-50}
pipelines=${4:-1 16}
peers=$PWD/target/peers

module=target/redis-cell/target/release/libredis_cell.so
if [ ! -f "$module" ]; then
  echo "building redis-cell (the differential test's harness builds the same)"
  cargo test --quiet --all-features --test full resp_differential::cl_throttle_answers_as_redis_cell_on_the_memory_store >/dev/null
fi
cargo build --profile release-lto --quiet --bin cellrate --example resp_floor
bin=target/release-lto
. scripts/bench-lib.sh
crab=$(throttlecrab_server)
work=$(mktemp -d)

side_by_side
start() { # name: (re)starts a server with no buckets
  local p; p=$(free_port)
  case $1 in
    floor) "${pin_server[@]}" "$bin/examples/resp_floor" "127.0.0.1:$p" 2>/dev/null & ;;
    cellrate) "${pin_server[@]}" "${CELLRATE_BIN:-$bin/cellrate}" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --resp-listen "127.0.0.1:$p" --config config/ >/dev/null 2>&1 & ;;
    redis-cell) mkdir -p "$work/redis"; "${pin_server[@]}" redis-server --port "$p" --bind 127.0.0.1 \
      --save "" --appendonly no --dir "$work/redis" --loadmodule "$PWD/$module" >/dev/null & ;;
    throttlecrab) "${pin_server[@]}" "$crab" --redis --redis-host 127.0.0.1 --redis-port "$p" \
      --log-level error >/dev/null 2>&1 & ;;
  esac
  pid[$1]=$!; port[$1]=$p
}
servers="floor cellrate redis-cell throttlecrab"
for name in $servers; do start "$name"; done
for name in $servers; do
  for _ in $(seq 100); do redis-cli -p "${port[$name]}" PING 2>/dev/null | grep -q PONG && break; sleep 0.05; done
done

# call SERVER SCENARIO: the command's words (throttlecrab's name for it, the same numbers).
call() {
  local name=CL.THROTTLE
  [ "$1" = throttlecrab ] && name=THROTTLE
  case $2 in
    hot) echo "$name bench:hot 999999 1000000000 1" ;;
    distinct) echo "$name bench:key:__rand_int__ 100 100 1" ;;
    denied) echo "$name bench:denied 1 1 3600" ;;
    million) echo "$name bench:million:__rand_int__ 100 100 3600" ;;
  esac
}

# pid: CPU time so far in ns, summed over its threads (/proc/PID/task/*/schedstat: no
# tick resolution to round a short run's figure).
cpu() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {printf "%.0f", s}'; }

# measure SERVER SCENARIO N KEYSPACE PIPELINE: loadgen's line for N calls by redis-benchmark.
measure() {
  local p=${pid[$1]} t0 t1 csv
  t0=$(cpu "$p")
  # shellcheck disable=SC2046 # the command's words
  csv=$("${pin_load[@]}" redis-benchmark -p "${port[$1]}" -c "$clients" -P "$5" -n "$3" \
    -r "$4" --csv $(call "$1" "$2") 2>/dev/null | tail -1 | tr -d '"')
  t1=$(cpu "$p")
  # CSV: test, rps, avg, min, p50, p95, p99, max (ms).
  echo "$csv" | awk -F, -v ns="$((t1 - t0))" -v n="$3" \
    -v rss="$(awk '/VmRSS/ {print $2}' "/proc/$p/status")" \
    '{printf "rps=%.0f p50_us=%.0f p99_us=%.0f cpu_us_per_req=%.3f rss_kib=%s errors=0\n",
      $2, $5 * 1000, $7 * 1000, ns / 1000 / n, rss}'
}

results="$work/results"
header
for round in $(seq "$rounds"); do
  for pipeline in $pipelines; do
    for scenario in hot distinct denied; do
      for target in $servers; do
        # Pipelined calls are cheap: five times as many, so that each run lasts about a
        # second, but for throttlecrab's, which wait on Nagle (about 18 000 a second).
        n=$requests
        [ "$pipeline" -gt 1 ] && [ "$target" != throttlecrab ] && n=$((requests * 5))
        row "$round" "$scenario/p$pipeline" "$target" \
          "$(measure "$target" "$scenario" "$n" 100000 "$pipeline")" "$results"
      done
    done
  done
done

echo
echo "memory per live key (3 000 000 calls over 10^6 keys, each kept an hour):"
for target in cellrate redis-cell throttlecrab; do
  kill "${pid[$target]}" 2>/dev/null; wait "${pid[$target]}" 2>/dev/null || true
  start "$target"
  for _ in $(seq 100); do redis-cli -p "${port[$target]}" PING 2>/dev/null | grep -q PONG && break; sleep 0.05; done
  before=$(awk '/VmRSS/ {print $2}' "/proc/${pid[$target]}/status")
  after=$(measure "$target" million 3000000 1000000 1 | field rss_kib)
  live=950213 # 10^6 (1 - e^-3): the keys redis-benchmark's 3 x 10^6 random draws reach
  [ "$target" = redis-cell ] && live=$(redis-cli -p "${port[$target]}" DBSIZE)
  python3 -c "print(f'  {\"$target\":12s} RSS {$before} KiB -> {$after} KiB: {($after - $before) * 1024 / $live:.0f} bytes per key ($live keys)')"
done

echo
for pair in "cellrate floor" "redis-cell floor" "throttlecrab floor" "redis-cell cellrate" "throttlecrab cellrate"; do
  set -- $pair
  echo "$1 / $2, min - max [median] over $rounds rounds:"
  for pipeline in $pipelines; do
    python3 scripts/ratios.py "$results" "$1" "$2" "hot/p$pipeline" "distinct/p$pipeline" "denied/p$pipeline"
  done
done
