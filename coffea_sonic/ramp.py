"""A lone caller's call over the wire starts and ends with small requests.

A call's requests go out one after another on one connection. The first request is on the wire
only once it is encoded (a 2 MB request takes this 2-core box ~6 ms: the link idles meanwhile),
and the call returns only once the server has run the last request and answered it (the same
again). So where this process is a server's only client over gRPC or HTTP, :func:`ramped` cuts
a call's first request into pieces that double from :data:`FIRST_BYTES` (each encoded while the
one before is on the wire) and its last request into pieces that halve down to it (the server's
work after the last byte is one small piece). Many processes sharing a server keep it busy
anyway: there every extra request's fixed cost counts, and calls keep their equal pieces.

>>> ramped([(0, 1000), (1000, 2000)], row_bytes=1024, first_bytes=128 * 1024)
[(0, 128), (128, 384), (384, 1000), (1000, 1616), (1616, 1872), (1872, 2000)]
>>> ramped([(0, 100)], row_bytes=64)   # one request: nothing to overlap
[(0, 100)]
"""

from __future__ import annotations

__all__ = ["FIRST_BYTES", "ramped"]

#: Bytes of the first (and last) request of a ramped call: encoded in well under 1 ms here, and
#: above the size where a request's fixed cost outweighs its bytes on a 1 Gb/s link.
FIRST_BYTES = 256 * 1024


def _doubling(rows: int, first: int) -> list[int]:
    """Piece sizes ``first, 2 first, 4 first, ...`` covering ``rows`` (the last takes the rest)."""
    sizes, size = [], first
    while rows > 0:
        if rows - size < size:  # the rest would be smaller than this piece: take it all
            size = rows
        sizes.append(size)
        rows -= size
        size *= 2
    return sizes


def ramped(plan: list[tuple[int, int]], row_bytes: int,
           first_bytes: int = FIRST_BYTES) -> list[tuple[int, int]]:
    """``plan`` (row spans ``(start, stop)``, one per request, in order) with its first span cut
    into doubling pieces from ``first_bytes`` and its last into halving pieces down to it; a plan
    of one span, or spans already this small, stays as it is."""
    if len(plan) < 2:
        return list(plan)
    first_rows = max(1, first_bytes // max(1, row_bytes))
    (start, stop), (last_start, last_stop) = plan[0], plan[-1]
    if stop - start < 2 * first_rows or last_stop - last_start < 2 * first_rows:
        return list(plan)
    head, position = [], start
    for size in _doubling(stop - start, first_rows):
        head.append((position, position + size))
        position += size
    tail, position = [], last_stop
    for size in _doubling(last_stop - last_start, first_rows):
        tail.append((position - size, position))
        position -= size
    return head + list(plan[1:-1]) + tail[::-1]
