"""``coffea-sonic bench link`` under the path RESULTS.md names (:mod:`coffea_sonic.bench.link`;
needs root); ``--help`` lists the options."""

import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("link", sys.argv[1:], prog="link_bench.py"))
