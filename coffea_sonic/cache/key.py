"""Cache keys: content-defined blocks and their hashes (how: docs/internals/caches.md)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import xxhash

__all__ = ["aim_rows", "block_key", "call_key", "content_blocks", "row_fingerprints"]

#: bytes of each input's row that decide where blocks end (the block key covers all bytes)
FINGERPRINT_BYTES = 64
#: a block's input bytes aimed at: small enough that a new chunk edge loses little, large
#: enough that a chunk is a few dozen files, not thousands
TARGET_BLOCK_BYTES = 32 * 1024
MIN_TARGET_ROWS = 64
MAX_TARGET_ROWS = 4096
_MULTIPLIERS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                         0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53,
                         0x94D049BB133111EB, 0xBF58476D1CE4E5B9], dtype=np.uint64)


def aim_rows(arrays: Mapping[str, np.ndarray], rows: int) -> int:
    """Rows per block aimed at: a power of two near ``TARGET_BLOCK_BYTES`` of input.

    >>> aim_rows({"x": np.zeros((10, 6), np.float32)}, 10)
    1024
    """
    row_bytes = sum(array.nbytes for array in arrays.values()) / max(rows, 1)
    wanted = TARGET_BLOCK_BYTES / max(row_bytes, 1.0)
    power = 1 << max(int(wanted).bit_length() - 1, 0)
    return int(min(max(power, MIN_TARGET_ROWS), MAX_TARGET_ROWS))


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64s (wrapping arithmetic)."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def row_fingerprints(arrays: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """One uint64 per row from the first ``FINGERPRINT_BYTES`` of each input's row."""
    total = np.zeros(rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for index, name in enumerate(sorted(arrays)):
            flat = np.ascontiguousarray(arrays[name]).reshape(rows, -1).view(np.uint8)
            head = flat[:, :FINGERPRINT_BYTES]
            if head.shape[1] % 8:
                head = np.pad(head, ((0, 0), (0, 8 - head.shape[1] % 8)))
            words = np.ascontiguousarray(head).view(np.uint64)
            mixed = (words * _MULTIPLIERS[: words.shape[1]]).sum(axis=1, dtype=np.uint64)
            total = _mix(total ^ _mix(mixed + np.uint64(index + 1)))
    return total


def content_blocks(arrays: Mapping[str, np.ndarray], rows: int, *,
                   target_rows: int | None = None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``rows``: blocks ended by the rows' content (the rule:
    docs/internals/caches.md)."""
    if rows == 0:
        return []
    target = target_rows or aim_rows(arrays, rows)
    low, high = max(target // 16, 1), target * 8
    mask = np.uint64(target - 1)
    candidates = np.flatnonzero((row_fingerprints(arrays, rows) & mask) == 0) + 1
    blocks: list[tuple[int, int]] = []
    start = 0
    for cut in candidates.tolist():
        while cut - start > high:
            blocks.append((start, start + high))
            start += high
        if cut - start >= low:
            blocks.append((start, cut))
            start = cut
    while rows - start > high:
        blocks.append((start, start + high))
        start += high
    if start < rows:
        blocks.append((start, rows))
    return blocks


def block_key(arrays: Mapping[str, np.ndarray], start: int, stop: int,
              extra: bytes = b"") -> str:
    """32 hex digits over every input's name, dtype, per-row shape and rows ``start:stop``."""
    digest = xxhash.xxh3_128()
    digest.update(extra)
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name][start:stop])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape[1:]}\0{stop - start}\0".encode())
        digest.update(memoryview(array).cast("B") if array.size else b"")
    return digest.hexdigest()


def call_key(arrays: Mapping[str, np.ndarray], counts: np.ndarray | None) -> str:
    """The key of a whole call (ragged calls, models without batching): inputs and counts.

    >>> call_key({"x": np.ones((3, 2))}, np.array([1, 2])) != call_key({"x": np.ones((3, 2))}, None)
    True
    """
    digest = xxhash.xxh3_128()
    if counts is not None:
        digest.update(b"counts\0" + np.ascontiguousarray(counts, dtype=np.int64).tobytes())
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(memoryview(array).cast("B") if array.size else b"")  # no cast of 0 bytes
    return digest.hexdigest()
