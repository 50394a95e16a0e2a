"""``coffea-sonic bench window`` under the path RESULTS.md names
(:mod:`coffea_sonic.bench.commands.window`); ``--help`` lists the options."""

import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("window", sys.argv[1:], prog="window_sweep.py"))
