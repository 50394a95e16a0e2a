"""Where a benchmark ran: CPU model, cores, memory, GPU, library versions, date.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
from typing import Any, Iterator

#: Distributions whose versions every result records.
RECORDED_PACKAGES: tuple[str, ...] = (
    "coffea-sonic", "coffea", "awkward", "dask", "distributed", "numpy", "onnxruntime",
    "tritonclient", "nvidia-pytriton", "grpcio", "torch",
)


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), or ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs ``nvidia-smi`` sees (empty without a GPU or driver).

    >>> isinstance(gpu_names(), list)
    True
    """
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        listing = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listing.returncode != 0:
        return []
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


def package_versions(names: tuple[str, ...] = RECORDED_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None if absent)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def machine_info() -> dict:
    """A JSON-ready description of this machine and software, stamped with the UTC date."""
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count() or 1,
        "memory_bytes": _memory_bytes(),
        "gpus": gpu_names(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": package_versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def machine_label(info: dict) -> str:
    """Short name for folders and titles: the first GPU's model, else ``cpu<cores>``.

    >>> machine_label({"gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 550.54"], "cpu_cores": 16})
    'nvidia-h100-80gb-hbm3'
    >>> machine_label({"gpus": [], "cpu_cores": 2})
    'cpu2'
    """
    if info.get("gpus"):
        name = info["gpus"][0].split(",")[0].strip().lower()
        return "-".join(part for part in name.replace("_", " ").split() if part)
    return f"cpu{info.get('cpu_cores', 0)}"


def machine_title(machine: dict) -> str:
    """The CPU, its cores, the first GPU (where there is one) and the date, for a page's title.

    >>> machine_title({"cpu_model": "Xeon", "cpu_cores": 2, "gpus": [], "date": "2026-01-01"})
    'Xeon, 2 cores, 2026-01-01'
    """
    gpu = f", {machine['gpus'][0]}" if machine.get("gpus") else ""
    return (f"{machine.get('cpu_model', '?')}, {machine.get('cpu_cores')} cores{gpu}, "
            f"{machine.get('date', '')}")


def uptime_line() -> str:
    """``uptime``'s line (the machine's load beside a result), or "" where it cannot run.

    >>> isinstance(uptime_line(), str)
    True
    """
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return ""


@contextlib.contextmanager
def stamped(**fields: Any) -> Iterator[dict]:
    """A run's report: ``machine``, ``uptime_before`` and ``command`` (this process' argv), then
    ``fields``; ``uptime_after`` is stamped when the block ends.

    >>> with stamped(rows=[]) as report:
    ...     report["rows"].append(1)
    >>> list(report)
    ['machine', 'uptime_before', 'command', 'rows', 'uptime_after']
    """
    report = {"machine": machine_info(), "uptime_before": uptime_line(),
              "command": " ".join(sys.argv), **fields}
    yield report
    report["uptime_after"] = uptime_line()


def load_lines(report: dict) -> list[str]:
    """A report's Markdown lines of the machine's load before and after and of its command.

    >>> load_lines({"uptime_before": "a", "uptime_after": "b", "command": "c"})
    ['load: before `a`, after `b`', '', 'command: `c`', '']
    """
    return [f"load: before `{report.get('uptime_before', '')}`, after "
            f"`{report.get('uptime_after', '')}`", "",
            f"command: `{report.get('command', '')}`", ""]
