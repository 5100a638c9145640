#!/usr/bin/env bash
# Decisions per second through cellrate's Redis store against redis-benchmark running a
# trivial EVALSHA (`return 1`) on the same redis-server, alternating A B A B in one run, and
# Redis's own CPU time per call or decision (utime+stime of redis-server from /proc).
#
# Usage: scripts/bench-redis.sh [rounds] [requests] [streams] [before-binary]
#   streams: concurrent callers (redis-benchmark -c, the store's concurrent tasks);
#   before-binary: a `redis_throughput` bench binary built from another commit, measured
#   beside this one (e.g. before and after a change), at `streams` and at one stream;
#   or the word `kinds`: this binary with a GCRA limit, a calendar window and charges
#   (KIND=gcra|calendar|charge), side by side;
#   or the word `module`: cellrate's module (crates/module, built in release) loaded into
#   the server, and this binary deciding through the script (`after`, --redis-module
#   forbid) and through the module (`module`, --redis-module require), side by side.
# REDIS_SERVER names another server binary with redis-server's flags (e.g. valkey-server).
# Prints one line per measurement (`ROUND SCENARIO TARGET key=value ...`), then min-max
# ratios over the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
requests=${2:-200000}
streams=${3:-64}
before=${4:-}

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
load=()
if [ "$before" = module ]; then
  cargo build --release --locked -p cellrate-redis-module >&2
  load=(--loadmodule "$PWD/target/release/libcellrate_redis.so")
fi
"${REDIS_SERVER:-redis-server}" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" "${load[@]}" >/dev/null &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.05; done

after=$(cargo bench --bench redis_throughput --no-run 2>&1 | grep -o '(target/[^)]*redis_throughput-[0-9a-f]*)' | tr -d '()' | tail -1)
sha=$(redis-cli -p "$port" SCRIPT LOAD "return 1")
ticks=$(getconf CLK_TCK)
redis_cpu() { awk '{print $14 + $15}' "/proc/$server/stat"; }
results=$(mktemp)

# One measurement: $1 round, $2 scenario, $3 target, $4 clients, $5 requests.
measure() {
  local round=$1 scenario=$2 target=$3 clients=$4 n=$5 cpu0 cpu1 line
  cpu0=$(redis_cpu)
  case $target in
    evalsha)
      line=$(redis-benchmark -p "$port" -c "$clients" -n "$n" --csv EVALSHA "$sha" 0 | tail -1 | tr -d '"' |
        awk -F, '{printf "rps=%s p50_us=%.0f p99_us=%.0f", $2, $5 * 1000, $7 * 1000}')
      ;;
    *)
      local binary=$after kind=gcra module=forbid
      [ "$target" = before ] && binary=$before
      [ "$target" = module ] && module=require
      case $target in gcra | calendar | charge) kind=$target ;; esac
      line=$(MODULE=$module KIND=$kind REDIS_URL="redis://127.0.0.1:$port" REQUESTS="$n" CLIENTS="$clients" "$binary" |
        grep -o 'decisions_per_second=.*' | sed 's/decisions_per_second=/rps=/')
      ;;
  esac
  cpu1=$(redis_cpu)
  local cpu_us
  cpu_us=$(python3 -c "print(f'{($cpu1 - $cpu0) / $ticks * 1e6 / $n:.2f}')")
  echo "$round $scenario $target $line cpu_us_per_req=$cpu_us" | tee -a "$results"
}

targets="evalsha after"
[ -n "$before" ] && targets="evalsha before after"
[ "$before" = kinds ] && targets="evalsha gcra calendar charge"
[ "$before" = module ] && targets="evalsha after module"
for round in $(seq "$rounds"); do
  for target in $targets; do
    measure "$round" "streams-$streams" "$target" "$streams" "$requests"
  done
  for target in $targets; do
    measure "$round" one-stream "$target" 1 $((requests / 10))
  done
done

echo "ratios, min-max over the rounds (cpu_us_per_req is Redis's CPU per call or decision):"
if [ "$before" = kinds ]; then
  for kind in calendar charge; do
    echo " $kind / gcra:"
    python3 scripts/ratios.py "$results" "$kind" gcra "streams-$streams" one-stream
  done
  rm -f "$results"
  exit 0
fi
echo " cellrate / trivial EVALSHA:"
python3 scripts/ratios.py "$results" after evalsha "streams-$streams" one-stream
if [ "$before" = module ]; then
  echo " module / trivial EVALSHA:"
  python3 scripts/ratios.py "$results" module evalsha "streams-$streams" one-stream
  echo " module / script (after):"
  python3 scripts/ratios.py "$results" module after "streams-$streams" one-stream
elif [ -n "$before" ]; then
  echo " after / before:"
  python3 scripts/ratios.py "$results" after before "streams-$streams" one-stream
fi
rm -f "$results"
