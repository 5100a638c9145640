#!/usr/bin/env bash
# The image, built by a container engine and run: podman builds the Dockerfile unchanged,
# then runs the image the ways users do, and checks what the image promises.
#
#   1. build     `podman build` of the Dockerfile on the base images' local stand-ins
#                (scripts/stand-in-images.sh: no registry is reachable here), in a build
#                container whose cargo home is empty, so the build needs nothing but the
#                crates Cargo.lock names (fetched from crates.io over the host's network,
#                with the host's CA bundle mounted read-only); with CELLRATE_IMAGE_PGO=1
#                its server profile-guided, as the build stage shows
#   2. serve     `podman run --read-only` with the image's ENTRYPOINT and CMD: the process
#                is uid/gid 65532, its root is mounted read-only, and it answers the
#                README's first `Check` (grpcurl over loopback)
#   3. ratelimit run as `/bin/ratelimit` with the environment Envoy Gateway gives its
#                rate-limit container (Redis backend, xDS config with
#                FORCE_START_WITHOUT_INITIAL_CONFIG and no control plane reachable,
#                Prometheus, the runtime directory mounted read-only at /data): it serves
#                and, reading no file in xDS mode as upstream, limits nothing yet (OK, OK,
#                OK); then with upstream's file configuration it answers from the runtime
#                directory's limit, counted in Redis: OK, OK, OVER_LIMIT
#   4. SIGTERM   each container exits 0 within STOP_BOUND_S of SIGTERM
#   5. module    the module image (`--target module`), run read-only as users run it with a
#                volume at /modules, copies libcellrate_redis.so into it; this machine's
#                redis-server loads that file (`--loadmodule`) and answers CL.THROTTLE with
#                redis-cell's numbers, and its errors
#
# Host network, loopback addresses and ports the kernel picks (port 0, read back from the
# JSON log); every wait is bounded. Needs root (podman runs rootful here).
# PROFILE is the Dockerfile's build argument: `release` (the default here) keeps CI's time
# reasonable; CELLRATE_IMAGE_PROFILE=release-lto builds what `docker build .` builds. So is
# PGO: 0 here (the profile-guided build doubles the image's build, about 25 minutes more on
# two cores), CELLRATE_IMAGE_PGO=1 builds the server profile-guided as `docker build .` does,
# and checks that the image got that build.
# Usage: scripts/image-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/scripts/podman-containers.conf"
[ "$(id -u)" = 0 ] || { echo "image-check: needs root (rootful podman)" >&2; exit 1; }

profile="${CELLRATE_IMAGE_PROFILE:-release}"
pgo="${CELLRATE_IMAGE_PGO:-0}"
image=localhost/cellrate-image-check
STOP_BOUND_S=15
FIRST_REQUEST='{"items": [{"name": "NewOrdersPerAccount", "id": "12345678"}]}'

log() { echo "image-check: $*"; }
now() { date +%s.%N; }
since() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$1" "$(now)"; }

started=$(now)
scripts/stand-in-images.sh
log "stand-in base images ready in $(since "$started") s"

# 1. build
build_started=$(now)
ca_mount=()
# cargo in the build container reaches crates.io through this machine's network, whose
# TLS may be signed by a CA only the host's bundle holds.
[ -f /etc/ssl/certs/ca-certificates.crt ] \
  && ca_mount=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
# The build stage is tagged too, so that it is not "dangling": the prune below removes what
# earlier checks built from other sources (gigabytes of target directory each) and keeps
# what this one built, the next run's layer cache.
podman build --pull=never --network=host --build-arg "PROFILE=$profile" --build-arg "PGO=$pgo" "${ca_mount[@]}" \
  --target build -t "$image-build" .
podman build --pull=never --network=host --build-arg "PROFILE=$profile" --build-arg "PGO=$pgo" "${ca_mount[@]}" \
  -t "$image" .
podman build --pull=never --network=host --build-arg "PROFILE=$profile" --build-arg "PGO=$pgo" "${ca_mount[@]}" \
  --target module -t "$image-module" .
