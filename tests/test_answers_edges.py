"""Edges of answer checking and assembly (coffea_sonic.answers): pure, in-process."""
from __future__ import annotations

import numpy as np
import pytest

from coffea_sonic.answers import assemble, cast_output, check_outputs, check_version, preallocate
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.errors import InferenceError


def _info(*outputs: TensorInfo, max_batch_size: int = 8) -> ModelInfo:
    return ModelInfo("m", ("1",), "onnxruntime_onnx", max_batch_size,
                     inputs=(TensorInfo("x", "FP32", (2,)),), outputs=outputs)


def test_a_version_other_than_the_requested_one_is_refused_and_blanks_pass():
    with pytest.raises(InferenceError, match="requested version 1 but a:1 answered with version 2"):
        check_version("m", "1", "2", "a:1")
    check_version("m", "1", "1", "a:1")
    check_version("m", "", "2", "a:1")
    check_version("m", "1", "", "a:1")


def test_a_scalar_answer_of_a_batching_model_is_refused_as_misaligned():
    with pytest.raises(InferenceError, match="refusing misaligned outputs"):
        check_outputs("m", _info(TensorInfo("y", "FP32", (1,))), {"y": np.float32(1.0)}, rows=1,
                      source="a:1")


def test_a_declared_zero_width_output_must_come_back_zero_wide():
    info = _info(TensorInfo("y", "FP32", (0,)))
    assert check_outputs("m", info, {"y": np.zeros((3, 0), np.float32)}, rows=3,
                         source="a:1")["y"].shape == (3, 0)
    with pytest.raises(InferenceError, match="per-row shape \\[2\\], the model declares \\[0\\]"):
        check_outputs("m", info, {"y": np.zeros((3, 2), np.float32)}, rows=3, source="a:1")


def test_a_variable_dimension_takes_any_size_and_a_missing_dimension_is_refused():
    info = _info(TensorInfo("y", "FP32", (-1,)))
    assert check_outputs("m", info, {"y": np.zeros((2, 7), np.float32)}, rows=2,
                         source="a:1")["y"].shape == (2, 7)
    with pytest.raises(InferenceError, match="per-row shape \\[\\]"):
        check_outputs("m", info, {"y": np.zeros(2, np.float32)}, rows=2, source="a:1")


def test_a_non_batching_model_checks_the_whole_shape():
    info = _info(TensorInfo("y", "FP32", (4,)), max_batch_size=0)
    assert check_outputs("m", info, {"y": np.zeros(4, np.float32)}, rows=1,
                         source="a:1")["y"].shape == (4,)
    with pytest.raises(InferenceError, match="per-row shape \\[5\\]"):
        check_outputs("m", info, {"y": np.zeros(5, np.float32)}, rows=1, source="a:1")


def test_outputs_delivered_already_are_passed_through_unchecked():
    info = _info(TensorInfo("y", "FP32", (1,)))
    arrived = np.zeros((9, 1), np.float64)
    assert check_outputs("m", info, {"y": arrived}, rows=3, source="a:1",
                         delivered=frozenset({"y"}))["y"] is arrived


def test_a_cast_happens_only_where_it_is_safe():
    tensor = TensorInfo("y", "FP64", (1,))
    same = np.zeros((2, 1), np.float64)
    assert cast_output("m", tensor, same, "a:1") is same
    widened = cast_output("m", tensor, np.ones((2, 1), np.float32), "a:1")
    assert widened.dtype == np.float64 and widened.tolist() == [[1.0], [1.0]]
    with pytest.raises(InferenceError, match="gave int64, the model declares int8"):
        cast_output("m", TensorInfo("y", "INT8", (1,)), np.zeros(2, np.int64), "a:1")


def test_preallocation_needs_batching_known_dims_and_fixed_width_types():
    fixed = TensorInfo("y", "FP32", (3,))
    out = preallocate(_info(fixed), 5)
    assert out is not None and out["y"].shape == (5, 3) and out["y"].dtype == np.float32
    assert preallocate(_info(fixed, max_batch_size=0), 5) is None
    assert preallocate(_info(fixed, TensorInfo("z", "FP32", (-1,))), 5) is None
    assert preallocate(_info(fixed, TensorInfo("s", "BYTES", (1,))), 5) is None
    empty = preallocate(_info(TensorInfo("z", "FP32", (0,))), 5)
    assert empty is not None and empty["z"].shape == (5, 0)


def test_pieces_are_joined_in_input_order_without_their_padding():
    info = _info(TensorInfo("y", "FP32", (1,)))
    first = {"y": np.array([[0.0], [1.0], [-1.0]], np.float32)}  # one padding row
    second = {"y": np.array([[2.0], [3.0], [-1.0]], np.float32)}
    out = assemble("m", info, 4, [(0, 2), (2, 4)], [first, second], None)
    assert out["y"].ravel().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_single_piece_is_copied_not_handed_out():
    info = _info(TensorInfo("y", "FP32", (1,)))
    piece = {"y": np.array([[5.0], [6.0], [9.0]], np.float32)}
    out = assemble("m", info, 2, [(0, 2)], [piece], None)
    assert out["y"].ravel().tolist() == [5.0, 6.0]
    out["y"][0] = 0.0
    assert piece["y"][0, 0] == 5.0


def test_preallocated_outputs_are_returned_as_they_are():
    info = _info(TensorInfo("y", "FP32", (1,)))
    written = {"y": np.arange(3, dtype=np.float32).reshape(3, 1)}
    assert assemble("m", info, 3, [(0, 3)], [{"y": written["y"]}], written) is written


def test_a_call_with_a_piece_missing_or_rows_short_is_refused():
    info = _info(TensorInfo("y", "FP32", (1,)))
    with pytest.raises(InferenceError, match="1 of 2 requests of a 4-row call have no answer"):
        assemble("m", info, 4, [(0, 2), (2, 4)], [{"y": np.zeros((2, 1))}, None], None)
    with pytest.raises(InferenceError, match="assembled 2 rows of output 'y' for 3 input rows"):
        assemble("m", info, 3, [(0, 2)], [{"y": np.zeros((2, 1))}], None)


def test_an_answer_of_an_unsafe_type_is_refused_naming_model_output_and_server():
    info = ModelInfo("tagger", ("1",), "python", 8, (TensorInfo("x", "FP32", (1,)),),
                     (TensorInfo("a", "FP32", (1,)), TensorInfo("y", "INT8", (1,))))
    answer = {"a": np.ones((2, 1), np.float32), "y": np.zeros((2, 1), np.int64)}
    with pytest.raises(InferenceError, match="^model 'tagger' output 'y': 127.0.0.1:8001 gave "
                                             "int64, the model declares int8$"):
        check_outputs("tagger", info, answer, rows=2, source="127.0.0.1:8001")
    with pytest.raises(InferenceError, match="output 'y'"):  # checked after a delivered one
        check_outputs("tagger", info, answer, rows=2, source="127.0.0.1:8001",
                      delivered=frozenset({"a"}))
