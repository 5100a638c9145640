#!/usr/bin/env bash
# CL.THROTTLE throughput: redis-benchmark against cellrate's Redis-protocol listener (memory
# store) and against redis-server with redis-cell 0.2.2 loaded, same machine, same
# connections and pipeline depth, alternating A B A B in one run. Two workloads: distinct
# keys (__rand_int__ over 100 000 keys) and one hot key. Prints each round, the median of
# each side and the ratio cellrate / redis-cell, then the CPU each server spent per call
# (from /proc: on a 2-core machine the benchmark client takes a core of its own, so the
# throughput of the faster server is bounded by the client; CPU per call is not).
# Usage: scripts/bench-resp.sh [rounds] [requests] [clients] [pipeline]
# redis-cell comes from the differential tests' build (target/redis-cell), made here if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
requests=${2:-500000}
clients=${3:-50}
pipeline=${4:-16}

module=target/redis-cell/target/release/libredis_cell.so
if [ ! -f "$module" ]; then
  echo "building redis-cell (the differential test's harness builds the same)"
  cargo test --quiet --all-features --test full resp_differential::cl_throttle_answers_as_redis_cell_on_the_memory_store >/dev/null
fi
cargo build --release --quiet

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cell_port=$(free_port)
ours_port=$(free_port)
dir=$(mktemp -d)
redis-server --port "$cell_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --loadmodule "$PWD/$module" >/dev/null &
cell=$!
target/release/cellrate serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --resp-listen "127.0.0.1:$ours_port" --config config/ 2>/dev/null &
ours=$!
trap 'kill $cell $ours 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  redis-cli -p "$cell_port" PING >/dev/null 2>&1 && redis-cli -p "$ours_port" PING >/dev/null 2>&1 && break
  sleep 0.05
done

cpu() { # pid: CPU ticks (user + system) so far
  awk '{print $14 + $15}' "/proc/$1/stat"
}
rate() { # port, key
  redis-benchmark -p "$1" -c "$clients" -P "$pipeline" -n "$requests" -r 100000 -q \
    CL.THROTTLE "$2" 15 30 60 2>/dev/null | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for workload in "distinct keys:user:__rand_int__" "one hot key:hot"; do
  name=${workload%%:*}
  key=${workload#*:}
  echo "== $name ($clients connections, pipeline $pipeline, $requests calls a round)"
  echo "round  redis-cell/s  cellrate/s  ratio"
  : > "$dir/a"; : > "$dir/b"
  cpu_a=0; cpu_b=0
  for round in $(seq "$rounds"); do
    t0=$(cpu $cell); a=$(rate "$cell_port" "$key"); cpu_a=$((cpu_a + $(cpu $cell) - t0))
    t0=$(cpu $ours); b=$(rate "$ours_port" "$key"); cpu_b=$((cpu_b + $(cpu $ours) - t0))
    echo "$a" >> "$dir/a"; echo "$b" >> "$dir/b"
    echo "$round  $a  $b  $(python3 -c "print(f'{$b/$a:.2f}')")"
  done
  ma=$(median < "$dir/a"); mb=$(median < "$dir/b")
  echo "median  $ma  $mb  $(python3 -c "print(f'{$mb/$ma:.2f}')")"
  hz=$(getconf CLK_TCK)
  python3 -c "
calls = $rounds * $requests
a = $cpu_a / $hz / calls * 1e6
b = $cpu_b / $hz / calls * 1e6
print(f'server CPU per call: redis-cell {a:.2f} us, cellrate {b:.2f} us (redis-cell / cellrate {a/b:.2f})')"
done
