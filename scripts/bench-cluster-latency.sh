#!/usr/bin/env bash
# Latency against the number of descriptors on a Redis Cluster (issue 61, item 3): p50/p99
# of ShouldRateLimit with 1, 2 and 10 descriptors per request, each descriptor's id on its
# own cluster slot and the slots dealt over the three masters (loadgen's desc1/desc2/desc10),
# against a 3-master Redis Cluster started here on loopback, at a fixed open-loop rate
# (a request is sent at its tick whether or not earlier ones were answered), cellrate
# serving on its Redis store in cluster mode.
#
#   scripts/bench-cluster-latency.sh [path] [seconds] [rate] [rounds]
#     path     script (default: no module loaded, batch.lua decides) | module (each node
#              started with --loadmodule $CELLRATE_MODULE, default
#              target/release/libcellrate_redis.so, and cellrate given $MODULE_FLAGS,
#              default `--redis-module require`) | memory (the floor: cellrate on its memory
#              store, the same requests with no Redis call, to tell the machine's own tail
#              from the store's)
#     seconds  measured seconds per point (default 20, after 1 s of warm-up)
#     rate     requests a second (default 1000: this 2-core machine's 10 descriptors
#              reach saturation near 2000, see BENCHMARKS.md)
#     rounds   rounds of every point (default 2)
#
# Environment:
#   CELLRATE_EXTRA_FLAGS  more flags for every cellrate (e.g. `--redis-module forbid`)
#   BINARIES              cellrate binaries to compare side by side in one run, as
#                         `label=path ...` (default: now=target/release/cellrate, built
#                         here); each point runs every binary in turn, A B A B
#   REDIS_SERVER          the redis-server (or valkey-server) to start (default: on PATH)
#   POINTS                the descriptor counts (default: `1 2 10`)
#   LOADGEN_FROM          `sent` (default): a latency counts from when its request was sent;
#                         `tick`: from when it was due, which adds the timer's lateness
#                         (about 1 ms here) to every latency (see benches/grpc/loadgen.rs)
# Prints one row per point (p50/p99/p99.9 µs, cellrate's and the three Redis's CPU µs per
# request, the commands Redis counted per request (a script call and each redis.call in
# it) and its socket reads per request (fewer reads than calls: calls arrived pipelined,
# several in one read), store errors and fallback answers, requests not sent (the client's
# 256 outstanding were all taken: the server fell behind)), then per binary the median
# over rounds of p99(N)/p99(1) and p50(N)/p50(1).
set -euo pipefail
cd "$(dirname "$0")/.."
path=${1:-script}
seconds=${2:-20}
rate=${3:-1000}
rounds=${4:-2}
points=${POINTS:-1 2 10}
redis_server=${REDIS_SERVER:-redis-server}
extra=${CELLRATE_EXTRA_FLAGS:-}
. scripts/bench-lib.sh

case $path in
  script | memory) module_args=(); path_flags="" ;;
  module)
    module=${CELLRATE_MODULE:-target/release/libcellrate_redis.so}
    [ -f "$module" ] || { echo "no module at $module (cargo build --release -p cellrate-redis-module)" >&2; exit 2; }
    module_args=(--loadmodule "$(realpath "$module")")
    path_flags=${MODULE_FLAGS:---redis-module require} ;;
  *) echo "path: script, module or memory" >&2; exit 2 ;;
esac

cargo build --release --quiet --bin cellrate --example loadgen
binaries=${BINARIES:-now=target/release/cellrate}
loadgen=target/release/examples/loadgen

dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# A free loopback port whose cluster bus port (10 000 higher) is free too, at most 55535.
cluster_port() {
  python3 -c '
import random, socket
for _ in range(1000):
    port = random.randint(20000, 45000)
    try:
        for p in (port, port + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", p)); s.close()
    except OSError:
        continue
    print(port); break'
}

# Three masters, no replicas, no persistence: as the test harness's RedisCluster.
ports=() redis_pids=()
for n in 0 1 2; do
  port=$(cluster_port)
  mkdir -p "$dir/node$n"
  (cd "$dir/node$n" && exec "$redis_server" --port "$port" --bind 127.0.0.1 --save "" \
    --appendonly no --cluster-enabled yes --cluster-node-timeout 1000 \
    --cluster-config-file nodes.conf "${module_args[@]}" >"$dir/node$n/log" 2>&1) &
  pids+=($!) redis_pids+=($!) ports+=("$port")
done
for port in "${ports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.05; done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 0 \
  --cluster-yes >/dev/null || { tail -n 5 "$dir"/node*/log >&2; exit 1; }
for _ in $(seq 200); do
  ok=0
  for port in "${ports[@]}"; do
    redis-cli -p "$port" CLUSTER INFO | grep -q cluster_state:ok && ok=$((ok + 1))
  done
  [ "$ok" = 3 ] && break
  sleep 0.1
done
nodes=$(printf 'redis://127.0.0.1:%s,' "${ports[@]}")
nodes=${nodes%,}
version=$("$redis_server" --version | head -1)

# CPU ticks (1/100 s) of the Redis nodes together.
redis_ticks() {
  local total=0 pid
  for pid in "${redis_pids[@]}"; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$total"
}

# Commands and socket reads the Redis nodes processed so far (INFO stats), summed: their
# ratio says whether a node gets several calls per read (pipelined) or one.
redis_counts() {
  local port
  for port in "${ports[@]}"; do redis-cli -p "$port" INFO stats; done \
    | awk -F: '/^total_commands_processed/ {c += $2} /^total_reads_processed/ {r += $2}
               END {print c + 0, r + 0}'
}

# start LABEL BINARY: a cellrate on the cluster; prints "PID PORT METRICS_PORT".
start() {
  # The limit's keys tagged by id (`<prefix>900:{<id>}`): the slot loadgen chose for an id
  # is its key's.
  local port metrics store=(--store redis --redis-cluster-nodes "$nodes" --redis-timeout-ms 1000
    --redis-tag-by-id BenchHot)
  port=$(free_port) metrics=$(free_port)
  [ "$path" = memory ] && store=(--store memory)
  # A 1 s store deadline, so that no call is cut short and the whole distribution is
  # seen (a missed deadline would be a fast fallback answer, not a latency).
  # shellcheck disable=SC2086
  "$2" serve --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 \
    --metrics-listen "127.0.0.1:$metrics" --config benches/grpc/limits "${store[@]}" \
    $path_flags $extra \
    >"$dir/$1.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$metrics/metrics" >/dev/null 2>&1 && break
    sleep 0.05
  done
  echo "$pid $port $metrics"
}

# Store errors and fallback answers so far.
store_errors() {
  curl -s "http://127.0.0.1:$1/metrics" | awk '/^cellrate_store_(errors|fallbacks)_total/ {s += $2} END {print s + 0}'
}

declare -A servers
for spec in $binaries; do
  label=${spec%%=*}
  read -r pid port metrics < <(start "$label" "${spec#*=}")
  pids+=("$pid")
  servers[$label]="$pid $port $metrics"
done

echo "# $version, 3 masters on loopback; path=$path; cellrate flags: $path_flags $extra"
echo "# open loop at $rate req/s, ${seconds} s per point after 1 s warm-up, $(nproc) cores"
fmt='%-5s %-8s %-5s %7s %7s %7s %8s %9s %10s %9s %9s %6s %6s\n'
printf "$fmt" round binary desc req/s p50_us p99_us p999_us cr_us/req redis_us/req \
  cmds/req reads/req errors unsent
results=$dir/results
for round in $(seq "$rounds"); do
  for n in $points; do
    for spec in $binaries; do
      label=${spec%%=*}
      read -r pid port metrics <<<"${servers[$label]}"
      errors0=$(store_errors "$metrics")
      ticks0=$(redis_ticks)
      read -r commands0 reads0 < <(redis_counts)
      out=$(LOADGEN_OPEN=1 LOADGEN_FROM=${LOADGEN_FROM:-sent} "$loadgen" "127.0.0.1:$port" envoy "desc$n" 4 64 "$seconds" "$pid" "$rate" 2>/dev/null | tr '\n' ' ')
      # The warm-up second is in the Redis window too: counted over seconds + 1.
      redis_us=$(python3 -c "print(f'{($(redis_ticks) - $ticks0) * 1e4 / (max($(echo "$out" | field rps), 1) * ($seconds + 1)):.1f}')")
      errors=$(( $(store_errors "$metrics") - errors0 + $(echo "$out" | field errors) ))
      read -r commands reads < <(redis_counts)
      # Per request sent (over the run with its warm-up second; INFO's own calls excepted).
      sent=$(( $(echo "$out" | field rps) * (seconds + 1) ))
      per_call=$(python3 -c "print(f'{($commands - $commands0 - 3) / max($sent, 1):.2f} {($reads - $reads0 - 3) / max($sent, 1):.2f}')")
      printf "$fmt" "$round" "$label" "$n" "$(echo "$out" | field rps)" \
        "$(echo "$out" | field p50_us)" "$(echo "$out" | field p99_us)" \
        "$(echo "$out" | field p999_us)" "$(echo "$out" | field cpu_us_per_req)" \
        "$redis_us" $per_call "$errors" "$(echo "$out" | field unsent)"
      echo "$label $n $(echo "$out" | field p99_us) $(echo "$out" | field p50_us)" >>"$results"
    done
  done
done

echo
echo "median over $rounds rounds: p99(N)/p99(1) and p50(N)/p50(1)"
python3 - "$results" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
by = {}
for label, n, p99, p50 in rows:
    by.setdefault(label, {}).setdefault(int(n), []).append((float(p99), float(p50)))
for label, points in by.items():
    med = {n: (statistics.median(p for p, _ in v), statistics.median(q for _, q in v)) for n, v in points.items()}
    if 1 not in med:
        continue
    for n in sorted(med):
        p99, p50 = med[n]
        print(f"{label:8} desc={n:<3} p50={p50:.0f}us p99={p99:.0f}us  "
              f"p99 ratio={p99 / med[1][0]:.2f}  p50 ratio={p50 / med[1][1]:.2f}")
EOF
