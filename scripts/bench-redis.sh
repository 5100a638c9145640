#!/usr/bin/env bash
# Decisions per second through cellrate's Redis store against redis-benchmark running a
# trivial EVALSHA (`return 1`) on the same redis-server, alternating A B A B in one run.
# Both use 50 concurrent clients over loopback. Prints each round and the min-max ratio.
# Usage: scripts/bench-redis.sh [rounds] [requests]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
requests=${2:-100000}

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.05; done

cargo bench --bench redis_throughput --no-run >/dev/null 2>&1
sha=$(redis-cli -p "$port" SCRIPT LOAD "return 1")

echo "round  redis-benchmark EVALSHA/s  cellrate decisions/s  ratio"
ratios=()
for round in $(seq "$rounds"); do
  base=$(redis-benchmark -p "$port" -c 50 -n "$requests" -q EVALSHA "$sha" 0 | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1)
  ours=$(REDIS_URL="redis://127.0.0.1:$port" REQUESTS="$requests" CLIENTS=50 cargo bench -q --bench redis_throughput 2>/dev/null | grep -o 'decisions_per_second=[0-9]*' | cut -d= -f2)
  ratio=$(python3 -c "print(f'{$ours/$base:.2f}')")
  ratios+=("$ratio")
  echo "$round  $base  $ours  $ratio"
done
printf '%s\n' "${ratios[@]}" | sort -n | sed -n '1p;$p' | paste -sd' ' | awk '{print "ratio min-max: " $1 " - " $2}'
