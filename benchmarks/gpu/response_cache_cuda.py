"""``python -m coffea_sonic.bench.gpu.response_cache_cuda`` under the path that the GPU
scripts and RESULTS.md name (:mod:`coffea_sonic.bench.gpu.response_cache_cuda`);
``--help`` lists the options."""

import sys

from coffea_sonic.bench.gpu.response_cache_cuda import main

if __name__ == "__main__":
    sys.exit(main())
