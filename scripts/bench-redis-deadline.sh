#!/usr/bin/env bash
# How long the Redis store's script calls take, so that its deadline (`--redis-timeout-ms`)
# can be chosen from measurement: the distribution of one decision's latency through the
# Redis store against a local redis-server, at a paced load (RATE decisions a second over
# CLIENTS callers, not at saturation), with the machine idle and then with every core kept
# busy by CPU burners (a stand-in for a busy node: the test suite, a neighbour's build).
# For each candidate deadline it prints how many decisions took longer: each one would
# have been a spurious UNAVAILABLE (and, since the script had run, maybe a spent token).
#
# Usage: scripts/bench-redis-deadline.sh [rounds] [requests] [rate] [clients]
#   defaults: 3 rounds of 20 000 decisions at 2 000 a second over 16 callers.
# BURNERS sets the busy phase's number of burners (default: twice the cores). The store's
# deadline during the measurement is 10 s, so that no call is cut short and the whole
# distribution is seen. Prints one line per run (`ROUND PHASE key=value ...`), then the
# rates per candidate deadline over all rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
requests=${2:-20000}
rate=${3:-2000}
clients=${4:-16}
burners=${BURNERS:-$(($(nproc) * 2))}

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
"${REDIS_SERVER:-redis-server}" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$dir" >/dev/null &
server=$!
burning=()
stop_burners() {
  for pid in "${burning[@]}"; do kill "$pid" 2>/dev/null || true; done
  burning=()
}
trap 'stop_burners; kill $server 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.05; done

bench=$(cargo bench --bench redis_throughput --no-run 2>&1 \
  | grep -o '(target/[^)]*redis_throughput-[0-9a-f]*)' | tr -d '()' | tail -1)
results=$(mktemp)

run() {
  local round=$1 phase=$2 out
  out=$(REDIS_URL="redis://127.0.0.1:$port" REQUESTS=$requests CLIENTS=$clients RATE=$rate \
    TIMEOUT_MS=10000 KIND=gcra "$bench" | tr '\n' ' ')
  echo "$round $phase $out" | tee -a "$results"
}

for round in $(seq "$rounds"); do
  run "$round" idle
  for _ in $(seq "$burners"); do
    (while :; do :; done) &
    burning+=($!)
  done
  run "$round" busy
  stop_burners
done

python3 - "$results" "$requests" <<'EOF'
import re, sys
rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
per = int(sys.argv[2])
for phase in ("idle", "busy"):
    runs = [dict(kv.split("=", 1) for kv in r[2:] if "=" in kv) for r in rows if r[1] == phase]
    if not runs:
        continue
    total = per * len(runs)
    p = lambda k: "-".join(sorted({r[k] for r in runs}, key=int)[::max(1, len(runs) - 1)])
    print(f"{phase}: p50 {p('p50_us')} us, p99 {p('p99_us')} us, p99.9 {p('p999_us')} us, "
          f"max {p('max_us')} us (min-max over {len(runs)} runs)")
    for key in sorted((k for k in runs[0] if k.startswith("over_")),
                      key=lambda k: int(re.sub(r"\D", "", k))):
        over = sum(int(r[key]) for r in runs)
        rate = f"1 in {total // over}" if over else f"0 in {total}"
        print(f"  deadline {key[5:]:>6}: {over} of {total} over ({rate})")
EOF
