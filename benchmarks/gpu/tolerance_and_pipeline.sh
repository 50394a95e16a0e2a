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
mkdir -p "$OUT"
# shellcheck disable=SC1091
source benchmarks/gpu/triton-gpu-env.sh "$DEV" || exit 1
if ls "$DEV"/extra/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$DEV"/extra/*.whl || exit 1
fi
export PYTHONPATH=$PWD:${PYTHONPATH:+$PYTHONPATH:}/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
echo "cores: $(nproc)"
echo "== shadow tolerance"
timeout "${TOLERANCE_TIMEOUT:-120}" python3 benchmarks/gpu/shadow_tolerance.py --device gpu \
  --rows 20000 --out "$OUT/shadow_tolerance.json" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -12
echo "== trackgnn pipeline"
timeout "${PIPELINE_TIMEOUT:-200}" python3 benchmarks/pipeline_bench.py --device gpu --clients 1 8 \
  --out "$OUT" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -25
ls -la "$OUT"
