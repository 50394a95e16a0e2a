#!/usr/bin/env bash
# Stop what start.sh started, by the PIDs it recorded under $SLURM_DIR; cancel this user's jobs
# first. A SLURM that start.sh did not start (no PID files) is left alone.
#
#   scripts/slurm/stop.sh
set -uo pipefail
SLURM_DIR=${SLURM_DIR:-${TMPDIR:-/tmp}/coffea-sonic-slurm}
say() { printf '[slurm/stop] %s\n' "$*"; }
if [ ! -s "$SLURM_DIR/slurmctld.pid" ] && [ ! -s "$SLURM_DIR/slurmd.pid" ] && [ ! -s "$SLURM_DIR/munged.pid" ]; then
  say "nothing recorded in $SLURM_DIR; nothing to stop"
  exit 0
fi
scancel -u "$(id -un)" 2>/dev/null || true
for daemon in slurmd slurmctld munged; do
  [ -s "$SLURM_DIR/$daemon.pid" ] || continue
  pid=$(cat "$SLURM_DIR/$daemon.pid")
  kill "$pid" 2>/dev/null
  # slurmctld needs a few seconds to save its state before it exits
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then say "$daemon ($pid) still alive"; else say "stopped $daemon ($pid)"; fi
  rm -f "$SLURM_DIR/$daemon.pid"
done
