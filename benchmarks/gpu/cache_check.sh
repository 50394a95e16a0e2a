#!/usr/bin/env bash
# The demo run twice with the persistent inference cache on a GPU machine (one command):
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device && bash benchmarks/gpu/fetch_wheels.sh --no-wrapper
#   GPU machine: bash benchmarks/gpu/cache_check.sh          (bring .device along)
#
# Sets up tritonserver + the model Python (triton-gpu-env.sh), installs the carried coffea / Dask
# wheels into /tmp/site, then runs
#   coffea-sonic bench cache --scenario demo-twice --demo-args "--device gpu --workers $WORKERS"
# (the demo's 40 000 events, its embedded server on the GPU, a fresh cache directory): both runs'
# wall times, the second run's requests (0 expected), identical histograms. Writes demo-twice.json
# and cache-log.txt into $OUT (default bench-output/cache-gpu). (The CUDA shared memory probe of
# Triton's response cache is a recorded study now: benchmarks/studies/README.md.)
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/cache-gpu}
WORKERS=${WORKERS:-8}
# shellcheck disable=SC1091
source benchmarks/gpu/prologue.sh
timeout "${TIMEOUT:-200}" python3 -m coffea_sonic.cli bench cache --scenario demo-twice \
  --demo-args "--device gpu --workers $WORKERS" -o "$OUT" "$@" 2>&1 \
  | grep --line-buffered -v "RuntimeWarning\|warnings.warn\|distributed.worker.memory" | tee "$OUT/cache-log.txt"
status=${PIPESTATUS[0]}
ls -la "$OUT"
exit "$status"