podman image prune -f --filter label=cellrate.stand-in=true >/dev/null
log "podman build (PROFILE=$profile PGO=$pgo) took $(since "$build_started") s"
if [ "$pgo" = 1 ]; then
  # The server was laid out by a profile of its own load: the build stage holds the merged
  # profile, and the binary the image got is the one rebuilt with it.
  podman run --rm --network=none "$image-build" sh -c \
    "test -s target/pgo-data/merged.profdata && cmp -s cellrate target/pgo-use/$profile/cellrate" \
    || { log "the image's server is not the profile-guided build"; exit 1; }
  log "the server is the profile-guided build"
fi

work=$(mktemp -d /tmp/cellrate-image-check.XXXXXX)
containers=()
redis_pid=""
module_redis_pid=""
cleanup() {
  for c in "${containers[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  [ -z "$redis_pid" ] || kill "$redis_pid" 2>/dev/null || true
  [ -z "$module_redis_pid" ] || kill "$module_redis_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The JSON fields of container $1's "cellrate serving" line, waiting at most 30 s.
serving() {
  local line
  for _ in $(seq 1 150); do
    line=$(podman logs "$1" 2>&1 | grep -m1 '"cellrate serving"' || true)
    if [ -n "$line" ]; then
      echo "$line"
      return 0
    fi
    [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ] || break
    sleep 0.2
  done
  podman logs "$1" >&2 || true
  echo "image-check: $1 never served" >&2
  return 1
}
field() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])["fields"][sys.argv[2]])' "$1" "$2"; }

# The process of container $1 runs as uid and gid 65532 on a read-only root (from the host's
# /proc, not from what podman was asked for).
user_and_root() {
  local pid uid gid root
  pid=$(podman inspect -f '{{.State.Pid}}' "$1")
  uid=$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")
  gid=$(awk '/^Gid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")
  root=$(awk '$5 == "/" {print $6}' "/proc/$pid/mountinfo" | head -1)
  [ "$uid" = "65532 65532 65532 65532" ] && [ "$gid" = "65532 65532 65532 65532" ] \
    || { echo "image-check: $1 runs as uid $uid, gid $gid, not 65532" >&2; return 1; }
  case "$root" in
    ro | ro,*) ;;
    *) echo "image-check: $1's root is mounted $root, not read-only" >&2; return 1 ;;
  esac
  log "$1: uid and gid 65532, root mounted $root"
}

# SIGTERM to container $1's process: exit code 0, within STOP_BOUND_S.
terminate() {
  local t code
  t=$(now)
  podman kill --signal TERM "$1" >/dev/null
  code=$(timeout "$STOP_BOUND_S" podman wait "$1") \
    || { echo "image-check: $1 still running ${STOP_BOUND_S} s after SIGTERM" >&2; return 1; }
  [ "$code" = 0 ] || { podman logs "$1" >&2; echo "image-check: $1 exited $code on SIGTERM" >&2; return 1; }
  log "$1: exit 0, $(since "$t") s after SIGTERM"
}

run_flags=(--detach --network=host --read-only --read-only-tmpfs=false --cap-drop=all
  --security-opt=no-new-privileges)

# 2. serve, as `docker run IMAGE` does, with loopback listeners.
checks_started=$(now)
serve="cellrate-image-check-$$-serve"
containers+=("$serve")
podman run "${run_flags[@]}" --name "$serve" \
  -e CELLRATE_LISTEN=127.0.0.1:0 -e CELLRATE_ADMIN_LISTEN=127.0.0.1:0 \
  -e CELLRATE_METRICS_LISTEN=127.0.0.1:0 "$image" >/dev/null
line=$(serving "$serve")
listen=$(field "$line" listen)
user_and_root "$serve"
answer=$(grpcurl -plaintext -emit-defaults -max-time 10 -d "$FIRST_REQUEST" "$listen" \
  cellrate.v1.RateLimiter/Check)
