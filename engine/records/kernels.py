"""Compiled loops of the records codec (numba), for what no column trick in C can do.

A records section of values of mixed sizes must be walked record by record:
each record's position depends on the previous record's length varint.  In
Python that walk costs about 0.6 us per record (``_sized_walk``); compiled by
numba it costs 0.07 us, which takes the text view of mixed 40-200 byte values
from 3.7x the CPU per byte of uniform 100-byte values to about 1.2x (README,
"Mixed value sizes").  numba compiles each kernel on its first call and keeps
the machine code in ``__pycache__`` (``cache=True``): the first process pays
about 2 s once, every later one about 0.1 s to load it.

Kernels check every byte they rely on and answer -1 when anything differs from
what they expect; the caller then runs the general Python loop, which decodes
exactly as before and names what is wrong.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["uniform_text"]


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _varint(data: npt.NDArray[np.uint8], p: int, end: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """Kafka's zigzag varint at ``p``: (value, next position), or (0, -1) past ``end`` or beyond 5 bytes."""
    shift = 0
    raw = 0
    while True:
        if p >= end or shift > 28:
            return 0, -1
        b = data[p]
        p += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    return (raw >> 1) ^ -(raw & 1), p


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _uniform_text(data: npt.NDArray[np.uint8], count: int,
                  out: npt.NDArray[np.uint8]) -> int:  # pragma: no cover - compiled
    n = data.shape[0]
    p = 0
    o = 0
    for i in range(count):
        length, p = _varint(data, p, n)
        if p < 0 or length < 6 or p + length > n:
            return -1
        end = p + length
        if data[p] != 0 or data[p + 1] != 0:          # attributes, timestamp delta
            return -1
        delta, p = _varint(data, p + 2, end)
        if p < 0 or delta != i or p >= end or data[p] != 1:     # offset delta i, null key (varint -1)
            return -1
        vlen, p = _varint(data, p + 1, end)
        if p < 0 or vlen < 0 or p + vlen + 1 != end or data[end - 1] != 0:     # value, no headers
            return -1
        out[o:o + vlen] = data[p:p + vlen]
        o += vlen
        out[o] = 10
        o += 1
        p = end
    if p != n:
        return -1
    return o


def uniform_text(data: bytes, count: int) -> bytearray | None:
    """The text view (each value and ``\\n``) of ``count`` records in the layout ``encode_values`` writes
    without keys (any value sizes), or None when ``data`` is anything else.

    Every field is checked as the general decoder reads it: the record length
    (the record must end exactly there), attributes 0, timestamp delta 0, offset
    delta ``i``, a null key, a non-null value, no headers, and nothing after the
    last record.  The output is never longer than ``data`` (each record has at
    least five frame bytes and gains one newline).
    """
    out = bytearray(len(data))
    view = np.frombuffer(out, dtype=np.uint8)
    size = _uniform_text(np.frombuffer(data, dtype=np.uint8), count, view)
    del view                    # the bytearray can be resized once no array exports it
    if size < 0:
        return None
    del out[size:]
    return out
