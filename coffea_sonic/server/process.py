"""The tritonserver binary as a process: where it is, its backend folder and environment, stopping it.

How it works, and the environment variables that override where the binary comes from:
docs/internals/server.md.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..core.process_local import ProcessLocal
from ..errors import MissingDependencyError, ServerStartError
from . import environment as server_env
from .environment import ServerEnvironment

__all__ = ["build_backend_dir", "check_given_ports", "finalize", "parent_death_prefix",
           "port_in_use", "remove_shm_regions", "remove_stale_shm_regions", "server_binary",
           "server_environment", "spawn", "stop_process_group"]

logger = logging.getLogger("coffea_sonic.server.launcher")


def server_binary(environment: ServerEnvironment | None = None) -> Path:
    """Path of the tritonserver binary (``$TRITONSERVER_BIN`` or the nvidia-pytriton wheel's)."""
    override = os.environ.get("TRITONSERVER_BIN")
    path = Path(override) if override else (
        (environment or server_env.resolve()).server_dir / "bin" / "tritonserver")
    if not path.is_file():
        raise MissingDependencyError(f"tritonserver binary not found at {path}")
    return path


def build_backend_dir(dest: Path, environment: ServerEnvironment | None = None) -> Path:
    """Backend folder whose python backend uses the stub built for the server Python's version.

    ``$TRITON_BACKEND_DIR`` wins if set (it must already hold ``python/`` with a matching stub).
    """
    override = os.environ.get("TRITON_BACKEND_DIR")
    if override:
        return Path(override)
    environment = environment or server_env.resolve()
    server_dir, version = environment.server_dir, environment.version
    stub = server_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        available = sorted(p.name for p in (server_dir / "python_backend_stubs").iterdir())
        raise MissingDependencyError(
            f"nvidia-pytriton has no python-backend stub for Python {version} "
            f"(it has {available}); run coffea-sonic's server under one of those")
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    backend_files = server_dir / "backends" / "python"
    for source in (backend_files / "libtriton_python.so",
                   backend_files / "triton_python_backend_utils.py", stub):
        target = python_dir / source.name
        if not target.exists():
            # Symlinks keep the binaries' RPATHs pointing at the wheel's bundled libraries.
            target.symlink_to(source)
    return dest


def server_environment(environment: ServerEnvironment | None = None) -> dict[str, str]:
    """Environment for tritonserver: the server Python's python3 and libpython found first
    (``$TRITON_SERVER_PATH`` / ``$TRITON_SERVER_LD_LIBRARY_PATH`` replace the computed values)."""
    if environment is None and not server_env.overridden():
        environment = server_env.resolve()
    env = dict(os.environ)
    env["PATH"] = os.environ.get("TRITON_SERVER_PATH") or os.pathsep.join(
        [str(environment.bin_dir), os.environ.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.environ.get("TRITON_SERVER_LD_LIBRARY_PATH") or os.pathsep.join(
        part for part in (environment.libdir, os.environ.get("LD_LIBRARY_PATH", "")) if part)
    # The model's Python must not pick up a user's PYTHONPATH with another numpy.
    env.pop("PYTHONHOME", None)
    if environment is not None and not server_env.is_this_interpreter(environment):
        env.pop("PYTHONPATH", None)
    return env


def parent_death_prefix() -> list[str]:
    """``setpriv --pdeathsig TERM`` when available: the server gets SIGTERM when we die."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


def spawn(argv: list[str], **options: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **options)``, made by this process' spawner thread (why:
    docs/internals/server.md).

    >>> spawn(["true"]).wait()
    0
    """
    return _spawners.get("spawner", lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="coffea-sonic-spawner")).submit(
        subprocess.Popen, argv, **options).result()


#: this process' spawner thread (a forked child starts its own)
_spawners: ProcessLocal[str, ThreadPoolExecutor] = ProcessLocal("server spawner")


def port_in_use(host: str, port: int) -> bool:
    """Whether ``host:port`` cannot be bound now (something listens there).

    >>> import socket
    >>> with socket.socket() as listener:
    ...     listener.bind(("127.0.0.1", 0)); listener.listen()
    ...     port_in_use("127.0.0.1", listener.getsockname()[1])
    True
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as a server binds (tritonserver does): connections of a stopped server's port left in
        # TIME_WAIT do not count, a listener does
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def check_given_ports(host: str, given: dict[str, int]) -> None:
    """Raise ``ServerStartError`` at once where a port the user chose (``{kind: port}``) is in
    use: a chosen port is never swapped for another, so retrying it could only fail again."""
    for kind, port in given.items():
        if port_in_use(host, port):
            raise ServerStartError(
                f"the {kind} port {port} given for tritonserver is in use on {host} (another "
                "server, or another process): choose another port, or 0 to have a free one "
                "picked")


def remove_stale_shm_regions() -> list[str]:
    """Regions of servers whose starting process is gone (``csonic_<pid>_...``)."""
    removed = []
    for region in glob.glob("/dev/shm/csonic_*_*"):
        owner = os.path.basename(region).split("_")[1]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            try:
                os.unlink(region)
                removed.append(region)
            except OSError:
                pass
    return removed


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (from /proc; a zombie holds nothing and is left
    out).

    >>> os.getpid() in group_members(os.getpgrp())
    True
    """
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Return once no live process is left in group ``pgid``: SIGKILL is delivered
    asynchronously, and a stub that is still exiting holds its memory, shm and files."""
    deadline = time.monotonic() + timeout_s
    while left := group_members(pgid):
        if time.monotonic() >= deadline:
            logger.warning("processes %s of tritonserver %d alive %.0f s after SIGKILL",
                           left, pgid, timeout_s)
            return
        time.sleep(0.02)


def stop_process_group(process: subprocess.Popen, grace_s: float) -> None:
    """Stop the server started in its own session as ``process``: SIGTERM, ``grace_s`` to exit,
    then SIGKILL for its group (python-backend stubs included); returns when none is alive."""
    if process.poll() is not None:
        # the server died (SIGKILL, crash) but its python-backend stubs, in its process
        # group, live on: they must not outlive it. A live process under the server's pid is
        # someone else's: the pid was reused after the server was reaped (pid_max can be
        # 32768), which the kernel does only once our group has no member left
        if os.path.exists(f"/proc/{process.pid}"):
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        _wait_group_gone(process.pid, grace_s)
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        logger.warning("tritonserver %d ignored SIGTERM for %.0f s; killing it", process.pid, grace_s)
    # Stubs are in the same session: make sure none outlives the server.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    _wait_group_gone(process.pid, grace_s)


def remove_shm_regions(prefix: str) -> list[str]:
    removed = []
    for region in glob.glob(f"/dev/shm/{prefix}*"):
        try:
            os.unlink(region)
            removed.append(region)
        except FileNotFoundError:
            pass
    return removed


def finalize(process: subprocess.Popen | None, shm_prefix: str, workdir: Path | None,
              keep_workdir: bool, grace_s: float) -> None:
    if process is not None:
        stop_process_group(process, grace_s)
    remove_shm_regions(shm_prefix)
    if workdir is not None and not keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
