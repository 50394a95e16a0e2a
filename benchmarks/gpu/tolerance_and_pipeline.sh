#!/usr/bin/env bash
# Shadow validation's honest GPU divergence per zoo model, then the trackgnn pipeline from 1 and
# 8 clients (fused and ensemble vs direct), in one command on a GPU machine (bring .device along):
#
#   bash benchmarks/gpu/tolerance_and_pipeline.sh
#
# Writes shadow_tolerance.json and pipeline-gpu.json/.md into $OUT (default bench-output/lead).
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/lead}
# shellcheck disable=SC1091
source benchmarks/gpu/prologue.sh
echo "== shadow tolerance"
timeout "${TOLERANCE_TIMEOUT:-120}" python3 benchmarks/gpu/shadow_tolerance.py --device gpu \
  --rows 20000 --out "$OUT/shadow_tolerance.json" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -12
echo "== trackgnn pipeline"
timeout "${PIPELINE_TIMEOUT:-200}" python3 benchmarks/pipeline_bench.py --device gpu --clients 1 8 \
  --out "$OUT" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -25
ls -la "$OUT"
