#!/usr/bin/env bash
# The profile-guided build against the plain one, side by side in one run (#62): the
# constant RLS server shaped as cellrate answers (benches/grpc/baseline.rs `shaped`, the
# floor), cellrate's release-lto build and its profile-guided build (scripts/build-pgo.sh,
# which this runs first when target/pgo-use holds no binary), taking turns within each
# round, the scenarios of scripts/bench-peers.sh (hot, distinct, denied, ip).
#
#   scripts/bench-pgo.sh [rounds] [seconds]        (default 5 rounds of 5 s)
#
# BENCH_PIN=1 runs the servers on CPU 0 and the load generator on CPU 1. STORE=redis runs
# both builds on one redis-server (Debian's, on a free loopback port, unpinned): the Redis
# store's path, which scripts/build-pgo.sh does not train. The floor is built profile-guided
# too, driven by the same ShouldRateLimit load (target/pgo-floor-use), and runs as a fourth
# server, `shaped-pgo`: the profile speeds up the stack beneath cellrate (tonic, hyper, h2)
# as well, and a floor without it would flatter the profile-guided cellrate. Prints the rows,
# then the min-max and median of cellrate / shaped, pgo / shaped-pgo, pgo / shaped and
# pgo / cellrate (server CPU per request).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
seconds=${2:-5}
pgo=target/pgo-use/release-lto/cellrate
[ -x "$pgo" ] || scripts/build-pgo.sh
cargo build --profile release-lto --quiet --bin cellrate --example baseline --example loadgen
bin=target/release-lto
. scripts/bench-lib.sh
work=$(mktemp -d)

# The floor, profile-guided: instrumented, driven by loadgen's ShouldRateLimit, rebuilt.
floor_pgo=target/pgo-floor-use/release-lto/examples/baseline
if [ ! -x "$floor_pgo" ]; then
  major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
  data=$PWD/target/pgo-floor-data
  rm -rf "$data"; mkdir -p "$data"
  CARGO_TARGET_DIR=target/pgo-floor-generate RUSTFLAGS="-Cprofile-generate=$data" \
    cargo build --profile release-lto --quiet --example baseline
  rm -f "$data"/*.profraw
  p=$(free_port)
  target/pgo-floor-generate/release-lto/examples/baseline "127.0.0.1:$p" shaped 2>/dev/null &
  floor_pid=$!
  sleep 1
  for scenario in hot distinct denied ip; do
    "$bin/examples/loadgen" "127.0.0.1:$p" envoy "$scenario" 2 16 5 "$floor_pid" >/dev/null
  done
  kill -TERM "$floor_pid"; wait "$floor_pid" 2>/dev/null || true
  "llvm-profdata-$major" merge -o "$data/merged.profdata" "$data"/*.profraw
  CARGO_TARGET_DIR=target/pgo-floor-use RUSTFLAGS="-Cprofile-use=$data/merged.profdata" \
    cargo build --profile release-lto --quiet --example baseline
fi

side_by_side
store=()
if [ "${STORE:-memory}" = redis ]; then
  redis_port=$(free_port)
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
  pid[redis]=$!
  for _ in $(seq 100); do redis-cli -p "$redis_port" PING 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  store=(--store redis --redis-url "redis://127.0.0.1:$redis_port")
fi
start() { # name
  local p; p=$(free_port)
  case $1 in
    shaped) "${pin_server[@]}" "$bin/examples/baseline" "127.0.0.1:$p" shaped 2>/dev/null & ;;
    shaped-pgo) "${pin_server[@]}" "$floor_pgo" "127.0.0.1:$p" shaped 2>/dev/null & ;;
    cellrate|pgo)
      local exe=$bin/cellrate; [ "$1" = pgo ] && exe=$pgo
      "${pin_server[@]}" "$exe" serve --listen "127.0.0.1:$p" --admin-listen 127.0.0.1:0 \
        --metrics-listen 127.0.0.1:0 --config benches/grpc/limits "${store[@]}" >/dev/null 2>&1 & ;;
  esac
  pid[$1]=$!; port[$1]=$p
}
servers="shaped shaped-pgo cellrate pgo"
for name in $servers; do start "$name"; done
sleep 1

results="$work/results"
grpc_rounds "hot distinct denied ip"

echo
for pair in "cellrate shaped" "pgo shaped-pgo" "pgo shaped" "pgo cellrate"; do
  set -- $pair
  echo "$1 / $2, min - max over $rounds rounds:"
  python3 scripts/ratios.py "$results" "$1" "$2" hot distinct denied ip
done
