#!/usr/bin/env bash
# cellrate's Redis module against redis-cell and a trivial script, side by side in one run
# (BENCHMARKS.md, "The Redis module"): redis-benchmark sends CL.THROTTLE to a redis-server
# with the module loaded, the same to one with redis-cell 0.2.2, and EVALSHA of a script
# that returns 1 (the floor of any decision made by a script) to a plain one, each over
# one hot key and over 100 000 keys, for a number of rounds; then the rates, the ratios and
# Redis's CPU per call (its own used_cpu_user + used_cpu_sys, INFO, before and after).
#
#   scripts/bench-module.sh [rounds] [requests] [clients] [pipeline]
#   (default 3, 200 000, 32, 1; a pipeline of 16 shows Redis's own cost, not the network's)
#
# Builds the module (release; needs libclang) and redis-cell (the differential's build) when
# missing. Servers on free loopback ports, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
requests=${2:-200000}
clients=${3:-32}
pipeline=${4:-1}

module=target/module/release/libcellrate_redis.so
cell=target/redis-cell/target/release/libredis_cell.so
cargo build --quiet --release --locked -p cellrate-redis-module --target-dir target/module
if [ ! -f "$cell" ]; then
  echo "redis-cell is built by the differential test's harness: run" >&2
  echo "  cargo test --all-features --test full resp_differential" >&2
  exit 1
fi

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
start() { # port, extra args...
  local p=$1; shift
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no "$@" >/dev/null &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && return; sleep 0.05; done
  echo "redis-server on $p did not start" >&2; exit 1
}
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

pm=$(port); start "$pm" --loadmodule "$PWD/$module"
pc=$(port); start "$pc" --loadmodule "$PWD/$cell"
ps=$(port); start "$ps"
sha=$(redis-cli -p "$ps" SCRIPT LOAD "return 1")

cpu() { redis-cli -p "$1" INFO cpu | awk -F: '/used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
# rate of: port, keyspace (0: one key), command...
rate() {
  local p=$1 r=$2; shift 2
  local args=(-p "$p" -n "$requests" -c "$clients" -P "$pipeline" -q)
  [ "$r" = 0 ] || args+=(-r "$r")
  local before after
  before=$(cpu "$p")
  local out
  out=$(redis-benchmark "${args[@]}" "$@" 2>/dev/null | tr '\r' '\n' | grep -Eo '[0-9.]+ requests per second' | tail -1 | awk '{print $1}')
  after=$(cpu "$p")
  echo "$out $(python3 -c "print(round(($after - $before) / $requests * 1e6, 2))")"
}

printf "%-6s %-8s %14s %14s %14s %9s %9s   %s\n" round keys module_rps cell_rps evalsha_rps "mod/cell" "mod/eval" "Redis CPU us/call: module cell evalsha"
for round in $(seq "$rounds"); do
  for keys in 0 100000; do
    key=k; [ "$keys" = 0 ] || key="k:__rand_int__"
    read -r m mc < <(rate "$pm" "$keys" CL.THROTTLE "$key" 1000000000 1000000000 1 1)
    read -r c cc < <(rate "$pc" "$keys" CL.THROTTLE "$key" 1000000000 1000000000 1 1)
    read -r e ec < <(rate "$ps" "$keys" EVALSHA "$sha" 1 "$key")
    printf "%-6s %-8s %14s %14s %14s %9.2f %9.2f   %s %s %s\n" "$round" "$keys" "$m" "$c" "$e" \
      "$(python3 -c "print($m / $c)")" "$(python3 -c "print($m / $e)")" "$mc" "$cc" "$ec"
  done
done