python3 -c '
import json, sys
overall = json.loads(sys.argv[1])["overall"]
assert overall["allowed"] is True and overall["remaining"] == "299", sys.argv[1]
' "$answer" || { echo "image-check: unexpected first answer: $answer" >&2; exit 1; }
log "$serve: the first Check on $listen: allowed, 299 remaining"
terminate "$serve"

# 3. As Envoy Gateway runs envoyproxy/ratelimit's image: `/bin/ratelimit`, its environment
# (the ratelimit container's variables; TLS to the control plane and to Envoy left out, the
# test suite covers them: tests/it/xds.rs), Redis on a free loopback port, no control plane
# reachable.
redis_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
xds_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 1 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$redis_port" ping >/dev/null || { echo "image-check: redis-server did not start" >&2; exit 1; }
mkdir -p "$work/data/ratelimit/config"
cat >"$work/data/ratelimit/config/image-check.yaml" <<'EOF'
domain: image-check
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 2}
EOF
chmod -R a+rX "$work"

# ratelimit NAME EXPECTED [podman run options...]: runs the image as `/bin/ratelimit` with
# the runtime directory at /data (read-only), Redis, Prometheus and the given variables,
# sends three ShouldRateLimit for one client and checks the answers are EXPECTED, then the
# user and root, /healthcheck and /metrics, and a clean SIGTERM.
ratelimit() {
  local name="cellrate-image-check-$$-$1" expected=$2 line listen health metrics codes answer keys
  shift 2
  containers+=("$name")
  podman run "${run_flags[@]}" --name "$name" --entrypoint /bin/ratelimit \
    -v "$work/data:/data:ro" \
    -e RUNTIME_ROOT=/data -e RUNTIME_SUBDIRECTORY=ratelimit -e RUNTIME_IGNOREDOTFILES=true \
    -e RUNTIME_WATCH_ROOT=false -e LOG_LEVEL=info -e USE_STATSD=false \
    -e BACKEND_TYPE=redis -e REDIS_SOCKET_TYPE=tcp -e "REDIS_URL=127.0.0.1:$redis_port" \
    -e USE_PROMETHEUS=true -e PROMETHEUS_ADDR=127.0.0.1:0 \
    -e GRPC_HOST=127.0.0.1 -e GRPC_PORT=0 -e HOST=127.0.0.1 -e PORT=0 -e LOG_FORMAT=json \
    -e CELLRATE_ADMIN_LISTEN=127.0.0.1:0 \
    "$@" "$image" >/dev/null
  line=$(serving "$name")
  listen=$(field "$line" listen)
  health=$(field "$line" health)
  metrics=$(field "$line" metrics)
  user_and_root "$name"
  codes=""
  for _ in 1 2 3; do
    answer=$(grpcurl -plaintext -max-time 10 \
      -d '{"domain": "image-check", "descriptors": [{"entries": [{"key": "client", "value": "a"}]}]}' \
      "$listen" envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit)
    codes="$codes $(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["overallCode"])' "$answer")"
  done
  [ "$codes" = " $expected" ] \
    || { echo "image-check: $name: ShouldRateLimit answered$codes, not $expected" >&2; exit 1; }
  # The probe port Envoy Gateway checks, and the Prometheus listener with the decisions counted.
  python3 -c '
import sys, urllib.request
with urllib.request.urlopen(f"http://{sys.argv[1]}/healthcheck", timeout=10) as r:
    assert r.status == 200, r.status
with urllib.request.urlopen(f"http://{sys.argv[2]}/metrics", timeout=10) as r:
    body = r.read()
    assert r.status == 200 and b"cellrate_decisions_total" in body and b"api=\"envoy\"" in body
' "$health" "$metrics"
  keys=$(redis-cli -p "$redis_port" dbsize)
  log "$name: ShouldRateLimit on $listen:$codes ($keys key(s) in Redis), /healthcheck 200, /metrics on $metrics"
  terminate "$name"
}

