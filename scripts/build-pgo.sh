#!/usr/bin/env bash
# A profile-guided build of the server (#62): the release-lto build, laid out by a profile of
# the benchmarks' own load. The gap between cellrate's instructions and its CPU time against
# the empty servers is cache misses (BENCHMARKS.md, "The gap between instructions and CPU
# time"); a profile lets LLVM put the hot code together and the cold code aside.
#
#   scripts/build-pgo.sh [seconds-per-scenario]     (default 5)
#
# PROFILE names the cargo profile (default release-lto; the Dockerfile passes its own). The
# image's build runs this script (the Dockerfile's PGO argument), so it needs nothing but
# bash, coreutils, cargo and llvm-profdata (redis-benchmark is optional).
#
# 1. builds cellrate instrumented (-Cprofile-generate) in target/pgo-generate;
# 2. serves the bench limits (benches/grpc/limits) on loopback and drives it with loadgen
#    (ShouldRateLimit hot, distinct, denied and IP-keyed, the native Check) and, when
#    redis-benchmark is installed, `CL.THROTTLE` over the Redis protocol, for the given
#    seconds each; the server is stopped with SIGTERM, so it writes its profile as it exits;
# 3. merges the profile with the llvm-profdata of rustc's own LLVM major version (Debian's
#    `llvm-NN` package; rustup's `llvm-tools` component would do too);
# 4. builds with -Cprofile-use into target/pgo-use/PROFILE/cellrate, and prints that path.
# Everything on loopback; every wait is bounded. About twice the release-lto build's time.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
profile=${PROFILE:-release-lto}

major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
profdata=
for candidate in "llvm-profdata-$major" "/usr/lib/llvm-$major/bin/llvm-profdata"; do
  command -v "$candidate" >/dev/null 2>&1 && { profdata=$candidate; break; }
done
[ -n "$profdata" ] || { echo "needs llvm-profdata of LLVM $major (apt-get install llvm-$major)" >&2; exit 1; }

data=$PWD/target/pgo-data
rm -rf "$data"
mkdir -p "$data"
build() { # TARGET_DIR RUSTFLAGS
  CARGO_TARGET_DIR=$1 RUSTFLAGS=$2 cargo build --profile "$profile" --locked --bin cellrate --quiet
}
build target/pgo-generate "-Cprofile-generate=$data"
# RUSTFLAGS reach build scripts too, which wrote profiles of their own as they ran.
rm -f "$data"/*.profraw
# The load generator, built without the instrumentation.
cargo build --profile "$profile" --locked --example loadgen --quiet
loadgen=target/$profile/examples/loadgen

# Loopback ports by bash's /dev/tcp (no python in a build container): a port nothing
# answers on is taken as free; at most 50 tries.
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p
  for _ in $(seq 50); do
    p=$(shuf -i 20000-60000 -n 1)
    answers "$p" || { echo "$p"; return 0; }
  done
  echo "no free loopback port found" >&2; return 1
}
wait_port() { # bounded: 120 x 0.5 s
  for _ in $(seq 120); do
    answers "$1" && return 0
    sleep 0.5
  done
  echo "server on port $1 did not start" >&2; return 1
}

port=$(free_port) resp=$(free_port)
"target/pgo-generate/$profile/cellrate" serve --listen "127.0.0.1:$port" \
  --resp-listen "127.0.0.1:$resp" --admin-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --config benches/grpc/limits >"$data/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
wait_port "$port"
for scenario in hot distinct denied ip; do
  "$loadgen" "127.0.0.1:$port" envoy "$scenario" 2 16 "$seconds" "$pid"
done
"$loadgen" "127.0.0.1:$port" check hot 2 16 "$seconds" "$pid"
if command -v redis-benchmark >/dev/null; then
  # Four connections: where the descriptor limit is low (a container build's 1 024), the
  # server shrinks its listeners' bounds to fit, and one address's share with them.
  # timeout bounds it.
  timeout $((seconds * 10 + 30)) redis-benchmark -p "$resp" -c 4 -P 16 -n $((seconds * 200000)) \
    -r 100000 -q CL.THROTTLE bench:key:__rand_int__ 100 100 1 >/dev/null \
    || { echo "redis-benchmark failed (open files: $(ulimit -n)); the server's log:" >&2
         tail -20 "$data/server.log" >&2; exit 1; }
fi
kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
trap - EXIT
ls "$data"/*.profraw >/dev/null || { echo "the server wrote no profile" >&2; exit 1; }
"$profdata" merge -o "$data/merged.profdata" "$data"/*.profraw
build target/pgo-use "-Cprofile-use=$data/merged.profdata"
echo "target/pgo-use/$profile/cellrate"
