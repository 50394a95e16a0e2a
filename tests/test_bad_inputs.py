"""The bad-input matrix: each mistake gets its clear error, or the right result.

Every error must name the model and the tensor, and say what was expected and what was given.
Mistakes found before anything is sent are checked once, on the in-memory transport serving the
zoo's declarations (which a test below compares with what the real server declares), and the
transport must see no request; everything that reaches a server runs on the real one, once per
transport (``each_transport``: gRPC, shared memory).
"""

from __future__ import annotations

import awkward as ak
import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.errors import (InferenceError, InputValidationError, ModelNotFoundError,
                                 ServerUnavailableError)
from coffea_sonic.model import TritonModel
from coffea_sonic.routing import clear_routers
from coffea_sonic.server.launcher import free_port
from coffea_sonic.transport.memory import MemoryTransport
from helpers import assert_sent_over, reference_engine

#: the zoo models the matrix uses
NAMES = ("jet_tagger", "particlenet_lite")


def _never_served(inputs):
    raise AssertionError("a refused input reached the wire")


@pytest.fixture(scope="module")
def memory_server():
    """An in-memory server declaring the zoo's signatures; it must never get a request."""
    transport = MemoryTransport({name: (zoo.declared_info(name), _never_served) for name in NAMES},
                                address="memory:1")
    yield transport
    assert transport.requests == 0
    transport.close()


@pytest.fixture
def offline(memory_server):
    """``offline(name, **options)``: a model of the in-memory server (validation only)."""
    clear_routers()

    def make(name: str, **options) -> TritonModel:
        return TritonModel(f"triton+grpc://memory:1/{name}",
                           transport=MemoryTransport.factory({"memory:1": memory_server}), **options)

    yield make
    assert memory_server.requests == 0
    clear_routers()


@pytest.fixture(scope="module")
def jet_model(triton_server, each_transport):
    return TritonModel(triton_server.url("jet_tagger"), transport=each_transport)


@pytest.fixture(scope="module")
def pnet_model(triton_server, each_transport):
    return TritonModel(triton_server.url("particlenet_lite"), transport=each_transport)


def _features(rows: int = 5) -> np.ndarray:
    return zoo.example_inputs("jet_tagger", rows)["features"]


def _message(error_type, call) -> str:
    with pytest.raises(error_type) as caught:
        call()
    return str(caught.value)


def test_unsafe_dtype_cast_is_refused_with_both_dtypes(offline):
    jet_model = offline("jet_tagger")
    text = _message(InputValidationError,
                    lambda: jet_model({"features": _features().astype(np.float64)}))
    for word in ("'jet_tagger'", "'features'", "float32", "float64", "astype"):
        assert word in text
    assert jet_model.stats.requests == 0  # nothing was sent


@pytest.mark.usefixtures("each_transport")
def test_safe_dtype_cast_gives_the_same_result(jet_model):
    integers = np.arange(30, dtype=np.int16).reshape(5, 6)
    as_float = integers.astype(np.float32)
    expected = reference_engine("jet_tagger", threads=1)({"features": as_float})["probs"]
    served = jet_model({"features": integers})["probs"]
    assert served.dtype == np.float32 and served.shape == (5, 3)
    np.testing.assert_allclose(served, expected, atol=1e-5)
    # the cast happens before sending: the same request as the float32 one, the same answer
    np.testing.assert_array_equal(served, jet_model({"features": as_float})["probs"])


def test_wrong_rank_names_expected_and_actual_shape(offline):
    jet_model = offline("jet_tagger")
    text = _message(InputValidationError, lambda: jet_model({"features": _features()[0]}))
    assert "expected rank 2 [N, 6]" in text and "got rank 1 shape [6]" in text


def test_wrong_fixed_dim_names_the_dim(offline):
    jet_model = offline("jet_tagger")
    text = _message(InputValidationError, lambda: jet_model({"features": _features()[:, :5]}))
    assert "'features'" in text and "[N, 6]" in text and "[5, 5]" in text and "must be 6" in text


def test_missing_and_extra_inputs_are_listed_with_the_declaration(offline):
    pnet_model = offline("particlenet_lite")
    inputs = zoo.example_inputs("particlenet_lite", 3)
    del inputs["pf_mask"]
    inputs["pf_charge"] = np.zeros((3, 32), np.float32)
    text = _message(InputValidationError, lambda: pnet_model(inputs))
    assert "missing ['pf_mask']" in text and "unexpected ['pf_charge']" in text
    assert "pf_points [N, 2, 32] FP32" in text


def test_inputs_with_different_row_counts_are_refused(offline):
    pnet_model = offline("particlenet_lite")
    inputs = zoo.example_inputs("particlenet_lite", 4)
    inputs["pf_mask"] = inputs["pf_mask"][:3]
    text = _message(InputValidationError, lambda: pnet_model(inputs))
    assert "'pf_mask' has 3 rows" in text and "has 4" in text


def test_jagged_columns_are_refused_with_a_hint(offline):
    jet_model = offline("jet_tagger")
    jagged = ak.Array([[1.0] * 6, [2.0] * 5])
    text = _message(InputValidationError, lambda: jet_model({"features": jagged}))
    assert "'features'" in text and "jagged" in text


@pytest.mark.usefixtures("each_transport")
def test_nan_and_inf_pass_through_by_default_like_in_process(jet_model):
    features = _features(4)
    features[1, 0], features[2, 3] = np.nan, np.inf
    served = jet_model({"features": features})["probs"]
    local = reference_engine("jet_tagger", threads=1)({"features": features})["probs"]
    np.testing.assert_allclose(served, local, atol=1e-5, equal_nan=True)
    strict = TritonModel(jet_model.url, nonfinite="raise")
    text = _message(InputValidationError, lambda: strict({"features": features}))
    assert "2 NaN/inf" in text and "'features'" in text


