#!/usr/bin/env bash
# Stop the haproxy that start.sh started, by the PID it recorded under $HAPROXY_DIR. An haproxy
# that start.sh did not start (no PID file) is left alone.
#
#   scripts/haproxy/stop.sh
set -uo pipefail
HAPROXY_DIR=${HAPROXY_DIR:-${TMPDIR:-/tmp}/coffea-sonic-haproxy}
say() { printf '[haproxy/stop] %s\n' "$*" >&2; }
if [ ! -s "$HAPROXY_DIR/haproxy.pid" ]; then
  say "nothing recorded in $HAPROXY_DIR; nothing to stop"
  exit 0
fi
pid=$(cat "$HAPROXY_DIR/haproxy.pid")
kill "$pid" 2>/dev/null   # SIGTERM: haproxy stops at once, closing every connection
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  kill -9 "$pid" 2>/dev/null
  say "haproxy ($pid) ignored SIGTERM; killed it"
else
  say "stopped haproxy ($pid)"
fi
rm -f "$HAPROXY_DIR/haproxy.pid" "$HAPROXY_DIR/port"
