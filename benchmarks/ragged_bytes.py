"""``coffea-sonic bench ragged`` under the path README and RESULTS.md name
(:mod:`coffea_sonic.bench.commands.ragged`), writing benchmarks/results/ragged_bytes.json as
before unless ``--json-file`` says otherwise; ``--help`` lists the options."""

import sys
from pathlib import Path

from coffea_sonic.bench.commands import run_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "ragged_bytes.json"

if __name__ == "__main__":
    sys.exit(run_scenario("ragged", ["--json-file", str(RESULTS), *sys.argv[1:]], prog="ragged_bytes.py"))
