#!/usr/bin/env bash
# Run HERE (CPU box), from the project root: puts NVIDIA's perf_analyzer 2.41.0 and the two libraries
# it needs into .device/pa (the binary xz-compressed: 4 MB instead of 17), installed first into
# the cache folder by coffea_sonic.bench.perf_analyzer (pip + apt-get download).
set -euo pipefail
DEV=${1:-.device}
DIR=$(python3 -c "from coffea_sonic.bench.perf_analyzer import install; print(install().library_dir)")
mkdir -p "$DEV/pa"
cp "$DIR"/libb64.so.0d "$DIR"/libcudart.so.12 "$DEV/pa/"
xz -T2 -6 -c "$DIR/perf_analyzer" > "$DEV/pa/perf_analyzer.xz"
du -sh "$DEV/pa"
