#!/usr/bin/env bash
# Run HERE (CPU box), from the project root, after benchmarks/gpu/prepare_device.sh .device: adds to
# .device/extra the wheels the GPU machine lacks for coffea and Dask (the end-to-end analysis, the
# coffea-wrapper mode: coffea's triton_wrapper imports coffea.util -> awkward, uproot, hist;
# tritonclient.http -> gevent).
#   bash benchmarks/gpu/fetch_wheels.sh [.device] [--no-wrapper]
# --no-wrapper leaves out gevent & co (only the coffea-wrapper mode needs them), which keeps the
# copy to the GPU machine under its 64 MiB together with prepare.sh's ~45 MB and the working tree.
# Versions are the project venv's.
set -euo pipefail
DEV=.device; WRAPPER=1
for arg in "$@"; do
  case $arg in
    --no-wrapper) WRAPPER=0 ;;
    *) DEV=$arg ;;
  esac
done
DEST=$DEV/extra
rm -f "$DEST"/gevent-*.whl "$DEST"/greenlet-*.whl "$DEST"/geventhttpclient-*.whl "$DEST"/brotli-*.whl
mkdir -p "$DEST"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"
python3 -m pip download -q --no-deps $PLAT -d "$DEST" \
  coffea==2026.9.0 awkward==2.14.0 awkward-cpp==57 uproot==5.7.7 hist==2.12.1 boost-histogram==1.8.1 \
  histoprint==2.7.1 uhi==1.2.1 lazy-importer==0.1.0 cramjam==2.14.0 xxhash==4.1.0 \
  cloudpickle==3.1.3 rich==15.0.0 importlib_metadata==10.2.0 zipp==4.1.2 \
  dask==2025.3.1 distributed==2025.3.1 dask-awkward==2026.2.1 dask-histogram==2026.2.0 \
  fsspec==2026.9.0 tornado==6.6.1 msgpack==1.2.4 psutil==7.2.2 PyYAML==6.0.4 cachetools==8.0.2 \
  click==8.5.1 toolz==1.2.0 locket==1.0.0 partd==1.4.2 loky==3.7.0 lz4==4.4.5 \
  sortedcontainers==2.4.0 tblib==3.2.2 zict==3.0.0 packaging==26.4 vector==1.9.0 2>&1 | grep -v "WARNING: Location" || true
if [ "$WRAPPER" = 1 ]; then
  python3 -m pip download -q --no-deps $PLAT -d "$DEST" \
    gevent==26.9.0 greenlet==3.3.2 geventhttpclient==2.6.1 brotli==1.2.1 2>&1 | grep -v "WARNING: Location" || true
fi
ls "$DEST"
# what is copied to the GPU machine: .device plus the working tree (tracked + untracked files)
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
total=$(( $(du -sb "$(dirname "$DEST")" | cut -f1) + tree ))
echo "copied to the GPU machine: $total bytes of 67108864 (64 MiB)"
if [ "$total" -gt 67108864 ]; then
  echo "over the 64 MiB that one copy to the GPU machine takes: drop $DEST (the bench then leaves out the coffea-wrapper" \
       "mode) or move large untracked files out of the tree" >&2
fi
