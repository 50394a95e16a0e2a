"""Triton's ragged batching on the embedded server: ``allow_ragged_batch`` inputs, batch inputs
and a ``batch_output``, as CMS's SONIC test repository uses them (tests/experiment_repository.py).

Many single-entry requests in flight are batched by the server: the ragged input reaches the
model as one 1-D tensor, the batch inputs carry each request's element count, and the scattered
output goes back to each request with its own input's shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

pytest.importorskip("onnxruntime")

from coffea_sonic.server import LocalTritonServer  # noqa: E402
from coffea_sonic.server.model_check import validate_repository  # noqa: E402
from coffea_sonic.server.standard import plan_repository  # noqa: E402
from experiment_repository import ragged_repository  # noqa: E402
from helpers import wait_for  # noqa: E402
from server_side import sent_over  # noqa: E402


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory):
    repository = ragged_repository(tmp_path_factory.mktemp("ragged") / "models")
    server = LocalTritonServer(repository=repository, device="cpu").start()
    try:
        yield repository, server
    finally:
        server.stop()


def test_ragged_model_is_planned_and_validated_like_the_official_container(ragged_server):
    repository, _ = ragged_server
    assert plan_repository(repository)[1] == []
    assert validate_repository(repository).problems == []


def test_ragged_requests_in_flight_are_concatenated_and_the_outputs_scattered(ragged_server):
    _, server = ragged_server
    client = grpcclient.InferenceServerClient(server.grpc_address)
    rng = np.random.default_rng(5)
    entries = [rng.normal(size=n).astype(np.float32) for n in (3, 0, 7, 1, 12, 5, 2, 9)]
    answers: dict[int, object] = {}

    def callback(index):
        return lambda result, error: answers.__setitem__(index, error or result)

    for index, values in enumerate(entries):
        tensor = grpcclient.InferInput("INPUT0", [1, len(values)], "FP32")
        tensor.set_data_from_numpy(values[None, :])
        client.async_infer("ragged_io", [tensor], callback(index))
    wait_for(lambda: len(answers) == len(entries), 60, "every ragged answer")
    for index, values in enumerate(entries):
        answer = answers[index]
        assert not isinstance(answer, Exception), answer
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), 2 * values[None, :])
        np.testing.assert_array_equal(answer.as_numpy("COUNT"), [[len(values)]])
    statistics = client.get_inference_statistics("ragged_io").model_stats[0]
    assert statistics.execution_count < len(entries)  # the server batched ragged requests
    client.close()


def test_tritonmodel_sends_one_request_per_event_to_a_triton_ragged_model(ragged_server,
                                                                           each_transport):
    from coffea_sonic import TritonModel

    _, server = ragged_server
    counts = np.array([3, 0, 7, 1, 12, 5, 2, 9, 4, 4], dtype=np.int64)
    values = np.random.default_rng(6).normal(size=int(counts.sum())).astype(np.float32)
    model = TritonModel(server.url("ragged_io"), fallback="off")
    try:
        with sent_over(each_transport, server) as wire:
            answer = model({"INPUT0": values}, counts=counts)
        requests = model.stats.requests
    finally:
        model.close()
    np.testing.assert_array_equal(answer["OUTPUT0"], 2 * values)  # per object, in event order
    np.testing.assert_array_equal(answer["COUNT"], counts[:, None].astype(np.float32))
    assert requests == len(counts)  # SonicTriton's way: one request per event
    assert wire.grpc_infers == len(counts)  # and the server took exactly those
