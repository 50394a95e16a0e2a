#!/usr/bin/env bash
# Run HERE (CPU machine), from the project root: builds .device/ (keep it git-ignored) with what the GPU
# machine lacks: a real tritonserver cut out of the nvidia-pytriton wheel, numpy 1.26.4 for the server's
# model Python, and tritonclient's wheels. About 46 MB; at most 64 MiB of files travel with one command to the GPU machine.
# Usage: bash benchmarks/gpu/prepare_device.sh [DEST=.device] [EXTRA_WHEEL_SPEC...]
set -euo pipefail
DEST=${1:-.device}; shift || true
mkdir -p "$DEST/whl"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
if [ ! -f "$DEST/ts.tar.xz" ]; then
  python3 -m pip download -q --no-deps nvidia-pytriton==0.7.0 -d "$T"
  mkdir -p "$T/x"
  unzip -q "$T"/nvidia_pytriton-*.whl 'pytriton/tritonserver/bin/*' 'pytriton/tritonserver/backends/*' \
    'pytriton/tritonserver/python_backend_stubs/3.12/*' 'pytriton/tritonserver/caches/*' 'nvidia_pytriton.libs/*' \
    -x 'nvidia_pytriton.libs/libpython3*' -d "$T/x"
  tar -C "$T/x" -cJf "$DEST/ts.tar.xz" .
fi
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
# numpy<2 for the server's model Python; client side keeps the device's own numpy 2 and grpcio (1.84 there)
python3 -m pip download -q --no-deps $PLAT -d "$DEST/whl" numpy==1.26.4 tritonclient==2.73.0 \
  protobuf==6.33.6 python-rapidjson==1.25 "$@"
du -sh "$DEST"; ls "$DEST/whl"
