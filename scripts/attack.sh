#!/usr/bin/env bash
# Hostile clients against a release build of cellrate on loopback, each attack against a
# fresh server with default flags, a well-behaved probe (a Check every 20 ms) measuring
# what an honest caller sees meanwhile. Bounded: each attack runs SECONDS (default 20).
# Not part of the test suite (the regression tests are tests/it/hostile_clients.rs and
# tests/it/caller_limits.rs); figures go to RELIABILITY.md.
#
#   scripts/attack.sh [seconds] [attack ...]
#   attacks: none streams deaf slowloris idle connections caller-fill config
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
attacks=("$@")
[ ${#attacks[@]} -gt 0 ] || attacks=(none streams deaf slowloris idle connections caller-fill config)

# ATTACK_BIN_DIR: binaries built earlier (cellrate, examples/attack), to measure a build
# other than the working tree's.
bin=${ATTACK_BIN_DIR:-target/release-lto}
[ -n "${ATTACK_BIN_DIR:-}" ] || cargo build --profile release-lto --quiet --bin cellrate --example attack
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

for attack in "${attacks[@]}"; do
  if [ "$attack" = config ]; then
    # The config attacks: a million aliased duplicate overrides, then a symlink to a file
    # that is not YAML; validate's time, peak RSS and output size.
    mkdir -p "$work/limits"
    cp benches/grpc/limits/*.yaml "$work/limits/"
    python3 - "$work/limits/overrides.yaml" <<'EOF'
import sys
with open(sys.argv[1], "w") as f:
    f.write("- &o\n  BenchKeys: {deny: true, ids: [\"x\"]}\n")
    f.write("- *o\n" * 1_000_000)
EOF
    /usr/bin/time -f "%e s %M KiB" "$bin/cellrate" validate "$work/limits" >"$work/out" 2>"$work/time" || true
    echo "kind=config-aliases lines=$(wc -l <"$work/out") bytes=$(wc -c <"$work/out") time=$(tail -1 "$work/time")"
    rm "$work/limits/overrides.yaml"
    head -c 5000000 /dev/urandom | base64 >"$work/secret.txt"
    ln -s "$work/secret.txt" "$work/limits/overrides.yaml"
    "$bin/cellrate" validate "$work/limits" >"$work/out" || true
    echo "kind=config-symlink lines=$(wc -l <"$work/out") bytes=$(wc -c <"$work/out")"
    rm -rf "$work/limits" "$work/secret.txt"
    continue
  fi
  port=$(free_port)
  "$bin/cellrate" serve --listen "127.0.0.1:$port" --admin-listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --config benches/grpc/limits >"$work/log" 2>&1 &
  pid=$!
  sleep 1
  rss_before=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
  echo "$("$bin/examples/attack" "127.0.0.1:$port" "$attack" "$seconds" "$pid") rss_before_kib=$rss_before"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
done
