"""Edges of the inference cache's keys (coffea_sonic.cache.key): pure, in-process.

Keys name files of a cache kept across runs and releases, so the same rows must give the same
blocks and keys every time: a changed key silently throws every user's cache away. The pinned
values below are what this version computes.
"""
from __future__ import annotations

import numpy as np

from coffea_sonic.cache.key import (MAX_TARGET_ROWS, MIN_TARGET_ROWS, aim_rows, block_key,
                                    call_key, content_blocks, row_fingerprints)


def _inputs(rows: int = 2000) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows * 3, dtype=np.float32).reshape(-1, 3),
            "y": (np.arange(rows, dtype=np.int64) * 7919) % 1000}


def test_fingerprints_and_keys_are_the_same_in_every_release():
    arrays = _inputs()
    assert row_fingerprints(arrays, 2000)[:4].tolist() == [
        3825900004491892757, 8235792604288970255, 7084476001799338304, 9472990620055830350]
    assert row_fingerprints({"b": np.arange(5, dtype=np.uint8)}, 5).tolist() == [
        8841707400507832957, 15916886550466581944, 18151660869741957452, 8593126688665306010,
        8547223582060069590]
    assert block_key(arrays, 0, 10) == "703c57d70756b6fc13b96f9e09f6dcb8"
    assert block_key(arrays, 0, 10, b"v1") == "3cbbcfcc9dc4da2a672f03998a0dc69c"
    assert call_key(arrays, None) == "4d73fa294332a510a30ff36f91a21965"
    assert call_key(arrays, np.array([1, 2])) == "b18afbbbaf415f9faa9303df47376dca"
    assert call_key({"s": np.array(3.0)}, None) == "78f2c6e972d101b2ce7674290ddfda77"


def test_blocks_are_cut_where_the_content_says_and_no_shorter_than_the_minimum():
    blocks = content_blocks(_inputs(), 2000, target_rows=64)
    assert blocks[:8] == [(0, 75), (75, 95), (95, 120), (120, 279), (279, 283), (283, 299),
                          (299, 485), (485, 543)]
    assert len(blocks) == 26 and blocks[-1][1] == 2000
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert min(stop - start for start, stop in blocks[:-1]) == 64 // 16


def test_runs_of_identical_rows_make_blocks_of_the_minimum_or_maximum_length():
    for value in range(40):
        same = {"x": np.full((1000, 2), value, np.float32)}
        blocks = content_blocks(same, 1000, target_rows=16)
        lengths = {stop - start for start, stop in blocks[:-1]}
        assert lengths in ({1}, {128}), (value, lengths)
        assert blocks[0][0] == 0 and blocks[-1][1] == 1000
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    seen = {frozenset(stop - start for start, stop in content_blocks(
        {"x": np.full((1000, 2), v, np.float32)}, 1000, target_rows=16)[:-1]) for v in range(40)}
    assert seen == {frozenset({1}), frozenset({128})}


def test_no_rows_give_no_blocks_and_a_short_call_gives_one():
    assert content_blocks({"x": np.zeros((0, 2))}, 0) == []
    assert content_blocks({"x": np.zeros((1, 2))}, 1, target_rows=64) == [(0, 1)]


def test_aimed_rows_are_a_power_of_two_within_their_bounds():
    assert aim_rows(_inputs(), 2000) == 1024
    assert aim_rows({"x": np.zeros((1, 1), np.uint8)}, 1) == MAX_TARGET_ROWS == 4096
    assert aim_rows({"x": np.zeros((2, 100_000), np.uint8)}, 2) == MIN_TARGET_ROWS == 64
    assert aim_rows({}, 0) == 4096
    assert aim_rows({"x": np.zeros((4, 100), np.uint8)}, 4) == 256
    assert aim_rows({"x": np.zeros((4, 1000), np.uint8)}, 4) == 64


def test_a_key_tells_apart_names_dtypes_shapes_rows_and_counts():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    base = block_key({"x": x}, 0, 2)
    assert block_key({"x": x}, 0, 2) == base
    assert block_key({"z": x}, 0, 2) != base
    assert block_key({"x": x.astype(np.float64)}, 0, 2) != base
    assert block_key({"x": x.reshape(4, 3, 1)}, 0, 2) != base
    assert block_key({"x": x}, 1, 3) != base
    assert block_key({"x": np.zeros((0, 3))}, 0, 0) == block_key({"x": np.zeros((0, 3))}, 0, 0)
    assert call_key({"x": x}, np.array([1, 3])) != call_key({"x": x}, np.array([2, 2]))


def test_fingerprints_read_the_first_64_bytes_of_wide_and_odd_rows():
    wide = np.arange(5 * 20, dtype=np.float32).reshape(5, 20)  # 80 bytes a row: 8 words used
    assert row_fingerprints({"w": wide}, 5).tolist() == [
        12200107093641328230, 6540965207303376295, 16918268901408182229, 1201576777680884186,
        3402711593192995628]
    odd = np.arange(45, dtype=np.uint8).reshape(5, 9)  # 9 bytes a row: padded to 16
    assert row_fingerprints({"n": odd}, 5).tolist() == [
        14767814682479719328, 2983868618111990420, 8262149702890922767, 5362562321300795020,
        1742229145905988897]
    assert block_key(_inputs(), 1, 11) == "cbe4b1cec926bacdc30ddbcb0c32b83c"


def test_block_size_aims_at_32_kib_of_input():
    from coffea_sonic.cache.key import TARGET_BLOCK_BYTES
    assert TARGET_BLOCK_BYTES == 32 * 1024
    # 64.05 bytes a row: 511.6 rows make 32 KiB, so the power of two below is 256
    assert aim_rows({"x": np.zeros((1, 6405), np.uint8)}, 100) == 256
    assert aim_rows({"x": np.zeros((1, 256), np.uint8)}, 0) == 128


def test_a_long_run_without_cuts_is_split_at_the_maximum_before_the_next_cut():
    # fingerprints of rows of 0.0 never end a block at target 16; rows of 9.0 do
    rows = np.array([0.0] * 200 + [9.0] + [0.0] * 50, np.float32).repeat(2).reshape(-1, 2)
    assert content_blocks({"x": rows}, 251, target_rows=16) == [(0, 128), (128, 201), (201, 251)]


def test_the_minimum_block_is_a_whole_number_of_rows_and_blocks_are_never_empty():
    same = {"x": np.full((10, 2), 209.0, np.float32)}  # every row is a cut at target 40
    assert content_blocks(same, 10, target_rows=40) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    for value in range(40):
        blocks = content_blocks({"x": np.full((1000, 2), value, np.float32)}, 1000, target_rows=16)
        assert all(stop > start for start, stop in blocks)


def test_a_long_run_without_a_content_cut_is_split_at_the_largest_block_before_the_cut():
    from coffea_sonic.cache.key import content_blocks, row_fingerprints

    def row_whose_fingerprint_cuts(cuts: bool) -> np.ndarray:
        for value in range(1, 10_000):
            row = {"x": np.full((1, 3), value, np.float32)}
            if (int(row_fingerprints(row, 1)[0]) & 15 == 0) == cuts:
                return row["x"]
        raise AssertionError("no such row")

    plain, cutting = row_whose_fingerprint_cuts(False), row_whose_fingerprint_cuts(True)
    x = np.concatenate([np.repeat(plain, 400, axis=0), cutting, np.repeat(plain, 20, axis=0)])
    blocks = content_blocks({"x": x}, len(x), target_rows=16)  # blocks at most 128 rows
    assert blocks == [(0, 128), (128, 256), (256, 384), (384, 401), (401, 421)]
