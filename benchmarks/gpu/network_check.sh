#!/usr/bin/env bash
# The e2e analysis with the server on a "GPU host" behind a 25 Gb/s tbf-shaped link (a network
# namespace with its own /dev/shm: the workers send over gRPC) vs the same server on the workers'
# host (shared memory), one command, under 2 minutes on an H100 machine (root):
#
#   here, once:  bash benchmarks/gpu/prepare_device.sh .device && bash benchmarks/gpu/fetch_wheels.sh --no-wrapper
#                pip download pyroute2==0.9.7 --no-deps -d .device/extra    (pure Python, 0.5 MB)
#   GPU machine: bash benchmarks/gpu/network_check.sh            (bring .device along)
#
# The GPU machines have no ip/tc binaries: the lab's namespaces, veths, bridge and tbf go through
# pyroute2 (netlink from Python). Writes network_check.json and network-log.txt into $OUT.
set -uo pipefail
DEV=${DEV:-.device}
OUT=${OUT:-bench-output/network}
EVENTS=${EVENTS:-400000}
WORKERS=${WORKERS:-$(( $(nproc) - 1 ))}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source benchmarks/gpu/triton-gpu-env.sh "$DEV" || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$DEV"/extra/*.whl || exit 1
export PYTHONPATH=$PWD:${PYTHONPATH:+$PYTHONPATH:}/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
echo "cores: $(nproc), memory: $(free -g | awk '/Mem:/ {print $2}') GiB, uid $(id -u)," \
  "ip: $(command -v ip || echo none), tc: $(command -v tc || echo none)"
python3 -c "import pyroute2; print('pyroute2', pyroute2.__version__)" || exit 1
timeout "${TIMEOUT:-140}" python3 benchmarks/gpu/network_check.py --events "$EVENTS" \
  --workers "$WORKERS" --out "$OUT" "$@" 2>&1 \
  | grep --line-buffered -v "RuntimeWarning\|warnings.warn\|distributed.worker.memory" | tee "$OUT/network-log.txt"
status=${PIPESTATUS[0]}
ls -la "$OUT"
exit "$status"
