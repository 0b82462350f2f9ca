"""The decode fast path: proving a records section has the layout ``encode_values`` writes.

Hot path, inlined on purpose: the column checks run as extended slices in C
and the variable-size walk inlines its one- and two-byte varints, because a
Python call per record costs more than the rest of the record.  Whatever fails
the proof is handed back (records taken, position) to the general loop in
:mod:`engine.records.decode`, so every batch decodes exactly as that loop
decodes it.
"""

from __future__ import annotations

import functools
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.records.encode import _encode_unkeyed
from engine.records.varint import _PREFIX_NULL_KEY, _TABLE_SIZE, _VARINT, _VARINT_LEN, _read_varint

# --- the uniform layout: batches written by encode_values without keys ----------------
#
# Every record of such a batch is
#     varint(L) | 00 attributes | 00 timestamp delta | varint(i) offset delta |
#     01 null key | varint(vlen) | value | 00 header count
# so everything but the value is a function of (i, vlen), and vlen a function of
# L once the width w of varint(i) is known.  Records i < 64, < 8192 and < 65536
# have w = 1, 2 and 3; the decoder handles each of those ranges as one segment.
# A segment whose records all have the same size (fixed-width lines: the common
# case of a bulk load) is verified column by column with extended slices, all in
# C; any other segment is walked record by record, checking each record's framing
# bytes against the tables.  Whatever fails a check is left to the general loop,
# which resumes at that record, so the result is the general path's, bytes for
# bytes, or the general path's CorruptRecordError.

_WIDTH_RANGES = ((0, 64, 1), (64, 8192, 2), (8192, _TABLE_SIZE, 3))


def _value_length_table() -> list[int | None]:
    """``L - w`` -> vlen for a null-keyed record with a non-null value and no headers.

    L = 4 + w + len(varint(vlen)) + vlen (the four one-byte fields: attributes,
    timestamp delta, null key, header count).  Lengths no such record can have
    map to None, which makes the walk's arithmetic fail over to the general loop;
    so do the last entries, reached by the negative index of a too-short record.
    """
    table: list[int | None] = [None] * _TABLE_SIZE
    table[5:69] = range(64)
    table[70:8198] = range(64, 8192)
    table[8199:_TABLE_SIZE - 8] = range(8192, _TABLE_SIZE - 8 - 7)
    return table


_VALUE_LENGTH = _value_length_table()
#: _OFFSET_DELTA_COLUMNS[w][t]: byte t of varint(i) for every i of width w, in
#: order: what the column of that byte must hold in a fixed-size segment.
_OFFSET_DELTA_COLUMNS = {
    w: [bytes(map(itemgetter(t), _VARINT[lo:hi])) for t in range(w)] for lo, hi, w in _WIDTH_RANGES
}


@functools.lru_cache(maxsize=8)
def _expected_frames(frame: bytes, delta_first: int, lo: int, count: int, w: int) -> npt.NDArray[np.uint8]:
    """The frames of records lo..lo+count-1 of one size as encode_values writes them, one per row.

    Every row is ``frame`` except the offset delta's ``w`` bytes from
    ``delta_first``, which count up from ``lo``.  Cached: the batches of a
    partition written with one line size share their frames.
    """
    expected = np.frombuffer(frame * count, np.uint8).reshape(count, len(frame)).copy()
    for t, column in enumerate(_OFFSET_DELTA_COLUMNS[w]):     # segments start where their width does
        expected[:, delta_first + t] = np.frombuffer(column, np.uint8, count)
    expected.flags.writeable = False
    return expected


def _fixed_size_segment(data: bytes, p: int, lo: int, stop: int, w: int) -> tuple[int, int, int] | None:
    """(record size, frame size, value size) if records lo..stop-1 from ``p`` are one size and verified.

    The first record fixes the size; then the frames of all records (the
    records as the rows of a matrix, compared at once) must equal what
    encode_values writes: the same bytes in every record, except the offset
    delta's, which must count up from ``lo``; and every header count must be 0.
    None when anything differs.
    """
    try:
        length, q = _read_varint(data, p)
    except (IndexError, ValueError):        # the general loop says what is wrong
        return None
    if not 0 <= length < _TABLE_SIZE:
        return None
    value_len = _VALUE_LENGTH[length - w]
    if value_len is None:
        return None
    size = q - p + length
    count = stop - lo
    end = p + count * size
    if end > len(data):
        return None
    length_len = q - p
    frame = _VARINT[length] + _PREFIX_NULL_KEY[lo] + _VARINT[value_len]
    frame_len = len(frame)
    if data[p:p + frame_len] != frame or data[p + size - 1] != 0:
        return None
    if count == 1:
        return size, frame_len, value_len
    rows = np.frombuffer(data, np.uint8, count * size, p).reshape(count, size)
    if not np.array_equal(rows[:, :frame_len], _expected_frames(frame, length_len + 2, lo, count, w)):
        return None
    if rows[:, -1].any():           # header counts
        return None
    return size, frame_len, value_len


