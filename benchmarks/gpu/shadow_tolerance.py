"""``python -m coffea_sonic.bench.gpu.shadow_tolerance`` under the path that the GPU
scripts and RESULTS.md name (:mod:`coffea_sonic.bench.gpu.shadow_tolerance`);
``--help`` lists the options."""

import sys

from coffea_sonic.bench.gpu.shadow_tolerance import main

if __name__ == "__main__":
    sys.exit(main())