# Envoy Gateway's environment: its limits come from its control plane over xDS, which is not
# reachable here; FORCE_START_WITHOUT_INITIAL_CONFIG serves without them and, as upstream,
# reads no file in xDS mode, so nothing is limited yet and nothing is counted.
ratelimit gateway "OK OK OK" \
  -e CONFIG_TYPE=GRPC_XDS_SOTW -e "CONFIG_GRPC_XDS_SERVER_URL=127.0.0.1:$xds_port" \
  -e CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit -e FORCE_START_WITHOUT_INITIAL_CONFIG=true
[ "$(redis-cli -p "$redis_port" dbsize)" = 0 ] \
  || { echo "image-check: in xDS mode it counted limits it was never sent" >&2; exit 1; }
# The same image with upstream's file configuration: the runtime directory's limit, counted
# in Redis (an hour's window: a minute's key could end, and leave Redis, between the last
# answer and the count, as it once did here).
ratelimit files "OK OK OVER_LIMIT" -e CONFIG_TYPE=FILE
[ "$(redis-cli -p "$redis_port" dbsize)" -ge 1 ] \
  || { echo "image-check: nothing written to Redis" >&2; exit 1; }

# 5. The module image as the chart's initContainer and `docker run -v VOLUME:/modules` run
# it: its entrypoint copies the module into the volume (here a directory any uid may write,
# as an emptyDir is). Then a real redis-server loads the copy and decides with it.
mkdir -p "$work/modules"
chmod 1777 "$work/modules"
podman run --rm --network=none --read-only --cap-drop=all --security-opt=no-new-privileges \
  -v "$work/modules:/modules" "$image-module" >/dev/null
so="$work/modules/libcellrate_redis.so"
[ -s "$so" ] || { echo "image-check: the module image copied nothing into /modules" >&2; exit 1; }
module_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$module_port" --save '' --appendonly no \
  --loadmodule "$so" >"$work/module-redis.log" 2>&1 &
module_redis_pid=$!
for _ in $(seq 1 100); do
  redis-cli -p "$module_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$module_port" ping >/dev/null \
  || { cat "$work/module-redis.log" >&2; echo "image-check: redis-server did not start with the image's module" >&2; exit 1; }
# redis-cell's numbers: max_burst 1 (2 in a burst), 1 per 60 s: allowed with 1 then 0
# remaining, then limited with at most 60 s to wait (the seconds depend on the clock between
# calls, not checked to the second); its argument error, which writes nothing.
throttle() { redis-cli -p "$module_port" CL.THROTTLE "$@" | tr '\n' ' ' | sed 's/ *$//'; }
answers="$(throttle k 1 1 60) | $(throttle k 1 1 60) | $(throttle k 1 1 60)"
python3 -c '
import sys
first, second, third = [[int(n) for n in a.split()] for a in sys.argv[1].split(" | ")]
assert first == [0, 2, 1, -1, 60], first
assert second[:4] == [0, 2, 0, -1] and 60 < second[4] <= 120, second
assert third[:3] == [1, 2, 0] and 0 < third[3] <= 60 and 0 < third[4] <= second[4], third
' "$answers" || { echo "image-check: the image's module answered CL.THROTTLE $answers" >&2; exit 1; }
error=$(throttle other 1 x 60)
[ "$error" = "Cell error: Couldn't parse as integer: x" ] \
  || { echo "image-check: the image's module answered a bad count with: $error" >&2; exit 1; }
[ "$(redis-cli -p "$module_port" exists other)" = 0 ] && [ "$(redis-cli -p "$module_port" dbsize)" = 1 ] \
  || { echo "image-check: the module's error wrote a key" >&2; exit 1; }
log "the module image copied $(stat -c %s "$so") bytes to /modules; redis-server $(redis-server --version | awk '{print $3}') loaded it: CL.THROTTLE $answers"
kill "$module_redis_pid"
wait "$module_redis_pid" 2>/dev/null || true
module_redis_pid=""
log "run checks took $(since "$checks_started") s; the whole image check $(since "$started") s"
