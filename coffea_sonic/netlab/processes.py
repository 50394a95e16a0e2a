"""A long-running process inside a lab host (own process group, log file, stop that always works).

:class:`LocalHost` is this machine as a host (no namespaces, no root): docs/internals/netlab.md.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path
from typing import Protocol, Sequence

from ..errors import NetworkLabError


class Host(Protocol):
    """What a process needs of its lab host (:class:`coffea_sonic.netlab.Host`)."""

    name: str

    def command_prefix(self) -> list[str]: ...

    def address(self, port: int) -> str: ...

logger = logging.getLogger(__name__)


class CommandUnavailableError(NetworkLabError):
    """A command the lab needs (haproxy, prometheus, openssl, dask) is not installed and cannot be
    installed here (not root, no apt-get, the install failed). The one lab error a test may skip
    on: what it would test cannot be had on this machine."""


class ServiceStartError(NetworkLabError):
    """A service the lab started exited, or did not listen in time (e.g. HAProxy refusing its
    configuration); the message carries the last lines of its output. Never a reason to skip: the
    thing under test is broken."""


def _parent_death_prefix() -> list[str]:
    # The process dies with the caller even when the caller is SIGKILLed; the signal survives
    # nsenter's exec into the command.
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


#: Linux sends the parent-death signal when the *thread* that started the child exits: every
#: process is started from this one long-lived thread, so that one (re)started from a short-lived
#: thread (a test's fault injector restarting the gateway) is not killed when that thread ends.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="netlab-spawn")


def _spawn(argv: list[str], **options) -> subprocess.Popen:
    return _SPAWNER.submit(subprocess.Popen, argv, **options).result()


def port_open(address: str, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection to ``address`` (``ip:port``) is accepted."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


class HostProcess:
    """A process started by :meth:`Host.popen`; stopped by the lab at the latest."""

    def __init__(self, host: Host, argv: Sequence[str], *, name: str, env: dict | None,
                 grace_s: float, log_path: Path) -> None:
        self.host = host
        self.argv = list(argv)
        self.name = name
        self.env = env
        self.grace_s = grace_s
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.start()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.alive else "stopped"
        return f"HostProcess({self.name!r} on {self.host.name}, {state})"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> "HostProcess":
        """(Re)start the process with the same command (appending to its log)."""
        if self.alive:
            return self
        with open(self.log_path, "ab") as log:
            self.process = _spawn(
                _parent_death_prefix() + self.host.command_prefix() + self.argv,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env, start_new_session=True)
        logger.info("netlab: started %s on %s (pid %d): %s", self.name, self.host.name,
                    self.process.pid, " ".join(self.argv))
        return self

    def kill(self) -> None:
        """SIGKILL the process and its group at once (a crash, for fault tests)."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        self.process.wait()

    def terminate(self) -> None:
        """Send SIGTERM to the process group (:meth:`stop` waits for it)."""
        if self.process is not None and self.process.poll() is None:
            self._signal_group(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s``. Idempotent."""
        if self.process is None:
            return
        self.terminate()
        try:
            self.process.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("netlab: %s ignored SIGTERM for %.0f s; killing it", self, self.grace_s)
        self._signal_group(signal.SIGKILL)
        self.process.wait()

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the process' output."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, errors="replace") as log:
            return "".join(deque(log, maxlen=lines))

    def wait_for_port(self, port: int, *, timeout_s: float = 60.0) -> str:
        """Wait until the host accepts connections on ``port``; return ``ip:port``.

        Raises :class:`ServiceStartError` with the log's tail if the process exits or time runs
        out.
        """
        address = self.host.address(port)
        deadline = time.monotonic() + timeout_s
        while not port_open(address):
            if not self.alive:
                raise ServiceStartError(f"{self.name} on {self.host.name} exited "
                                      f"({self.process.returncode}) before listening on {address}:"
                                      f"\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServiceStartError(f"{self.name} on {self.host.name} did not listen on "
                                      f"{address} within {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.1)
        return address


class LocalHost:
    """This machine as a host (no namespaces): loopback services, e.g. the gateway in a benchmark
    that needs no root. A context manager; stopping it stops every process it started.

    >>> with LocalHost() as here:
    ...     here.address(8001), here.command_prefix()
    ('127.0.0.1:8001', [])
    """

    name = "localhost"
    ip = "127.0.0.1"

    def __init__(self, logs: str | Path | None = None) -> None:
        import tempfile

        self.logs = Path(logs) if logs is not None else Path(tempfile.mkdtemp(prefix="netlab-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.processes: list[HostProcess] = []

    def __enter__(self) -> "LocalHost":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def address(self, port: int) -> str:
        return f"{self.ip}:{port}"

    def command_prefix(self) -> list[str]:
        return []

    def popen(self, argv: Sequence[str], *, name: str, env: dict | None = None,
              grace_s: float = 10.0) -> HostProcess:
        process = HostProcess(self, argv, name=name, env=env, grace_s=grace_s,
                              log_path=self.logs / f"{name}.log")
        self.processes.append(process)
        return process

    def stop(self) -> None:
        """Stop every process started here. Idempotent."""
        for process in self.processes:
            process.terminate()
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
