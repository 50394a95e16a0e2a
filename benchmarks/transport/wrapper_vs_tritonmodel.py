"""``coffea-sonic bench wrapper`` under the path RESULTS.md names (:mod:`coffea_sonic.bench.wrapper`);
``--help`` lists the options."""

import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("wrapper", sys.argv[1:], prog="wrapper_vs_tritonmodel.py"))
