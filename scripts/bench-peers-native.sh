#!/usr/bin/env bash
# Native gRPC APIs side by side, one run (#62): a client asks a rate limiter about one key
# in its own API, not Envoy's. Four servers take turns within each round (A B C D ...):
#   baseline      benches/grpc/baseline.rs answering cellrate's `Check` with a constant
#                 (tonic, the same runtime and allocator; the floor of gRPC on this stack):
#                 `allowed` alone
#   shaped        the same answering a constant with the fields and sizes of cellrate's
#                 answer (its limit, key, remaining and times): the floor of a server that
#                 answers what cellrate answers
#   cellrate      cellrate's `cellrate.v1.RateLimiter/Check`, memory store
#   throttlecrab  throttlecrab-server 0.4.40 (crates.io, `cargo install --locked` into
#                 target/peers/throttlecrab), its gRPC transport,
#                 `throttlecrab.RateLimiter/Throttle` with the same limits as parameters
#
#   scripts/bench-peers-native.sh [rounds] [seconds]        (default 5 rounds of 5 s)
#
# Scenarios (loadgen on one thread, 4 connections x 64 streams): hot (one key, never
# denied), distinct (100 000 keys in turn, 100 a second each), denied (one key, one an
# hour). BENCH_PIN=1 runs the servers on CPU 0 and the load generator on CPU 1 (taskset).
# CELLRATE_BIN=<binary> runs that cellrate instead of target/release-lto's (the
# profile-guided one of scripts/build-pgo.sh: target/pgo-use/release-lto/cellrate).
# Prints what scripts/bench-peers.sh prints, then RSS per live key at 10^6 keys.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
seconds=${2:-5}
peers=$PWD/target/peers

cargo build --profile release-lto --quiet --bin cellrate --example baseline --example loadgen
bin=target/release-lto
. scripts/bench-lib.sh
crab=$(throttlecrab_server)
work=$(mktemp -d)

side_by_side
declare -A rpc=([baseline]=check [shaped]=check [cellrate]=check [throttlecrab]=throttlecrab)
start() { # name: (re)starts a server with no buckets
  local p; p=$(free_port)
  case $1 in
    baseline) "${pin_server[@]}" "$bin/examples/baseline" "127.0.0.1:$p" 2>/dev/null & ;;
    shaped) "${pin_server[@]}" "$bin/examples/baseline" "127.0.0.1:$p" shaped 2>/dev/null & ;;
    cellrate) "${pin_server[@]}" "${CELLRATE_BIN:-$bin/cellrate}" serve --listen "127.0.0.1:$p" --admin-listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 & ;;
    throttlecrab) "${pin_server[@]}" "$crab" --grpc --grpc-host 127.0.0.1 --grpc-port "$p" \
      --log-level error >/dev/null 2>&1 & ;;
  esac
  pid[$1]=$!; port[$1]=$p
}
servers="baseline shaped cellrate throttlecrab"
for name in $servers; do start "$name"; done
sleep 1

results="$work/results"
grpc_rounds "hot distinct denied"
grpc_memory "cellrate throttlecrab"

echo
for pair in "cellrate baseline" "cellrate shaped" "throttlecrab shaped" "throttlecrab cellrate"; do
  set -- $pair
  echo "$1 / $2, min - max [median] over $rounds rounds:"
  python3 scripts/ratios.py "$results" "$1" "$2" hot distinct denied
done
