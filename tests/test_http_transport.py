"""HttpTransport against a real tritonserver: outputs, control calls, errors, TLS, fork, pickle.

Nothing here imports coffea_sonic.model: the transport is tested on its own interface.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import ssl
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.core.secrets import Secret
from coffea_sonic.core.tls import TlsOptions
from coffea_sonic.engines import CpuEngine
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.transport.base import InferRequest
from coffea_sonic.transport.errors import TransportError
from coffea_sonic.transport.grpc import GrpcTransport
from coffea_sonic.transport.http import HttpTransport

MODEL = "jet_tagger"
ROWS = 1000


@pytest.fixture(scope="module")
def server():
    server = LocalTritonServer(models=[MODEL], device="cpu").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def transport(server):
    with HttpTransport(ServerSettings(server.http_address, protocol="http")) as transport:
        yield transport


@pytest.fixture(scope="module")
def info(transport):
    return transport.model_info(MODEL, "", 10.0)


@pytest.fixture(scope="module")
def data():
    inputs = zoo.example_inputs(MODEL, ROWS, 7)
    return inputs, CpuEngine(MODEL)(inputs)


def request_of(info, inputs, **options) -> InferRequest:
    return InferRequest(MODEL, "", inputs, info.outputs, rows=len(inputs["features"]), **options)


def assert_close(outputs, reference) -> None:
    assert set(outputs) == set(reference)
    for name, expected in reference.items():
        assert outputs[name].shape == expected.shape and outputs[name].dtype == expected.dtype
        np.testing.assert_allclose(outputs[name], expected, rtol=0, atol=1e-5)


def kind_of(call) -> str:
    with pytest.raises(TransportError) as caught:
        call()
    return caught.value.kind


def wait_for(condition, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s} s")
        time.sleep(0.05)


class Relay:
    """A TCP (or TLS-terminating) relay to ``target`` whose connections a test can cut."""

    def __init__(self, target: str, context: ssl.SSLContext | None = None) -> None:
        host, port = target.rsplit(":", 1)
        self.target, self.context = (host, int(port)), context
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            if self.context is not None:
                client = self.context.wrap_socket(client, server_side=True)
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        self.pairs.append((client, upstream))
        try:
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 60)
                for source in readable:
                    sink = upstream if source is client else client
                    data = source.recv(1 << 16)
                    if not data:
                        return
                    sink.sendall(data)
                    while isinstance(source, ssl.SSLSocket) and source.pending():
                        sink.sendall(source.recv(source.pending()))
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def cut(self) -> None:
        """Close every relayed connection (as a restarted server or an idle timeout would)."""
        pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        self.cut()


# -- inference ----------------------------------------------------------------------------------


def test_outputs_equal_reference(transport, info, data):
    inputs, reference = data
    answer = transport.infer(request_of(info, inputs))
    assert_close(answer.outputs, reference)
    assert answer.model_version == "1" and answer.delivered == frozenset()
    assert answer.nbytes == reference["probs"].nbytes
    submitted = transport.submit(request_of(info, inputs)).result(timeout=30)
    assert_close(submitted.outputs, reference)


def test_outputs_land_in_destinations(transport, info, data):
    inputs, reference = data
    exact = np.full((ROWS, 3), np.nan, np.float32)
    answer = transport.infer(request_of(info, inputs, out={"probs": exact}))
    assert answer.delivered == {"probs"} and answer.outputs["probs"] is exact
    np.testing.assert_allclose(exact, reference["probs"], atol=1e-5)
    # a padded request: only the first rows land; a wider dtype casts safely
    head = np.zeros((ROWS - 3, 3), np.float64)
    answer = transport.submit(request_of(info, inputs, out={"probs": head})).result(timeout=30)
    assert answer.outputs["probs"] is head
    np.testing.assert_allclose(head, reference["probs"][:-3], atol=1e-5)
    # a destination that does not fit is left alone and the answer returned as is
    wrong = np.zeros((ROWS, 2), np.float32)
    answer = transport.infer(request_of(info, inputs, out={"probs": wrong}))
    assert answer.delivered == frozenset() and not wrong.any()
    assert_close(answer.outputs, reference)


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compression(server, info, data, compression):
    inputs, reference = data
    with HttpTransport(ServerSettings(server.http_address, protocol="http"),
                       compression=compression) as transport:
        assert_close(transport.infer(request_of(info, inputs)).outputs, reference)
        out = np.zeros((ROWS, 3), np.float32)
        answer = transport.submit(request_of(info, inputs, out={"probs": out})).result(timeout=30)
        assert answer.outputs["probs"] is out
        np.testing.assert_allclose(out, reference["probs"], atol=1e-5)


def test_concurrent_requests_share_a_bounded_pool(server, info):
    with HttpTransport(ServerSettings(server.http_address, protocol="http"),
                       max_connections=3) as transport:
        chunks = [zoo.example_inputs(MODEL, 50 + i, i) for i in range(24)]
        futures = [transport.submit(request_of(info, chunk)) for chunk in chunks]
        engine = CpuEngine(MODEL)
        for chunk, future in zip(chunks, futures):
            assert_close(future.result(timeout=60).outputs, engine(chunk))
        assert transport.stats["connections"] <= 3 and transport.stats["requests"] == 24


def test_cancel_before_answer(transport, info, data):
    inputs, reference = data
    # the real server may answer first: either way the future says what happened
    big = zoo.example_inputs(MODEL, 60_000, 1)
    future = transport.submit(request_of(info, big))
    cancelled = future.cancel()
    assert future.cancelled() is cancelled and future.done()
    if not cancelled:
        assert_close(future.result(timeout=60).outputs, CpuEngine(MODEL)(big))
    assert_close(transport.infer(request_of(info, inputs)).outputs, reference)
    # a server that takes the request and never answers: the cancel must win, and it aborts the
    # connection (the server sees it closed) instead of leaving a pool thread waiting for ever
    with socket.create_server(("127.0.0.1", 0)) as silent, HttpTransport(
            ServerSettings(f"127.0.0.1:{silent.getsockname()[1]}", protocol="http")) as held:
        future = held.submit(request_of(info, inputs))
        silent.settimeout(30)
        connection, _ = silent.accept()
        with connection:
            connection.settimeout(30)
            assert connection.recv(65536).startswith(b"POST ")  # the request is on the wire
            assert future.cancel() and future.cancelled()
            while connection.recv(65536):  # the rest of the request, then the client's close
                pass
        with pytest.raises(CancelledError):
            future.result(timeout=0)


def test_stale_pooled_connection_is_replaced(server, info, data):
    inputs, reference = data
    relay = Relay(server.http_address)
    try:
        with HttpTransport(ServerSettings(relay.address, protocol="http")) as transport:
            assert_close(transport.infer(request_of(info, inputs)).outputs, reference)
            wait_for(lambda: relay.pairs, what="relay connection")
            relay.cut()  # the kept-alive connection is now dead
            assert_close(transport.infer(request_of(info, inputs)).outputs, reference)
            assert transport.stats["connections"] == 2 and relay.accepted == 2
    finally:
        relay.close()


# -- control calls ------------------------------------------------------------------------------


def test_control_calls(server, transport, info):
    assert transport.ready(5.0) is True
    assert transport.model_index(5.0) == {MODEL: ("1",)}
    assert transport.model_ready(MODEL, "", 5.0) and transport.model_ready(MODEL, "1", 5.0)
    assert transport.model_ready("no_such_model", "", 5.0) is False
    assert info == GrpcTransport(ServerSettings(server.grpc_address)).model_info(MODEL, "", 10.0)
    assert info.max_batch_size > 0 and info.input_names == ("features",)
    assert transport.model_info(MODEL, "1", 5.0) == info
    assert "binary_tensor_data" in transport.server_metadata(5.0)["extensions"]
    assert transport.describe()["transport"] == "http"


def test_statistics_count_requests(transport, info):
    before = transport.statistics(MODEL, "", 5.0)
    transport.infer(request_of(info, zoo.example_inputs(MODEL, 123, 3)))
    after = wait_for(lambda: (lambda s: s if s.success_count > before.success_count else None)(
        transport.statistics(MODEL, "1", 5.0)), what="statistics update")
    assert after.inference_count >= before.inference_count + 123
    assert after.execution_count > before.execution_count


# -- errors -------------------------------------------------------------------------------------


def test_errors_are_classified(transport, info, data):
    inputs, _ = data
    missing = InferRequest("no_such_model", "", inputs, info.outputs, rows=ROWS)
    assert kind_of(lambda: transport.infer(missing)) == "not_found"
    assert kind_of(lambda: transport.submit(missing).result(timeout=30)) == "not_found"
    assert kind_of(lambda: transport.model_info("no_such_model", "", 5.0)) == "not_found"
    assert kind_of(lambda: transport.model_info(MODEL, "7", 5.0)) == "not_found"
    bad = request_of(info, {"features": np.ones((4, 5), np.float32)})
    assert kind_of(lambda: transport.infer(bad)) == "bad_request"
    wrong_dtype = request_of(info, {"features": np.ones((4, 6), np.float64)})
    assert kind_of(lambda: transport.submit(wrong_dtype).result(timeout=30)) == "bad_request"
    # the transport still works after its failures
    assert transport.ready(5.0)


def test_nothing_listening_is_down(info, data):
    inputs, _ = data
    with socket.socket() as held:  # bound, not listening: connections are refused
        held.bind(("127.0.0.1", 0))
        settings = ServerSettings(f"127.0.0.1:{held.getsockname()[1]}", protocol="http")
        with HttpTransport(settings) as transport:
            assert kind_of(lambda: transport.ready(2.0)) == "down"
            assert kind_of(lambda: transport.model_index(2.0)) == "down"
            error = transport.submit(request_of(info, inputs)).exception(timeout=30)
            assert isinstance(error, TransportError) and error.kind == "down" and error.retryable


def test_silent_server_times_out(info, data):
    inputs, _ = data
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        settings = ServerSettings(f"127.0.0.1:{silent.getsockname()[1]}", protocol="http")
        with HttpTransport(settings) as transport:
            started = time.monotonic()
            error = transport.submit(request_of(info, inputs, timeout_s=0.5)).exception(timeout=30)
            assert isinstance(error, TransportError) and error.kind == "timeout"
            assert time.monotonic() - started < 5
            assert kind_of(lambda: transport.ready(0.3)) == "timeout"


def test_grpc_port_is_not_http(server):
    with HttpTransport(ServerSettings(server.grpc_address, protocol="http")) as transport:
        with pytest.raises(TransportError) as caught:
            transport.ready(5.0)
    assert caught.value.kind == "down" and "HTTP port" in str(caught.value)


def test_restricted_api(info, data, restricted_tritonserver, restriction):
    """``--http-restricted-api``: 403 "This API is restricted" (kind restricted) until the key
    is sent under its own header name; inference, metadata and health stay open."""
    inputs, reference = data
    key, value = restriction.key, restriction.value
    restricted = restricted_tritonserver  # model-repository, shared-memory, statistics restricted
    open_transport = HttpTransport(ServerSettings(restricted.http_address, protocol="http"))
    assert open_transport.ready(5.0) and open_transport.model_ready(MODEL, "", 5.0)
    assert open_transport.model_info(MODEL, "", 5.0) == info
    assert_close(open_transport.infer(request_of(info, inputs)).outputs, reference)
    assert kind_of(lambda: open_transport.model_index(5.0)) == "restricted"
    assert kind_of(lambda: open_transport.statistics(MODEL, "", 5.0)) == "restricted"
    keyed = HttpTransport(ServerSettings.build(
        restricted.http_address, protocol="http", protocol_key=(key, Secret(value))))
    assert keyed.model_index(5.0) == {MODEL: ("1",)}
    assert keyed.statistics(MODEL, "", 5.0).success_count >= 1
    wrong = HttpTransport(ServerSettings.build(
        restricted.http_address, protocol="http", protocol_key=(key, "nope")))
    assert kind_of(lambda: wrong.model_index(5.0)) == "restricted"


# -- TLS ----------------------------------------------------------------------------------------


def _server_context(certificates, mutual: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates["cert"], certificates["key"])
    if mutual:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certificates["ca"])
    return context


def test_tls(server, certificates, info, data):
    inputs, reference = data
    relay = Relay(server.http_address, _server_context(certificates, mutual=False))
    try:
        for tls in (TlsOptions(root_certificates=certificates["ca"]),
                    TlsOptions(root_certificates=certificates["ca"], server_name="localhost")):
            with HttpTransport(ServerSettings(relay.address, protocol="http", tls=tls)) as transport:
                assert transport.ready(5.0)
                assert_close(transport.infer(request_of(info, inputs)).outputs, reference)
        for tls in (TlsOptions(),  # the system's roots do not know our CA
                    TlsOptions(root_certificates=certificates["ca"], server_name="wrong.example")):
            transport = HttpTransport(ServerSettings(relay.address, protocol="http", tls=tls))
            assert kind_of(lambda: transport.ready(5.0)) == "unauthenticated"
        missing = TlsOptions(root_certificates="/nonexistent/ca.pem")
        transport = HttpTransport(ServerSettings(relay.address, protocol="http", tls=missing))
        assert kind_of(lambda: transport.ready(5.0)) == "unauthenticated"
    finally:
        relay.close()


def test_mutual_tls_with_secret_key(server, certificates, info, data):
    inputs, reference = data
    relay = Relay(server.http_address, _server_context(certificates, mutual=True))
    try:
        tls = TlsOptions(root_certificates=certificates["ca"],
                         certificate_chain=certificates["cert"],
                         private_key=Secret(Path(certificates["key"]).read_text()))
        with HttpTransport(ServerSettings(relay.address, protocol="http", tls=tls)) as transport:
            assert_close(transport.infer(request_of(info, inputs)).outputs, reference)
        anonymous = HttpTransport(ServerSettings(
            relay.address, protocol="http", tls=TlsOptions(root_certificates=certificates["ca"])))
        assert kind_of(lambda: anonymous.ready(5.0)) in ("unauthenticated", "down")
    finally:
        relay.close()


# -- processes ----------------------------------------------------------------------------------


def test_forked_child_makes_its_own_connections(transport, info, data):
    inputs, reference = data
    transport.infer(request_of(info, inputs))  # the parent holds a kept-alive connection
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: use the inherited transport, report, leave at once
        code = 1
        try:
            outputs = transport.submit(request_of(info, inputs)).result(timeout=30).outputs
            ok = np.allclose(outputs["probs"], reference["probs"], atol=1e-5)
            own = all(connection.pid == os.getpid() for connection in transport._idle)
            code = 0 if ok and own and transport._idle else 2
        finally:
            os.write(write_end, bytes([code]))
            os._exit(0)
    os.close(write_end)
    try:
        assert select.select([read_end], [], [], 60)[0], "forked child did not answer"
        assert os.read(read_end, 1) == b"\x00"
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert_close(transport.infer(request_of(info, inputs)).outputs, reference)


def test_pickles_by_configuration(server, info, data):
    inputs, reference = data
    settings = ServerSettings.build(server.http_address, protocol="http",
                                    headers={"authorization": Secret("Bearer t0ps3cret")})
    transport = HttpTransport(settings, max_connections=2, compression="gzip")
    transport.infer(request_of(info, inputs))  # sockets and threads exist now
    blob = pickle.dumps(transport)
    assert b"t0ps3cret" not in blob and b"socket" not in blob
    clone = pickle.loads(blob)
    assert (clone.address, clone.max_connections, clone.compression) == (
        server.http_address, 2, "gzip")
    assert_close(clone.infer(request_of(info, inputs)).outputs, reference)
    transport.close()
    clone.close()


def test_an_answer_body_shorter_than_its_declared_tensor_fails_naming_the_output():
    import json

    from coffea_sonic.errors import InferenceError
    from coffea_sonic.transport.http.wire import decode_outputs

    def body(declared: int, sent: bytes) -> tuple[bytes, int]:
        header = json.dumps({"outputs": [{"name": "probs", "datatype": "FP32", "shape": [2],
                                          "parameters": {"binary_data_size": declared}}]})
        return header.encode() + sent, len(header)

    whole = np.ones(2, np.float32).tobytes()
    assert decode_outputs(*body(8, whole))[1]["probs"].tolist() == [1.0, 1.0]
    with pytest.raises(InferenceError, match=r"output 'probs': 8 of its 12 bytes arrived"):
        decode_outputs(*body(12, whole))
    with pytest.raises(InferenceError, match=r"output 'probs': 4 bytes for shape \[2\] FP32"):
        decode_outputs(*body(4, whole[:4]))
