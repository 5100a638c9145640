# Shared by the end-to-end benchmark scripts (sourced): a free loopback port, a field of
# loadgen's output, and the table every script prints and keeps for scripts/ratios.py.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# throttlecrab_server: throttlecrab-server 0.4.40's path, installed from crates.io into
# target/peers/throttlecrab (`cargo install --locked`, a few minutes on two cores) when
# missing.
throttlecrab_server() {
  local root=$PWD/target/peers/throttlecrab
  if [ ! -x "$root/bin/throttlecrab-server" ]; then
    echo "installing throttlecrab-server 0.4.40 from crates.io (a few minutes on two cores)" >&2
    cargo install --quiet --locked throttlecrab-server --version 0.4.40 --root "$root" >&2
  fi
  echo "$root/bin/throttlecrab-server"
}

# field NAME: the value of NAME=... in loadgen's output on stdin.
field() { sed -n "s/\(^\|.* \)$1=\([0-9.]*\).*/\2/p"; }

row_format='%-6s %-9s %-10s %10s %8s %8s %12s %9s %6s\n'

header() { printf "$row_format" round scenario server req/s p50_us p99_us cpu_us/req rss_kib errors; }

# row ROUND SCENARIO SERVER OUTPUT RESULTS: prints one row and keeps the run for ratios.py.
row() {
  printf "$row_format" "$1" "$2" "$3" \
    "$(echo "$4" | field rps)" "$(echo "$4" | field p50_us)" "$(echo "$4" | field p99_us)" \
    "$(echo "$4" | field cpu_us_per_req)" "$(echo "$4" | field rss_kib)" "$(echo "$4" | field errors)"
  echo "$1 $2 $3 $4" >> "$5"
}

# For the side-by-side scripts (bench-peers*.sh, bench-shared-core.sh): BENCH_PIN=1 puts the
# servers on CPU 0 and the load on CPU 1 (prefix a server with "${pin_server[@]}", the load
# with "${pin_load[@]}"); each script's `start` keeps its servers by name in `port` and
# `pid`, all stopped, and the work directory `$work` removed, on exit.
side_by_side() {
  pin_server=(); pin_load=()
  if [ "${BENCH_PIN:-0}" = 1 ]; then pin_server=(taskset -c 0); pin_load=(taskset -c 1); fi
  declare -gA port pid rpc # rpc: a script's RPC per server, where not envoy (grpc_rounds)
  trap 'for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "${work:-}"' EXIT
}

# grpc_rounds "SCENARIOS": every round, scenario and server of `$servers` in turn, loadgen on
# 4 connections x 64 streams for `$seconds`, in the RPC `rpc[SERVER]` names (default envoy);
# rows printed and kept in `$results`.
grpc_rounds() {
  local round scenario target out
  header
  for round in $(seq "$rounds"); do
    for scenario in $1; do
      for target in $servers; do
        out=$("${pin_load[@]}" "$bin/examples/loadgen" "127.0.0.1:${port[$target]}" \
          "${rpc[$target]:-envoy}" "$scenario" 4 64 "$seconds" "${pid[$target]}")
        row "$round" "$scenario" "$target" "$out" "$results"
      done
    done
  done
}

# grpc_memory "SERVERS": memory per live key, each server restarted empty (the script's
# `start`), RSS before, then every one of 10^6 keys once, each kept an hour.
grpc_memory() {
  local target before after out
  echo
  echo "memory per live key (10^6 keys, each kept an hour):"
  for target in $1; do
    kill "${pid[$target]}" 2>/dev/null; wait "${pid[$target]}" 2>/dev/null || true
    start "$target"; sleep 1
    before=$(awk '/VmRSS/ {print $2}' "/proc/${pid[$target]}/status")
    out=$(LOADGEN_TOTAL=1000000 "${pin_load[@]}" "$bin/examples/loadgen" "127.0.0.1:${port[$target]}" \
      "${rpc[$target]:-envoy}" million 4 64 600 "${pid[$target]}")
    after=$(echo "$out" | field rss_kib)
    python3 -c "print(f'  {\"$target\":12s} RSS {$before} KiB -> {$after} KiB: {($after - $before) * 1024 / 1e6:.0f} bytes per key ($(echo "$out" | field errors) errors)')"
  done
}
