"""``python -m coffea_sonic.bench.gpu.one_process_probe`` under the path that the GPU
scripts and RESULTS.md name (:mod:`coffea_sonic.bench.gpu.one_process_probe`);
``--help`` lists the options."""

import sys

from coffea_sonic.bench.gpu.one_process_probe import main

if __name__ == "__main__":
    sys.exit(main())
