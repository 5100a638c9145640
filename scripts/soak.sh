#!/usr/bin/env bash
# Soak: cellrate (memory store) under a steady load of ever-new keys, sampling its RSS,
# live buckets and errors. Each key is spent once and its bucket lives 60 s (BenchFresh:
# 1 per minute), so the store holds about rate x 60 buckets once warm and the sweeper must
# keep RSS flat from then on. Not part of the test suite (RELIABILITY.md has the figures).
#
#   scripts/soak.sh [minutes] [fraction of max load] [rpc: envoy|check] [rate]
#
# First measures the max rate of this load for 5 s, then runs at the given fraction of it
# (or at `rate` requests/s when given, to compare runs on a machine whose speed varies)
# for the given minutes, sampling every 10 s; prints a table and a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
fraction=${2:-0.5}
rpc=${3:-envoy}
fixed_rate=${4:-}

cargo build --profile release-lto --quiet --bin cellrate --example loadgen
bin=target/release-lto
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
metrics_port=$(free_port)
"$bin/cellrate" serve --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 \
  --metrics-listen "127.0.0.1:$metrics_port" --config benches/grpc/limits >/dev/null 2>&1 &
pid=$!
progress=$(mktemp)
trap 'kill $pid 2>/dev/null; rm -f "$progress"' EXIT
sleep 1

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
metric() { curl -s "http://127.0.0.1:$metrics_port/metrics" | awk -v m="$1" '$1 == m { s += $2 } END { printf "%d", s }'; }
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }

max=$("$bin/examples/loadgen" "127.0.0.1:$port" "$rpc" fresh 4 64 5 "$pid" | field rps)
rate=${fixed_rate:-$(python3 -c "print(int($max * $fraction))")}
echo "max ${max} req/s; soaking at ${rate} req/s for ${minutes} min, rpc ${rpc}"
# Let the buckets of the max-rate probe expire before the soak starts.
sleep 65
"$bin/examples/loadgen" "127.0.0.1:$port" "$rpc" fresh 4 64 $((minutes * 60)) "$pid" "$rate" \
  >"$progress.out" 2>"$progress" &
load=$!

printf '%6s %10s %12s %14s %10s %12s\n' t_s rss_kib live_buckets swept_total sent errors
samples=$((minutes * 6 + 1))
for i in $(seq 0 "$samples"); do
  kill -0 $load 2>/dev/null || break
  line=$(tail -n 1 "$progress")
  printf '%6s %10s %12s %14s %10s %12s\n' $((i * 10)) "$(rss)" "$(metric cellrate_live_buckets)" \
    "$(metric cellrate_swept_buckets_total)" "$(echo "$line" | field sent)" "$(echo "$line" | field errors)"
  sleep 10
done | tee "$progress.table"
wait $load
final=$(cat "$progress.out")
echo "loadgen: $final"
echo "store errors: $(metric cellrate_store_errors_total)"
# RSS after the first bucket lifetime (t = 70 s) against the end, and the largest; then
# the second half alone (flat means the sweeper keeps up and nothing leaks).
awk -v half=$((minutes * 30)) 'NR > 1 && $1 >= 70 { if (!start) start = $2; end = $2; if ($2 > max) max = $2 }
     NR > 1 && $1 >= half { if (!h) h = $2; if ($2 > hmax) hmax = $2 }
     END { if (start) printf "rss after warm-up %d KiB, at end %d KiB, max %d KiB: growth %.1f%%\n",
           start, end, max, (end - start) * 100 / start;
           if (h) printf "second half: rss %d KiB at its start, max %d KiB: growth %.1f%%\n",
           h, hmax, (hmax - h) * 100 / h }' "$progress.table"
rm -f "$progress.out" "$progress.table"
