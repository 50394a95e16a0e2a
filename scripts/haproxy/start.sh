#!/usr/bin/env bash
# Start HAProxy on this machine as a round-robin gRPC (HTTP/2) load balancer in front of
# tritonservers: installs Debian's haproxy with apt if missing (as root), writes the configuration
# from haproxy.cfg.tmpl under $HAPROXY_DIR, starts haproxy as a daemon and records its PID there,
# so that stop.sh stops exactly what this script started. No systemd needed. Starts in < 1 s once
# installed.
#
#   HAPROXY_BACKENDS=127.0.0.1:8001,127.0.0.1:9001 scripts/haproxy/start.sh
#   HAPROXY_DIR=/tmp/lb HAPROXY_PORT=8101 HAPROXY_BACKENDS=... scripts/haproxy/start.sh
#
# HAPROXY_PORT unset or 0: a free port is picked, and picked again if another process binds it
# before haproxy does (haproxy -D exits non-zero when its bind fails). The frontend's port is
# printed as "HAPROXY_PORT=<port>" on stdout and written to $HAPROXY_DIR/port.
# HAPROXY_BIND (default 127.0.0.1) is the frontend's address.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HAPROXY_DIR=${HAPROXY_DIR:-${TMPDIR:-/tmp}/coffea-sonic-haproxy}
HAPROXY_BIND=${HAPROXY_BIND:-127.0.0.1}
HAPROXY_PORT=${HAPROXY_PORT:-0}
ATTEMPTS=${HAPROXY_ATTEMPTS:-8}
say() { printf '[haproxy/start] %s\n' "$*" >&2; }

if [ -z "${HAPROXY_BACKENDS:-}" ]; then
  say "set HAPROXY_BACKENDS=host:port[,host:port...] (the tritonservers' gRPC addresses)"
  exit 2
fi
if [ -s "$HAPROXY_DIR/haproxy.pid" ] && kill -0 "$(cat "$HAPROXY_DIR/haproxy.pid")" 2>/dev/null; then
  say "an haproxy started from $HAPROXY_DIR is already running (pid $(cat "$HAPROXY_DIR/haproxy.pid")); run stop.sh first"
  exit 3
fi

# 1. the package (only when missing; wait for another apt run instead of failing on its lock)
if ! command -v haproxy >/dev/null; then
  if [ "$(id -u)" != 0 ]; then say "haproxy is not installed and installing it needs root" ; exit 4; fi
  command -v apt-get >/dev/null || { say "haproxy is not installed and there is no apt-get"; exit 4; }
  export DEBIAN_FRONTEND=noninteractive
  # Only the package's files are needed: keep its postinst from starting a system-wide haproxy.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends haproxy >/dev/null
  say "installed haproxy $(dpkg-query -W -f='${Version}' haproxy)"
fi
mkdir -p "$HAPROXY_DIR"

# 2. configuration: one "server" line per backend, health-checked over TCP
servers=""
index=0
IFS=',' read -r -a backends <<<"$HAPROXY_BACKENDS"
for backend in "${backends[@]}"; do
  servers+="  server triton$index $backend proto h2 check"$'\n'
  index=$((index + 1))
done

free_port() {  # a port in the ephemeral range nobody listens on right now (haproxy may still lose it)
  local port
  for _ in $(seq 100); do
    port=$(( 20000 + RANDOM % 40000 ))
    if ! (exec 3<>"/dev/tcp/$HAPROXY_BIND/$port") 2>/dev/null; then echo "$port"; return 0; fi
  done
  return 1
}

# 3. start, on a new port if the picked one was taken in between
for attempt in $(seq "$ATTEMPTS"); do
  port=$HAPROXY_PORT
  [ "$port" = 0 ] && port=$(free_port)
  {
    while IFS= read -r line; do
      case "$line" in
        @SERVERS@) printf '%s' "$servers" ;;
        *) line=${line//@BIND@/$HAPROXY_BIND}; line=${line//@PORT@/$port}
           printf '%s\n' "${line//@PIDFILE@/$HAPROXY_DIR/haproxy.pid}" ;;
      esac
    done <"$HERE/haproxy.cfg.tmpl"
  } >"$HAPROXY_DIR/haproxy.cfg"
  haproxy -c -q -f "$HAPROXY_DIR/haproxy.cfg"
  # -D: the parent exits only after every frontend is bound (non-zero if a bind failed)
  if haproxy -D -f "$HAPROXY_DIR/haproxy.cfg" 2>"$HAPROXY_DIR/haproxy.err"; then
    echo "$port" >"$HAPROXY_DIR/port"
    say "haproxy $(haproxy -v | head -n1 | awk '{print $3}') on $HAPROXY_BIND:$port (pid $(cat "$HAPROXY_DIR/haproxy.pid")) -> $HAPROXY_BACKENDS"
    echo "HAPROXY_PORT=$port"
    exit 0
  fi
  if [ "$HAPROXY_PORT" != 0 ] || ! grep -q "Address already in use" "$HAPROXY_DIR/haproxy.err"; then
    say "haproxy did not start:"; cat "$HAPROXY_DIR/haproxy.err" >&2
    exit 5
  fi
  say "port $port was taken before haproxy bound it (attempt $attempt of $ATTEMPTS)"
done
say "no free port after $ATTEMPTS attempts:"; cat "$HAPROXY_DIR/haproxy.err" >&2
exit 5
