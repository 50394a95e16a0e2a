"""Where a ``bench wrapper`` call's client time goes: its encoding steps, and py-spy samples.

* :func:`client_steps`: milliseconds of each client-side step of one request in isolation,
  TritonModel's gRPC encoding against the wrapper's (best of ``repeats``).
* :func:`sampling_profiles`: py-spy (all threads, idle included) on a child process that calls
  one client in a loop (``python -m coffea_sonic.bench.wrapper_profile``); the share of the
  calling thread's samples per function. py-spy is not a dependency of the project:
  :func:`require_py_spy` says how to install it where it is missing.

>>> steps = client_steps(slice_inputs(1000), piece_rows=1000, repeats=1)
>>> steps["piece_bytes"], steps["request_wire_bytes"] > steps["piece_bytes"]
(64000, True)
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ConfigurationError
from .wrapper_clients import (KEPT, MODEL, Client, slice_inputs, tritonmodel_client,
                              wrapper_client, write_repository)

__all__ = ["PROFILED_CLIENTS", "client_steps", "require_py_spy", "sampling_profiles"]

#: the clients py-spy samples
PROFILED_CLIENTS = ("coffea-wrapper", "grpc", "shm")
_INSTALL = "python -m venv /tmp/tools && /tmp/tools/bin/pip install py-spy"


def require_py_spy(path: str) -> str:
    """The py-spy binary ``path`` names (a path or a command on PATH), or ConfigurationError
    saying how to install it.

    >>> require_py_spy("/nonexistent/py-spy")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    coffea_sonic.errors.ConfigurationError: py-spy not found at '/nonexistent/py-spy' ...
    """
    found = shutil.which(path)
    if found is None:
        raise ConfigurationError(
            f"py-spy not found at {path!r} (it is not a dependency of coffea-sonic): install it "
            f"with `{_INSTALL}` and pass --py-spy /tmp/tools/bin/py-spy, or leave --py-spy out")
    return found


def _best_ms(function: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - began)
    return 1e3 * best


def _wrapper_encode(x: np.ndarray) -> Any:
    """numpy_call's per-request work: resize (pads to the batch size; a copy), astype (a second
    copy even for float32), set_data_from_numpy (tobytes: a third), the protobuf request."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(np.resize(x, x.shape).astype(np.float32))
    return _get_inference_request(
        model_name=MODEL, inputs=[tensor], model_version="1", request_id="",
        outputs=[grpcclient.InferRequestedOutput("y")], sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, parameters=None)


def client_steps(inputs: dict[str, np.ndarray], piece_rows: int, repeats: int) -> dict[str, Any]:
    """Milliseconds of each client-side step for one ``piece_rows``-row request, in isolation.

    TritonModel's gRPC path (:func:`~coffea_sonic.transport.grpc.codec.encode_framed`, what the
    gRPC transport sends; :func:`~coffea_sonic.transport.grpc.codec.encode_request` and
    protobuf serialisation beside it) against the wrapper's (:func:`_wrapper_encode`).
    """
    from tritonclient.grpc import service_pb2

    from ..transport.grpc.codec import decode_response, encode_framed, encode_request

    x = inputs["x"][:piece_rows]
    request = encode_request(MODEL, "1", {"x": x})
    wire = request.SerializeToString()
    response = service_pb2.ModelInferResponse(model_name=MODEL, model_version="1")
    response.outputs.add(name="y", datatype="FP32", shape=[len(x), KEPT])
    response.raw_output_contents.append(x[:, :KEPT].copy().tobytes())
    return {"piece_rows": len(x), "piece_bytes": int(x.nbytes), "request_wire_bytes": len(wire),
            "memcpy_once_ms": _best_ms(x.copy, repeats),
            "tobytes_ms": _best_ms(x.tobytes, repeats),
            "tritonmodel_encode_framed_ms": _best_ms(
                lambda: encode_framed(MODEL, "1", {"x": x}), repeats),
            "protobuf_encode_request_ms": _best_ms(
                lambda: encode_request(MODEL, "1", {"x": x}), repeats),
            "protobuf_serialize_ms": _best_ms(request.SerializeToString, repeats),
            "server_like_parse_ms": _best_ms(
                lambda: service_pb2.ModelInferRequest.FromString(wire), repeats),
            "tritonmodel_decode_response_ms": _best_ms(lambda: decode_response(response), repeats),
            "wrapper_encode_request_ms": _best_ms(lambda: _wrapper_encode(x), repeats),
            "wrapper_serialize_ms": _best_ms(_wrapper_encode(x).SerializeToString, repeats)}


