"""Small helpers shared by several test modules."""

from __future__ import annotations

import importlib.util
import os
import pickletools
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, TypeVar

import numpy as np

T = TypeVar("T")


def pickled_class_names(blob: bytes) -> set[str]:
    """Every ``module name`` global a pickle refers to (what unpickling would import)."""
    names, recent = set(), []
    for opcode, argument, _ in pickletools.genops(blob):
        if isinstance(argument, str):
            recent.append(argument)
        if opcode.name in ("GLOBAL", "INST"):
            names.add(str(argument))
        elif opcode.name == "STACK_GLOBAL":
            names.add(" ".join(recent[-2:]))
    return names


def grpc_reference(address: str, name: str, inputs: dict) -> dict:
    """Outputs over plain gRPC, tensors in the message: the reference other transports must equal."""
    # Imported here so that tests using only the waiting helpers do not depend on transport
    # internals (being refactored).
    from coffea_sonic.transport.grpc.channel import get_connection
    from coffea_sonic.transport.grpc.codec import decode_response, encode_request

    response = get_connection(address).stub.ModelInfer(encode_request(name, "", inputs), timeout=60)
    return decode_response(response)


def our_registered_regions(grpc_address: str) -> set[str]:
    """Names of the system shared-memory regions that live processes of this package have
    registered on the server at ``grpc_address``, as the server's own status lists them."""
    from server_side import registered_regions

    return registered_regions(grpc_address)


def assert_sent_over(transport: str, server: Any, call: Callable[[], T], *,
                     outputs_in_shm: bool = True) -> T:
    """Run ``call`` (which sends to ``server``) and check from the server's side that its
    requests went over ``transport`` ("grpc", "shm" or "http"): the infer requests the server's
    log shows per front end, the outputs it wrote into shared memory, our regions its status
    lists (see :func:`server_side.sent_over`). ``server``: the LocalTritonServer, or the gRPC
    address of a tritonserver on this host. Returns what ``call`` returned."""
    from server_side import sent_over

    with sent_over(transport, server, outputs_in_shm=outputs_in_shm):
        return call()


def wait_for(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str], *,
             interval: float = 0.05, ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Tests wait on the condition they need instead of sleeping a guessed time and asserting: on a
    loaded 2-core machine any guess is either slow or flaky. Exceptions of the ``ignoring`` types
    count as "not yet" (a server still starting refuses connections); on timeout the
    AssertionError says ``what`` was awaited (a callable is asked then, to describe the state at
    the end), for how long, and the last ignored error.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except ignoring as error:
            last_error = error
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            awaited = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {awaited}{detail}")
        time.sleep(interval)


class CheckedThread(threading.Thread):
    """A thread whose outcome the test collects: ``finish()`` joins it and re-raises its error.

    A plain ``threading.Thread`` prints its exception to stderr and lets the test pass; here an
    assertion failing in the thread fails the test, and a thread that hangs is reported.
    """

    def __init__(self, target: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        super().__init__(name=name or getattr(target, "__name__", None), daemon=True)
        self._function, self._arguments = target, args
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._function(*self._arguments)
        except BaseException as error:  # noqa: BLE001 (re-raised by finish in the test's thread)
            self.error = error

    def finish(self, timeout: float) -> Any:
        """Join within ``timeout`` seconds; re-raise the thread's exception; return its result."""
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name!r} still running after {timeout:g} s")
        if self.error is not None:
            raise self.error
        return self.result


def run_in_threads(function: Callable[..., T], arguments: Iterable[tuple], timeout: float) -> list[T]:
    """Call ``function(*args)`` for every ``args`` at once, one thread each; return the results.

    Every thread is joined within one shared ``timeout``; the first exception raised in any
    thread is re-raised here (the others are attached as notes).
    """
    threads = [CheckedThread(function, *args, name=f"{getattr(function, '__name__', 'worker')}"
                             f"{tuple(args)!r}") for args in arguments]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    if hung:
        raise AssertionError(f"threads still running after {timeout:g} s: {hung}")
    errors = [thread.error for thread in threads if thread.error is not None]
    if errors:
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"another thread also failed: {other!r}")
        raise first
    return [thread.result for thread in threads]


