"""``coffea-sonic bench transport`` under the path run_on_device.sh names
(:mod:`coffea_sonic.bench.transport_bench`); ``--help`` lists the options."""

import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("transport", sys.argv[1:], prog="bench_transport.py"))
