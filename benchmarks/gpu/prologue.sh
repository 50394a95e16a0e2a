# Sourced by the GPU scripts, from the project root, after they set DEV and OUT: sets up
# tritonserver and the model Python (triton-gpu-env.sh), installs the carried coffea / Dask wheels
# of $DEV/extra (when there are any) into /tmp/site, puts the project and them on PYTHONPATH, and
# names the machine (GPUs, cores, memory, load).
mkdir -p "$OUT"
# shellcheck disable=SC1091
source benchmarks/gpu/triton-gpu-env.sh "$DEV" || exit 1
if ls "$DEV"/extra/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$DEV"/extra/*.whl || exit 1
fi
export PYTHONPATH=$PWD:${PYTHONPATH:+$PYTHONPATH:}/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
echo "cores: $(nproc), memory: $(free -g | awk '/Mem:/ {print $2}') GiB; $(uptime)"
