#!/usr/bin/env bash
# Honest GPU-vs-CPU differences of every zoo model, for shadow validation's default tolerances
# (one command on the GPU machine, about a minute; the measurement stops after $TIMEOUT = 80 s,
# keeping the models measured so far):
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device
#   GPU machine: bash benchmarks/gpu/shadow_tolerance.sh          (bring .device along)
#
# Sets up tritonserver + the model Python (triton-gpu-env.sh), then runs shadow_tolerance.py:
# the zoo models served by the default GPU server, every answer against onnxruntime on the CPU
# (the in-process reference that shadow validation runs): shadow's divergence and the max absolute
# difference per model and output. Writes shadow_tolerance.json and shadow_tolerance.txt into
# $OUT (default bench-output/shadow-tolerance).
# On the CPU box: LOCAL=1 DEVICE=cpu bash benchmarks/gpu/shadow_tolerance.sh --rows 300 (0 expected).
# tolerance_and_pipeline.sh runs the same measurement before the trackgnn pipeline bench.
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/shadow-tolerance}
DEVICE=${DEVICE:-gpu}
mkdir -p "$OUT"
if [ "${LOCAL:-0}" = 1 ]; then
  PY=${PY:-.venv/bin/python}
else
  PY=python3
  # shellcheck disable=SC1091
  source benchmarks/gpu/triton-gpu-env.sh "$DEV" || exit 1
  export PYTHONPATH=$PWD:${PYTHONPATH:+$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
echo "cores: $(nproc); $(uptime)"
timeout "${TIMEOUT:-80}" $PY benchmarks/gpu/shadow_tolerance.py --device "$DEVICE" \
  --out "$OUT/shadow_tolerance.json" "$@" 2>&1 | grep -v "RuntimeWarning\|warnings.warn" \
  | tee "$OUT/shadow_tolerance.txt"
status=${PIPESTATUS[0]}
ls -la "$OUT"
exit "$status"
