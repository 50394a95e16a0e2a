"""``coffea-sonic bench pipeline`` under the path the GPU scripts and RESULTS.md name
(:mod:`coffea_sonic.bench.commands.pipeline`); ``--help`` lists the options."""

import logging
import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("pipeline", sys.argv[1:], prog="pipeline_bench.py",
                          level=logging.INFO))
