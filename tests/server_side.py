"""Which wire carried a test's requests, as the server saw them: its own log.

A client's ``transport_kind`` reports the object it built, not what reached the server. For the
span of a ``with watch_wire(server) as wire:`` block the tritonserver logs at verbose level 1 (set
through its logging API, restored after), and the block's log lines are counted: the gRPC
``ModelInfer`` calls it took, the HTTP ``.../infer`` requests it took, the outputs it wrote into
shared memory (Triton logs "using shared-memory for 'NAME'" per output; inputs it reads from a
region leave no line). Our shared-memory regions registered on the server after the block come
from its shared-memory status. The span ends with a marker request whose path the HTTP front end
logs: once the marker is in the log, every line the server wrote during the block is too.

Triton 2.51's metrics have no per-protocol counter, and its statistics count requests of every
front end together: the log is the one place that says which front end took a request.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

#: a gRPC infer call (unary or stream) the server took: one line per call
GRPC_INFER = re.compile(rb"New request handler for Model(?:Stream)?InferHandler\b")
#: an HTTP infer request the server took (2 is POST)
HTTP_INFER = re.compile(rb'HTTP request: \d+ /v2/models/[^"\s]+/infer"')
#: an output the server wrote into a shared-memory region named by the request
SHM_OUTPUT = re.compile(rb"(?:GRPC|HTTP):? using shared-memory for '")
#: a system shared-memory region registered over gRPC
SHM_REGISTER = re.compile(rb"Process for SystemSharedMemoryRegister, rpc_ok=1, \d+ step START")
#: how long the server may take to log the marker request
MARKER_TIMEOUT_S = 60.0
#: the transports whose wire :func:`sent_over` can check
CHECKED = ("grpc", "shm", "http")


@dataclass(frozen=True)
class ServerSide:
    """A tritonserver as the wire checks reach it: its addresses, where its log is read, and the
    headers that open its restricted APIs (logging, shared memory) if it restricts them."""

    grpc_address: str
    http_address: str
    #: the server's log from a byte offset on
    log_from: Callable[[int], bytes]
    grpc_headers: Mapping[str, str] = field(default_factory=dict)
    http_headers: Mapping[str, str] = field(default_factory=dict)
    #: the log's length in bytes (None: ``len(log_from(0))``)
    log_size: Callable[[], int] | None = None

    @classmethod
    def of_file(cls, grpc_address: str, http_address: str, path: str | os.PathLike,
                **headers: Mapping[str, str]) -> "ServerSide":
        def log_from(offset: int) -> bytes:
            with open(path, "rb") as log:
                log.seek(offset)
                return log.read()

        return cls(grpc_address, http_address, log_from, **headers,
                   log_size=lambda: os.path.getsize(path))


def server_side(server: Any) -> ServerSide:
    """``server`` as :class:`ServerSide`: a LocalTritonServer (anything with ``log_path``,
    ``grpc_address`` and ``http_address``), or the gRPC address of a tritonserver running on
    this host whose output goes to a file (found by its command line, its log by its stdout)."""
    if isinstance(server, ServerSide):
        return server
    if isinstance(server, str):
        return _local_tritonserver(server)
    return ServerSide.of_file(server.grpc_address, server.http_address, server.log_path)


def _local_tritonserver(grpc_address: str) -> ServerSide:
    host, port = grpc_address.rsplit(":", 1)
    wanted = {f"--grpc-port={port}", f"--grpc-address={host}"}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not wanted <= set(argv) or not any(a.endswith("tritonserver") for a in argv):
                continue
            log = os.path.realpath(proc / "fd" / "1")
        except OSError:  # gone, or not ours
            continue
        options = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--http-")
                       and "=" in arg)
        if os.path.isfile(log) and "http-port" in options:
            http = f"{options.get('http-address', host)}:{options['http-port']}"
            return ServerSide.of_file(grpc_address, http, log)
    raise AssertionError(f"no tritonserver with gRPC on {grpc_address} logging to a file on this "
                         "host: pass the server object (or a ServerSide) to read what it saw")


@dataclass
class Wire:
    """What the server took during a :func:`watch_wire` block (filled in when the block ends)."""

    #: gRPC infer calls
    grpc_infers: int = 0
    #: HTTP infer requests
    http_infers: int = 0
    #: outputs written into shared-memory regions the requests named
    shm_outputs: int = 0
    #: system shared-memory regions registered (over gRPC)
    shm_registrations: int = 0
    #: our shared-memory regions registered on the server before and after the block
    regions_before: set[str] = field(default_factory=set)
    regions: set[str] = field(default_factory=set)

    @property
    def new_regions(self) -> set[str]:
        """Our regions registered during the block and still registered after it."""
        return self.regions - self.regions_before

    def __str__(self) -> str:
        return (f"{self.grpc_infers} gRPC infer calls, {self.http_infers} HTTP infer requests, "
                f"{self.shm_outputs} outputs written into shared memory, "
                f"{self.shm_registrations} region registrations; our regions registered after: "
                f"{sorted(self.regions) or 'none'}, before: "
                f"{sorted(self.regions_before) or 'none'}")


def _api(side: ServerSide, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://{side.http_address}{path}", method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **side.http_headers})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def _log_size(side: ServerSide) -> int:
    return side.log_size() if side.log_size is not None else len(side.log_from(0))


def _through_marker(side: ServerSide, start: int, may_die: bool) -> bytes | None:
    """The log from ``start`` up to a marker request sent now (waited for in the log); None
    when the server is gone and ``may_die``: its log then ends with everything it took."""
    from helpers import wait_for

    marker = f"wire-check-{uuid.uuid4().hex}"
    try:
        with urllib.request.urlopen(f"http://{side.http_address}/v2/models/{marker}/ready",
                                    timeout=30):
            pass
    except urllib.error.HTTPError:  # no such model: the request is logged all the same
        pass
    except urllib.error.URLError:
        if may_die:
            return None
        raise

    def logged() -> bytes | None:
        text = side.log_from(start)
        return text if marker.encode() in text else None

    text = wait_for(logged, MARKER_TIMEOUT_S,
                    f"tritonserver at {side.grpc_address} to log {marker}")
    return text[:text.index(marker.encode())]


@contextlib.contextmanager
def watch_wire(server: Any, *, may_die: bool = False) -> Iterator[Wire]:
    """Count what the server took during the block (see the module docstring).

    ``may_die``: the block may kill the server (its log, complete once it is dead, is read to the
    end; a dead server holds no region)."""
    side = server_side(server)
    regions_before = registered_regions(side)
    start = _log_size(side)
    previous = int(_api(side, "/v2/logging")["log_verbose_level"])
    _api(side, "/v2/logging", {"log_verbose_level": max(1, previous)})
    wire = Wire()
    try:
        yield wire
        text = _through_marker(side, start, may_die)
    finally:
        with contextlib.suppress(OSError):  # a server the block stopped has nothing to restore
            _api(side, "/v2/logging", {"log_verbose_level": previous})
    gone = text is None
    if gone:
        text = side.log_from(start)
    wire.grpc_infers = len(GRPC_INFER.findall(text))
    wire.http_infers = len(HTTP_INFER.findall(text))
    wire.shm_outputs = len(SHM_OUTPUT.findall(text))
    wire.shm_registrations = len(SHM_REGISTER.findall(text))
    wire.regions_before = regions_before
    wire.regions = set() if gone else registered_regions(side)


def _grpc_client(grpc_address: str):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(grpc_address)


def registered_regions(server: Any) -> set[str]:
    """Names of the system shared-memory regions that live processes of this package have
    registered on ``server`` (a gRPC address, or what :func:`server_side` takes), as the server's
    own status lists them."""
    from coffea_sonic.transport.shm.regions import PREFIX, pid_alive, pid_of

    if isinstance(server, str):
        address, headers = server, {}
    else:
        side = server_side(server)
        address, headers = side.grpc_address, dict(side.grpc_headers)
    client = _grpc_client(address)
    try:
        status = client.get_system_shared_memory_status(as_json=True, headers=headers)
    finally:
        client.close()
    return {name for name in status.get("regions", {}) if name.startswith(PREFIX)
            and (pid := pid_of(name)) is not None and pid_alive(pid)}


@contextlib.contextmanager
def sent_over(transport: str, server: Any, *, outputs_in_shm: bool = True,
              may_die: bool = False) -> Iterator[Wire]:
    """Check, from the server's side, that the block's requests went over ``transport``.

    ``"grpc"``: gRPC infer calls, no HTTP one, no output written into shared memory, no region of
    ours newly registered after the block (regions of transports opened before it may stay), and
    no region registered during it but the probe region an ``"auto"`` choice registers and drops.

    ``"shm"``: gRPC infer calls, no HTTP one, outputs written into shared memory. With
    ``outputs_in_shm=False`` (calls whose outputs all come back in the message: outputs of unknown
    size, or answers the server refused to write into the request's regions; the server logs
    nothing of the inputs it reads from a region) instead a region of ours on the server before or
    after the block, or registered during it (build the model before the block: a transport's
    first use registers and drops a probe region, which would count).

    ``"http"``: HTTP infer requests, no gRPC one. ``may_die``: see :func:`watch_wire`.
    """
    if transport not in CHECKED:
        raise ValueError(f"no wire check for transport {transport!r} (checked: {CHECKED})")
    with watch_wire(server, may_die=may_die) as wire:
        yield wire
    seen = f"[{transport}] run, the server took {wire}"
    if transport == "http":
        assert wire.http_infers and not wire.grpc_infers, seen
    else:
        assert wire.grpc_infers and not wire.http_infers, seen
    if transport == "grpc":
        assert not (wire.shm_outputs or wire.new_regions or wire.shm_registrations > 1), seen
    elif transport == "shm":
        assert (wire.shm_outputs if outputs_in_shm else
                wire.regions_before or wire.regions or wire.shm_registrations), seen