#: onnxruntime on an ONNX file, in another Python: inputs and outputs travel as .npz bytes.
_REFERENCE_SCRIPT = """
import io, sys
import numpy as np
import onnxruntime
options = onnxruntime.SessionOptions()
options.intra_op_num_threads = int(sys.argv[2])
session = onnxruntime.InferenceSession(sys.argv[1], sess_options=options,
                                       providers=["CPUExecutionProvider"])
feed = np.load(io.BytesIO(sys.stdin.buffer.read()))
names = [output.name for output in session.get_outputs()]
values = session.run(names, {key: feed[key] for key in feed.files})
out = io.BytesIO()
np.savez(out, **dict(zip(names, values)))
sys.stdout.buffer.write(out.getvalue())
"""


def reference_engine(name: str, threads: int = 0) -> Callable[[dict], dict]:
    """The in-process CPU engine of zoo model ``name``: the expected outputs of client tests.

    With onnxruntime here (the ``onnx`` extra) that is ``CpuEngine``; a client-only install
    has none, so the same onnxruntime on the same ONNX file runs in the server's environment
    (which has it for the served models), one process per call.
    """
    import importlib.util

    from coffea_sonic.engines import CpuEngine

    if importlib.util.find_spec("onnxruntime") is not None:
        return CpuEngine(name, threads=threads)
    import io
    import subprocess

    import numpy as np

    from coffea_sonic import zoo
    from coffea_sonic.server.environment import resolve

    python, path = str(resolve().python), str(zoo.onnx_path(name))

    def engine(inputs: dict) -> dict:
        feed = io.BytesIO()
        np.savez(feed, **{tensor.name: np.ascontiguousarray(inputs[tensor.name], tensor.dtype)
                          for tensor in zoo.spec(name).inputs})
        answer = subprocess.run([python, "-I", "-c", _REFERENCE_SCRIPT, path, str(threads)],
                                input=feed.getvalue(), capture_output=True, check=True, timeout=300)
        with np.load(io.BytesIO(answer.stdout)) as values:
            return {key: values[key] for key in values.files}

    return engine


def histogram_arrays(output: dict[str, Any]) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """Per (histogram, dataset): bin contents and variances, flow bins included.

    Per dataset because the order of a growing category axis follows the order chunks were
    accumulated in, which differs from run to run.
    """
    arrays = {}
    for name, histogram in output["histograms"].items():
        for dataset in histogram.axes["dataset"]:
            view = histogram[{"dataset": dataset}]
            arrays[(name, dataset)] = (np.asarray(view.values(flow=True)),
                                       np.asarray(view.variances(flow=True)))
    return arrays


def assert_same_histograms(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Every histogram of ``got`` equals ``want``'s, bin by bin (values and variances), with the
    same axes: what a run that lost or doubled an event cannot pass."""
    got_arrays, want_arrays = histogram_arrays(got), histogram_arrays(want)
    assert sorted(got_arrays) == sorted(want_arrays)
    for key, (values, variances) in want_arrays.items():
        got_values, got_variances = got_arrays[key]
        np.testing.assert_array_equal(got_values, values, err_msg=str(key))
        np.testing.assert_array_equal(got_variances, variances, err_msg=str(key))
    for name, histogram in want["histograms"].items():
        other = got["histograms"][name]
        assert [axis.name for axis in other.axes] == [axis.name for axis in histogram.axes], name
        for axis in histogram.axes:
            if axis.name != "dataset":
                assert other.axes[axis.name] == axis, (name, axis.name)


def every_parser(parser: Any, path: tuple[str, ...] = ()):
    """``(subcommand path, parser)`` of ``parser`` and every subparser below it, depth first."""
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from every_parser(child, path + (name,))


def stop_gracefully(process: Any, grace_s: float = 60.0) -> None:
    """SIGTERM ``process`` (a ``subprocess.Popen``) if it still runs, SIGKILL it after
    ``grace_s``; reaped either way."""
    import signal
    import subprocess

    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


#: the repository's root (benchmarks/ scripts live there, outside the package)
REPOSITORY = Path(__file__).resolve().parents[1]


def load_benchmark_script(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module: the repository-only scripts are loaded by their path."""
    spec = importlib.util.spec_from_file_location(name, REPOSITORY / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def benchmark_script_help(name: str) -> str:
    """What ``python benchmarks/NAME.py --help`` prints, run from the checkout as a user would."""
    path = [str(REPOSITORY)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    done = subprocess.run([sys.executable, str(REPOSITORY / "benchmarks" / f"{name}.py"), "--help"],
                          cwd=REPOSITORY, env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout
