"""Interoperability on real deployments we did not write (issue 10, acceptance (a)-(c)).

(a) a PyTriton 0.7 server at its defaults: its model is a bound Python function (onnxruntime on
    the shipped jet_tagger ONNX file); model-repository, shared-memory and statistics (and trace,
    logging) answer only to an access token.
(b) our embedded tritonserver restricting model-repository, shared-memory and statistics with
    ``--grpc-restricted-protocol`` / ``--http-restricted-api``, as a facility may run it.
(c) two embedded tritonservers behind Debian's HAProxy (round robin per gRPC call over HTTP/2, the
    shape SuperSONIC deploys with Envoy), one of them SIGKILLed in the middle of a long call.

On each, a ``TritonModel`` built from the URL alone (``transport="auto"``, the default, and
``transport="grpc"``) must return every row, equal to in-process onnxruntime within 1e-5, with no
restricted-protocol key given: inference, metadata and health stay open on those servers. On each
``"auto"`` picks plain gRPC (no shared memory behind a restriction or a balancer), which the
server's own log must show (tests/server_side.py). coffea's own ``triton_wrapper`` runs against
(a) and (b) as the reference that the servers themselves are fine.
The restriction itself is asserted with tritonclient, so a server that silently stopped restricting
cannot make the client tests pass for the wrong reason.

Loopback only; ports picked free and re-picked when lost; every wait is on a condition.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator, Mapping

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from coffea_sonic import TritonModel, zoo
from coffea_sonic.engines import CpuEngine
from coffea_sonic.server import LocalTritonServer

from interop_servers import (MODEL, PYTRITON_TOKEN_KEY, HAProxy, PyTritonJetTagger,
                             RestrictionKey, ServedRequests, wait_until)
from server_side import ServerSide, sent_over

TOLERANCE = 1e-5
#: Rows of one call against (a) and (b): odd, and more than PyTriton's max_batch_size (4096), so
#: the client must split by the batch size the *server* declares, not the zoo's 65536.
ROWS = 10_007
#: The long call of (c): 150 requests of 1000 rows, 4 in flight, alternating between backends.
LONG_CALL_ROWS = 150_000
ROWS_PER_REQUEST = 1000
#: Requests each backend must have served before the victim is killed (both really in rotation).
SERVED_BEFORE_KILL = 10
TRANSPORTS = ["auto", "grpc"]


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> CpuEngine:
    """In-process onnxruntime on the same ONNX file: the reference every served output must equal."""
    return CpuEngine(MODEL, threads=1)


@pytest.fixture(scope="module")
def rows() -> dict[str, np.ndarray]:
    return zoo.example_inputs(MODEL, ROWS, seed=11)


@pytest.fixture(scope="module")
def pytriton_server(tmp_path_factory) -> Iterator[PyTritonJetTagger]:
    """(a) PyTriton 0.7 at its defaults (access token on), jet_tagger bound to onnxruntime."""
    server = PyTritonJetTagger(tmp_path_factory.mktemp("pytriton"))
    with server:
        yield server


# -- helpers -----------------------------------------------------------------------------------


def _assert_every_row(outputs: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
                      engine: CpuEngine) -> None:
    expected = engine(inputs)["probs"]
    assert set(outputs) >= {"probs"}, f"outputs {sorted(outputs)} lack 'probs'"
    got = outputs["probs"]
    assert got.shape == expected.shape, f"got {got.shape}, onnxruntime gives {expected.shape}"
    np.testing.assert_allclose(got, expected, atol=TOLERANCE, rtol=0)


def _infer_with_default_client(url: str, transport: str,
                               inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One call of a TritonModel built from the URL alone (no key, no headers)."""
    model = TritonModel(url, transport=transport)
    try:
        outputs = model(inputs)
        # every row answered by the server, none by a fallback that a setting might have enabled
        assert model.stats.rows == len(inputs["features"])
        assert model.stats.fallback_rows == 0
        return outputs
    finally:
        model.close()


def _pytriton_side(server: PyTritonJetTagger) -> ServerSide:
    """PyTriton's tritonserver as the wire checks reach it: its output is kept by PyTriton's
    ``TritonServer`` (``logs()``), its logging and shared-memory APIs open to the access token."""
    token = RestrictionKey(PYTRITON_TOKEN_KEY, server.access_token)
    logs = server.triton._triton_server.logs
    return ServerSide(server.grpc_address, server.http_address,
                      lambda offset: logs().encode()[offset:],
                      grpc_headers=token.grpc_header, http_headers=token.http_header)


def _coffea_wrapper(grpc_address: str):
    """coffea's ``triton_wrapper`` for jet_tagger version 1, as its own tests call it (numpy)."""
    from coffea.ml_tools.triton_wrapper import triton_wrapper

    class JetTaggerWrapper(triton_wrapper):
        def prepare_awkward(self, *args, **kwargs):
            raise NotImplementedError("these tests call numpy_call")

    # the wrapper defaults to TLS for gRPC; these servers speak plain gRPC on loopback
    return JetTaggerWrapper(f"triton+grpc://{grpc_address}/{MODEL}/1", client_args={"ssl": False})


