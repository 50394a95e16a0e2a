"""Edges of input validation and request planning (coffea_sonic.validation): pure, in-process."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from coffea_sonic import validation
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.errors import ConfigurationError, InputValidationError
from coffea_sonic.validation import (GRPC_MESSAGE_LIMIT, empty_outputs, piece_arrays, plan_pieces,
                                     validate_inputs)


def _info(*inputs: TensorInfo, max_batch_size: int = 4,
          outputs: tuple[TensorInfo, ...] = (TensorInfo("y", "FP32", (2,)),)) -> ModelInfo:
    return ModelInfo("m", ("1",), "python", max_batch_size, inputs, outputs)


X3 = TensorInfo("x", "FP32", (3,))


def test_inputs_must_be_a_mapping_and_the_policy_known():
    with pytest.raises(InputValidationError, match="takes a dict .* with inputs \\['x'\\], got list"):
        validate_inputs(_info(X3), [np.zeros((1, 3))])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="nonfinite must be 'pass', 'warn' or 'raise', not 'x'"):
        validate_inputs(_info(X3), {"x": np.zeros((1, 3))}, nonfinite="x")  # type: ignore[arg-type]


def test_missing_and_unexpected_names_are_both_listed_with_the_declared_shapes():
    info = _info(TensorInfo("x", "FP32", (3, -1)), TensorInfo("z", "INT64", (1,)))
    with pytest.raises(InputValidationError) as raised:
        validate_inputs(info, {"x": np.zeros((1, 3, 2), np.float32), "w": 1})
    assert str(raised.value) == ("model 'm' inputs: missing ['z'] and unexpected ['w']; the model "
                                 "declares x [N, 3, *] FP32, z [N, 1] INT64")
    with pytest.raises(InputValidationError, match="inputs: missing \\['x'\\]; the model declares x \\[3\\] FP32$"):
        validate_inputs(_info(X3, max_batch_size=0), {})
    with pytest.raises(InputValidationError, match="inputs: unexpected \\['w'\\]; "):
        validate_inputs(_info(X3), {"x": np.zeros((1, 3), np.float32), "w": 1})


def test_rows_must_agree_and_are_returned():
    info = _info(X3, TensorInfo("z", "INT64", (1,)))
    arrays, rows = validate_inputs(info, {"x": np.zeros((5, 3), np.float32),
                                          "z": np.zeros((5, 1), np.int64)})
    assert rows == 5 and list(arrays) == ["x", "z"]
    with pytest.raises(InputValidationError, match="input 'z' has 4 rows but 'x' has 5"):
        validate_inputs(info, {"x": np.zeros((5, 3), np.float32), "z": np.zeros((4, 1), np.int64)})
    assert validate_inputs(_info(X3), {"x": np.zeros((0, 3), np.float32)})[1] == 0


def test_arrays_come_back_contiguous_and_untouched_when_already_right():
    given = np.zeros((6, 3), np.float32)
    assert validate_inputs(_info(X3), {"x": given})[0]["x"] is given
    strided = np.zeros((6, 6), np.float32)[:, ::2]
    assert validate_inputs(_info(X3), {"x": strided})[0]["x"].flags.c_contiguous


def test_rank_and_fixed_dims_are_checked_and_free_dims_are_not():
    with pytest.raises(InputValidationError, match="expected rank 2 \\[N, 3\\], got rank 1 shape \\[3\\]"):
        validate_inputs(_info(X3), {"x": np.zeros(3, np.float32)})
    with pytest.raises(InputValidationError, match="got \\[2, 4\\] \\(dim 1 is 4, must be 3\\)"):
        validate_inputs(_info(X3), {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(InputValidationError, match="\\(dim 0 is 4, must be 3\\)"):
        validate_inputs(_info(X3, max_batch_size=0), {"x": np.zeros(4, np.float32)})
    free = TensorInfo("x", "FP32", (-1, 0))
    assert validate_inputs(_info(free), {"x": np.zeros((2, 7, 0), np.float32)})[1] == 2
    with pytest.raises(InputValidationError, match="dim 2 is 1, must be 0"):
        validate_inputs(_info(free), {"x": np.zeros((2, 7, 1), np.float32)})


def test_jagged_values_and_scalars_are_refused():
    with pytest.raises(InputValidationError, match="cannot be made a regular numpy array"):
        validate_inputs(_info(X3), {"x": [[1.0, 2.0, 3.0], [1.0]]})
    with pytest.raises(InputValidationError, match="input 'x' is a scalar; rows are needed"):
        validate_inputs(_info(TensorInfo("x", "FP32", ()), max_batch_size=0),
                        {"x": np.float32(1.0)})


def test_only_safe_casts_happen_and_bytes_take_strings():
    arrays, _ = validate_inputs(_info(X3), {"x": np.ones((2, 3), np.int16)})
    assert arrays["x"].dtype == np.float32 and arrays["x"].tolist() == [[1.0] * 3] * 2
    with pytest.raises(InputValidationError, match="expected dtype float32 \\(FP32\\), got float64; "
                                                   "float64 -> float32 is not a safe cast"):
        validate_inputs(_info(X3), {"x": np.ones((2, 3), np.float64)})
    text = _info(TensorInfo("s", "BYTES", (1,)))
    for value in (np.array([[b"a"]]), np.array([["a"]]), np.array([[b"a"]], dtype=object)):
        assert validate_inputs(text, {"s": value})[0]["s"].dtype == value.dtype
    with pytest.raises(InputValidationError, match="expected dtype object \\(BYTES\\), got float32"):
        validate_inputs(text, {"s": np.zeros((1, 1), np.float32)})


def test_nonfinite_values_raise_warn_once_or_pass(caplog):
    info = _info(TensorInfo("nf_edge", "FP32", (3,)))
    bad = np.array([[np.nan, 1.0, np.inf], [0.0, 0.0, 0.0]], np.float32)
    with pytest.raises(InputValidationError, match="2 NaN/inf values of 6 and nonfinite='raise'"):
        validate_inputs(info, {"nf_edge": bad}, nonfinite="raise")
    validate_inputs(info, {"nf_edge": bad}, nonfinite="pass")
    validation._warned_nonfinite.discard(("m", "nf_edge"))
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.validation"):
        validate_inputs(info, {"nf_edge": bad}, nonfinite="warn")
        validate_inputs(info, {"nf_edge": bad}, nonfinite="warn")
    assert [r.getMessage().count("holds 2 NaN/inf values of 6") for r in caplog.records] == [1]
    assert ("m", "nf_edge") in validation._warned_nonfinite
    with pytest.raises(InputValidationError, match="2 NaN/inf"):
        validate_inputs(info, {"nf_edge": bad}, nonfinite="raise")


def test_a_sum_that_overflows_is_not_taken_for_nonfinite_values():
    big = TensorInfo("h", "FP16", (2,))
    validate_inputs(_info(big), {"h": np.full((4, 2), 60000, np.float16)}, nonfinite="raise")


def test_equal_pieces_within_the_batch_and_byte_caps():
    info = _info(X3, max_batch_size=1800)
    arrays = {"x": np.zeros((2048, 3), np.float32)}
    assert plan_pieces(info, arrays, 2048, 1 << 30) == [(0, 1024, 0), (1024, 2048, 0)]
    assert plan_pieces(info, arrays, 2048, 12 * 700) == [(0, 683, 0), (683, 1366, 0),
                                                         (1366, 2048, 0)]
    assert plan_pieces(info, arrays, 2048, 1) == [(r, r + 1, 0) for r in range(2048)][:2048]
    assert plan_pieces(info, arrays, 0, 1 << 20) == []


def test_strings_are_sized_with_their_length_prefixes():
    info = _info(TensorInfo("s", "BYTES", (1,)), max_batch_size=100)
    arrays = {"s": np.array([[b"abcdef"]] * 10, dtype=object)}  # 10 bytes a row
    assert plan_pieces(info, arrays, 10, 50) == [(0, 5, 0), (5, 10, 0)]
    words = {"s": np.array([["abcdef"]] * 10)}
    assert plan_pieces(info, words, 10, 50) == [(0, 5, 0), (5, 10, 0)]
    assert plan_pieces(info, words, 10, 49) == [(0, 4, 0), (4, 8, 0), (8, 10, 0)]


def test_a_row_over_the_grpc_limit_is_refused():
    row = 2 ** 31 - 1 - (1 << 20)
    for size, fails in ((row, False), (row + 1, True)):
        arrays = {"x": np.broadcast_to(np.zeros(1, np.uint8), (1, size))}
        info = _info(TensorInfo("x", "UINT8", (size,)))
        if fails:
            with pytest.raises(InputValidationError, match="over gRPC's 2 GiB message limit"):
                plan_pieces(info, arrays, 1, 1 << 20)
        else:
            assert plan_pieces(info, arrays, 1, 1 << 20) == [(0, 1, 0)]
    assert GRPC_MESSAGE_LIMIT == 2 ** 31 - 1


def test_models_without_batching_go_in_padded_pieces_of_their_leading_dim():
    fixed = _info(TensorInfo("x", "FP32", (4, 2)), TensorInfo("z", "FP32", (4,)), max_batch_size=0)
    arrays = {"x": np.zeros((10, 2), np.float32), "z": np.zeros(10, np.float32)}
    assert plan_pieces(fixed, arrays, 10, 1) == [(0, 4, 0), (4, 8, 0), (8, 10, 2)]
    free = _info(TensorInfo("x", "FP32", (-1, 2)), max_batch_size=0)
    assert plan_pieces(free, {"x": np.zeros((10, 2), np.float32)}, 10, 40) == [(0, 5, 0), (5, 10, 0)]
    for inputs in ((TensorInfo("x", "FP32", (4,)), TensorInfo("z", "FP32", (5,))),
                   (TensorInfo("x", "FP32", ()),)):
        with pytest.raises(ConfigurationError, match="do not share a leading row dimension"):
            plan_pieces(_info(*inputs, max_batch_size=0),
                        {t.name: np.zeros(4, np.float32) for t in inputs}, 4, 100)
    huge = _info(TensorInfo("x", "UINT8", (1 << 20, 1 << 11)), max_batch_size=0)
    row = {"x": np.broadcast_to(np.zeros(1, np.uint8), (1, 1 << 11))}
    with pytest.raises(InputValidationError, match="demands 1048576 rows per request"):
        plan_pieces(huge, row, 1, 1 << 20)
    fits = _info(TensorInfo("x", "UINT8", (1023, 1 << 11)), max_batch_size=0)
    assert plan_pieces(fits, row, 1, 1 << 20) == [(0, 1, 1022)]


def test_pieces_are_views_or_zero_padded_copies():
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(3, 2),
              "s": np.array([b"a", b"b", b"c"], dtype=object)}
    plain = piece_arrays(arrays, 1, 3, 0)
    assert np.shares_memory(plain["x"], arrays["x"]) and plain["x"].tolist() == [[2, 3], [4, 5]]
    padded = piece_arrays(arrays, 1, 3, 2)
    assert padded["x"].tolist() == [[2, 3], [4, 5], [0, 0], [0, 0]]
    assert padded["s"].tolist() == [b"b", b"c", b"", b""]


def test_empty_outputs_have_the_declared_types_and_no_rows():
    outputs = (TensorInfo("y", "INT64", (-1, 2)), TensorInfo("z", "FP32", (3, 4)))
    batching = empty_outputs(_info(X3, outputs=outputs))
    assert batching["y"].shape == (0, 0, 2) and batching["y"].dtype == np.int64
    plain = empty_outputs(_info(X3, max_batch_size=0, outputs=outputs))
    assert plain["y"].shape == (0, 2) and plain["z"].shape == (0, 4)


def test_fixed_zero_dims_are_shown_as_numbers_and_free_ones_as_stars():
    info = _info(TensorInfo("x", "FP32", (0, -1)))
    with pytest.raises(InputValidationError, match="declares x \\[N, 0, \\*\\] FP32$"):
        validate_inputs(info, {})
    plain = _info(TensorInfo("x", "FP32", (0, -1)), max_batch_size=0)
    with pytest.raises(InputValidationError, match="declares x \\[0, \\*\\] FP32$"):
        validate_inputs(plain, {})


def test_zero_byte_rows_count_as_one_byte_when_planning():
    info = _info(TensorInfo("x", "FP32", (0,)), max_batch_size=100)
    assert plan_pieces(info, {"x": np.zeros((10, 0), np.float32)}, 10, 5) == [(0, 5, 0), (5, 10, 0)]


def test_a_leading_dim_of_one_or_zero_or_free_is_not_a_fixed_request_size():
    one = _info(TensorInfo("x", "FP32", (1, 2)), max_batch_size=0)
    assert plan_pieces(one, {"x": np.zeros((3, 2), np.float32)}, 3, 1 << 20) == [
        (0, 1, 0), (1, 2, 0), (2, 3, 0)]
    zero = _info(TensorInfo("x", "FP32", (0, 2)), max_batch_size=0)
    assert plan_pieces(zero, {"x": np.zeros((3, 2), np.float32)}, 3, 1 << 20) == [(0, 3, 0)]
    free = _info(TensorInfo("x", "FP32", (-1, 2)), max_batch_size=0)
    assert plan_pieces(free, {"x": np.zeros((10, 2), np.float32)}, 10, 56) == [(0, 5, 0), (5, 10, 0)]


def test_a_fixed_request_of_exactly_the_grpc_limit_is_allowed():
    size = 2 ** 31 - 1 - (1 << 20)
    info = _info(TensorInfo("x", "UINT8", (1, size)), max_batch_size=0)
    arrays = {"x": np.broadcast_to(np.zeros(1, np.uint8), (1, size))}
    assert plan_pieces(info, arrays, 1, 1 << 20) == [(0, 1, 0)]


# --- NaN/inf checked request by request (check_finite_rows) -------------------------------------

def _rows_with_nan_in_row(row: int) -> dict[str, np.ndarray]:
    x = np.ones((4, 2), np.float32)
    x[row, 1] = np.nan
    return {"x": x, "ids": np.arange(4, dtype=np.int64)}


def test_a_request_of_clean_rows_passes_even_when_later_rows_hold_nan():
    validation.check_finite_rows("edge_finite", _rows_with_nan_in_row(3), 0, 3, "raise")


def test_a_request_holding_nan_fails_and_counts_the_whole_call():
    arrays = _rows_with_nan_in_row(2)
    arrays["x"][0, 0] = np.inf  # outside the request, still counted in the message
    with pytest.raises(InputValidationError,
                       match="model 'edge_finite' input 'x': 2 NaN/inf values of 8 and "
                             "nonfinite='raise'"):
        validation.check_finite_rows("edge_finite", arrays, 2, 4, "raise")


def test_pass_never_looks_and_integer_or_bytes_tensors_are_never_checked():
    validation.check_finite_rows("edge_finite", _rows_with_nan_in_row(1), 0, 4, "pass")
    validation.check_finite_rows("edge_finite", {"ids": np.arange(4)}, 0, 4, "raise")
    names = np.array([b"jet", b"muon"], dtype=object)  # no NaN to look for, nothing to sum
    validation.check_finite_rows("edge_finite", {"names": names}, 0, 2, "raise")


def test_warn_says_it_once_per_model_and_tensor_request_after_request(caplog):
    validation._warned_nonfinite.discard(("edge_warn", "x"))
    arrays = _rows_with_nan_in_row(1)
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.validation"):
        validation.check_finite_rows("edge_warn", arrays, 0, 2, "warn")
        validation.check_finite_rows("edge_warn", arrays, 0, 2, "warn")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "model 'edge_warn' input 'x' holds 1 NaN/inf values of 8" in caplog.text
    with pytest.raises(InputValidationError, match="model 'edge_warn' input 'x'"):
        validation.check_finite_rows("edge_warn", arrays, 0, 2, "raise")  # warned, still refused
    validation._warned_nonfinite.discard(("edge_warn", "x"))


def test_a_rows_bytes_add_up_over_every_input_numbers_and_strings_alike():
    info = _info(X3, TensorInfo("ids", "INT64", (2,)), TensorInfo("s", "BYTES", (1,)),
                 max_batch_size=100)
    arrays = {"x": np.zeros((10, 3), np.float32),          # 12 bytes a row
              "ids": np.zeros((10, 2), np.int64),          # 16
              "s": np.array([[b"abcdef"]] * 10, dtype=object),  # 6 + 4-byte prefix
              "t": np.array([[b"ab"]] * 10, dtype=object)}      # 2 + 4
    assert validation._row_bytes(arrays, 10) == 12 + 16 + 10 + 6
    assert plan_pieces(info, arrays, 10, 44 * 5) == [(0, 5, 0), (5, 10, 0)]
