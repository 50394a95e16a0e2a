"""``coffea-sonic bench soak`` under the path RESULTS.md names
(:mod:`coffea_sonic.bench.commands.soak`); ``--help`` lists the options."""

import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("soak", sys.argv[1:], prog="soak.py"))