def loop_for_profile(client_name: str, max_batch_size: int, rows: int, seconds: float,
                     ready: Path) -> None:
    """The child's work: its own server, one client called in a loop for ``seconds``; writes
    ``ready`` when warm, then the milliseconds per call into it."""
    from ..server import LocalTritonServer

    workdir = Path(tempfile.mkdtemp(prefix="wrapper-vs-tritonmodel-profile-"))
    repository = write_repository(workdir / "models", max_batch_size, True)
    inputs = slice_inputs(rows)
    with LocalTritonServer(repository=repository, device="cpu") as server:
        client: Client = (
            wrapper_client(server.grpc_address, rows) if client_name == "coffea-wrapper" else
            tritonmodel_client(client_name, server.url(MODEL), transport=client_name))
        for _ in range(3):
            client.call(inputs)
        ready.write_text("ready")
        began, calls = time.monotonic(), 0
        while time.monotonic() - began < seconds:
            client.call(inputs)
            calls += 1
        ready.write_text(json.dumps({"ms_per_call": 1e3 * (time.monotonic() - began) / calls}))
        client.close()


def main_thread_profile(raw: str, top: int) -> dict[str, Any]:
    """Share of the calling thread's samples per function (self and inclusive) from py-spy's
    raw output (``stack;frames count`` per line).

    >>> main_thread_profile("MainThread;a (x.py:1);b (x.py:2) 3\\nother;c (y.py:1) 5", top=2)
    {'samples': 3, 'self': [('b (x.py:2)', 1.0)], 'inclusive': [('a (x.py:1)', 1.0), ('b (x.py:2)', 1.0)]}
    """
    self_counts: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if "MainThread" not in frames[0]:
            continue  # the caller's thread: where a call's wall time goes
        total += int(count)
        names = [re.sub(r" \(/.*?(site-packages|coffea_sonic)/", " (", frame)
                 for frame in frames[1:]]
        if names:
            self_counts[names[-1]] += int(count)
        for name in dict.fromkeys(names):
            inclusive[name] += int(count)

    def share(counter: collections.Counter) -> list[tuple[str, float]]:
        return [(name, round(count / max(total, 1), 3)) for name, count in counter.most_common(top)]

    return {"samples": total, "self": share(self_counts), "inclusive": share(inclusive)}


def _profile_one(py_spy: str, client_name: str, max_batch_size: int, seconds: float,
                 rows: int) -> dict[str, Any]:
    """py-spy on a child process calling ``client_name`` in a loop (it starts its own server)."""
    with tempfile.TemporaryDirectory() as scratch:
        ready, raw = Path(scratch) / "ready", Path(scratch) / "profile.raw"
        child = subprocess.Popen([sys.executable, "-m", __name__, client_name,
                                  str(max_batch_size), str(rows), str(seconds + 10), str(ready)])
        try:
            deadline = time.monotonic() + 120
            while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)  # the child starts its own server first
            if not ready.exists():
                raise RuntimeError(f"the profiled {client_name} client did not start "
                                   f"(exit code {child.poll()})")
            subprocess.run([py_spy, "record", "-p", str(child.pid), "-d", str(int(seconds)),
                            "-r", "250", "--threads", "--idle", "--nonblocking",
                            "--format", "raw", "-o", str(raw)],
                           check=True, capture_output=True, timeout=seconds + 60)
            child.wait(timeout=seconds + 60)
            return {**json.loads(ready.read_text()),
                    **main_thread_profile(raw.read_text(), top=20)}
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def sampling_profiles(py_spy: str, max_batch_size: int, seconds: float,
                      rows: int) -> dict[str, Any]:
    """A py-spy profile of each of :data:`PROFILED_CLIENTS` calling ``rows``-row calls."""
    return {name: _profile_one(py_spy, name, max_batch_size, seconds, rows)
            for name in PROFILED_CLIENTS}


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}",
                                     description="the child process py-spy samples")
    parser.add_argument("client", choices=PROFILED_CLIENTS)
    parser.add_argument("max_batch_size", type=int)
    parser.add_argument("rows", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("ready", type=Path)
    args = parser.parse_args(argv)
    loop_for_profile(args.client, args.max_batch_size, args.rows, args.seconds, args.ready)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