@pytest.mark.usefixtures("each_transport")
def test_nan_in_a_later_request_fails_the_whole_call_with_the_whole_calls_count(jet_model):
    features = _features(400)  # four requests of 100 rows; the first ones go out clean
    features[390, 0], features[399, 5] = np.nan, -np.inf
    strict = TritonModel(jet_model.url, nonfinite="raise",
                         max_request_bytes=100 * features[0].nbytes)
    handle = strict.infer_async({"features": features})
    text = _message(InputValidationError, handle.result)
    assert "'jet_tagger'" in text and "'features'" in text
    assert f"2 NaN/inf values of {features.size}" in text
    assert strict.stats.requests <= 3  # the request holding them was never sent
    features[390, 0], features[399, 5] = 0.0, 0.0
    assert strict({"features": features})["probs"].shape == (400, 3)


@pytest.mark.usefixtures("each_transport")
def test_nan_in_a_later_request_is_warned_about_with_the_whole_calls_count(jet_model, caplog):
    from coffea_sonic import validation

    validation._warned_nonfinite.discard(("jet_tagger", "features"))
    features = _features(400)
    features[350, 1], features[399, 2] = np.nan, np.inf
    model = TritonModel(jet_model.url, max_request_bytes=100 * features[0].nbytes)
    with caplog.at_level("WARNING", logger="coffea_sonic.validation"):
        probs = model({"features": features})["probs"]
    validation._warned_nonfinite.discard(("jet_tagger", "features"))
    assert probs.shape == (400, 3)
    local = reference_engine("jet_tagger", threads=1)({"features": features})["probs"]
    np.testing.assert_allclose(probs, local, atol=1e-5, equal_nan=True)
    warnings = [r.getMessage() for r in caplog.records if r.name == "coffea_sonic.validation"]
    assert len(warnings) == 1 and f"holds 2 NaN/inf values of {features.size}" in warnings[0]


def test_events_with_zero_objects_give_empty_typed_outputs(offline):
    jet_model = offline("jet_tagger")
    jets_per_event = ak.Array([[], [], []])  # three events without a single jet
    flat = np.asarray(ak.flatten(jets_per_event), dtype=np.float32).reshape(0, 6)
    outputs = jet_model({"features": flat})
    assert outputs["probs"].shape == (0, 3) and outputs["probs"].dtype == np.float32
    assert ak.unflatten(outputs["probs"], ak.num(jets_per_event)).tolist() == [[], [], []]


@pytest.mark.usefixtures("each_transport")
def test_call_larger_than_one_request_is_split_and_complete(triton_server):
    model = TritonModel(triton_server.url("jet_tagger"), max_request_bytes=4096)
    features = _features(2000)
    outputs = model({"features": features})["probs"]
    assert model.stats.requests == -(-2000 // (4096 // 24)) and outputs.shape == (2000, 3)
    np.testing.assert_allclose(
        outputs, reference_engine("jet_tagger", threads=1)({"features": features})["probs"], atol=1e-5)


@pytest.mark.usefixtures("each_transport")
def test_unknown_model_lists_what_the_server_serves(triton_server):
    model = TritonModel(triton_server.url("no_such_tagger"))
    text = _message(ModelNotFoundError, lambda: model({"features": _features()}))
    assert "'no_such_tagger'" in text and "jet_tagger (versions 1)" in text
    assert triton_server.grpc_address in text


@pytest.mark.usefixtures("each_transport")
def test_unknown_version_names_the_versions_served(triton_server):
    model = TritonModel(triton_server.url("jet_tagger", 7))
    text = _message(ModelNotFoundError, lambda: model({"features": _features()}))
    assert "'jet_tagger' version 7" in text and "versions 1" in text


@pytest.mark.usefixtures("each_transport")
def test_unreachable_server_is_named_with_a_hint():
    address = f"127.0.0.1:{free_port()}"
    model = TritonModel(f"triton+grpc://{address}/jet_tagger", connect_timeout_s=0.5)
    text = _message(ServerUnavailableError, lambda: model({"features": _features()}))
    assert address in text and "is the server running" in text


def test_non_mapping_inputs_are_refused(offline):
    jet_model = offline("jet_tagger")
    text = _message(InputValidationError, lambda: jet_model(_features()))
    assert "takes a dict" in text and "['features']" in text


@pytest.mark.usefixtures("each_transport")
def test_signature_checksum_mismatch_is_a_clear_error(triton_server, jet_model):
    served = jet_model.info.checksum
    assert TritonModel(jet_model.url, expected_checksum=served)({"features": _features()})
    wrong = TritonModel(jet_model.url, expected_checksum="0123456789abcdef")
    text = _message(InferenceError, lambda: wrong({"features": _features()}))
    assert served in text and "0123456789abcdef" in text and "jet_tagger" in text


@pytest.mark.usefixtures("each_transport")
def test_in_memory_declarations_equal_what_the_server_declares(jet_model, pnet_model):
    for model in (jet_model, pnet_model):
        declared = zoo.declared_info(model.info.name)
        assert (model.info.inputs, model.info.outputs, model.info.max_batch_size) == (
            declared.inputs, declared.outputs, declared.max_batch_size)


def test_each_transport_case_sends_over_its_wire(jet_model, each_transport, triton_server):
    outputs = assert_sent_over(each_transport, triton_server.grpc_address,
                               lambda: jet_model({"features": _features()}))
    assert outputs["probs"].shape == (5, 3) and jet_model.transport_kind == each_transport
