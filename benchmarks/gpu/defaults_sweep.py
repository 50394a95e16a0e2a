"""``python -m coffea_sonic.bench.gpu.defaults_sweep`` under the path that the GPU
scripts and RESULTS.md name (:mod:`coffea_sonic.bench.gpu.defaults_sweep`);
``--help`` lists the options."""

import sys

from coffea_sonic.bench.gpu.defaults_sweep import main

if __name__ == "__main__":
    sys.exit(main())
