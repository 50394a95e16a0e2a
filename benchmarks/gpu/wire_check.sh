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
#
# `bash benchmarks/gpu/wire_check.sh accept` (at most 4 minutes with setup): only the one-client rows of the
# acceptance list, each beside its baseline from the same run:
# 1. defaults_sweep.py --plan accept: in-process GpuEngine; default TritonModel (1 process); gRPC
#    forced at its default, at 2.25 MiB x 8 over 4 connections and at 4.5 MiB x 4 over 4
#    connections, the last two kinds from 8 processes too;
# 2. perf_analyzer at the matching concurrency (batch 2048; gRPC c 1 and 8, CUDA memory c 1);
# 3. pipeline_bench.py --clients 1: trackgnn direct, fused, ensemble from one client, with the
#    served models' per-stage times (TRACKGNN_STAGE_TIMES) beside the direct call's.
# Writes defaults-accept.json/.md, reference/, pipeline-gpu.json/.md, stage-times.jsonl and logs.
#
# `bash benchmarks/gpu/wire_check.sh share` (about 4 minutes with setup): gRPC forced at its
# defaults (sized by the process's share of the server's work) and at the fixed 9 MiB x 2, from 1
# and 8 processes (defaults_sweep --plan share), then perf_analyzer over gRPC (c 1 and 8) beside
# a default TritonModel. Writes defaults-share.json/.md, reference/ and logs.
#
# `bash benchmarks/gpu/wire_check.sh pipeline` (about 7 minutes with setup): trackgnn direct,
# fused and ensemble from 1, 8 and 16 clients, the modes alternating in 6 rounds (bench pipeline
# --rounds), at the server's defaults (one instance per GPU, warmed at start,
# the models taking GPU inputs where they lie, the ensemble's stages handing tensors over on the
# GPU), then all again with tensors through the host (--handoff host). Writes pipeline-device/
# and pipeline-host/ (pipeline-gpu.json/.md, log).
set -uo pipefail
DEV=${DEV:-.device}
MODE=${1:-all}
OUT=${OUT:-bench-output/wire}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source benchmarks/gpu/triton-gpu-env.sh "$DEV" || exit 1
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
mkdir -p /tmp/pa && cp "$DEV"/pa/lib* /tmp/pa/ && xz -dc "$DEV"/pa/perf_analyzer.xz > /tmp/pa/perf_analyzer \
  && chmod 755 /tmp/pa/perf_analyzer && export COFFEA_SONIC_PERF_ANALYZER=/tmp/pa
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "cores: $(nproc); date: $(date -u +%FT%TZ)"
quiet="RuntimeWarning\|warnings.warn"
reference() {  # timeout_s transports window_s concurrency... (the CLI wants awkward, not carried)
  timeout "$1" python3 -c "import sys, logging; logging.basicConfig(level=logging.INFO)
from coffea_sonic.bench.reference import run_reference_command as run
sys.exit(run(['emtrk_cnn'], sys.argv[1].split(','), False, '$OUT/reference', None, '${REF_DEVICE:-gpu}',
             batches=[2048], concurrency=[int(c) for c in sys.argv[2:]], window_s=$3))" "$2" "${@:4}" \
    2>&1 | grep --line-buffered -v "$quiet" | tee "$OUT/reference-log.txt" | tail -12
}
if [ "$MODE" = share ]; then
  timeout 150 python3 benchmarks/gpu/defaults_sweep.py --plan share --duration 4 --out "$OUT" --budget 120 2>&1 \
    | grep --line-buffered -v "^INFO:coffea\|$quiet" | tee "$OUT/defaults-share-log.txt" | tail -14
  echo "== perf_analyzer over gRPC at matching concurrency ($SECONDS s so far)"
  reference 70 grpc 3 1 8
  echo "done in $SECONDS s"; ls -la "$OUT"
  exit 0
fi
if [ "$MODE" = pipeline ]; then
  # no TRACKGNN_STAGE_TIMES here: its device synchronisations slow the served call more than the
  # direct one (set it for where a call's time goes, not for ratios)
  for handoff in device host; do
    echo "== trackgnn, handoff $handoff ($SECONDS s so far)"
    mkdir -p "$OUT/pipeline-$handoff"
    timeout 280 python3 benchmarks/pipeline_bench.py --device gpu --clients 1 8 16 --duration 12 --rounds 6 \
      --handoff $handoff --out "$OUT/pipeline-$handoff" 2>&1 | grep -v "$quiet" \
      | tee "$OUT/pipeline-$handoff/log.txt" | tail -16
  done
  echo "done in $SECONDS s"; ls -la "$OUT"
  exit 0
fi
if [ "$MODE" = accept ]; then
  timeout 80 python3 benchmarks/gpu/defaults_sweep.py --plan accept --out "$OUT" --budget 62 2>&1 \
    | grep --line-buffered -v "^INFO:coffea\|$quiet" | tee "$OUT/defaults-accept-log.txt" | tail -14
  echo "== perf_analyzer at matching concurrency ($SECONDS s so far)"
  reference 55 grpc 2 1 8
  mv "$OUT/reference" "$OUT/reference-grpc" 2>/dev/null; mv "$OUT/reference-log.txt" "$OUT/reference-grpc-log.txt"
  reference 35 cuda 2 1
  echo "== trackgnn from one client ($SECONDS s so far)"
  TRACKGNN_STAGE_TIMES=$(cd "$OUT" && pwd)/stage-times.jsonl timeout 80 python3 benchmarks/pipeline_bench.py \
    --device gpu --clients 1 --duration 2.5 --out "$OUT" 2>&1 | grep -v "$quiet" \
    | tee "$OUT/pipeline-log.txt" | tail -16
  echo "done in $SECONDS s"; ls -la "$OUT"
  exit 0
fi
timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/gpu/defaults_sweep.py --plan wire --out "$OUT" \
  --budget "${SWEEP_BUDGET:-230}" 2>&1 | grep --line-buffered -v "^INFO:coffea\|RuntimeWarning\|warnings.warn" \
  | tee "$OUT/defaults-wire-log.txt" | tail -30
left=$(( ${TOTAL_BUDGET:-570} - SECONDS - 10 ))
echo "== reference (at most $left s)"
# (the same as `coffea-sonic bench reference --models emtrk_cnn --transports grpc shm cuda
#  --batches 2048 --concurrency 1 8 --window 4 --device gpu`; the CLI wants awkward, not carried)
reference "$left" grpc,shm,cuda 4.0 1 8
ls -la "$OUT" "$OUT/reference" 2>/dev/null
