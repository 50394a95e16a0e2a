"""NVIDIA's ``perf_analyzer``, installed on demand into a cache folder, and one measurement with it.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingDependencyError

__all__ = ["PerfAnalyzer", "PerfAnalyzerUnavailable", "PerfPoint", "install", "parse_throughput"]

logger = logging.getLogger(__name__)

VERSION = "2.41.0"
_WHEEL_BINARY = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
_CUDART = "nvidia/cuda_runtime/lib/libcudart.so.12"
_LIBRARIES = ("libb64.so.0d", "libcudart.so.12")
_THROUGHPUT = re.compile(
    r"Concurrency: \d+, throughput: ([0-9.e+]+) infer/sec, latency ([0-9.e+]+) usec")


class PerfAnalyzerUnavailable(MissingDependencyError):
    """perf_analyzer could not be installed or started here (the message says why)."""


def parse_throughput(text: str) -> tuple[float, float] | None:
    """(rows/s, mean latency in µs) from perf_analyzer's summary line, or None."""
    found = _THROUGHPUT.findall(text)
    if not found:
        return None
    rows, latency = found[-1]
    return float(rows), float(latency)


@dataclass(frozen=True)
class PerfPoint:
    """One perf_analyzer measurement: ``rows_per_s`` (0 when it failed, ``error`` says why)."""

    batch: int
    concurrency: int
    rows_per_s: float
    latency_us: float = 0.0
    error: str = ""
    #: the stability (max spread of 3 windows, %) the measurement met: 30, else a looser retry
    stability: int = 30


@dataclass(frozen=True)
class PerfAnalyzer:
    """The perf_analyzer binary and the folder of the libraries it needs."""

    binary: Path
    library_dir: Path

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(self.library_dir), env.get("LD_LIBRARY_PATH", "")) if p)
        return env

    def measure(self, model: str, address: str, protocol: str, batch: int, concurrency: int,
                shared_memory: str = "none", output_bytes: int = 0, window_ms: int = 2500,
                timeout_s: float = 180.0) -> PerfPoint:
        """One point against a server (``protocol`` grpc or http, ``shared_memory`` none, system
        or cuda, ``output_bytes`` per request for the output regions); a failure comes back as
        ``error``. Stable means 3 windows within 30 % of each other (up to 10 windows); a point
        that is not (a machine others load) is measured again within 100 %."""
        for stability in (30, 100):
            command = [str(self.binary), "-m", model, "-u", address, "-i", protocol,
                       "-b", str(batch), "--concurrency-range", str(concurrency),
                       "-p", str(window_ms), "-r", "10", "-s", str(stability)]
            if shared_memory != "none":
                command += ["--shared-memory", shared_memory,
                            "--output-shared-memory-size", str(max(output_bytes, 1024))]
            try:
                done = subprocess.run(command, capture_output=True, text=True,
                                      timeout=timeout_s, env=self.environment())
            except subprocess.TimeoutExpired:
                return PerfPoint(batch, concurrency, 0.0, error=f"no result within {timeout_s:g} s")
            rows, latency = parse_throughput(done.stdout) or (0.0, 0.0)
            error = ""
            if done.returncode != 0 or not rows:
                tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
                error = f"exit {done.returncode}: " + " | ".join(tail)[:400]
            point = PerfPoint(batch, concurrency, rows, latency, error=error, stability=stability)
            if "stable measurement" not in error:
                return point
        return point


def _pip_download(requirement: str, platform_tag: str, dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--platform", platform_tag, "--python-version", "3.11", "-q", "-d", str(dest),
               requirement]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    name = requirement.split("=")[0].replace("-", "_")
    wheels = glob.glob(str(dest / f"{name}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise PerfAnalyzerUnavailable(
            f"cannot download {requirement} with pip ({done.stderr.strip()[-300:]}); put "
            "perf_analyzer, libb64.so.0d and libcudart.so.12 in a folder and set "
            "COFFEA_SONIC_PERF_ANALYZER to it")
    return Path(wheels[0])


def _extract(wheel: Path, member: str, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, \
            open(target, "wb") as out:
        shutil.copyfileobj(source, out)
    target.chmod(0o755)


def _libb64(target: Path, scratch: Path) -> None:
    """``libb64.so.0d`` from the system, else from Debian's package (downloaded, not installed)."""
    for known in ("/usr/lib/x86_64-linux-gnu/libb64.so.0d", "/usr/lib64/libb64.so.0d"):
        if os.path.isfile(known):
            shutil.copy(known, target)
            return
    if not (shutil.which("apt-get") and shutil.which("dpkg")):
        raise PerfAnalyzerUnavailable(
            "perf_analyzer needs libb64.so.0d (Debian package libb64-0d) and there is no "
            "apt-get here; copy the library into " + str(target.parent))
    done = subprocess.run(["apt-get", "download", "libb64-0d"], cwd=scratch, capture_output=True,
                          text=True, timeout=300)
    debs = glob.glob(str(scratch / "libb64-0d_*.deb"))
    if not debs:
        raise PerfAnalyzerUnavailable(
            f"apt-get download libb64-0d failed ({done.stderr.strip()[-300:]}); "
            "run apt-get update, or install libb64-0d")
    subprocess.run(["dpkg", "-x", debs[0], str(scratch / "deb")], check=True, timeout=120)
    found = glob.glob(str(scratch / "deb" / "**" / "libb64.so.0d"), recursive=True)
    if not found:
        raise PerfAnalyzerUnavailable(f"{debs[0]} holds no libb64.so.0d")
    shutil.copy(found[0], target)


def install(folder: Path | None = None) -> PerfAnalyzer:
    """perf_analyzer ready to run: from ``$COFFEA_SONIC_PERF_ANALYZER``, the cache, or downloaded.

    Raises :class:`PerfAnalyzerUnavailable` saying why where it cannot be had or cannot start.
    """
    from ..zoo import cache_dir

    given = os.environ.get("COFFEA_SONIC_PERF_ANALYZER")
    folder = Path(given) if given and folder is None else (
        folder or cache_dir() / f"perf_analyzer-{VERSION}")
    if not all((folder / name).is_file() for name in ("perf_analyzer", *_LIBRARIES)):
        if given:
            raise PerfAnalyzerUnavailable(
                f"COFFEA_SONIC_PERF_ANALYZER={given} must hold perf_analyzer, libb64.so.0d and "
                "libcudart.so.12")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as scratch_name:
            scratch = Path(scratch_name)
            logger.info("installing perf_analyzer %s into %s", VERSION, folder)
            _extract(_pip_download(f"tritonclient=={VERSION}", "manylinux1_x86_64", scratch),
                     _WHEEL_BINARY, scratch / "perf_analyzer")
            _extract(_pip_download("nvidia-cuda-runtime-cu12", "manylinux2014_x86_64", scratch),
                     _CUDART, scratch / "libcudart.so.12")
            _libb64(scratch / "libb64.so.0d", scratch)
            for name in ("perf_analyzer", *_LIBRARIES):
                os.replace(scratch / name, folder / name)
    analyzer = PerfAnalyzer(folder / "perf_analyzer", folder)
    done = subprocess.run([str(analyzer.binary), "--version"], capture_output=True, text=True,
                          env=analyzer.environment(), timeout=60)
    if "Perf Analyzer Version" not in done.stdout + done.stderr:
        raise PerfAnalyzerUnavailable(
            f"{analyzer.binary} does not start: {(done.stdout + done.stderr).strip()[-300:]}")
    return analyzer
