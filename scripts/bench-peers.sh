#!/usr/bin/env bash
# Four servers side by side, one run (#37 goal 7, #62): the empty tonic RLS server that
# answers a constant (benches/grpc/baseline.rs, the floor of this stack) twice, as
# `baseline` (the smallest valid answer) and as `shaped` (a constant with the fields and
# sizes of cellrate's answers: the floor of a server that answers what cellrate answers),
# cellrate (memory store), and Kuadrant's limitador (Rust, tonic, memory store), built here
# from its repository at a pinned commit, so that the lead is measured again whenever the
# path changes.
#
#   scripts/bench-peers.sh [rounds] [seconds]        (default 5 rounds of 5 s)
#
# LIMITADOR_SRC=<path> takes limitador from a checkout you point it at (a work tree, or a
# bare git directory such as a mirror, whose pinned commit is checked out into
# target/peers/limitador), for machines that reach package registries but not GitHub;
# without it, the repository is cloned. The checkout leaves out the `*.profraw` files
# limitador's history holds (coverage data, not sources): a mirror that keeps no large
# blobs lacks them, and the build does not read them.
#
# limitador needs protoc and libclang to build (installed from Debian's packages when
# missing, as root or through sudo); cellrate needs neither. Its first build takes a long
# while on two cores (RocksDB and a vendored OpenSSL); it is kept in target/peers/.
#
# Scenarios (ShouldRateLimit, loadgen on one thread, 4 connections x 64 streams):
#   hot       one key, allowed
#   distinct  100 000 keys in turn, 100 a second each
#   denied    one key, denied
#   ip        100 000 client addresses in turn (Envoy's remote_address, domain benchip), 100
#             a second each: a configured limit keyed by the caller's address
#   million   1 000 000 keys in turn, each kept an hour: RSS per live key afterwards
# BENCH_PIN=1 runs the servers on CPU 0 and the load generator on CPU 1 (taskset), so that
# they do not share a core's time and caches (each server then has one core).
# CELLRATE_BIN=<binary> runs that cellrate instead of target/release-lto's (the
# profile-guided one of scripts/build-pgo.sh: target/pgo-use/release-lto/cellrate).
# The servers take turns within each round (A B C D A B C D). Prints requests/s, latency,
# server CPU per request (utime+stime from /proc) and RSS, then the median and min-max of
# cellrate/baseline, cellrate/shaped and limitador/cellrate, and memory per live key at 10^6 keys.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
seconds=${2:-5}
limitador_commit=2981b2b
peers=$PWD/target/peers

sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
if ! command -v protoc >/dev/null || ! ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1; then
  echo "installing protobuf-compiler and libclang-dev from Debian's packages (limitador's build)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq protobuf-compiler libclang-dev >/dev/null
fi
if [ ! -x "$peers/limitador/target/release/limitador-server" ]; then
  if [ ! -d "$peers/limitador" ]; then
    # A checkout given (work tree or bare git directory), else the repository itself.
    git clone -q --no-checkout "${LIMITADOR_SRC:-https://github.com/Kuadrant/limitador}" \
      "$peers/limitador"
    git -C "$peers/limitador" sparse-checkout set --no-cone '/*' '!*.profraw'
  fi
  git -C "$peers/limitador" checkout -q "$limitador_commit"
  echo "building limitador-server $limitador_commit (release, as it ships)"
  (cd "$peers/limitador" && cargo build --release --quiet -p limitador-server)
fi

cargo build --profile release-lto --quiet --bin cellrate --example baseline --example loadgen
bin=target/release-lto
. scripts/bench-lib.sh
work=$(mktemp -d)
# The same limits in limitador's terms.
"$peers/limitador/target/release/limitador-server" --validate benches/grpc/limitador.yaml >/dev/null

side_by_side
start() { # name: (re)starts a server with no buckets
  local p; p=$(free_port)
  case $1 in
    baseline) "${pin_server[@]}" "$bin/examples/baseline" "127.0.0.1:$p" 2>/dev/null & ;;
    shaped) "${pin_server[@]}" "$bin/examples/baseline" "127.0.0.1:$p" shaped 2>/dev/null & ;;
    cellrate) "${pin_server[@]}" "${CELLRATE_BIN:-$bin/cellrate}" serve --listen "127.0.0.1:$p" --admin-listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 & ;;
    limitador) "${pin_server[@]}" "$peers/limitador/target/release/limitador-server" -b 127.0.0.1 -p "$p" \
      -B 127.0.0.1 -P "$(free_port)" benches/grpc/limitador.yaml memory >/dev/null 2>&1 & ;;
  esac
  pid[$1]=$!; port[$1]=$p
}
servers="baseline shaped cellrate limitador"
for name in $servers; do start "$name"; done
sleep 1

results="$work/results"
grpc_rounds "hot distinct denied ip"
grpc_memory "cellrate limitador"

echo
for pair in "cellrate baseline" "cellrate shaped" "limitador cellrate"; do
  set -- $pair
  echo "$1 / $2, min - max over $rounds rounds:"
  python3 scripts/ratios.py "$results" "$1" "$2" hot distinct denied ip
done
