"""Small helpers shared by several test modules."""

from __future__ import annotations

import pickletools
import threading
import time
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


def _shm_status_client(grpc_address: str):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(grpc_address)


def our_registered_regions(grpc_address: str) -> set[str]:
    """Names of the system shared-memory regions that live processes of this package have
    registered on the server at ``grpc_address``, as the server's own status lists them."""
    from coffea_sonic.transport.shm.regions import PREFIX, pid_alive, pid_of

    client = _shm_status_client(grpc_address)
    try:
        status = client.get_system_shared_memory_status(as_json=True)
    finally:
        client.close()
    return {name for name in status.get("regions", {}) if name.startswith(PREFIX)
            and (pid := pid_of(name)) is not None and pid_alive(pid)}


def assert_sent_over(transport: str, grpc_address: str, call: Callable[[], T]) -> T:
    """Run ``call`` (which sends to the server at ``grpc_address``) and check, from the server's
    shared-memory status while our transports are still open, that it went over ``transport``:
    for "grpc" no region of ours is registered after it, for "shm" at least one is.

    In a ``[grpc]`` run no transport of ours holds shared memory on the server, so a region of
    ours registered before the call is a leftover (a path that went away before its transport
    could unregister, e.g. a stopped gateway): it is unregistered first, so that the check sees
    what this call did. Returns what ``call`` returned."""
    if transport == "grpc":
        client = _shm_status_client(grpc_address)
        try:
            for name in our_registered_regions(grpc_address):
                client.unregister_system_shared_memory(name)
        finally:
            client.close()
    elif transport != "shm":
        raise ValueError(f"no wire check for transport {transport!r}")
    result = call()
    regions = our_registered_regions(grpc_address)
    if transport == "grpc":
        assert not regions, f"a [grpc] run registered shared memory on the server: {regions}"
    else:
        assert regions, "a [shm] run registered no shared-memory region on the server"
    return result


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
