"""The client's policy on the in-memory transport: fast, no server, every branch reachable.

Retries, failover, discovery of servers that restrict their index, the shared-memory fallback,
wrong answers (rows, outputs, dtypes, shapes, versions) and the single copy of outputs. The same
behaviours are tested on real servers over gRPC, shared memory and HTTP elsewhere.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from coffea_sonic import TritonModel
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.errors import ConfigurationError, InferenceError, ServerUnavailableError
from coffea_sonic.routing import clear_routers
from coffea_sonic.transport.base import InferRequest
from coffea_sonic.transport.errors import TransportError
from coffea_sonic.transport.memory import MemoryTransport

INFO = ModelInfo("double", ("1", "2"), "python", 1 << 20, (TensorInfo("x", "FP32", (4,)),),
                 (TensorInfo("y", "FP32", (4,)), TensorInfo("n", "INT64", (1,))))


def _engine(inputs):
    x = inputs["x"]
    return {"y": x * 2, "n": np.arange(len(x), dtype=np.int64)[:, None]}


def _servers(*addresses: str, **options) -> dict[str, MemoryTransport]:
    return {a: MemoryTransport({"double": (INFO, _engine)}, address=a, **options) for a in addresses}


def _model(servers: dict[str, MemoryTransport], **options) -> TritonModel:
    clear_routers()
    urls = [f"triton+grpc://{address}/double" for address in servers]
    options.setdefault("retry", {"initial_backoff_s": 0.0, "jitter": 0.0})
    return TritonModel(urls, transport=MemoryTransport.factory(servers), **options)


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(1000, 4)).astype(np.float32)


def test_outputs_arrive_whole_and_in_order_across_many_requests(x):
    servers = _servers("a:1", "b:1")
    model = _model(servers, max_request_bytes=4 * 4 * 100)
    out = model({"x": x})
    assert np.array_equal(out["y"], x * 2)
    assert out["n"].shape == (1000, 1)
    assert model.stats.requests == 10
    assert servers["a:1"].requests > 0 and servers["b:1"].requests > 0  # balanced


def test_unpinned_model_uses_the_highest_version_and_refuses_another(x):
    servers = _servers("a:1")
    model = _model(servers)
    assert model.served_version == "2"
    servers["a:1"].rewrite_next(lambda outputs: outputs, version="1")
    with pytest.raises(InferenceError, match="requested version 2 but a:1 answered with version 1"):
        model({"x": x})


@pytest.mark.parametrize("rewrite, why", [
    (lambda o: {**o, "y": o["y"][:-1]}, "refusing misaligned outputs"),
    (lambda o: {"y": o["y"]}, "lacks outputs"),
    (lambda o: {**o, "y": o["y"].astype(np.float64)}, "the model declares float32"),
    (lambda o: {**o, "y": o["y"][:, :3]}, "per-row shape"),
])
def test_a_wrong_answer_fails_the_call_and_is_never_returned(x, rewrite, why):
    servers = _servers("a:1")
    model = _model(servers)
    servers["a:1"].rewrite_next(rewrite)
    with pytest.raises(InferenceError, match=why):
        model({"x": x})
    assert model.stats.rows == 0


def test_a_safe_cast_answer_is_accepted(x):
    servers = _servers("a:1")
    model = _model(servers)
    servers["a:1"].rewrite_next(lambda o: {**o, "y": o["y"].astype(np.float16)})
    assert model({"x": x})["y"].dtype == np.float32


def test_busy_and_down_answers_are_retried_and_fail_over(x):
    servers = _servers("a:1", "b:1")
    model = _model(servers)
    servers["a:1"].fail_next("busy")
    servers["b:1"].fail_next("down")
    assert np.array_equal(model({"x": x})["y"], x * 2)
    assert model.stats.retries >= 1


def test_a_bad_request_is_not_retried(x):
    servers = _servers("a:1", "b:1")
    model = _model(servers)
    for server in servers.values():
        server.fail_next("bad_request", detail="unexpected shape")
    with pytest.raises(Exception, match="rejected the inputs"):
        model({"x": x})
    assert model.stats.retries == 0


def test_all_servers_down_raises_after_the_retry_budget(x):
    servers = _servers("a:1")
    model = _model(servers, retry={"max_attempts": 2, "total_s": 2.0, "initial_backoff_s": 0.0,
                                   "quarantine_s": 30.0})
    model.info
    servers["a:1"].up = False
    with pytest.raises(ServerUnavailableError, match="no server could serve"):
        model({"x": x})


def test_a_server_that_restricts_its_index_is_asked_per_model(x):
    servers = _servers("a:1", restricted=frozenset({"model-repository", "statistics"}))
    model = _model(servers)
    assert np.array_equal(model({"x": x})["y"], x * 2)
    with pytest.raises(ConfigurationError, match="protocol_key"):
        model.server_statistics()


def test_statistics_skip_restricted_servers_when_others_answer(x):
    servers = {**_servers("a:1", restricted=frozenset({"statistics"})), **_servers("b:1")}
    model = _model(servers)
    model({"x": x})
    assert model.server_statistics().inference_count == servers["b:1"].statistics(
        "double", "", 1).inference_count


class _RegionLosingTransport(MemoryTransport):
    """A shared-memory transport whose server never knows our region (a balancer in front)."""

    name = "shm"

    def submit(self, request):
        self.requests += 1
        from coffea_sonic.transport.base import TransportFuture

        future = TransportFuture()
        future.fail(TransportError("shm_region", "Unable to find shared memory region: 'r'",
                                   address=self.address, code="INVALID_ARGUMENT"))
        return future


def test_a_shared_memory_region_error_resends_over_the_plain_transport(x, caplog):
    plain = MemoryTransport({"double": (INFO, _engine)}, address="a:1")
    lossy = _RegionLosingTransport({"double": (INFO, _engine)}, address="a:1")
    clear_routers()
    model = TritonModel("triton+grpc://a:1/double", transport=lambda settings: plain)
    router = model._get_runtime().router
    endpoint = router.endpoints[0]
    endpoint.data = lossy  # as if "auto" had chosen shared memory for this server
    with caplog.at_level("WARNING"):
        out = model({"x": x})
    assert np.array_equal(out["y"], x * 2)
    assert endpoint.shm_off.startswith("shm_region") or "shared memory" in endpoint.shm_off
    assert model.stats.failed_requests == 0 and model.stats.retries == 0
    assert sum("not using shared memory" in r.message for r in caplog.records) == 1


def test_outputs_are_written_once_into_the_calls_arrays():
    servers = _servers("a:1")
    model = _model(servers, max_request_bytes=1 << 30)
    big = np.ones((500_000, 4), np.float32)
    model({"x": big[:10]})
    tracemalloc.start()
    try:
        out = model({"x": big})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    output_bytes = out["y"].nbytes + out["n"].nbytes
    # the engine makes its answer (= output bytes) and the client one copy of it; piece
    # concatenation or a protobuf round trip would add another output's worth
    assert peak < 2.5 * output_bytes, (peak, output_bytes)


def test_delivery_refuses_rows_that_do_not_fit():
    request = InferRequest("m", "1", {}, INFO.outputs, rows=3,
                           out={"y": np.zeros((2, 4), np.float32)})
    answered = np.ones((2, 4), np.float32)  # one row short of the request
    from coffea_sonic.transport.base import deliver

    assert deliver(request, "y", answered) is answered
