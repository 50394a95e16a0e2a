"""Edges of ragged calls (coffea_sonic.ragged): declarations, counts, plans, answers. In-process."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from coffea_sonic import ragged
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.errors import InferenceError, InputValidationError
from coffea_sonic.ragged import HARD_REQUEST_LIMIT, RaggedCall, check_plain_call, signature

X = TensorInfo("x", "FP32", (-1,))
XC = TensorInfo("x__counts", "INT64", (-1,))
Y = TensorInfo("y", "FP32", (-1,))
E = TensorInfo("e", "FP32", (1,))


def _info(inputs=(X, XC), outputs=(Y, E), ragged_inputs=("x", "x__counts"),
          ragged_outputs=("y",), max_batch_size: int = 8) -> ModelInfo:
    return ModelInfo("m", ("1",), "python", max_batch_size, tuple(inputs), tuple(outputs),
                     ragged_inputs=tuple(ragged_inputs), ragged_outputs=tuple(ragged_outputs))


def _call(counts, info: ModelInfo | None = None) -> RaggedCall:
    rows = int(sum(counts))
    return RaggedCall.build(info or _info(), {"x": np.arange(rows, dtype=np.float32)}, counts)


@pytest.mark.parametrize("info, message", [
    (_info(max_batch_size=0), "expected max_batch_size >= 1, it declares 0"),
    (_info(ragged_inputs=("x__counts",)), "declares no ragged input"),
    (_info(inputs=(X, XC, TensorInfo("z", "FP32", (-1,)), TensorInfo("z__counts", "INT64", (-1,))),
           ragged_inputs=("x", "x__counts", "z", "z__counts")),
     "expected exactly one counts input 'x__counts' or 'z__counts' \\(TYPE_INT64, dims \\[-1\\]\\) "
     "for its ragged inputs \\['x', 'z'\\], it declares \\['x__counts', 'z__counts'\\]; a ragged model "
     "declares .*ragged_model_config writes one"),
    (_info(inputs=(X, XC, TensorInfo("z__counts", "INT64", (-1,))),
           ragged_inputs=("x", "x__counts", "z__counts")), "also declares \\['z__counts'\\]"),
    (_info(inputs=(X, TensorInfo("x__counts", "INT32", (-1,)))), "declares INT32\\[-1\\]"),
    (_info(inputs=(X, TensorInfo("x__counts", "INT64", (2,)))), "declares INT64\\[2\\]"),
    (_info(inputs=(X, XC, TensorInfo("w", "FP32", (1,)))), "also declares \\['w'\\]"),
    (_info(inputs=(TensorInfo("x", "FP32", (3,)), XC)), "expected dims \\[-1, ...\\].* declares \\[3\\]"),
    (_info(inputs=(TensorInfo("x", "FP32", ()), XC)), "expected dims \\[-1, ...\\].* declares \\[\\]"),
    (_info(inputs=(TensorInfo("x", "BYTES", (-1,)), XC)), "is BYTES: ragged inputs must be numeric"),
    (_info(outputs=(TensorInfo("y", "FP32", (2,)), E)), "per-object output 'y': expected dims"),
    (_info(outputs=(TensorInfo("y", "FP32", ()), E)), "per-object output 'y': expected dims"),
])
def test_declarations_that_cannot_take_ragged_calls_are_refused(info, message):
    with pytest.raises(InputValidationError, match=message):
        signature(info)


def test_a_signature_strips_the_row_axis_and_tells_the_two_formats_apart():
    sig = signature(_info(inputs=(TensorInfo("x", "FP32", (-1, 3)), XC),
                          outputs=(TensorInfo("y", "FP32", (-1, 2)), E)))
    assert [t.dims for t in sig.inputs] == [(3,)] and sig.counts == "x__counts"
    assert sig.object_output_names == ("y",) and [t.dims for t in sig.object_outputs] == [(2,)]
    assert sig.event_outputs == (E,) and not sig.per_event
    triton = signature(_info(inputs=(X,), ragged_inputs=("x",)))
    assert triton.per_event and triton.counts is None


def test_a_models_declaration_is_read_once_and_the_memo_stays_small():
    info = _info()
    assert ragged._prepared(info)[0] is ragged._prepared(info)[0]
    infos = [_info() for _ in range(70)]
    for each in infos:
        ragged._prepared(each)
        assert len(ragged._PREPARED) <= 64
    assert ragged._PREPARED[id(infos[-1])][0] is infos[-1]


def test_a_plain_call_to_a_model_that_needs_counts_is_refused():
    with pytest.raises(InputValidationError, match="takes ragged inputs \\['x'\\] with per-event counts "
                                                   "\\['x__counts'\\]: call model\\(inputs, counts=rows_per_event\\)"):
        check_plain_call(_info(), {"x": np.zeros((1, 3))})
    check_plain_call(_info(), {"x": np.zeros((1, 3)), "x__counts": np.zeros((1, 1))})
    check_plain_call(_info(), [np.zeros(3)])  # type: ignore[arg-type]
    check_plain_call(_info(inputs=(X,), ragged_inputs=("x",)), {"x": np.zeros((1, 3))})
    check_plain_call(_info(ragged_inputs=()), {"x": np.zeros((1, 3))})


@pytest.mark.parametrize("counts, message", [
    ([[1, 2]], "shape \\[1, 2\\] dtype int64"), ([1.0, 2.0], "shape \\[2\\] dtype float64"),
    ([0, -1, 4], "expected counts >= 0, event 1 has -1"),
    ([1, 1], "the counts of 2 events sum to 2 rows but 'x' has 3"),
    ([[1], [1, 1]], "counts must be a 1-d integer array of rows per event, got list"),
])
def test_counts_must_be_rows_per_event_that_sum_to_the_rows(counts, message):
    with pytest.raises(InputValidationError, match=message):
        RaggedCall.build(_info(), {"x": np.zeros(3, np.float32)}, counts)


def test_two_ragged_inputs_are_named_together_in_a_sum_mismatch():
    two = _info(inputs=(X, TensorInfo("z", "FP32", (-1,)), XC),
                ragged_inputs=("x", "z", "x__counts"))
    with pytest.raises(InputValidationError, match="but 'x', 'z' have 3"):
        RaggedCall.build(two, {"x": np.zeros(3, np.float32), "z": np.zeros(3, np.float32)}, [1])


def test_counts_are_not_taken_as_an_input_and_empty_calls_work():
    with pytest.raises(InputValidationError, match="'x__counts' is filled by the client from counts="):
        RaggedCall.build(_info(), {"x": np.zeros(1, np.float32), "x__counts": [1]}, [1])
    empty = _call(np.zeros(0, np.int64))
    assert (empty.events, empty.rows, empty.plan(100)) == (0, 0, [])
    out = empty.empty_outputs()
    assert out["y"].shape == (0,) and out["e"].shape == (0, 1) and out["e"].dtype == np.float32
    call = _call(np.array([2, 0, 1], dtype=np.uint8))
    assert call.counts.dtype == np.int64 and call.offsets.tolist() == [0, 2, 2, 3]


def test_plans_keep_events_whole_and_groups_about_equal():
    call = _call([1] * 10)  # 4 bytes a row, 8 bytes of count: 12 bytes an event
    assert call.plan(120) == [(0, 10, 0)]
    assert call.plan(119) == [(0, 5, 0), (5, 10, 0)]
    assert call.plan(60) == [(0, 5, 0), (5, 10, 0)]
    assert call.plan(48) == [(0, 3, 0), (3, 7, 0), (7, 10, 0)]
    assert call.plan(40) == [(0, 2, 0), (2, 5, 0), (5, 7, 0), (7, 10, 0)]
    assert call.plan(12) == [(e, e + 1, 0) for e in range(10)]
    uneven = _call([5, 1, 1, 1, 6, 1, 1, 4])
    assert uneven.plan(30) == [(0, 1, 0), (1, 3, 0), (3, 4, 0), (4, 5, 0), (5, 7, 0), (7, 8, 0)]
    assert uneven.plan(40) == [(0, 2, 0), (2, 4, 0), (4, 5, 0), (5, 7, 0), (7, 8, 0)]
    assert uneven.plan(50) == [(0, 2, 0), (2, 4, 0), (4, 6, 0), (6, 8, 0)]


def test_an_event_over_the_cap_goes_alone_and_is_logged(caplog):
    call = _call([1, 9, 1])
    with caplog.at_level(logging.INFO, logger="coffea_sonic.ragged"):
        assert call.plan(20) == [(0, 1, 0), (1, 2, 0), (2, 3, 0)]
    assert "1 event(s) over the request cap of 20 bytes (the first: event 1, 44 bytes)" in caplog.text


def test_an_event_over_grpcs_limit_is_refused():
    sig = signature(_info(inputs=(TensorInfo("x", "UINT8", (-1,)), XC)))
    rows = np.zeros(1, np.uint8)  # planning reads only the bytes of a row (1) and the counts
    most = HARD_REQUEST_LIMIT - 8  # rows of an event that just fits, with its 8-byte count
    for last, fails in ((most, False), (most + 1, True)):
        counts = np.array([1, last], np.int64)
        call = RaggedCall(sig, {"x": rows}, counts, np.concatenate([[0], np.cumsum(counts)]))
        if fails:
            with pytest.raises(InputValidationError, match=f"event 1 has {last} rows, "
                                                           f"{HARD_REQUEST_LIMIT + 1} bytes"):
                call.plan(1 << 20)
        else:
            assert call.plan(1 << 20) == [(0, 1, 0), (1, 2, 0)]


def test_one_request_per_event_in_tritons_own_format():
    triton = _info(inputs=(X,), ragged_inputs=("x",))
    assert _call([2, 0, 1], triton).plan(1 << 20) == [(0, 1, 0), (1, 2, 0), (2, 3, 0)]
    assert set(_call([2, 1], triton).tensors(0, 1)) == {"x"}


def test_requests_carry_the_groups_rows_and_counts_and_expect_matching_shapes():
    call = _call([2, 0, 3])
    request = call.tensors(1, 3)
    assert request["x"].tolist() == [[2.0, 3.0, 4.0]] and request["x__counts"].tolist() == [[0, 3]]
    assert [(t.name, t.dims) for t in call.request_outputs(1, 3)] == [("y", (1, 3)), ("e", (2, 1))]
    assert [(t.name, t.dims) for t in call.request_outputs(1, 2)] == [("y", (1, -1)), ("e", (1, 1))]


def test_answers_of_the_wrong_shape_are_refused_and_right_ones_cast():
    call = _call([2, 0, 3])
    good = {"y": np.arange(3, dtype=np.float16).reshape(1, 3), "e": np.zeros((2, 1), np.float32)}
    checked = call.check(1, 3, good, "a:1")
    assert checked["y"].dtype == np.float32 and checked["y"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(InferenceError, match="answer lacks outputs \\['e'\\]"):
        call.check(1, 3, {"y": good["y"]}, "a:1")
    for bad, message in (
            ({"y": np.zeros((1, 4)), "e": good["e"]}, "per-object output 'y' has shape \\[1, 4\\]"),
            ({"y": np.zeros(3), "e": good["e"]}, "expected \\[1, 3\\]"),
            ({"y": np.zeros((2, 3)), "e": good["e"]}, "per-object output 'y' has shape \\[2, 3\\]"),
            ({"y": good["y"], "e": np.zeros((3, 1))}, "per-event output 'e' has shape \\[3, 1\\] "
                                                      "for a group of 2 events with 3 rows; "
                                                      "expected \\[2, 1\\] \\(one row per event: 2 events\\)"),
            ({"y": good["y"], "e": np.zeros((2, 2))}, "per-event output 'e'")):
        with pytest.raises(InferenceError, match=message):
            call.check(1, 3, bad, "a:1")
    wide = _call([1], _info(outputs=(Y, TensorInfo("e", "FP32", (-1,)))))
    assert wide.check(0, 1, {"y": np.zeros((1, 1), np.float32),
                             "e": np.zeros((1, 7), np.float32)}, "a:1")["e"].shape == (1, 7)
    zero = _call([1], _info(outputs=(Y, TensorInfo("e", "FP32", (0,)))))
    with pytest.raises(InferenceError, match="expected \\[1, 0\\]"):
        zero.check(0, 1, {"y": np.zeros((1, 1), np.float32), "e": np.zeros((1, 1), np.float32)}, "a:1")


def test_groups_are_joined_in_event_order_and_split_back_per_event():
    call = _call([2, 0, 3])
    first = {"y": np.array([0.0, 1.0]), "e": np.array([[10.0]])}
    second = {"y": np.array([2.0, 3.0, 4.0]), "e": np.array([[11.0], [12.0]])}
    out = call.assemble([(0, 1), (1, 3)], [first, second])
    assert out["y"].tolist() == [0, 1, 2, 3, 4] and out["e"].ravel().tolist() == [10, 11, 12]
    events = call.split(out)
    assert [e["y"].tolist() for e in events] == [[0, 1], [], [2, 3, 4]]
    assert [e["e"].tolist() for e in events] == [[10], [11], [12]]
    whole = {"y": np.arange(5.0), "e": np.zeros((3, 1))}
    single = call.assemble([(0, 3)], [whole])
    single["y"][0] = 99.0
    assert whole["y"][0] == 0.0
    with pytest.raises(InferenceError, match="a group of events has no answer"):
        call.assemble([(0, 1), (1, 3)], [first, None])
    with pytest.raises(InferenceError, match="a group of events has no answer"):
        call.assemble([(0, 1), (1, 3)], [first])
    with pytest.raises(InferenceError, match="assembled 2 rows of output 'y', expected 5"):
        call.assemble([(0, 1)], [first])


def test_signatures_cannot_change_and_calls_compare_by_identity():
    import dataclasses

    sig = signature(_info())
    with pytest.raises(dataclasses.FrozenInstanceError):
        sig.counts = None  # type: ignore[misc]
    call = _call([1, 2])
    assert {call: 1}[call] == 1 and call != _call([1, 2])
    assert HARD_REQUEST_LIMIT == 2 ** 31 - 1 - 2 ** 20


def test_int64_counts_are_used_without_a_copy():
    counts = np.array([1, 2], np.int64)
    assert np.shares_memory(_call(counts).counts, counts)


def test_a_single_event_over_the_cap_is_one_group_and_one_at_the_cap_is_not_logged(caplog):
    assert _call([9]).plan(20) == [(0, 1, 0)]
    with caplog.at_level(logging.INFO, logger="coffea_sonic.ragged"):
        assert _call([1, 3, 1]).plan(20) == [(0, 1, 0), (1, 2, 0), (2, 3, 0)]
    assert "over the request cap" not in caplog.text


def test_empty_outputs_make_variable_dims_zero():
    call = _call([1], _info(outputs=(TensorInfo("y", "FP32", (-1, -1)), TensorInfo("e", "FP32", (-1, 2)))))
    out = call.empty_outputs()
    assert out["y"].shape == (0, 0) and out["e"].shape == (0, 0, 2)


def test_balanced_groups_cut_nearest_the_equal_shares():
    assert _call([4, 3, 1, 5, 0, 0, 0, 8, 0]).plan(120) == [(0, 4, 0), (4, 9, 0)]
    assert _call([1, 7, 8, 1, 2, 8, 6]).plan(55) == [(0, 2, 0), (2, 3, 0), (3, 5, 0), (5, 6, 0),
                                                     (6, 7, 0)]
    assert _call([8, 7, 8, 3, 1, 0, 1]).plan(25) == [(0, 1, 0), (1, 2, 0), (2, 3, 0), (3, 4, 0),
                                                     (4, 5, 0), (5, 7, 0)]


def test_a_ragged_call_applies_the_models_nonfinite_policy_to_its_rows():
    rows = np.array([1.0, np.nan, 3.0], np.float32)
    with pytest.raises(InputValidationError, match="input 'x': 1 NaN/inf values of 3 and "
                                                   "nonfinite='raise'"):
        RaggedCall.build(_info(), {"x": rows}, [2, 1], "raise")
    assert RaggedCall.build(_info(), {"x": rows}, [2, 1], "pass").rows == 3