def _value_length_by_size_table(w: int) -> list[int | None]:
    """Record size T (length varint included) -> vlen, for offset-delta width ``w``.

    The variable-size walk uses it to find a value from the two ends of its
    record without reading the value's own length.  The last entries stay None,
    for the negative index a garbage length can produce.
    """
    table: list[int | None] = [None] * (_TABLE_SIZE + 8)
    for value_len in range(_TABLE_SIZE - 16):
        length = 4 + w + _VARINT_LEN[value_len] + value_len
        table[_VARINT_LEN[length] + length] = value_len
    return table


#: offset-delta width -> its table, built on first use (not at import: docs/performance.md, "Figures behind the code")
_VALUE_LENGTH_BY_SIZE: dict[int, list[int | None]] = {}


def _sized_walk(data: bytes, count: int) -> list[bytes] | None:
    """The values of a uniform-layout section of records of any sizes, or None.

    The walk reads only each record's length and takes the value as the bytes
    before the record's last one (the header count), sized by the table; it
    checks nothing on the way.  The proof comes after, in C: encoding the values
    again must give ``data`` byte for byte.  When it does, ``data`` is exactly
    what encode_values writes for these values, which every decoder reads back
    as them; when it does not (another writer, a null, a corrupt length), the
    caller runs the general loop, which also says what is wrong.
    """
    if count > _TABLE_SIZE:
        return None
    values: list[bytes] = []
    append = values.append
    p = 0
    try:
        for lo, hi, w in _WIDTH_RANGES:
            if lo >= count:
                break
            by_size = _VALUE_LENGTH_BY_SIZE.get(w)
            if by_size is None:
                by_size = _VALUE_LENGTH_BY_SIZE[w] = _value_length_by_size_table(w)
            for _ in range((hi if hi < count else count) - lo):
                b = data[p]
                e = p + 1 + (b >> 1) if b < 0x80 else p + 2 + (((b & 0x7F) | (data[p + 1] << 7)) >> 1)
                # A size no such record has maps to None: TypeError, caught below.
                append(data[e - 1 - by_size[e - p]:e - 1])  # type: ignore[operator]
                p = e
        if p != len(data) or _encode_unkeyed(values) != data:
            return None
    except (IndexError, TypeError):     # ran off the end / a size no such record has
        return None
    return values


def _fixed_size_text(data: bytes, segments: list[tuple[int, int, int, int]]) -> bytearray:
    """The text view of verified fixed-size segments, (position, records, record size, frame size) each.

    One strided copy per segment into one result: the records as the rows of
    a matrix, their value columns copied into the rows of the result and its
    last column set to newlines (not the frame columns deleted from a copy one
    extended slice at a time: docs/performance.md, "Figures behind the code"),
    and no join of the segments after.
    """
    out = bytearray(sum(count * (size - frame_len) for _, count, size, frame_len in segments))
    o = 0
    for p, count, size, frame_len in segments:
        line = size - frame_len            # the value and the newline that replaces the header count
        rows = np.frombuffer(out, np.uint8, count * line, o).reshape(count, line)
        rows[:, :-1] = np.frombuffer(data, np.uint8, count * size, p).reshape(count, size)[:, frame_len:-1]
        rows[:, -1] = 10
        o += count * line
    return out


def _uniform_values(data: bytes, count: int, text: bool) -> tuple[list[Any], int, int]:     # Any: see parts below
    """Decode the uniform-layout prefix of a records section.

    Returns (parts, records taken, position after them).  Without ``text`` the
    parts are the values; with it they are chunks of the text view (values each
    followed by a newline).  This is the path of a process without the compiled
    walk (``kernels.records_text``, ``records_columns``: any layout, tried first
    by the decoders), and of a batch that walk refuses: a fixed-size segment
    becomes text without one bytes object per record: one strided copy of its
    value columns per segment into one buffer (_fixed_size_text).  A batch with
    a segment of mixed sizes is taken whole by _sized_walk, or up to that
    segment only.
    """
    # Any: values (bytes) without ``text``, text chunks (bytes, bytearray) with it; each caller knows which
    parts: list[Any] = []
    text_segments: list[tuple[int, int, int, int]] = []
    p = 0
    for lo, hi, w in _WIDTH_RANGES:
        if lo >= count:
            break
        stop = hi if hi < count else count
        fixed = _fixed_size_segment(data, p, lo, stop, w)
        if fixed is None:
            if type(data) is not bytes:         # decode_text's memoryview: the walk below takes bytes
                data = bytes(data)
            # mixed sizes
            values = _sized_walk(data, count)
            if values is None:          # the general loop goes on from this segment
                if text_segments:
                    parts.append(_fixed_size_text(data, text_segments))
                return parts, lo, p
            if text:
                values.append(b"")
                return [b"\n".join(values)], count, len(data)
            return values, count, len(data)
        size, frame_len, value_len = fixed
        end = p + (stop - lo) * size
        if text:
            text_segments.append((p, stop - lo, size, frame_len))
        else:
            parts += [data[s:s + value_len] for s in range(p + frame_len, end, size)]
        p = end
    if text_segments:
        parts.append(_fixed_size_text(data, text_segments))
    return parts, min(count, _TABLE_SIZE), p
