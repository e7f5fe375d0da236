# Shared by scripts/test and scripts/demo (sourced, not run).

# Installs etcd, protoc and curl if missing (apt, as root).
install_missing() {
  local who=$1 need=()
  command -v etcd >/dev/null || need+=(etcd-server)
  command -v protoc >/dev/null || need+=(protobuf-compiler)
  command -v curl >/dev/null || need+=(curl)
  command -v python3 >/dev/null || need+=(python3)
  # The console's browser test (tests/console.rs) runs headless Chromium.
  if [ "$who" = scripts/test ]; then command -v chromium >/dev/null || need+=(chromium); command -v chromedriver >/dev/null || need+=(chromium-driver); fi
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "$who: missing ${need[*]}; run as root or install them" >&2
      exit 2
    fi
    echo "$who: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_etcd DIR: a throwaway etcd on free loopback ports with its data in
# DIR; sets ETCD_PID and exports CCATTLER_ETCD; waits (with a deadline)
# until it answers.
start_etcd() {
  local dir=$1 client_port peer_port
  client_port=$(free_port)
  peer_port=$(free_port)
  export CCATTLER_ETCD="http://127.0.0.1:${client_port}"
  etcd --name ccattler --data-dir "$dir/data" \
    --listen-client-urls "$CCATTLER_ETCD" --advertise-client-urls "$CCATTLER_ETCD" \
    --listen-peer-urls "http://127.0.0.1:${peer_port}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${peer_port}" \
    --initial-cluster "ccattler=http://127.0.0.1:${peer_port}" \
    >"$dir/etcd.log" 2>&1 &
  ETCD_PID=$!
  for _ in $(seq 1 100); do
    if curl -fsS "$CCATTLER_ETCD/health" 2>/dev/null | grep -q '"health":"true"'; then return 0; fi
    if ! kill -0 "$ETCD_PID" 2>/dev/null; then cat "$dir/etcd.log" >&2; echo "etcd exited" >&2; exit 1; fi
    sleep 0.1
  done
  cat "$dir/etcd.log" >&2
  echo "etcd did not become healthy within 10 s" >&2
  exit 1
}

# stop_pid PID: SIGTERM, then SIGKILL after 10 s.
stop_pid() {
  local pid=$1
  kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
