"""Launch the real ``tritonserver`` binary shipped in the nvidia-pytriton wheel, directly.

How it works: docs/internals/server.md.

>>> with LocalTritonServer(models=["jet_tagger"], device="cpu") as server:
...     server.url("jet_tagger")
'triton+grpc://127.0.0.1:.../jet_tagger'
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections import deque
from pathlib import Path
from typing import Iterable, Literal, Sequence

from ..errors import ConfigurationError, ServerStartError
from . import environment as server_env
from .environment import ServerEnvironment
from .pipelines import PIPELINE_GPU_INSTANCES, cuda_pool_flags, write_models
from .process import (build_backend_dir, check_given_ports, finalize, parent_death_prefix,
                      remove_shm_regions, spawn,
                      remove_stale_shm_regions, server_binary, server_environment,
                      stop_process_group)
from .response_cache import server_flags
from .served import install_adapters, prepare_repository
from ..zoo.trees import tree_names

logger = logging.getLogger(__name__)

DeviceChoice = Literal["auto", "cpu", "gpu"]
#: Model instances per GPU when not given. Each python-backend instance spends milliseconds of
#: host work (copies, Python) per request; with 6 that hides behind the others' GPU work, and
#: more gave nothing (benchmarks/RESULTS.md, "What sets each default"; data in
#: benchmarks/gpu/results-defaults). Pipelines: their own (pipelines.PIPELINE_GPU_INSTANCES).
GPU_INSTANCES = 6
#: How many lines of the server log a failed start reports.
LOG_TAIL_LINES = 40
#: Starts tried when a port picked free was taken by another process before the server bound it.
PORT_ATTEMPTS = 5
#: What tritonserver logs when a port it was given is in use (gRPC, HTTP and metrics alike).
_PORT_TAKEN = re.compile(r"Socket '[^']*:(\d+)' already in use")


def gpu_count() -> int:
    """How many CUDA GPUs are visible (the lines ``nvidia-smi -L`` lists; 0 without nvidia-smi).

    >>> import tempfile; from unittest import mock
    >>> folder = tempfile.mkdtemp(); smi = os.path.join(folder, "nvidia-smi")
    >>> with open(smi, "w") as script:  # what nvidia-smi -L prints on a 2-GPU node
    ...     _ = script.write("#!/bin/sh\\necho 'GPU 0: NVIDIA H100'\\necho 'GPU 1: NVIDIA H100'\\n")
    >>> os.chmod(smi, 0o755)
    >>> with mock.patch.dict(os.environ, {"PATH": folder}):
    ...     gpu_count()
    2
    >>> with mock.patch.dict(os.environ, {"PATH": "/nonexistent"}):
    ...     gpu_count()
    0
    """
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if listing.returncode != 0:
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU"))


def gpu_available() -> bool:
    """Whether a CUDA GPU is visible (``nvidia-smi -L`` lists one).

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"PATH": "/nonexistent"}):  # no nvidia-smi
    ...     gpu_available()
    False
    """
    return gpu_count() > 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it).

    Only "right now": another process may bind it before the caller's server does. Whoever hands
    it to a server must retry on a new port when the bind fails (as ``LocalTritonServer`` does).

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> list[int]:
    """``count`` different ports, each free on ``host`` right now and none of ``avoid``: two
    :func:`free_port` calls may return the same port (the OS hands a freed port out again), and
    tritonserver refuses one port for two of its endpoints.

    >>> len(set(free_ports(3)))
    3
    """
    ports: list[int] = []
    seen = set(avoid)
    while len(ports) < count:
        port = free_port(host)
        if port not in seen:
            ports.append(port)
            seen.add(port)
    return ports


def _cache_bytes(size: int | str | None) -> int | None:
    """Bytes of a response-cache size given as an int or text ("512MB"), None for off."""
    if size is None:
        return None
    from ..cache import parse_size

    return parse_size(size, "response cache size")


def _check_options(device: str, models: Iterable[str] | None,
                   repository: str | os.PathLike | None, gpus: Sequence[int] | None) -> None:
    """Raise ``ConfigurationError`` for options of a LocalTritonServer that cannot work."""
    if device not in ("auto", "cpu", "gpu"):
        raise ConfigurationError(f"device must be auto, cpu or gpu, not {device!r}")
    if models is not None and repository is not None:
        raise ConfigurationError("give either models (from the zoo) or repository, not both")
    if gpus is not None and (not list(gpus) or not all(
            isinstance(g, int) and g >= 0 for g in gpus)):
        raise ConfigurationError(f"gpus must be a non-empty list of GPU indices, not {gpus!r}")


class _PortTaken(ServerStartError):
    """tritonserver could not bind a port picked free for it: another process took it first."""


class LocalTritonServer:
    """A real tritonserver on this machine, serving zoo models or an existing repository.

    ``repository`` may be written for NVIDIA's official Triton container
    (docs/internals/standard-repositories.md). A model it cannot serve raises
    :class:`~coffea_sonic.errors.UnservableModelError` before anything starts, unless
    ``skip_unservable=True``: then ``skipped`` lists ``(model, version, reason)`` of the ones left
    out. Ports given as 0 are picked free. Use it as a context manager (or ``start()`` / ``stop()``).

    >>> server = LocalTritonServer(models=["jet_tagger"], grpc_port=0)
    >>> server.running
    False

    Attributes once started: ``grpc_address`` ("127.0.0.1:PORT"), ``http_address``, ``metrics_url``,
    ``url(model)`` (coffea's ``triton+grpc://`` form), ``pid``, ``log_path``, ``repository``.
    """

    def __init__(
        self,
        models: Iterable[str] | None = None,
        repository: str | os.PathLike | None = None,
        device: DeviceChoice = "auto",
        grpc_port: int = 0,
        http_port: int = 0,
        metrics_port: int = 0,
        *,
        host: str = "127.0.0.1",
        instances: int | None = None,
        startup_timeout_s: float = 120.0,
        extra_args: Sequence[str] = (),
        workdir: str | os.PathLike | None = None,
        keep_workdir: bool = False,
        log_verbose: int = 0,
        repository_options: dict | None = None,
        die_with_parent: bool = True,
        skip_unservable: bool = False,
        gpus: Sequence[int] | None = None,
        response_cache: int | str | None = None,
        torch_ops_libraries: Sequence[str | os.PathLike] = (),
    ) -> None:
        _check_options(device, models, repository, gpus)
        self.models = list(models) if models is not None else None
        self.repository = Path(repository).resolve() if repository is not None else None
        self.requested_device, self.host, self.instances = device, host, instances
        self.ports = {"grpc": grpc_port, "http": http_port, "metrics": metrics_port}
        self.startup_timeout_s, self.extra_args = startup_timeout_s, list(extra_args)
        self.workdir = Path(workdir) if workdir is not None else None
        self.keep_workdir, self.log_verbose = keep_workdir, log_verbose
        self.repository_options = dict(repository_options or {})
        #: bytes of Triton's response cache (None: off); zoo models are served with it enabled
        self.response_cache = _cache_bytes(response_cache)
        if self.response_cache is not None:
            self.repository_options.setdefault("response_cache", True)
        # Linux delivers the parent-death signal when the starting *thread* exits: start a
        # long-lived server from the main thread (or a long-lived one), or pass False.
        self.die_with_parent = die_with_parent
        self.skip_unservable = skip_unservable
        #: operator libraries the repository's TorchScript models may need (server/torch_ops.py)
        self.torch_ops_libraries = tuple(str(Path(p).resolve()) for p in torch_ops_libraries)
        #: GPUs the server may use (None: every visible one); the model instances per GPU
        #: (``instances``) are placed on each of them
        self.gpus = list(gpus) if gpus is not None else None
        #: (model, version, reason) of the repository's models left out (``skip_unservable``).
        self.skipped: list[tuple[str, int | None, str]] = []
        #: The repository the server reads: the served mirror of ``repository``, or the zoo's.
        self.served_repository: Path | None = None
        self._library_paths: list[str] = []
        #: The Python environment the server runs from (set on start).
        self.environment: ServerEnvironment | None = None
        self.shm_prefix = f"csonic_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self.device: str | None = None
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self._finalizer: weakref.finalize | None = None

    # -- addresses -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.ports['grpc']}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.ports['http']}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports['metrics']}/metrics"

    def url(self, model: str, version: int | str | None = None) -> str:
        """coffea's URL form for ``model`` on this server: ``triton+grpc://host:port/model[/v]``."""
        suffix = f"/{version}" if version is not None else ""
        return f"triton+grpc://{self.grpc_address}/{model}{suffix}"

    def __repr__(self) -> str:
        state = f"grpc={self.grpc_address}" if self.running else "stopped"
        return f"LocalTritonServer({state}, device={self.device or self.requested_device})"

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "LocalTritonServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _command(self, repository: Path, backend_dir: Path) -> list[str]:
        ports = self.ports
        return [
            str(server_binary(self.environment)),
            f"--model-repository={repository}",
            f"--backend-directory={backend_dir}",
            f"--http-address={self.host}", f"--http-port={ports['http']}",
            f"--grpc-address={self.host}", f"--grpc-port={ports['grpc']}",
            f"--metrics-address={self.host}", f"--metrics-port={ports['metrics']}",
            f"--allow-gpu-metrics={'true' if self.device == 'gpu' else 'false'}",
            "--exit-timeout-secs=5",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            # A stub busy with a large CPU batch on a loaded machine must not be declared dead
            # (Triton 2.51 does not restart it; the model would fail until the server restarts).
            "--backend-config=python,stub-timeout-seconds=120",
            *(server_flags(self.response_cache, server_binary()) if self.response_cache is not None
              else ()),
            *cuda_pool_flags(self.models, self.device, self.repository_options.get("handoff"),
                             self._server_gpus() if self.device == "gpu" else 0,
                             self.extra_args),
            *self.extra_args,
        ]

    def _server_gpus(self) -> int:
        """How many GPUs the server sees (its CUDA_VISIBLE_DEVICES: ``gpus``, or this process's)."""
        if self.gpus is not None:
            return len(self.gpus)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return len([part for part in visible.split(",") if part.strip()])
        return gpu_count()

    def start(self) -> "LocalTritonServer":
        """Start the server and wait until every model is ready; raise ``ServerStartError`` if not."""
        if self.running:
            return self
        self.device = self.requested_device
        if self.device == "auto":
            self.device = "gpu" if gpu_available() else "cpu"
        workdir = self.workdir or Path(tempfile.mkdtemp(prefix="coffea-sonic-server-"))
        workdir.mkdir(parents=True, exist_ok=True)
        # several python-backend instances per GPU: one instance's host-side work per
        # request, not the GPU, is the bottleneck (see GPU_INSTANCES)
        instances = self.instances or (GPU_INSTANCES if self.device == "gpu" else 1)
        self.environment = None if server_env.overridden() else server_env.resolve()
        prepared = None
        if self.repository is not None:
            try:  # refusals come before anything starts, and leave nothing behind
                prepared = prepare_repository(self.repository, workdir / "models",
                                              device=self.device,
                                              skip_unservable=self.skip_unservable,
                                              torch_ops_libraries=self.torch_ops_libraries)
            except Exception:
                if self.workdir is None:
                    shutil.rmtree(workdir, ignore_errors=True)
                raise
            self.skipped = [tuple(refusal) for refusal in prepared.skipped]
            repository = prepared.path
        else:
            server_env.export_generated_models(self.environment, self.models)
            repository = write_models(
                workdir / "models", self.models, backend="python", device=self.device,
                instances=instances, link=True,
                pipeline_instances=self.instances or PIPELINE_GPU_INSTANCES,
                **self.repository_options)
        self.served_repository = repository
        backend_dir = build_backend_dir(workdir / "backends", self.environment)
        if (prepared.needs_adapters if prepared is not None
                else any(name in tree_names() for name in self.models or ())):
            backend_dir, self._library_paths = install_adapters(
                backend_dir, workdir / "backends-adapted")
        self.log_path = workdir / "tritonserver.log"
        stale = remove_stale_shm_regions()
        if stale:
            logger.info("removed %d shared-memory regions of servers whose owner is gone", len(stale))
        self._start_on_free_ports(repository, backend_dir, workdir)
        logger.info("tritonserver ready: grpc %s, http %s, metrics %s (pid %d)",
                    self.grpc_address, self.http_address, self.metrics_url, self.pid)
        return self

    def _start_on_free_ports(self, repository: Path, backend_dir: Path, workdir: Path) -> None:
        """Spawn the server and wait for it; again on new ports where one picked free was taken."""
        picked = [kind for kind, port in self.ports.items() if port == 0]
        check_given_ports(self.host, {k: p for k, p in self.ports.items() if k not in picked})
        for attempt in range(1, PORT_ATTEMPTS + 1):
            given = [port for kind, port in self.ports.items() if kind not in picked]
            for kind, port in zip(picked, free_ports(len(picked), self.host, avoid=given)):
                self.ports[kind] = port
            self._spawn(self._command(repository, backend_dir), workdir)
            try:
                self._wait_ready()
                break
            except _PortTaken as taken:
                if attempt == PORT_ATTEMPTS:
                    report = self._failure_report()
                    self.stop()
                    raise ServerStartError(f"{taken} ({attempt} attempts). {report}") from None
                # Lost the race between free_port() and tritonserver's bind: start again on
                # newly picked ports (the repository and backends are reused).
                logger.info("%s; starting again on new ports (attempt %d of %d)", taken,
                            attempt + 1, PORT_ATTEMPTS)
                self._discard_failed_start()

    def _spawn(self, command: list[str], workdir: Path) -> None:
        """Start the tritonserver process; its finalizer stops it and cleans up after it."""
        logger.info("starting tritonserver (%s) on %s: %s", self.device, self.grpc_address,
                    " ".join(command))
        environment = server_environment(self.environment)
        if self.gpus is not None:  # the server sees only these, as its GPUs 0..n-1
            environment["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        if self._library_paths:  # the copied python-backend library's own libraries (served.py)
            environment["LD_LIBRARY_PATH"] = os.pathsep.join(
                part for part in (environment.get("LD_LIBRARY_PATH"), *self._library_paths) if part)
        with open(self.log_path, "wb") as log:
            prefix = parent_death_prefix() if self.die_with_parent else []
            self.process = spawn(
                prefix + command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=environment, start_new_session=True)
        self._finalizer = weakref.finalize(
            self, finalize, self.process, self.shm_prefix, workdir if self.workdir is None else None,
            self.keep_workdir, 10.0)
        atexit.register(self._finalizer)

    def _discard_failed_start(self) -> None:
        """Clean up after a process that failed to bind, keeping the workdir for the next try."""
        if self._finalizer is not None:
            self._finalizer.detach()  # its cleanup would delete the temporary workdir
            atexit.unregister(self._finalizer)
            self._finalizer = None
        if self.process is not None:
            stop_process_group(self.process, 10.0)
        remove_shm_regions(self.shm_prefix)

    def _enabled(self, service: str) -> bool:
        return not any(arg.replace(" ", "") in (f"--allow-{service}=false", f"--allow-{service}=0")
                       for arg in self.extra_args)

    def _taken_picked_port(self) -> str | None:
        """The failed start's port clash, if the log shows one on a port this launcher picked."""
        if self.log_path is None or not self.log_path.exists():
            return None
        match = _PORT_TAKEN.search(self.log_path.read_text(errors="replace"))
        if match is None:
            return None
        kinds = [kind for kind, port in self.ports.items() if str(port) == match.group(1)]
        return f"{'/'.join(kinds) or 'a'} port {match.group(1)} was taken" if kinds else None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, errors="replace") as log:
            return "".join(deque(log, maxlen=lines))

    def log_errors(self, limit: int = 20) -> str:
        """Error lines of the server log (config parse errors come long before its last lines)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        noise = ("CudaDriverHelper", "cudaGetDeviceCount", "Unable to allocate pinned")
        with open(self.log_path, errors="replace") as log:
            errors = [line for line in log
                      if (line[:1] == "E" and line[1:5].isdigit()) or "ERROR" in line
                      if not any(text in line for text in noise)]
        return "".join(errors[:limit])

    def _failure_report(self) -> str:
        return (f"Errors in its log ({self.log_path}):\n{self.log_errors()}"
                f"Last lines of its log:\n{self.log_tail()}")

    def _answers(self, target: str | int) -> bool:
        """An HTTP URL answers 200, or a port of this host (an int) takes a connection."""
        try:
            if isinstance(target, int):
                with socket.create_connection((self.host, target), timeout=1.0):
                    return True
            with urllib.request.urlopen(target, timeout=1.0) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _wait_ready(self) -> None:
        """Wait until the server is ready on every port; raise ``_PortTaken`` on a lost port race."""
        deadline = time.monotonic() + self.startup_timeout_s
        ready_url = f"http://{self.http_address}/v2/health/ready"
        while time.monotonic() < deadline:
            failed = False
            if self.process.poll() is None and self._answers(ready_url) and (
                    not self._enabled("metrics") or self._answers(self.metrics_url)) and (
                    not self._enabled("grpc") or self._answers(self.ports["grpc"])):
                if "failed to start" not in self.log_errors():
                    return
                failed = True
                try:
                    self.process.wait(timeout=30)  # it is on its way out
                except subprocess.TimeoutExpired:
                    pass
            if failed or self.process.poll() is not None:
                taken = self._taken_picked_port()
                if taken is not None:
                    raise _PortTaken(f"tritonserver could not start: {taken} before it bound it")
                report = self._failure_report()
                self.stop()
                raise ServerStartError(
                    f"tritonserver failed during start-up (exit code {self.process.returncode}). "
                    f"{report}")
            time.sleep(0.1)
        report = self._failure_report()
        self.stop()
        raise ServerStartError(
            f"tritonserver was not ready after {self.startup_timeout_s:.0f} s. {report}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL), its stubs and its shm regions. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
            atexit.unregister(self._finalizer)
            self._finalizer = None
