"""Request size x requests in flight for one default-otherwise TritonModel, per transport, one run.

``coffea-sonic bench window`` runs it (:mod:`coffea_sonic.bench.commands.window`). One client
process (:func:`coffea_sonic.bench.reference.tritonmodel_task`) calls the transport-bound
``passthrough`` model (x: 16 floats -> y: 2, 200 000-row calls, 12.8 MB) on an embedded server back
to back; every configuration gets one window per round, the rounds alternate through all
configurations (so a machine others load shifts all of them alike), and the table keeps each
configuration's best and median window. :func:`write_sweep` writes window-sweep.json and
window-sweep.md.

>>> report = {"machine": {"cpu_model": "cpu", "cpu_cores": 2, "date": "today"},
...           "uptime_before": "a", "uptime_after": "b", "rows": 10, "command": "c",
...           "windows": {"grpc 2 MiB x 4": [1e6, 3e6, 2e6]}}
>>> markdown(report).splitlines()[-1]
'| grpc 2 MiB x 4 | 3.00 | 2.00 |'
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .clients import ClientPool
from .files import write_report
from .machine import machine_info, uptime_line
from .passthrough import PASSTHROUGH, write_passthrough
from .reference import tritonmodel_task

__all__ = ["WindowSweep", "markdown", "run_sweep", "write_sweep"]

MiB = 1 << 20


@dataclass
class WindowSweep:
    """The grid (transports x request sizes in MiB x requests in flight) and each window."""

    transports: list[str] = field(default_factory=lambda: ["grpc"])
    sizes_mib: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    in_flight: list[int] = field(default_factory=lambda: [2, 4, 8])
    rows: int = 200_000
    window: float = 3.0
    rounds: int = 3


def run_sweep(config: WindowSweep) -> dict:
    """Every configuration once per round, on one embedded CPU server; the report."""
    from ..server import LocalTritonServer

    report = {"machine": machine_info(), "uptime_before": uptime_line(), "rows": config.rows,
              "window_s": config.window, "command": " ".join(sys.argv), "windows": {}}
    configs = [(t, s, f) for t in config.transports for s in config.sizes_mib
               for f in config.in_flight]
    repository = write_passthrough(Path(tempfile.mkdtemp(prefix="passthrough-")))
    pool = ClientPool(1, tritonmodel_task)
    try:
        with LocalTritonServer(repository=repository, device="cpu") as server:
            for _ in range(config.rounds):
                for transport, size, flight in configs:
                    address = server.http_address if transport == "http" else server.grpc_address
                    scheme = "http" if transport == "http" else "grpc"
                    task = {"url": f"triton+{scheme}://{address}/{PASSTHROUGH}",
                            "transport": transport, "rows": config.rows, "model": PASSTHROUGH,
                            "duration": config.window,
                            "options": {"max_request_bytes": int(size * MiB),
                                        "max_in_flight": flight}}
                    _, (result,) = pool.run(task, 1)
                    key = f"{transport} {size:g} MiB x {flight}"
                    report["windows"].setdefault(key, []).append(result.get("rows_per_s", 0.0))
                    print(key, result, flush=True)
    finally:
        pool.close()
    report["uptime_after"] = uptime_line()
    return report


def markdown(report: dict) -> str:
    """The table: each configuration's best and median window, with machine, load and command."""
    machine = report["machine"]
    lines = [f"# {PASSTHROUGH}, {report['rows']}-row calls, one process ({machine['cpu_model']}, "
             f"{machine['cpu_cores']} cores, {machine['date']})", "",
             f"load: before `{report['uptime_before']}`, after `{report['uptime_after']}`", "",
             f"command: `{report['command']}`", "",
             "| transport, request size x in flight | best M rows/s | median M rows/s |",
             "|---|---|---|"]
    for key, windows in report["windows"].items():
        lines.append(f"| {key} | {max(windows) / 1e6:.2f} | "
                     f"{statistics.median(windows) / 1e6:.2f} |")
    return "\n".join(lines) + "\n"


def write_sweep(report: dict, out: str | Path) -> str:
    """window-sweep.json and window-sweep.md in ``out``; returns the table."""
    return write_report(report, out, "window-sweep", markdown)
