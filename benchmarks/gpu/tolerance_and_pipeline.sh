#!/usr/bin/env bash
# The trackgnn pipeline from 1 and 8 clients (fused and ensemble vs direct) on a GPU machine, in
# one command (bring .device along):
#
#   bash benchmarks/gpu/tolerance_and_pipeline.sh
#
# Writes pipeline-gpu.json/.md into $OUT (default bench-output/lead). Its first part, shadow
# validation's honest GPU divergence per zoo model, is a recorded study now
# (benchmarks/studies/README.md).
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/lead}
# shellcheck disable=SC1091
source benchmarks/gpu/prologue.sh
echo "== trackgnn pipeline"
timeout "${PIPELINE_TIMEOUT:-200}" python3 benchmarks/pipeline_bench.py --device gpu --clients 1 8 \
  --out "$OUT" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -25
ls -la "$OUT"
