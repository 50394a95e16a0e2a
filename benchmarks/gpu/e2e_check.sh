#!/usr/bin/env bash
# The analysis end to end on a GPU machine: in-process CPU inference vs in-process GPU in
# every worker vs served on 1, 2, 4 GPUs (those the machine has), one command:
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device && bash benchmarks/gpu/fetch_wheels.sh --no-wrapper
#   GPU machine: bash benchmarks/gpu/e2e_check.sh             (bring .device along)
#                EVENTS=1000000 WORKERS=60 bash benchmarks/gpu/e2e_check.sh
#
# Sets up tritonserver + the model Python (triton-gpu-env.sh), installs the carried coffea / Dask
# wheels into /tmp/site, then runs
#   coffea-sonic bench e2e --events $EVENTS --workers $WORKERS -o $OUT
# (default: 1 000 000 events, one Dask worker per core but one). Writes results.json, results.md,
# e2e_machine.png and e2e-log.txt into $OUT (default bench-output/e2e).
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/e2e}
EVENTS=${EVENTS:-1000000}
WORKERS=${WORKERS:-$(( $(nproc) - 1 ))}
# shellcheck disable=SC1091
source benchmarks/gpu/prologue.sh
timeout "${TIMEOUT:-560}" python3 -m coffea_sonic.cli bench e2e --events "$EVENTS" \
  --workers "$WORKERS" -o "$OUT" "$@" 2>&1 \
  | grep --line-buffered -v "RuntimeWarning\|warnings.warn\|distributed.worker.memory" | tee "$OUT/e2e-log.txt"
status=${PIPESTATUS[0]}
cat "$OUT/results.md" 2>/dev/null
ls -la "$OUT"
exit "$status"
