#!/usr/bin/env bash
# The GPU-machine benchmark of benchmarks/RESULTS.md, self-contained for one command on the GPU machine.
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device && bash benchmarks/gpu/fetch_wheels.sh
#   GPU machine: timeout 570 bash benchmarks/gpu/run_on_device.sh      (with .device copied there)
#
# It sets up tritonserver + the model Python (numpy 1.26 + the machine's torch), installs the
# carried client wheels (prologue.sh; without them mode coffea-wrapper is left out), then
#   1. `coffea-sonic bench suite --preset gpu --device gpu`: jet_tagger and emtrk_cnn in modes cpu,
#      local-gpu, remote, remote-sync, coffea-wrapper, with client-process sweeps,
# writing JSON / markdown / PNG into $OUT (results.json, results.md,
# three PNGs, bench.log).
#
# On the CPU box, LOCAL=1 runs only the python part with this venv (BENCH_DEVICE=cpu), e.g.
#   LOCAL=1 BENCH_DEVICE=cpu OUT=/tmp/gpu-local bash benchmarks/gpu/run_on_device.sh \
#       --models jet_tagger --chunk-rows 16384 --clients 1 2
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/gpu}
BENCH_DEVICE=${BENCH_DEVICE:-gpu}
# the whole script stays inside TOTAL_BUDGET seconds (one command there may run 600 s)
TOTAL_BUDGET=${TOTAL_BUDGET:-570}
mkdir -p "$OUT"
if [ "${LOCAL:-0}" = 1 ]; then
  PY=${PY:-.venv/bin/python}
else
  PY=python3
  # shellcheck disable=SC1091
  source benchmarks/gpu/prologue.sh
fi
export PYTHONUNBUFFERED=1
MODES=()
if ! $PY -c "import coffea.ml_tools.triton_wrapper, tritonclient.http" 2>/dev/null; then
  echo "coffea's triton_wrapper is not importable here (no $DEV/extra wheels?): mode coffea-wrapper left out"
  MODES=(--modes cpu local-gpu remote remote-sync)
fi
$PY - <<'PYEOF' || exit 1
import importlib.metadata as md, sys, numpy, onnxruntime
import tritonclient.grpc
import coffea_sonic.bench
from coffea_sonic.server import gpu_available, server_binary
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
print("python", sys.version.split()[0], "numpy", numpy.__version__, "onnxruntime",
      onnxruntime.__version__, "coffea", version("coffea"), "tritonclient", version("tritonclient"),
      "grpcio", version("grpcio"))
print("tritonserver", server_binary(), "gpu", gpu_available())
PYEOF
BENCH_TIMEOUT=$(( TOTAL_BUDGET - SECONDS - 15 ))
echo "== bench (at most $BENCH_TIMEOUT s)"
timeout "$BENCH_TIMEOUT" $PY -m coffea_sonic.cli bench suite --preset gpu --device "$BENCH_DEVICE" \
  --output "$OUT" "${MODES[@]}" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "RuntimeWarning\|warnings.warn"
status=${PIPESTATUS[0]}
# a run stopped by the time limit leaves its checkpoint: keep it as the result
if [ ! -f "$OUT/results.json" ] && [ -f "$OUT/results.partial.json" ]; then
  mv "$OUT/results.partial.json" "$OUT/results.json"
fi
# 2. if time is left: the served CNN with INSTANCES model instances on the GPU (one instance is
#    busy >90 % at 8 clients while the GPU idles), to see how far more instances close the gap
INSTANCES=${INSTANCES:-3}
left=$(( TOTAL_BUDGET - SECONDS - 10 ))
if [ "$INSTANCES" -gt 1 ] && [ "$left" -gt 90 ]; then
  echo "== bench: ${INSTANCES_MODEL:-emtrk_cnn} served by $INSTANCES instances (at most $left s)"
  timeout "$left" $PY -m coffea_sonic.cli bench suite --preset gpu --device "$BENCH_DEVICE" \
    --instances "$INSTANCES" --models "${INSTANCES_MODEL:-emtrk_cnn}" --modes remote \
    --no-default-batch --in-flight 4 --clients 1 4 8 12 16 --repetitions 3 \
    --output /tmp/bench-instances 2>&1 | grep -v "RuntimeWarning\|warnings.warn" | tail -12
  for name in results.json results.partial.json; do
    if [ -f "/tmp/bench-instances/$name" ]; then
      cp "/tmp/bench-instances/$name" "$OUT/instances-$INSTANCES.json"; break
    fi
  done
fi
ls -la "$OUT"
exit "$status"
