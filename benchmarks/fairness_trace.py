"""``coffea-sonic bench trace`` under the path RESULTS.md names
(:mod:`coffea_sonic.bench.commands.trace`); ``--help`` lists the options."""

import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("trace", sys.argv[1:], prog="fairness_trace.py"))
