#!/usr/bin/env bash
# Instructions per request, cellrate against the constant-answer baseline, counted by
# valgrind's callgrind: repeatable for the same binaries and inputs whatever else the
# machine is doing (unlike CPU time on a shared machine), so it tells small changes apart.
# It counts instructions, not time: cache misses and lock waits do not show.
#
#   scripts/bench-callgrind.sh [requests] [scenarios...] [before-dir]
#
# scenarios: loadgen's (hot, distinct, denied, ip: 100 000 client addresses under a limit
# keyed by Envoy's remote_address), check (the native Check on hot's key) and resp
# (`CL.THROTTLE` on 100 000 keys at random over the Redis protocol, redis-benchmark with 50
# connections pipelining 16; the baseline is then benches/resp/floor.rs); default hot
# distinct denied ip check.
# before-dir: a directory holding a `cellrate` binary built the same way from another commit
# (its target/callgrind/release-lto), measured in the same run beside this one, with this
# commit's loadgen, baseline and benches/grpc/limits (the request bodies must be the same).
# LIMITADOR_BIN=<limitador-server> counts Kuadrant's limitador too (memory store, the same
# limits in its terms: benches/grpc/limitador.yaml; scripts/bench-peers.sh builds it), and
# prints limitador / cellrate.
# BASELINE=shaped runs the baseline answering cellrate's answers' fields and sizes (the floor
# of scripts/bench-peers*.sh, #62) instead of the smallest valid answer.
# CACHE_SIM=1 also simulates the caches (callgrind --cache-sim=yes: 32 KiB L1s, the
# machine's last level) and prints, per request, instruction and data L1 misses,
# last-level misses, and the cycle estimate Ir + 10 x L1 misses + 100 x LL misses (the
# model KCachegrind uses); ratios are then of that estimate. A slower run: use ~2000
# requests.
# Each server runs under callgrind with instrumentation off; after a warm-up of 500 requests,
# instrumentation is switched on for exactly `requests` requests (loadgen, LOADGEN_TOTAL, 1
# connection x 16 streams), then dumped. Prints instructions per request, the ratio, and
# keeps the profiles in target/callgrind/ for callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-20000}
shift || true
before=
scenarios=()
for arg in "$@"; do
  if [ -d "$arg" ]; then before=$arg; else scenarios+=("$arg"); fi
done
[ ${#scenarios[@]} -gt 0 ] || scenarios=(hot distinct denied ip check)
[ -z "$before" ] || [ -x "$before/cellrate" ] || { echo "no cellrate binary in $before"; exit 1; }

command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)"; exit 1; }
export CARGO_TARGET_DIR=target/callgrind
# (Through --config: cargo reads CARGO_PROFILE_RELEASE_LTO_DEBUG as profile `release`.)
# The server on its own: built with the examples, it would get the features their
# dev-dependencies turn on (tokio's test-util: a clock check in every Instant::now), which
# the production build has not.
build() { cargo build --config 'profile.release-lto.debug="line-tables-only"' --profile release-lto --quiet "$@"; }
build --bin cellrate
build --example baseline --example loadgen --example resp_floor
bin=$CARGO_TARGET_DIR/release-lto
out=$CARGO_TARGET_DIR/profiles
mkdir -p "$out"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # bounded: 120 x 0.5 s
  for _ in $(seq 120); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),1)" 2>/dev/null && return 0
    sleep 0.5
  done
  echo "server on port $1 did not start" >&2; return 1
}

vg=(valgrind --tool=callgrind --instr-atstart=no)
[ -z "${CACHE_SIM:-}" ] || vg+=(--cache-sim=yes)

# load SCENARIO PORT PID N: N requests of the scenario.
load() {
  if [ "$1" = resp ]; then
    redis-benchmark -p "$2" -c 50 -P 16 -n "$4" -r 100000 -q CL.THROTTLE bench:key:__rand_int__ 100 100 1 >/dev/null 2>&1
  elif [ "$1" = check ]; then
    LOADGEN_TOTAL=$4 "$bin/examples/loadgen" "127.0.0.1:$2" check hot 1 16 1 "$3" >/dev/null
  else
    LOADGEN_TOTAL=$4 "$bin/examples/loadgen" "127.0.0.1:$2" envoy "$1" 1 16 1 "$3" >/dev/null
  fi
}

