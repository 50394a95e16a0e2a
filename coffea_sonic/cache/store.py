"""One cache entry on disk, checked when read (format: docs/internals/caches.md)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import struct
import threading
from pathlib import Path
from typing import Mapping

import numpy as np
import xxhash

__all__ = ["ENTRY_SUFFIX", "MAGIC", "TEMP_PREFIX", "CorruptEntry", "decode_entry", "read_entry",
           "write_entry"]

logger = logging.getLogger(__name__)

MAGIC = b"CSONIC1\n"
ENTRY_SUFFIX = ".out"
TEMP_PREFIX = ".tmp-"
_LENGTH = struct.Struct("<I")
_HOST = socket.gethostname().replace("/", "_")[:40]


class CorruptEntry(ValueError):
    """An entry whose bytes do not match its header (short, torn or altered)."""


def _encode(outputs: Mapping[str, np.ndarray]) -> tuple[bytes, list[memoryview]]:
    arrays = {name: np.ascontiguousarray(array) for name, array in outputs.items()}
    digest = xxhash.xxh3_128()
    views = []
    for array in arrays.values():
        view = memoryview(array).cast("B") if array.size else memoryview(b"")
        digest.update(view)
        views.append(view)
    header = json.dumps({
        "outputs": [[name, array.dtype.str, list(array.shape)] for name, array in arrays.items()],
        "payload": sum(len(view) for view in views),
        "xxh3_128": digest.hexdigest(),
    }).encode()
    return MAGIC + _LENGTH.pack(len(header)) + header, views


def write_entry(path: Path, outputs: Mapping[str, np.ndarray]) -> int:
    """Write ``outputs`` atomically to ``path`` (parents made); returns the file's size."""
    head, views = _encode(outputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.parent / (f"{TEMP_PREFIX}{path.name}.{_HOST}.{os.getpid()}."
                          f"{threading.get_ident()}.{secrets.token_hex(4)}")
    try:
        with open(temp, "wb") as handle:
            handle.write(head)
            for view in views:
                handle.write(view)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return len(head) + sum(len(view) for view in views)


def decode_entry(data: bytes) -> dict[str, np.ndarray]:
    """The outputs held by an entry's bytes; ``CorruptEntry`` if they do not check out."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LENGTH.size:
        raise CorruptEntry("not a coffea-sonic cache entry (bad magic or too short)")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    try:
        header = json.loads(data[start:start + length])
        specs, payload_size, checksum = header["outputs"], header["payload"], header["xxh3_128"]
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptEntry(f"unreadable header ({error})") from None
    payload = memoryview(data)[start + length:]
    if len(payload) != payload_size:
        raise CorruptEntry(f"payload of {len(payload)} bytes, header says {payload_size}")
    if xxhash.xxh3_128(payload).hexdigest() != checksum:
        raise CorruptEntry("payload checksum differs from the header's")
    outputs: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype_text, shape in specs:
        dtype = np.dtype(dtype_text)
        count = int(np.prod(shape, dtype=np.int64))
        outputs[name] = np.frombuffer(payload, dtype=dtype, count=count,
                                      offset=offset).reshape(shape)
        offset += count * dtype.itemsize
    if offset != payload_size:
        raise CorruptEntry(f"outputs take {offset} bytes of a {payload_size}-byte payload")
    return outputs


def read_entry(path: Path) -> tuple[dict[str, np.ndarray] | None, bool]:
    """The entry's outputs (read-only arrays) or None if absent, and whether it was corrupt
    (then it is deleted, logged, and reads as absent)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except (FileNotFoundError, NotADirectoryError):
        return None, False
    except OSError as error:  # e.g. ESTALE on NFS after another client evicted it
        logger.info("coffea-sonic cache: cannot read %s (%s); treated as a miss", path, error)
        return None, False
    try:
        return decode_entry(data), False
    except CorruptEntry as error:
        logger.warning("coffea-sonic cache: %s is corrupt (%s); removed, the rows are recomputed",
                       path, error)
        with contextlib.suppress(OSError):
            path.unlink()
        return None, True