def _refusal(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as refused:
        call()
    return refused.value


def _assert_restricted_but_serving(grpc_address: str, http_address: str, *,
                                   grpc_header: dict[str, str], http_header: dict[str, str]
                                   ) -> list[str]:
    """The restricted groups refuse a caller without the key; health, metadata, config and
    inference answer anyone. Messages and status codes are what the client fix must recognise.

    Returns the model names of the repository index as read *with* the key.
    """
    (grpc_name,), (http_name,) = grpc_header, http_header
    grpc = grpcclient.InferenceServerClient(grpc_address)
    http = httpclient.InferenceServerClient(http_address)
    try:
        for name, call in {
            "RepositoryIndex": grpc.get_model_repository_index,
            "ModelStatistics": lambda **kw: grpc.get_inference_statistics(MODEL, **kw),
            "SystemSharedMemoryStatus": grpc.get_system_shared_memory_status,
            "CudaSharedMemoryStatus": grpc.get_cuda_shared_memory_status,
        }.items():
            refusal = _refusal(call)
            assert refusal.status() == "StatusCode.UNAVAILABLE", (name, refusal)
            assert (f"This protocol is restricted, expecting header '{grpc_name}'"
                    in refusal.message()), (name, refusal)
            call(headers=grpc_header)  # the key opens it
        refusal = _refusal(http.get_model_repository_index)
        assert refusal.status() == "403"
        assert f"This API is restricted, expecting header '{http_name}'" in refusal.message()
        indexed = [entry["name"] for entry in http.get_model_repository_index(headers=http_header)]
        # open to anyone: what inference needs
        assert grpc.is_server_live() and grpc.is_server_ready() and grpc.is_model_ready(MODEL)
        metadata = grpc.get_model_metadata(MODEL, as_json=True)
        assert [i["name"] for i in metadata["inputs"]] == ["features"]
        assert grpc.get_model_config(MODEL, as_json=True)["config"]["max_batch_size"] > 0
        features = zoo.example_inputs(MODEL, 8, seed=1)["features"]
        request = grpcclient.InferInput("features", list(features.shape), "FP32")
        request.set_data_from_numpy(features)
        assert grpc.infer(MODEL, [request]).as_numpy("probs").shape == (8, 3)
        return indexed
    finally:
        grpc.close()
        http.close()


def _stop_in_parallel(stops: list[Callable[[], None]]) -> None:
    """Run every stop at once (each tritonserver takes ~3 s to unload); re-raise the first error."""
    errors: list[BaseException] = []

    def run(stop: Callable[[], None]) -> None:
        try:
            stop()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(stop,)) for stop in stops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _stop_even_if_killed(server: LocalTritonServer) -> None:
    """Stop ``server``; if it was SIGKILLed, first kill what it left in its process group.

    A tritonserver killed with SIGKILL leaves its python-backend stubs running (orphans that do
    not exit on their own), and ``stop()`` does nothing for a server that already exited. The
    server leads its own process group (it is started in a new session), so the group is its pid.
    """
    if server.process is not None and server.process.poll() is not None:
        group = server.pid

        def group_gone() -> bool:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                return True
            return False

        wait_until(group_gone, 10, f"the processes left by killed server {group} to exit")
    server.stop()


@contextlib.contextmanager
def _two_servers_behind_haproxy() -> Iterator[tuple[list[LocalTritonServer], HAProxy]]:
    """Two embedded jet_tagger servers and an HAProxy balancing gRPC over both (all stopped after)."""
    servers: list[LocalTritonServer] = []
    balancer: HAProxy | None = None
    try:
        for _ in range(2):
            # started from this (the main) thread: their parent-death signal follows the
            # starting thread
            servers.append(LocalTritonServer(models=[MODEL], device="cpu").start())
        balancer = HAProxy([server.grpc_address for server in servers])
        balancer.start()
        yield servers, balancer
    finally:
        stops = [lambda server=server: _stop_even_if_killed(server) for server in servers]
        if balancer is not None:
            stops.append(balancer.stop)
        _stop_in_parallel(stops)


# -- (a) PyTriton 0.7 at its defaults -------------------------------------------------------------


def test_pytriton_at_its_defaults_restricts_repository_shm_and_statistics_but_serves_inference(
        pytriton_server):
    # PyTriton restricts with the key "triton-access-token": gRPC callers must send it as
    # "triton-grpc-protocol-triton-access-token", HTTP callers as "triton-access-token".
    token = RestrictionKey(PYTRITON_TOKEN_KEY, pytriton_server.access_token)
    indexed = _assert_restricted_but_serving(
        pytriton_server.grpc_address, pytriton_server.http_address,
        grpc_header=token.grpc_header, http_header=token.http_header)
    # PyTriton loads its models through the load API with their config and files in the request,
    # not from its --model-repository: even with the token, the repository index lists nothing.
    # A client cannot discover PyTriton's models from the index at all, key or not.
    assert MODEL not in indexed


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_default_triton_model_gets_every_row_from_pytriton_at_its_defaults(
        pytriton_server, transport, rows, engine):
    # "auto" picks plain gRPC: PyTriton's shared-memory API refuses a caller without the token
    with sent_over("grpc", _pytriton_side(pytriton_server)):
        outputs = _infer_with_default_client(pytriton_server.url(), transport, rows)
    _assert_every_row(outputs, rows, engine)


