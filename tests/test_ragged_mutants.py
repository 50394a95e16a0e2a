"""What a user reads from ragged calls, word for word, and what a request declares
(coffea_sonic.ragged).

Pure, in-process tests written for survivors of the mutmut run (scripts/mutmut_run.py): every
refusal names the model and says the fix in full, a misaligned or mistyped answer is refused
naming model, source, shape and type, and a request's expected outputs keep their datatypes.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.errors import InferenceError, InputValidationError
from coffea_sonic.ragged import HARD_REQUEST_LIMIT, RaggedCall, check_plain_call, signature

X = TensorInfo("x", "FP32", (-1,))
XC = TensorInfo("x__counts", "INT64", (-1,))
Y = TensorInfo("y", "FP32", (-1, -1))  # per object: a free number of values per row
E = TensorInfo("e", "INT32", (1,))

HELP = ("a ragged model declares max_batch_size >= 1, inputs 'x' (dims [-1, ...], "
        "allow_ragged_batch: true) and 'x__counts' (TYPE_INT64, dims [-1], allow_ragged_batch: "
        "true), and its per-object outputs in a batch_output of kind "
        "BATCH_SCATTER_WITH_INPUT_SHAPE (coffea_sonic.ragged; "
        "coffea_sonic.server.repository.ragged_model_config writes one)")


def _info(inputs=(X, XC), ragged_inputs=("x", "x__counts"), max_batch_size: int = 8,
          name: str = "mm_ragged") -> ModelInfo:
    return ModelInfo(name, ("1",), "python", max_batch_size, tuple(inputs), (Y, E),
                     ragged_inputs=tuple(ragged_inputs), ragged_outputs=("y",))


def _message(raising, *args) -> str:
    with pytest.raises((InputValidationError, InferenceError)) as raised:
        raising(*args)
    return str(raised.value)


def test_a_model_without_batching_is_refused_with_the_whole_declaration_to_write():
    assert _message(signature, _info(max_batch_size=0)) == (
        "model 'mm_ragged' cannot take ragged calls: expected max_batch_size >= 1, it declares 0 "
        f"(no batching); {HELP}")


def test_a_model_without_ragged_inputs_is_told_to_send_padded_rows():
    info = _info(ragged_inputs=("x__counts",))
    assert _message(signature, info) == (
        f"model 'mm_ragged' declares no ragged input (inputs {[t.describe() for t in info.inputs]}, "
        f"none with allow_ragged_batch: true besides counts); expected {HELP}. Send padded rows "
        "without counts/ragged instead")


def test_an_input_that_is_not_ragged_is_refused_with_both_ways_out():
    info = _info(inputs=(X, XC, TensorInfo("w", "FP32", (1,))))
    assert _message(signature, info) == (
        "model 'mm_ragged': a ragged call sends only ragged inputs and their counts, but the model "
        "also declares ['w'] (not allow_ragged_batch); declare them ragged (per-object rows) or "
        "call the model without counts/ragged")


def test_a_call_without_counts_is_told_how_to_give_them():
    assert _message(check_plain_call, _info(), {"x": np.zeros(3, np.float32)}) == (
        "model 'mm_ragged' takes ragged inputs ['x'] with per-event counts ['x__counts']: call "
        "model(inputs, counts=rows_per_event) (self.infer(..., ragged=True) in a processor); see "
        "coffea_sonic.ragged")


def test_counts_that_do_not_add_up_are_refused_naming_the_model():
    assert _message(RaggedCall.build, _info(), {"x": np.zeros(4, np.float32)}, [1, 2]) == (
        "model 'mm_ragged' input 'x__counts': the counts of 2 events sum to 3 rows but 'x' has 4; "
        "expected counts that sum to the rows given (one entry per event, in row order)")


def test_rows_of_the_wrong_rank_are_refused_naming_the_model():
    assert _message(RaggedCall.build, _info(), {"x": np.zeros((3, 2), np.float32)}, [3]) == (
        "model 'mm_ragged' input 'x': expected rank 1 [N], got rank 2 shape [3, 2]")


def test_an_event_over_the_cap_is_logged_naming_the_model(caplog):
    call = RaggedCall.build(_info(), {"x": np.zeros(11, np.float32)}, [1, 9, 1])
    with caplog.at_level(logging.INFO, logger="coffea_sonic.ragged"):
        assert call.plan(20) == [(0, 1, 0), (1, 2, 0), (2, 3, 0)]
    assert [r.getMessage() for r in caplog.records] == [
        "coffea-sonic: mm_ragged: 1 event(s) over the request cap of 20 bytes (the first: event "
        "1, 44 bytes) are sent alone"]


def test_an_event_over_grpcs_limit_is_refused_with_what_to_do():
    sig = signature(_info(inputs=(TensorInfo("x", "UINT8", (-1,)), XC)))
    counts = np.array([HARD_REQUEST_LIMIT], np.int64)  # planning reads a row's bytes and counts
    call = RaggedCall(sig, {"x": np.zeros(1, np.uint8)}, counts, np.array([0, counts[0]]))
    assert _message(call.plan, 1 << 20) == (
        f"model 'mm_ragged': event 0 has {HARD_REQUEST_LIMIT} rows, {HARD_REQUEST_LIMIT + 8} "
        f"bytes; expected at most {HARD_REQUEST_LIMIT} bytes per event (gRPC's 2 GiB message "
        "limit), and an event is never split across requests. Split or thin the event")


def test_a_requests_expected_outputs_keep_their_datatypes():
    call = RaggedCall.build(_info(), {"x": np.zeros(3, np.float32)}, [1, 2])
    assert [(t.name, t.datatype, t.dims) for t in call.request_outputs(0, 2)] == [
        ("y", "FP32", (1, 3, -1)), ("e", "INT32", (2, 1))]


def test_misaligned_answers_are_refused_saying_what_was_expected():
    call = RaggedCall.build(_info(), {"x": np.zeros(3, np.float32)}, [1, 2])
    good_e = np.zeros((2, 1), np.int32)
    assert _message(call.check, 0, 2, {"y": np.zeros((1, 2, 4), np.float32), "e": good_e},
                    "S") == (
        "model 'mm_ragged' at S: per-object output 'y' has shape [1, 2, 4] for a group of 2 events "
        "with 3 rows; expected [1, 3, '*'] (one row per object: 3 rows); refusing misaligned "
        "outputs")
    assert _message(call.check, 0, 2, {"y": np.zeros((1, 3, 4), np.float32),
                                       "e": np.zeros((3, 1), np.int32)}, "S") == (
        "model 'mm_ragged' at S: per-event output 'e' has shape [3, 1] for a group of 2 events "
        "with 3 rows; expected [2, 1] (one row per event: 2 events); refusing misaligned outputs")


def test_an_answer_of_an_unsafe_type_is_refused_naming_model_and_source():
    call = RaggedCall.build(_info(), {"x": np.zeros(3, np.float32)}, [1, 2])
    assert _message(call.check, 0, 2, {"y": np.zeros((1, 3, 4), np.float64),
                                       "e": np.zeros((2, 1), np.int32)}, "server S") == (
        "model 'mm_ragged' output 'y': server S gave float64, the model declares float32")


def test_planning_groups_of_events_raises_no_numpy_warning():
    call = RaggedCall.build(_info(), {"x": np.zeros(40, np.float32)}, [1, 9, 3, 7, 2, 8, 4, 6])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy deprecates a search side spelled other than exactly
        groups = call.plan(64)
    assert groups == [(0, 2, 0), (2, 4, 0), (4, 6, 0), (6, 8, 0)]  # 56 bytes each