count() { # server scenario -> instructions per request (CACHE_SIM: and misses, estimate)
  local server=$1 scenario=$2 port pid file listen
  port=$(free_port)
  file="$out/$server-$scenario.callgrind"
  rm -f "$file" "$file".*
  # The decisions listener, or with `resp` the Redis-protocol one, on the measured port.
  listen=(--listen "127.0.0.1:$port")
  [ "$scenario" = resp ] && listen=(--listen 127.0.0.1:0 --resp-listen "127.0.0.1:$port")
  if [ "$server" = before ]; then
    "${vg[@]}" --callgrind-out-file="$file" \
      "$before/cellrate" serve "${listen[@]}" --admin-listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 &
  elif [ "$server" = limitador ]; then
    "${vg[@]}" --callgrind-out-file="$file" \
      "$LIMITADOR_BIN" -b 127.0.0.1 -p "$port" -B 127.0.0.1 -P "$(free_port)" \
      benches/grpc/limitador.yaml memory >/dev/null 2>&1 &
  elif [ "$server" = baseline ] && [ "$scenario" = resp ]; then
    "${vg[@]}" --callgrind-out-file="$file" "$bin/examples/resp_floor" "127.0.0.1:$port" 2>/dev/null &
  elif [ "$server" = baseline ]; then
    "${vg[@]}" --callgrind-out-file="$file" \
      "$bin/examples/baseline" "127.0.0.1:$port" ${BASELINE:+"$BASELINE"} 2>/dev/null &
  else
    "${vg[@]}" --callgrind-out-file="$file" \
      "$bin/cellrate" serve "${listen[@]}" --admin-listen 127.0.0.1:0 \
      --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >/dev/null 2>&1 &
  fi
  pid=$!
  wait_port "$port"
  load "$scenario" "$port" "$pid" 500
  callgrind_control -i on $pid >/dev/null 2>&1
  load "$scenario" "$port" "$pid" "$requests"
  callgrind_control -d $pid >/dev/null 2>&1
  callgrind_control -i off $pid >/dev/null 2>&1
  kill $pid; wait $pid 2>/dev/null || true
  # The dump (file.1) holds the measured window only.
  mv "$file.1" "$file"
  # totals: Ir [Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw] (the events line names them).
  awk -v n="$requests" -v sim="${CACHE_SIM:-}" '/^totals:/ {
    if (sim == "") { print int($2 / n); exit }
    l1 = $5 + $6 + $7; ll = $8 + $9 + $10
    printf "%d %d %d %d %d\n", ($2 + 10 * l1 + 100 * ll) / n, $2 / n, $5 / n, ($6 + $7) / n, ll / n
    exit }' "$file"
}

ratio() { python3 -c "print(f'{$1/$2:.3f}')"; }
misses() { # label "cest ir i1 d1 ll" -> a line of the simulated caches, per request
  local label=$1; set -- $2
  printf '  %-9s Ir %s, I1 misses %s, D1 misses %s, LL misses %s, estimate %s\n' "$label" "$2" "$3" "$4" "$5" "$1"
}
unit=ir/req
[ -z "${CACHE_SIM:-}" ] || unit=est/req
if [ -z "$before" ]; then
  printf '%-9s %14s %14s %7s\n' scenario "baseline_$unit" "cellrate_$unit" ratio
else
  printf '%-9s %14s %14s %14s %7s %7s %12s\n' scenario "baseline_$unit" "before_$unit" \
    "after_$unit" before after after/before
fi
for scenario in "${scenarios[@]}"; do
  b_all=$(count baseline "$scenario")
  c_all=$(count cellrate "$scenario")
  b=${b_all%% *} c=${c_all%% *}
  if [ -z "$before" ]; then
    printf '%-9s %14s %14s %7s\n' "$scenario" "$b" "$c" "$(ratio "$c" "$b")"
  else
    o_all=$(count before "$scenario")
    o=${o_all%% *}
    printf '%-9s %14s %14s %14s %7s %7s %12s\n' "$scenario" "$b" "$o" "$c" \
      "$(ratio "$o" "$b")" "$(ratio "$c" "$b")" "$(ratio "$c" "$o")"
  fi
  if [ -n "${CACHE_SIM:-}" ]; then
    misses baseline "$b_all"
    [ -z "$before" ] || misses before "$o_all"
    misses cellrate "$c_all"
  fi
  if [ -n "${LIMITADOR_BIN:-}" ] && [ "$scenario" != check ] && [ "$scenario" != resp ]; then
    l_all=$(count limitador "$scenario")
    l=${l_all%% *}
    printf '%-9s limitador_%s %s, limitador/cellrate %s\n' "$scenario" "$unit" "$l" "$(ratio "$l" "$c")"
    [ -z "${CACHE_SIM:-}" ] || misses limitador "$l_all"
  fi
done
echo "profiles: $out (callgrind_annotate --inclusive=yes FILE)"
