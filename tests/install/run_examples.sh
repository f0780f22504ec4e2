#!/usr/bin/env bash
# Runs the examples against each other, and the client against a redis-server with the module:
#   run_examples.sh <directory with dma-example-*> [<dma.so>]
# 1. dma-example-server, then dma-example-client fabric (and dma-example-client-static fabric,
#    if built) against it: the server writes its value into each client's exposed buffer.
# 2. With a module: redis-server --loadmodule <dma.so> on a free loopback port, then
#    dma-example-client redis (and -static): DMA.SET and DMA.GET of 1 MiB, verified.
# Every wait has a deadline: the server's "listening" line is read with `read -t`, each client
# runs under `timeout`; redis-server is polled with PING (a child cannot notify us) until a
# deadline. Everything started is killed on exit.
set -euo pipefail
bin=$1
module=${2:-}
provider=${PROVIDER:-tcp}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "run_examples: $*" >&2; exit 1; }

clients=("$bin/dma-example-client")
[ -x "$bin/dma-example-client-static" ] && clients+=("$bin/dma-example-client-static")

# 1. The example server and the fabric client.
mkfifo "$work/listening"
timeout 120 "$bin/dma-example-server" --provider "$provider" --requests "${#clients[@]}" \
  >"$work/listening" 2>"$work/server.log" &
server=$!
pids+=("$server")
exec 3<"$work/listening"
read -r -t 30 -u 3 word port || fail "the example server did not start: $(cat "$work/server.log")"
[ "$word" = listening ] || fail "unexpected line from the server: $word $port"
for client in "${clients[@]}"; do
  out=$(timeout 60 "$client" fabric "$port" --provider "$provider") ||
    fail "$client fabric failed: $out"
  echo "$(basename "$client"): $out"
done
wait "$server" || fail "the example server exited with $?: $(cat "$work/server.log")"
exec 3<&-

# 2. The dma::Client example against redis-server with the module.
[ -n "$module" ] || exit 0
[ -f "$module" ] || fail "no module at $module"
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
for attempt in 1 2 3 4 5; do
  rport=$(free_port)
  IPATH_NO_BACKTRACE=1 redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
    --loadmodule "$module" providers "$provider" bind 127.0.0.1 >"$work/redis.log" 2>&1 &
  redis=$!
  pids+=("$redis")
  ready=
  deadline=$((SECONDS + 30))
  while [ $SECONDS -lt $deadline ] && kill -0 "$redis" 2>/dev/null; do
    if [ "$(redis-cli -p "$rport" ping 2>/dev/null)" = PONG ]; then ready=1; break; fi
    sleep 0.05  # polling a child that cannot notify us, bounded by the deadline
  done
  [ -n "$ready" ] && break
  grep -q "Address already in use" "$work/redis.log" || fail "redis-server did not start: $(cat "$work/redis.log")"
done
[ -n "$ready" ] || fail "redis-server could not bind a free port"
for client in "${clients[@]}"; do
  out=$(timeout 60 "$client" redis "$rport" --provider "$provider") ||
    fail "$client redis failed: $out"
  echo "$(basename "$client"): $out"
done
redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
echo "run_examples: all passed"
