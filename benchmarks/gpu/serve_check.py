"""``python -m coffea_sonic.bench.gpu.serve_check`` under the path that the GPU
scripts and RESULTS.md name (:mod:`coffea_sonic.bench.gpu.serve_check`);
``--help`` lists the options."""

import sys

from coffea_sonic.bench.gpu.serve_check import main

if __name__ == "__main__":
    sys.exit(main())
