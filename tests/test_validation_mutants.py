"""What a user reads and gets from input validation, word for word (coffea_sonic.validation).

Pure, in-process tests written for survivors of the mutmut run (scripts/mutmut_run.py): the
messages a user keeps (errors and the NaN/inf warning), numpy's own warnings kept quiet, and the
NaN/inf policy applied to every tensor of a request, in any order.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

from coffea_sonic import validation
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.errors import ConfigurationError, InputValidationError
from coffea_sonic.validation import check_finite_rows, plan_pieces, validate_inputs


def _info(*inputs: TensorInfo, max_batch_size: int = 4) -> ModelInfo:
    return ModelInfo("m", ("1",), "python", max_batch_size, inputs, (TensorInfo("y", "FP32", (2,)),))


@pytest.fixture
def fresh_warnings():
    """Model/tensor pairs used here have not been warned about, before or after the test."""
    pairs = {("mm_val", name) for name in ("x", "a", "b", "ids")}
    validation._warned_nonfinite.difference_update(pairs)
    yield
    validation._warned_nonfinite.difference_update(pairs)


def test_a_jagged_input_is_refused_with_numpys_reason_and_the_fix():
    jagged = [[1.0, 2.0], [3.0]]
    with pytest.raises(ValueError) as numpy_says:
        np.asarray(jagged)
    with pytest.raises(InputValidationError) as raised:
        validate_inputs(_info(TensorInfo("x", "FP32", (2,))), {"x": jagged})
    assert str(raised.value) == (
        f"model 'm' input 'x': cannot be made a regular numpy array (ValueError: "
        f"{numpy_says.value}); pad/flatten jagged columns first (coffea_sonic.columns helpers)")


@pytest.mark.parametrize("policy", ["warn", "raise"])
def test_finite_values_whose_sum_overflows_raise_no_numpy_warning(policy, fresh_warnings, caplog):
    huge = np.full((4, 2), 3e38, np.float32)  # finite, but their float32 sum is inf
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        validate_inputs(_info(TensorInfo("x", "FP32", (2,))), {"x": huge}, nonfinite=policy)
        check_finite_rows("mm_val", {"x": huge}, 0, 4, policy)
    assert caplog.records == []


def test_the_nonfinite_warning_is_said_word_for_word(fresh_warnings, caplog):
    x = np.array([[np.nan, 1.0], [np.inf, 2.0], [3.0, 4.0]], np.float32)
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.validation"):
        check_finite_rows("mm_val", {"x": x}, 0, 3, "warn")
    assert [r.getMessage() for r in caplog.records] == [
        "coffea-sonic: model 'mm_val' input 'x' holds 2 NaN/inf values of 6; they are sent as they "
        "are (the model decides, as it would in-process). Said once per model and tensor; "
        "nonfinite='raise' rejects them, 'pass' stops looking"]


def test_pass_sends_nan_rows_without_a_word_and_leaves_nothing_on_record(fresh_warnings, caplog):
    x = np.array([[np.nan, 1.0], [2.0, 3.0]], np.float32)
    with caplog.at_level(logging.DEBUG):
        check_finite_rows("mm_val", {"x": x}, 0, 2, "pass")
    assert caplog.records == []
    assert ("mm_val", "x") not in validation._warned_nonfinite
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.validation"):
        check_finite_rows("mm_val", {"x": x}, 0, 2, "warn")  # so the first warning is still due
    assert len(caplog.records) == 1


def test_a_float_tensor_after_an_integer_or_a_clean_one_is_still_checked(fresh_warnings):
    nan = np.array([[np.nan], [1.0]], np.float32)
    with pytest.raises(InputValidationError, match="model 'mm_val' input 'b': 1 NaN/inf"):
        check_finite_rows("mm_val", {"ids": np.arange(2), "b": nan}, 0, 2, "raise")
    with pytest.raises(InputValidationError, match="model 'mm_val' input 'b': 1 NaN/inf"):
        check_finite_rows("mm_val", {"a": np.ones((2, 1), np.float32), "b": nan}, 0, 2, "raise")


def test_after_its_warning_a_tensor_is_not_looked_at_while_the_next_one_is(fresh_warnings, caplog):
    class CountedSums(np.ndarray):
        sums = 0

        def sum(self, *args, **kwargs):
            CountedSums.sums += 1
            return super().sum(*args, **kwargs)

    a = np.array([[np.nan], [1.0]], np.float32).view(CountedSums)
    b = np.array([[np.inf], [1.0]], np.float32)
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.validation"):
        check_finite_rows("mm_val", {"a": a}, 0, 2, "warn")
        looked = CountedSums.sums
        check_finite_rows("mm_val", {"a": a, "b": b}, 0, 2, "warn")
    assert looked >= 1 and CountedSums.sums == looked  # 'a' was warned about: not summed again
    assert [r.getMessage().split(" holds")[0] for r in caplog.records] == [
        "coffea-sonic: model 'mm_val' input 'a'", "coffea-sonic: model 'mm_val' input 'b'"]


def test_a_model_without_batching_or_a_shared_leading_dim_cannot_be_split():
    info = _info(TensorInfo("x", "FP32", (3,)), TensorInfo("z", "FP32", (4,)), max_batch_size=0)
    arrays = {"x": np.zeros((3,), np.float32), "z": np.zeros((4,), np.float32)}
    with pytest.raises(ConfigurationError) as raised:
        plan_pieces(info, arrays, 3, 1 << 20)
    assert str(raised.value) == (
        "model 'm' has no batching (max_batch_size 0) and its inputs do not share a leading row "
        f"dimension ({[t.describe() for t in info.inputs]}); it cannot be split into rows")


def test_a_fixed_request_over_the_grpc_limit_is_refused_in_so_many_words():
    size = 2 ** 30
    info = _info(TensorInfo("x", "UINT8", (2, size)), max_batch_size=0)
    arrays = {"x": np.broadcast_to(np.zeros(1, np.uint8), (2, size))}  # 2 rows of 1 GiB
    with pytest.raises(InputValidationError) as raised:
        plan_pieces(info, arrays, 2, 1 << 20)
    assert str(raised.value) == (
        "model 'm' demands 2 rows per request, over gRPC's 2 GiB message limit")
