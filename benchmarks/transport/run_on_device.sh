#!/usr/bin/env bash
# The GPU-machine part of benchmarks/transport, self-contained for one command on the GPU machine.
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device; mkdir -p .devtransport/whl
#                ln -f .device/ts.tar.xz .devtransport/; ln -f .device/whl/*.whl .devtransport/whl/
#   device run:  bash benchmarks/transport/run_on_device.sh      (carry: .devtransport)
#
# 1. the CUDA shared-memory tests of tests/test_shm_transport.py (a GPU tritonserver, a fake one);
# 2. bench_transport.py --plan gpu (coffea-sonic bench transport): rows/s and GB/s per transport,
#    GPU utilisation, server profile; JSON, table, figure + log into $OUT.
set -uo pipefail
DEV=${DEV:-.devtransport}
OUT=${OUT:-/tmp/transport-out}
BUDGET=${BUDGET:-560}
# shellcheck disable=SC1091
source benchmarks/gpu/prologue.sh
echo "== CUDA shared-memory test"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_shm_transport.py -k cuda 2>&1 \
  | tail -25 | tee "$OUT/pytest-cuda.txt"
echo "== transport benchmark (at most $(( BUDGET - SECONDS )) s)"
timeout $(( BUDGET - SECONDS )) python3 benchmarks/transport/bench_transport.py --plan "${PLAN:-gpu}" \
  --duration "${DURATION:-3}" --out "$OUT" --tag "${TAG:-h100}" "$@" 2>&1 \
  | grep -v "^INFO:coffea\|starting tritonserver\|wrote /\|RuntimeWarning\|warnings.warn" | tee "$OUT/bench-log.txt"
ls -la "$OUT"
