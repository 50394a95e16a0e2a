#!/usr/bin/env bash
# The seeds' models on a GPU machine, one command:
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device && bash benchmarks/gpu/fetch_wheels.sh --no-wrapper
#   GPU machine: bash benchmarks/gpu/pipeline_check.sh            (bring .device along)
#
# 1. benchmarks/pipeline_bench.py --device gpu --clients 1 8: the trackgnn pipeline in-process
#    (direct), served as one fused python-backend model, and served as a Triton ensemble of stages;
# 2. coffea-sonic bench suite --models particlenet deepmet --modes cpu local-gpu remote: in-process CPU vs
#    in-process GPU vs served, 1 and 8 client processes.
# Writes pipeline-gpu.json/.md and models/results.* into $OUT (default bench-output/pipeline).
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/pipeline}
# shellcheck disable=SC1091
source benchmarks/gpu/prologue.sh
echo "== trackgnn pipeline"
timeout "${PIPELINE_TIMEOUT:-260}" python3 benchmarks/pipeline_bench.py --device gpu --clients 1 8 \
  --out "$OUT" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -25
left=$(( ${TOTAL_BUDGET:-560} - SECONDS - 10 ))
echo "== particlenet, deepmet (at most $left s)"
timeout "$left" python3 -m coffea_sonic.cli bench suite --preset gpu --device gpu \
  --models particlenet deepmet --modes cpu local-gpu remote --batch-sizes 512 --no-default-batch \
  --chunk-rows 4096 --clients 1 8 --in-flight 4 --repetitions 3 --e2e-events 0 \
  -o "$OUT/models" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -25
if [ ! -f "$OUT/models/results.json" ] && [ -f "$OUT/models/results.partial.json" ]; then
  mv "$OUT/models/results.partial.json" "$OUT/models/results.json"
fi
ls -la "$OUT" "$OUT/models" 2>/dev/null
