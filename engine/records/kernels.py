"""Compiled loops of the records codec (numba), for what no column trick in C can do.

Two walks that Python cannot speed up with column tricks, because each
record's position depends on the previous record's length varint:

* ``uniform_text``: the text view of a batch of values of mixed sizes;
* ``key_columns``: the log cleaner's offset-map pass, the offset, key and
  tombstone flag of every record of a read chunk's batches;
* ``transactional_batches``: the walk for transaction markers
  (engine.transactions), which must see every batch header of a log.

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

from typing import NamedTuple

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["KeyColumns", "key_columns", "load", "transactional_batches", "uniform_text"]


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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _key_columns(buf: npt.NDArray[np.uint8], batches: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64],
                 key_starts: npt.NDArray[np.int64], key_lengths: npt.NDArray[np.int64],
                 null_values: npt.NDArray[np.bool_]) -> int:  # pragma: no cover - compiled
    r = 0
    for b in range(batches.shape[0]):
        p = batches[b, 0] + 61                  # past the batch header
        base = batches[b, 1]
        stop = batches[b, 0] + batches[b, 2] + 12
        if stop > buf.shape[0]:
            return -1 - b
        for _ in range(batches[b, 3]):
            length, p = _varint(buf, p, stop)
            if p < 0 or length < 0 or p + length > stop:
                return -1 - b
            end = p + length
            p += 1                              # attributes
            while p < end and buf[p] >= 0x80:   # timestamp delta (a varlong): not needed
                p += 1
            delta, p = _varint(buf, p + 1, end)
            if p < 0:
                return -1 - b
            offsets[r] = base + delta
            key_length, p = _varint(buf, p, end)
            if p < 0 or key_length < -1 or p + max(key_length, 0) >= end:
                return -1 - b
            key_starts[r] = p
            key_lengths[r] = key_length
            if key_length > 0:
                p += key_length
            null_values[r] = buf[p] == 1        # value length -1: a tombstone
            p = end
            r += 1
        if p != stop:
            return -1 - b
    return r


class KeyColumns(NamedTuple):
    """The cleaner's view of the records of some batches: parallel arrays, one entry per record."""

    offsets: npt.NDArray[np.int64]
    key_starts: npt.NDArray[np.int64]      # position of the key in the buffer
    key_lengths: npt.NDArray[np.int64]     # -1: a null key
    null_values: npt.NDArray[np.bool_]     # tombstones


def key_columns(buf: bytes, batches: npt.NDArray[np.int64], records: int) -> KeyColumns | None:
    """Offsets, key positions and tombstones of every record of uncompressed data batches, in one call.

    ``batches`` holds one row per batch: (position in ``buf``, base offset,
    batch length, record count); ``records`` is the sum of the counts.  Each
    record is read as ``engine.records.decode.decode_key_columns`` reads it
    (its length must hold its fields and the batch must end with its last
    record); None when any batch is malformed: the caller's Python loop then
    says which and why.
    """
    offsets = np.empty(records, dtype=np.int64)
    key_starts = np.empty(records, dtype=np.int64)
    key_lengths = np.empty(records, dtype=np.int64)
    null_values = np.empty(records, dtype=np.bool_)
    done = _key_columns(np.frombuffer(buf, dtype=np.uint8), batches, offsets, key_starts, key_lengths,
                        null_values)
    if done != records:
        return None
    return KeyColumns(offsets, key_starts, key_lengths, null_values)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _transactional_batches(buf: npt.NDArray[np.uint8],
                           found: npt.NDArray[np.int64]) -> tuple[int, int, int]:  # pragma: no cover - compiled
    n = buf.shape[0]
    p = 0
    last = -1
    count = 0
    while p + 61 <= n:
        length = int((np.int64(buf[p + 8]) << 24) | (np.int64(buf[p + 9]) << 16) | (np.int64(buf[p + 10]) << 8)
                     | np.int64(buf[p + 11]))
        if length < 49 or p + 12 + length > n:          # shorter than a v2 header, or not whole here
            break
        if buf[p + 22] & 0x10:                           # attributes (int16 at 21): transactional
            found[count] = p
            count += 1
        last = p
        p += 12 + length
    return count, last, p


def transactional_batches(buf: bytes) -> tuple[list[int], int, int]:
    """A header-only walk of the whole batches at the front of ``buf``, as ``iter_batches`` frames them.

    Returns (positions of transactional batches, position of the last whole
    batch or -1, position after it).  What is left after it (a batch that does
    not fit, a torn or damaged length) is for the caller's own walk.
    """
    found = np.empty(len(buf) // 61 + 1, dtype=np.int64)
    count, last, end = _transactional_batches(np.frombuffer(buf, dtype=np.uint8), found)
    return found[:count].tolist(), last, end


def load() -> None:
    """Compile (the first time) or load from ``__pycache__`` every kernel of this module, on empty input:
    ``scripts/setup.sh`` does it at install, the benchmarks before they time anything."""
    uniform_text(b"", 0)
    key_columns(b"", np.zeros((0, 5), dtype=np.int64), 0)
    transactional_batches(b"")
