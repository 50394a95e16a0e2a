"""Real Triton deployments we did not write, for the interoperability tests (tests/test_interop.py).

* :class:`PyTritonJetTagger`: a PyTriton 0.7 server at its defaults (its access-token restriction of
  model-repository, shared-memory, statistics, trace and logging included), serving ``jet_tagger``
  bound to a Python function that runs the shipped ONNX file through onnxruntime.
* :func:`restricted_server`: our embedded tritonserver started with ``--grpc-restricted-protocol``
  and ``--http-restricted-api``, as a facility might run it.
* :class:`HAProxy`: Debian's haproxy (installed on first use by ``scripts/haproxy/start.sh``)
  balancing gRPC per request, round robin over HTTP/2, across several tritonservers.

Everything binds to 127.0.0.1 only, on ports picked free and picked again if lost before the bind.
Helpers wait on conditions (:func:`wait_until`), never for a fixed time.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.launcher import free_ports
from coffea_sonic.server.launcher import server_environment

REPO = Path(__file__).resolve().parents[1]
HAPROXY_SCRIPTS = REPO / "scripts" / "haproxy"
LOOPBACK = "127.0.0.1"
MODEL = "jet_tagger"

#: The header PyTriton 0.7 puts in front of its restricted endpoints (``TRITON_ACCESS_HEADER``).
PYTRITON_TOKEN_KEY = "triton-access-token"
#: tritonserver's gRPC form of a restriction key ``KEY``: the header it expects is this prefix + KEY.
GRPC_RESTRICTED_HEADER_PREFIX = "triton-grpc-protocol-"
#: The protocol groups the restricted test server puts behind its key (as PyTriton's defaults do).
RESTRICTED_GROUPS = ("model-repository", "shared-memory", "statistics")


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str,
               poll_s: float = 0.01) -> None:
    """Return as soon as ``condition()`` is true; raise ``TimeoutError`` naming ``what`` if it
    is still false after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


@contextlib.contextmanager
def _environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block (restored afterwards)."""
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class PyTritonJetTagger:
    """A PyTriton 0.7 ``Triton`` at its defaults, serving ``jet_tagger`` from a bound function.

    The bound function runs ``CpuEngine("jet_tagger")`` (onnxruntime on the shipped ONNX file) in
    this process, as a PyTriton user's model would. Two settings differ from PyTriton's defaults,
    neither of which changes what a client sees: every endpoint binds to 127.0.0.1 on free ports
    (its default is 0.0.0.0:8000-8002), and ``exit_timeout_secs`` is 3 instead of 30 so the test
    does not wait half a minute for shutdown. Its security configuration is left at the default:
    a random access token guards model-repository, shared-memory, statistics, trace and logging.
    """

    def __init__(self, workspace: str | os.PathLike, *, max_batch_size: int = 4096,
                 attempts: int = 4) -> None:
        self.workspace = Path(workspace)
        self.max_batch_size = max_batch_size
        self.attempts = attempts
        self.ports: dict[str, int] = {}
        self.triton = None

    @property
    def grpc_address(self) -> str:
        return f"{LOOPBACK}:{self.ports['grpc']}"

    @property
    def http_address(self) -> str:
        return f"{LOOPBACK}:{self.ports['http']}"

    def url(self, version: int | None = None) -> str:
        """``triton+grpc://127.0.0.1:PORT/jet_tagger[/version]`` (coffea's URL form)."""
        return f"triton+grpc://{self.grpc_address}/{MODEL}" + (f"/{version}" if version else "")

    @property
    def access_token(self) -> str:
        """The token PyTriton generated; sent as a header it opens the restricted endpoints."""
        return self.triton.get_access_token()

    def _bind_and_run(self, attempt_dir: Path) -> None:
        from pytriton.decorators import batch
        from pytriton.model_config import ModelConfig, Tensor
        from pytriton.triton import Triton, TritonConfig

        from coffea_sonic.engines import CpuEngine

        engine = CpuEngine(MODEL, threads=1)

        @batch
        def infer(features: np.ndarray) -> dict[str, np.ndarray]:
            return engine({"features": features})

        self.ports = dict(zip(("http", "grpc", "metrics"), free_ports(3, LOOPBACK)))
        config = TritonConfig(
            http_address=LOOPBACK, http_port=self.ports["http"],
            grpc_address=LOOPBACK, grpc_port=self.ports["grpc"],
            metrics_address=LOOPBACK, metrics_port=self.ports["metrics"],
            exit_timeout_secs=3)
        self.triton = Triton(config=config, workspace=attempt_dir)
        self.triton.bind(
            model_name=MODEL, infer_func=infer,
            inputs=[Tensor(name="features", dtype=np.float32, shape=(6,))],
            outputs=[Tensor(name="probs", dtype=np.float32, shape=(3,))],
            config=ModelConfig(max_batch_size=self.max_batch_size))
        # PyTriton launches its tritonserver with this process's environment plus its own
        # libraries. The python-backend stub must load *this* interpreter's libpython (pyenv's),
        # not Debian's /usr/lib one with another stdlib (the model then fails to load with
        # "'_thread.RLock' object has no attribute '_recursion_count'"): put its LIBDIR first,
        # exactly as LocalTritonServer does.
        with _environment({"LD_LIBRARY_PATH": server_environment()["LD_LIBRARY_PATH"]}):
            self.triton.run()  # returns once the server and the bound model are ready

    def start(self) -> "PyTritonJetTagger":
        """Start PyTriton; on a failed start (e.g. a port taken before the bind) retry on new ports."""
        failures: list[str] = []
        for attempt in range(1, self.attempts + 1):
            attempt_dir = self.workspace / f"attempt-{attempt}"
            try:
                self._bind_and_run(attempt_dir)
                return self
            except Exception as error:  # PyTriton raises several types for a server that died
                failures.append(f"attempt {attempt} on ports {self.ports}: "
                                f"{type(error).__name__}: {error}")
                try:
                    self.stop()
                except Exception as stop_error:  # reported with the start failure below
                    failures.append(f"  and stopping it failed: {stop_error!r}")
        raise RuntimeError("PyTriton did not start:\n" + "\n".join(failures))

    def stop(self) -> None:
        """Stop the server, its proxy processes and the bound function's threads. Idempotent."""
        if self.triton is not None:
            triton, self.triton = self.triton, None
            triton.stop()

    def __enter__(self) -> "PyTritonJetTagger":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


