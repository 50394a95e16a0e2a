#!/usr/bin/env bash
# The gRPC default against other request sizes, the trackgnn pipeline and the end-to-end analysis
# on a GPU machine, one command (after wire_check.sh):
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device && bash benchmarks/gpu/fetch_wheels.sh --no-wrapper
#   GPU machine: bash benchmarks/gpu/wire_check2.sh     (bring .device/ts.tar.xz, .device/whl, .device/extra)
#
# 1. defaults_sweep.py --plan wire2 (emtrk_cnn, gRPC forced: 2 MiB x 4 and other sizes/windows,
#    1 and 8 processes, in-process GpuEngine before and after);
# 2. pipeline_bench.py --device gpu --clients 1 8 (trackgnn direct, fused, ensemble; the server's
#    per-request profile);
# 3. coffea-sonic bench e2e (1 000 000 events, one Dask worker per core but one).
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/wire2}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source benchmarks/gpu/triton-gpu-env.sh "$DEV" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$DEV"/extra/*.whl || exit 1
export PYTHONPATH=$PWD:${PYTHONPATH:+$PYTHONPATH:}/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "cores: $(nproc); date: $(date -u +%FT%TZ)"
timeout 150 python3 benchmarks/gpu/defaults_sweep.py --plan wire2 --out "$OUT" --budget 110 2>&1 \
  | grep --line-buffered -v "^INFO:coffea\|RuntimeWarning\|warnings.warn" | tee "$OUT/defaults-wire2-log.txt" | tail -16
echo "== trackgnn pipeline"
timeout 150 python3 benchmarks/pipeline_bench.py --device gpu --clients 1 8 --duration 4 --out "$OUT" 2>&1 \
  | grep -v "RuntimeWarning\|warnings.warn" | tee "$OUT/pipeline-log.txt" | tail -20
left=$(( ${TOTAL_BUDGET:-575} - SECONDS - 10 ))
echo "== e2e (at most $left s)"
timeout "$left" python3 -m coffea_sonic.cli bench e2e --events 1000000 --workers $(( $(nproc) - 1 )) \
  -o "$OUT/e2e" 2>&1 | grep --line-buffered -v "RuntimeWarning\|warnings.warn\|distributed.worker.memory" \
  | tee "$OUT/e2e-log.txt" | tail -15
ls -la "$OUT" "$OUT/e2e" 2>/dev/null
