"""TritonModel against the real embedded tritonserver (session fixture ``triton_server``), once
per transport (``each_transport``: gRPC, shared memory)."""

from __future__ import annotations

import functools
import multiprocessing
import pickle
import time

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.model import TritonModel
from coffea_sonic.stats import counted_since
from coffea_sonic.transport.grpc import channel
from helpers import (assert_sent_over, pickled_class_names, reference_engine, run_in_threads,
                     wait_for)

# client-level suite: every test runs over gRPC and over shared memory
pytestmark = pytest.mark.usefixtures("each_transport")

TOLERANCE = 1e-5


def _compare_rows(name: str, rows: int) -> np.ndarray:
    """Rows checked against onnxruntime (all, except for the big CNN: the edges)."""
    if name == "emtrk_cnn" and rows > 64:
        return np.unique(np.r_[0:4, rows // 2, rows - 6:rows])
    return np.arange(rows)


@functools.cache
def _in_process(name: str, rows: int) -> dict[str, np.ndarray]:
    """onnxruntime's outputs (helpers.reference_engine: in this process, or in the server's
    environment on a client-only stack) on the rows of ``_compare_rows`` (the same for every
    transport: computed once per module run)."""
    inputs = zoo.example_inputs(name, rows, seed=rows)
    checked = _compare_rows(name, rows)
    return reference_engine(name, threads=1)({key: value[checked] for key, value in inputs.items()})


@pytest.mark.parametrize("name", zoo.names())
def test_outputs_equal_cpu_engine_on_1_7_and_max_batch_plus_one_rows(triton_server, name):
    # a byte cap above the largest request, so that only max_batch_size splits the call
    model = TritonModel(triton_server.url(name), max_request_bytes=1 << 30)
    max_batch = model.info.max_batch_size
    for rows in (1, 7, max_batch + 1):
        inputs = zoo.example_inputs(name, rows, seed=rows)
        outputs = model(inputs)
        checked = _compare_rows(name, rows)
        expected = _in_process(name, rows)
        assert sorted(outputs) == sorted(expected)
        for key, value in outputs.items():
            assert value.shape[0] == rows and value.dtype == np.float32 and value.flags.writeable
            np.testing.assert_allclose(value[checked], expected[key], atol=TOLERANCE, rtol=0)
    # 1 + 1 requests, then max_batch_size + 1 rows -> exactly two (never padded, never cyclic)
    assert model.stats.requests == 4
    assert model.stats.rows == max_batch + 9


def test_pinned_version_url_serves_that_version(triton_server):
    model = TritonModel(triton_server.url("jet_tagger", 1))
    inputs = zoo.example_inputs("jet_tagger", 5)
    np.testing.assert_allclose(model(inputs)["probs"], reference_engine("jet_tagger")(inputs)["probs"],
                               atol=TOLERANCE)


def test_splitting_by_bytes_sends_several_requests_and_keeps_order(triton_server):
    inputs = zoo.example_inputs("jet_tagger", 1000, seed=3)
    reference = TritonModel(triton_server.url("jet_tagger"))
    start = reference.server_statistics()
    whole = reference(inputs)["probs"]
    counted_since(reference.server_statistics, start, 1)  # not counted in the split's block
    split = TritonModel(triton_server.url("jet_tagger"), max_request_bytes=24 * 100,
                        max_in_flight=3)
    with split.measure_server() as measured:
        outputs = split(inputs)["probs"]
    np.testing.assert_array_equal(outputs, whole)
    assert split.stats.requests == 10 and split.stats.bytes_sent == 24 * 1000
    assert measured.delta.success_count == 10 and measured.delta.inference_count == 1000


def test_empty_input_makes_no_request_and_returns_typed_empty_outputs(triton_server):
    model = TritonModel(triton_server.url("emtrk_cnn"))
    model.info  # metadata first, so only inference would show up in the statistics
    before = model.server_statistics()
    outputs = model({"patch": np.zeros((0, 1, 48, 48), np.float32)})
    delta = model.server_statistics() - before
    assert delta.success_count == 0 and delta.fail_count == 0
    assert model.stats.requests == 0 and model.stats.calls == 1
    assert {k: (v.shape, v.dtype) for k, v in outputs.items()} == {
        "em_trk_none": ((0, 3), np.float32), "michel": ((0, 1), np.float32)}


def test_infer_async_overlaps_the_callers_other_work(triton_server):
    model = TritonModel(triton_server.url("particlenet_lite"))
    inputs = zoo.example_inputs("particlenet_lite", 2048)
    model(inputs)  # warm up
    began = time.perf_counter()
    expected = model(inputs)["probs"]
    synchronous_s = time.perf_counter() - began
    handle = model.infer_async(inputs)
    # While the caller does other work (here: polls), the request completes in the background:
    # nothing but the caller's own thread calling result() could otherwise make it progress.
    wait_for(handle.done, timeout=60 + 2 * synchronous_s,
             what="the request to complete without the caller waiting on its result")
    wait_before = model.stats.wait_s
    np.testing.assert_array_equal(handle.result()["probs"], expected)
    assert model.stats.wait_s == wait_before  # nothing left to wait for


def test_threads_sharing_one_model_each_get_their_own_rows(triton_server):
    model = TritonModel(triton_server.url("jet_tagger"), max_in_flight=2,
                        max_request_bytes=24 * 64)
    engine = reference_engine("jet_tagger", threads=1)

    def work(seed: int) -> None:
        inputs = zoo.example_inputs("jet_tagger", 300 + seed, seed=seed)
        got = model(inputs)["probs"]
        assert got.shape == (300 + seed, 3), f"thread {seed} got {got.shape[0]} rows"
        np.testing.assert_allclose(got, engine(inputs)["probs"], atol=TOLERANCE, rtol=1e-5,
                                   err_msg=f"thread {seed} got wrong rows")

    run_in_threads(work, [(seed,) for seed in range(6)], timeout=120)


def test_stats_count_requests_rows_bytes_and_latency(triton_server):
    model = TritonModel(triton_server.url("jet_tagger"))
    model(zoo.example_inputs("jet_tagger", 10))
    stats = model.stats
    assert (stats.calls, stats.requests, stats.rows) == (1, 1, 10)
    assert stats.bytes_sent == 10 * 6 * 4 and stats.bytes_received == 10 * 3 * 4
    # wait_s may be 0: the answer can arrive before result() is called
    assert stats.latency_s > 0 and stats.wait_s >= 0 and stats.failed_requests == 0


def test_pickle_of_a_used_model_holds_no_grpc_object(triton_server):
    model = TritonModel(triton_server.url("jet_tagger"),
                        headers={"authorization": "Bearer not-in-pickles"})
    model(zoo.example_inputs("jet_tagger", 3))
    blob = pickle.dumps(model)
    offending = [n for n in pickled_class_names(blob) if "grpc" in n.lower() or "tritonclient" in n]
    assert offending == []
    assert b"not-in-pickles" not in blob
    assert pickle.loads(blob).stats.requests == 0  # counters start over in every copy


def test_unpickled_copies_share_this_processes_channel(triton_server):
    model = TritonModel(triton_server.url("jet_tagger"))
    model(zoo.example_inputs("jet_tagger", 2))
    channels = channel.pool_size()
    for _ in range(5):  # what coffea's Runner does per chunk
        copy = pickle.loads(pickle.dumps(model))
        copy(zoo.example_inputs("jet_tagger", 2))
        assert copy._get_runtime().router is model._get_runtime().router
        assert (copy._get_runtime().router.endpoints[0].control.connection
                is model._get_runtime().router.endpoints[0].control.connection)
    assert channel.pool_size() == channels


def _run_in_child(blob: bytes) -> list[float]:
    model = pickle.loads(blob)
    return model(zoo.example_inputs("jet_tagger", 4, seed=9))["probs"].ravel().tolist()


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_unpickled_model_works_in_another_process(triton_server, start_method):
    model = TritonModel(triton_server.url("jet_tagger"))
    expected = model(zoo.example_inputs("jet_tagger", 4, seed=9))["probs"]  # parent has a channel
    context = multiprocessing.get_context(start_method)
    with context.Pool(1) as pool:
        got = pool.apply_async(_run_in_child, (pickle.dumps(model),)).get(timeout=90)
    np.testing.assert_allclose(np.array(got).reshape(expected.shape), expected, atol=TOLERANCE)
    # the parent's channel still works after the child used its own
    np.testing.assert_array_equal(model(zoo.example_inputs("jet_tagger", 4, seed=9))["probs"],
                                  expected)


def test_each_transport_case_sends_over_its_wire(triton_server, each_transport):
    model = TritonModel(triton_server.url("jet_tagger"))
    inputs = zoo.example_inputs("jet_tagger", 300)
    outputs = assert_sent_over(each_transport, triton_server.grpc_address, lambda: model(inputs))
    np.testing.assert_allclose(outputs["probs"], reference_engine("jet_tagger")(inputs)["probs"],
                               atol=TOLERANCE)
    assert model.transport_kind == each_transport