@dataclass(frozen=True)
class RestrictionKey:
    """The ``KEY=VALUE`` of a tritonserver restriction and the headers that satisfy it."""

    key: str
    value: str

    @property
    def grpc_header(self) -> dict[str, str]:
        """gRPC metadata that opens the restricted groups (tritonserver prefixes the key)."""
        return {GRPC_RESTRICTED_HEADER_PREFIX + self.key: self.value}

    @property
    def http_header(self) -> dict[str, str]:
        """HTTP header that opens the restricted APIs (the key as given)."""
        return {self.key: self.value}


def restricted_server(key: RestrictionKey, groups: tuple[str, ...] = RESTRICTED_GROUPS,
                      **options) -> LocalTritonServer:
    """An embedded tritonserver serving ``jet_tagger`` whose ``groups`` need ``key`` on gRPC and HTTP.

    tritonserver 2.51 accepts only ``GROUPS:KEY=VALUE`` (its ``--help`` shows ``GROUPS,KEY=VALUE``,
    which makes it exit with a usage error).
    """
    restriction = f"{','.join(groups)}:{key.key}={key.value}"
    return LocalTritonServer(
        models=[MODEL], device="cpu",
        extra_args=[f"--grpc-restricted-protocol={restriction}",
                    f"--http-restricted-api={restriction}"],
        **options)


def new_restriction_key() -> RestrictionKey:
    return RestrictionKey("coffea-sonic-interop-key", secrets.token_urlsafe(16))


class HAProxy:
    """Debian's haproxy in front of ``backends`` (gRPC addresses), started by scripts/haproxy.

    ``scripts/haproxy/start.sh`` installs the package with apt if it is missing (root), writes the
    configuration from ``haproxy.cfg.tmpl`` (round robin, HTTP/2 on both sides, TCP health
    checks) into ``directory``, and starts haproxy on a free loopback port, picking another one
    if it was taken before haproxy bound it. ``stop.sh`` stops it by the PID it recorded.
    """

    def __init__(self, backends: list[str], directory: str | os.PathLike | None = None) -> None:
        self.backends = list(backends)
        self._own_directory = directory is None
        self.directory = Path(directory) if directory is not None else Path(
            tempfile.mkdtemp(prefix="coffea-sonic-haproxy-"))
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def url(self, version: int | None = None) -> str:
        return f"triton+grpc://{self.address}/{MODEL}" + (f"/{version}" if version else "")

    def _environment(self) -> dict[str, str]:
        return {**os.environ, "HAPROXY_DIR": str(self.directory), "HAPROXY_BIND": LOOPBACK,
                "HAPROXY_BACKENDS": ",".join(self.backends)}

    @property
    def pid(self) -> int | None:
        pidfile = self.directory / "haproxy.pid"
        return int(pidfile.read_text()) if pidfile.exists() else None

    def start(self) -> "HAProxy":
        result = subprocess.run([str(HAPROXY_SCRIPTS / "start.sh")], capture_output=True,
                                text=True, timeout=600, env=self._environment())
        if result.returncode != 0:
            raise RuntimeError(f"scripts/haproxy/start.sh failed ({result.returncode}):\n"
                               f"{result.stdout}\n{result.stderr}")
        lines = [line for line in result.stdout.splitlines() if line.startswith("HAPROXY_PORT=")]
        self.port = int(lines[-1].split("=", 1)[1])
        return self

    def stop(self) -> None:
        """Stop haproxy (by its recorded PID) and remove its directory if we made it. Idempotent."""
        subprocess.run([str(HAPROXY_SCRIPTS / "stop.sh")], capture_output=True, text=True,
                       timeout=60, env=self._environment())
        if self._own_directory:
            for leftover in self.directory.glob("*"):
                leftover.unlink()
            self.directory.rmdir()
            self._own_directory = False

    def __enter__(self) -> "HAProxy":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


class ServedRequests:
    """Successful ``jet_tagger`` inference requests a tritonserver has counted (its statistics).

    Read with tritonclient over gRPC, independent of the client under test. Only for servers that
    do not restrict the statistics group.
    """

    def __init__(self, grpc_address: str) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(grpc_address)

    def __call__(self) -> int:
        statistics = self._client.get_inference_statistics(MODEL, client_timeout=5)
        return sum(stats.inference_stats.success.count for stats in statistics.model_stats)

    def close(self) -> None:
        self._client.close()
