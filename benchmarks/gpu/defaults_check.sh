#!/usr/bin/env bash
# Served vs in-process on one GPU at DEFAULT settings, self-contained for the GPU machine.
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device           (.device is git-ignored, ~46 MB)
#   GPU machine: bash benchmarks/gpu/defaults_check.sh               (bring .device along)
#                bash benchmarks/gpu/defaults_check.sh --plan gpus   (every GPU of the machine)
#
# Sets up tritonserver + the model Python (prologue.sh), then runs
# benchmarks/gpu/defaults_sweep.py (default plan: final = default LocalTritonServer(device="gpu") +
# default TritonModel; emtrk_cnn 2048-row chunks with 1, 8, 16 client processes and jet_tagger
# 65 536-row chunks with 8, against in-process GpuEngine in the same run). Writes
# defaults-<plan>.json / .md and the log into $OUT (default bench-output/defaults).
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/defaults}
# shellcheck disable=SC1091
source benchmarks/gpu/prologue.sh
set -o pipefail
timeout "${TIMEOUT:-570}" python3 benchmarks/gpu/defaults_sweep.py --out "$OUT" "$@" 2>&1 \
  | grep --line-buffered -v "^INFO:coffea\|RuntimeWarning\|warnings.warn" | tee "$OUT/defaults-log.txt"
status=$?
ls -la "$OUT"
exit $status
