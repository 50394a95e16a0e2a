"""The table and figure of a ``coffea-sonic bench transport`` JSON again
(``coffea-sonic bench transport --replot JSON -o DIR``)::

    python benchmarks/transport/plot_transport.py results-cpu.json -o figures
"""

import sys

from coffea_sonic.bench.commands import run_scenario

if __name__ == "__main__":
    sys.exit(run_scenario("transport", ["--replot", *sys.argv[1:]], prog="plot_transport.py"))