def test_coffea_triton_wrapper_gets_every_row_from_pytriton(pytriton_server, rows, engine):
    outputs = _coffea_wrapper(pytriton_server.grpc_address).numpy_call(["probs"], dict(rows))
    _assert_every_row(outputs, rows, engine)


# -- (b) tritonserver with --grpc-restricted-protocol / --http-restricted-api ----------------------


def test_restricted_tritonserver_refuses_repository_shm_and_statistics_but_serves_inference(
        restricted_tritonserver, restriction):
    indexed = _assert_restricted_but_serving(
        restricted_tritonserver.grpc_address, restricted_tritonserver.http_address,
        grpc_header=restriction.grpc_header, http_header=restriction.http_header)
    assert indexed == [MODEL]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_default_triton_model_gets_every_row_from_a_restricted_tritonserver(
        restricted_tritonserver, restriction, transport, rows, engine):
    server = restricted_tritonserver
    side = ServerSide.of_file(server.grpc_address, server.http_address, server.log_path,
                              grpc_headers=restriction.grpc_header,
                              http_headers=restriction.http_header)
    # "auto" picks plain gRPC: the server refuses our shared-memory registration without the key
    with sent_over("grpc", side):
        outputs = _infer_with_default_client(server.url(MODEL), transport, rows)
    _assert_every_row(outputs, rows, engine)


def test_coffea_triton_wrapper_gets_every_row_from_a_restricted_tritonserver(
        restricted_tritonserver, rows, engine):
    outputs = _coffea_wrapper(restricted_tritonserver.grpc_address).numpy_call(
        ["probs"], dict(rows))
    _assert_every_row(outputs, rows, engine)


# -- (c) two servers behind HAProxy, one SIGKILLed mid-call --------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_haproxy_over_two_servers_loses_no_row_when_one_is_killed_mid_call(transport, engine):
    inputs = zoo.example_inputs(MODEL, LONG_CALL_ROWS, seed=23)
    with contextlib.ExitStack() as cleanup:
        (victim, survivor), balancer = cleanup.enter_context(_two_servers_behind_haproxy())
        victim_served = ServedRequests(victim.grpc_address)
        cleanup.callback(victim_served.close)
        survivor_served = ServedRequests(survivor.grpc_address)
        cleanup.callback(survivor_served.close)
        model = TritonModel(balancer.url(), transport=transport,
                            max_request_bytes=ROWS_PER_REQUEST * 6 * 4, timeout_s=20)
        cleanup.callback(model.close)
        call_over = threading.Event()
        killed: dict[str, int] = {}
        killer_errors: list[BaseException] = []

        def kill_victim_once_both_serve() -> None:
            try:
                # Both backends in rotation and the call well under way (or already over, when
                # the client failed at once: then nothing is killed and its error is reported).
                wait_until(lambda: call_over.is_set() or (
                    victim_served() >= SERVED_BEFORE_KILL
                    and survivor_served() >= SERVED_BEFORE_KILL),
                    timeout_s=60, what=f"both backends to serve {SERVED_BEFORE_KILL} requests")
                if call_over.is_set():
                    return
                killed["survivor_served"] = survivor_served()
                os.kill(victim.pid, signal.SIGKILL)
                killed["victim_pid"] = victim.pid
            except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
                killer_errors.append(error)

        killer = threading.Thread(target=kill_victim_once_both_serve, name="killer", daemon=True)
        killer.start()
        # "auto" picks plain gRPC, as both backends' logs show: the probe's status calls, spread
        # over both backends, do not all find the region it registered
        with sent_over("grpc", victim, may_die=True), sent_over("grpc", survivor):
            try:
                outputs = model(inputs)
            except BaseException as error:
                for killer_error in killer_errors:
                    error.add_note(f"the killer thread also failed: {killer_error!r}")
                raise
            finally:
                call_over.set()
                killer.join(timeout=60)
                assert not killer.is_alive(), "the killer thread did not finish"
        if killer_errors:
            raise killer_errors[0]
        assert killed, "the call ended before both backends had served; nothing was killed mid-call"
        wait_until(lambda: victim.process.poll() is not None, 10, "the killed server to exit")
        # the survivor served the rest: the kill came while the call still had requests to send
        assert survivor_served() > killed["survivor_served"]
        _assert_every_row(outputs, inputs, engine)
        assert model.stats.rows == LONG_CALL_ROWS and model.stats.fallback_rows == 0
