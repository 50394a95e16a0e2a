"""The facility's processes, started inside lab hosts: tritonserver, and the commands they need.

Each returns once its service answers, or raises ``ServiceStartError`` with the process' log
(docs/internals/netlab.md, with an example).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .processes import CommandUnavailableError, HostProcess, ServiceStartError

if TYPE_CHECKING:
    from .lab import Host

logger = logging.getLogger(__name__)

GRPC_PORT, HTTP_PORT, METRICS_PORT = 8001, 8000, 8002


def ensure_command(command: str, package: str) -> str:
    """The path of ``command``, installing Debian's ``package`` first where it is missing and this
    process may (root, apt-get; its service is not started). Raises
    :class:`CommandUnavailableError` where it is missing and cannot be installed here."""
    found = shutil.which(command)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise CommandUnavailableError(
            f"{command} is not installed, and this process cannot install it (needs root and "
            f"apt-get): install it with 'apt-get install -y {package}'")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:  # only the package's files are wanted, not a system-wide service
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        for argv in (["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-qq"],
                     ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-qq",
                      "--no-install-recommends", package]):
            result = subprocess.run(argv, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                raise CommandUnavailableError(f"{command} is not installed and "
                                              f"{' '.join(argv)} failed: {result.stderr[-2000:]}")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)
    found = shutil.which(command)
    if not found:
        raise CommandUnavailableError(f"installing {package} gave no {command} command")
    return found


@dataclass
class TritonHost:
    """A tritonserver on a lab host (``process`` runs :func:`serve_main` there)."""

    host: "Host"
    process: HostProcess
    models: list[str] = field(default_factory=list)

    @property
    def grpc_address(self) -> str:
        return self.host.address(GRPC_PORT)

    @property
    def http_address(self) -> str:
        return self.host.address(HTTP_PORT)

    @property
    def metrics_address(self) -> str:
        return self.host.address(METRICS_PORT)

    def url(self, model: str) -> str:
        return f"triton+grpc://{self.grpc_address}/{model}"

    def ready(self) -> bool:
        """Whether the server answers ``/v2/health/ready``."""
        try:
            with urllib.request.urlopen(f"http://{self.http_address}/v2/health/ready",
                                        timeout=1.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 180.0) -> "TritonHost":
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if not self.process.alive or time.monotonic() > deadline:
                what = "exited" if not self.process.alive else f"not ready after {timeout_s:.0f} s"
                raise ServiceStartError(f"tritonserver on {self.host.name} {what}:\n"
                                      f"{self.process.log_tail()}")
            time.sleep(0.2)
        return self


def start_triton(host: "Host", models: Sequence[str], *, extra_args: Sequence[str] = (),
                 wait: bool = True, device: str = "cpu", startup_timeout_s: float = 180.0,
                 repository: str | os.PathLike | None = None) -> TritonHost:
    """An embedded tritonserver (:class:`~coffea_sonic.server.LocalTritonServer`) on ``host``,
    serving zoo ``models`` (or, with ``models`` empty, the model ``repository``) on ``device``
    (``cpu`` or ``gpu``) on ports 8001 (gRPC), 8000 (HTTP) and 8002 (metrics) of its address."""
    argv = [sys.executable, "-m", "coffea_sonic.netlab.services", "triton", "--host", host.ip,
            "--device", device]
    argv += ["--models", *models] if models else ["--repository", str(repository)]
    for argument in extra_args:
        argv.append(f"--extra-arg={argument}")
    triton = TritonHost(host, host.popen(argv, name="tritonserver", grace_s=30.0), list(models))
    return triton.wait_ready(startup_timeout_s) if wait else triton


def serve_main(argv: list[str] | None = None) -> int:
    """Entry point run inside a host: a LocalTritonServer until SIGTERM (its /dev/shm is the
    host's, so its regions are cleaned up in the right place)."""
    from ..server import LocalTritonServer

    parser = argparse.ArgumentParser(prog="python -m coffea_sonic.netlab.services triton")
    parser.add_argument("--host", required=True)
    served = parser.add_mutually_exclusive_group(required=True)
    served.add_argument("--models", nargs="+")
    served.add_argument("--repository", help="a model repository instead of zoo models")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--extra-arg", action="append", default=[])
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    workdir = tempfile.mkdtemp(prefix="netlab-triton-")
    server = LocalTritonServer(models=options.models, repository=options.repository,
                               device=options.device, host=options.host,
                               grpc_port=GRPC_PORT, http_port=HTTP_PORT,
                               metrics_port=METRICS_PORT, extra_args=options.extra_arg,
                               workdir=workdir)
    try:
        with server:
            logger.info("tritonserver ready on %s", server.grpc_address)
            while not stop.wait(0.5):
                if not server.running:
                    logger.error("tritonserver exited:\n%s", server.log_tail())
                    return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "triton":
        sys.exit(serve_main(sys.argv[2:]))
    sys.exit("usage: python -m coffea_sonic.netlab.services triton --host IP --models NAME...")
