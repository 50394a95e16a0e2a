#!/usr/bin/env bash
# Run HERE (CPU box), from the project root, after ../shared/device/prepare.sh .device: adds to
# .device/extra the wheels the GPU machine lacks for the coffea-wrapper mode (coffea's
# triton_wrapper imports coffea.util -> awkward, uproot, hist; tritonclient.http -> gevent).
# Versions are the project venv's. Together with prepare.sh's ~52 MB this stays under the device
# tool's 64 MiB carry limit (check: du -sb .device plus the working tree).
set -euo pipefail
DEST=${1:-.device}/extra
mkdir -p "$DEST"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"
python3 -m pip download -q --no-deps $PLAT -d "$DEST" \
  coffea==2026.9.0 awkward==2.14.0 awkward-cpp==57 uproot==5.7.7 hist==2.12.1 boost-histogram==1.8.1 \
  histoprint==2.7.1 uhi==1.2.1 lazy-importer==0.1.0 cramjam==2.14.0 xxhash==4.1.0 \
  gevent==26.9.0 greenlet==3.3.2 geventhttpclient==2.6.1 brotli==1.2.1 \
  cloudpickle==3.1.3 rich==15.0.0 importlib_metadata==10.2.0 2>&1 | grep -v "WARNING: Location" || true
ls "$DEST"
# what one device call would carry: .device plus the working tree (tracked + untracked files)
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
total=$(( $(du -sb "$(dirname "$DEST")" | cut -f1) + tree ))
echo "carry: $total bytes of 67108864 (64 MiB)"
if [ "$total" -gt 67108864 ]; then
  echo "over the 64 MiB that one command to the GPU machine carries: drop $DEST (the bench then leaves out the coffea-wrapper" \
       "mode) or move large untracked files out of the tree" >&2
fi
