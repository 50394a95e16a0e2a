#!/usr/bin/env bash
# The gRPC path and one process on a GPU machine, beside NVIDIA's perf_analyzer, one command:
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device && bash benchmarks/gpu/pa_carry.sh
#   GPU machine: bash benchmarks/gpu/wire_check.sh      (bring .device/ts.tar.xz, .device/whl, .device/pa)
#
# 1. defaults_sweep.py --plan wire: emtrk_cnn 2048-row chunks, default server; default TritonModel
#    from 1 and 8 processes, gRPC forced with 1/2/4 connections, CUDA memory in pieces, system shm;
#    in-process GpuEngine before and after (the ratios' denominator);
# 2. coffea-sonic bench reference: perf_analyzer (batch 2048, concurrency 1 and 8) beside a default
#    TritonModel (1 process) over gRPC, system shm and CUDA shm, on the same default server.
# Writes defaults-wire.json/.md, reference/ (results.json, results.md, reference.png) and the logs
# into $OUT (default bench-output/wire).
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/wire}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source benchmarks/gpu/triton-gpu-env.sh "$DEV" || exit 1
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
mkdir -p /tmp/pa && cp "$DEV"/pa/lib* /tmp/pa/ && xz -dc "$DEV"/pa/perf_analyzer.xz > /tmp/pa/perf_analyzer \
  && chmod 755 /tmp/pa/perf_analyzer && export COFFEA_SONIC_PERF_ANALYZER=/tmp/pa
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "cores: $(nproc); date: $(date -u +%FT%TZ)"
timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/gpu/defaults_sweep.py --plan wire --out "$OUT" \
  --budget "${SWEEP_BUDGET:-230}" 2>&1 | grep --line-buffered -v "^INFO:coffea\|RuntimeWarning\|warnings.warn" \
  | tee "$OUT/defaults-wire-log.txt" | tail -30
left=$(( ${TOTAL_BUDGET:-570} - SECONDS - 10 ))
echo "== reference (at most $left s)"
# (the same as `coffea-sonic bench reference --models emtrk_cnn --transports grpc shm cuda
#  --batches 2048 --concurrency 1 8 --window 4 --device gpu`; the CLI wants awkward, not carried)
timeout "$left" python3 -c "import sys, logging; logging.basicConfig(level=logging.INFO)
from coffea_sonic.bench.reference_run import run_reference_command as run
sys.exit(run(['emtrk_cnn'], ['grpc', 'shm', 'cuda'], False, '$OUT/reference', None, 'gpu',
             batches=[2048], concurrency=[1, 8], window_s=4.0))" 2>&1 | grep --line-buffered -v "RuntimeWarning\|warnings.warn" \
  | tee "$OUT/reference-log.txt" | tail -12
ls -la "$OUT" "$OUT/reference" 2>/dev/null
