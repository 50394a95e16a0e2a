"""Cache keys of calls with no bytes and of counts in any integer type (coffea_sonic.cache.key).

Pure, in-process tests written for survivors of the mutmut run (scripts/mutmut_run.py). Keys name
files of a cache kept across runs and releases (tests/test_cache_key_edges.py pins them), so the
values below are what this version computes.
"""
from __future__ import annotations

import numpy as np

from coffea_sonic.cache.disk import InferenceCache
from coffea_sonic.cache.key import block_key, call_key, row_fingerprints
from coffea_sonic.cache.lookup import plan_call
from coffea_sonic.core.tensors import ModelInfo, TensorInfo


def test_a_call_whose_events_have_no_rows_has_a_key_of_its_own():
    empty = {"x": np.zeros((0, 3), np.float32)}
    assert call_key(empty, np.array([0, 0])) == "8b9d05e9969dfe75fcdb6c792b673b15"
    assert call_key(empty, np.array([0])) != call_key(empty, np.array([0, 0]))
    assert call_key({"x": np.array(5.0)}, None) == "3d08c129718f8831852c61d4b7fb60d5"


def test_a_ragged_call_of_empty_events_is_looked_up_in_the_cache(tmp_path):
    info = ModelInfo("m", ("1",), "python", 8, (TensorInfo("x", "FP32", (-1, 3)),),
                     (TensorInfo("y", "FP32", (-1,)),), ragged_inputs=("x",),
                     ragged_outputs=("y",))
    plan = plan_call(InferenceCache(tmp_path), info, "1", {"x": np.zeros((0, 3), np.float32)}, 2,
                     np.array([0, 0]))
    assert plan.keys == ["8b9d05e9969dfe75fcdb6c792b673b15"] and plan.missing == [0]


def test_counts_give_the_same_key_in_any_integer_type():
    arrays = {"x": np.ones((3, 2), np.float32)}
    keys = {call_key(arrays, counts) for counts in
            ([1, 2], np.array([1, 2], np.int32), np.array([1, 2], np.uint16),
             np.array([1, 2], np.int64))}
    assert keys == {"2c5fbb025704343ccb15d7005b30aa89"}


def test_a_block_of_no_bytes_has_the_same_key_in_every_release():
    arrays = {"x": np.zeros((4, 3), np.float32)}
    assert block_key(arrays, 2, 2) == "ddf24ae2a67c9c8f39be5eecb86c235f"
    assert block_key({"x": np.zeros((4, 0), np.float32)}, 0, 4) == (
        "5c9c5e1c69f922f2a923a9d27dbec0fd")


def test_rows_without_inputs_still_get_one_fingerprint_each():
    assert row_fingerprints({}, 3).tolist() == [0, 0, 0]
