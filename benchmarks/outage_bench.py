"""``coffea-sonic bench outage`` under the path RESULTS.md names (:mod:`coffea_sonic.bench.outage`),
writing benchmarks/results/cpu2-outage unless ``-o`` says otherwise; ``--help`` lists the options."""

import sys
from pathlib import Path

from coffea_sonic.bench.commands import run_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "cpu2-outage"

if __name__ == "__main__":
    sys.exit(run_scenario("outage", ["-o", str(RESULTS), *sys.argv[1:]], prog="outage_bench.py"))
