"""Compiled loops of the records codec, for what no column trick in Python can do.

The loops are C (``engine/records/_kernels.c``, a plain CPython extension
built with the package: ``scripts/setup.sh``); this module gives them their
Python signatures.  Each has a Python path that produces the same bytes, which
the callers take when the extension is not built (``engine.records.compiled``):

* ``records_text``/``records_jsonl``: the one walk of a records section of
  any layout (every producer's: own deltas, keys, nulls, headers), the text
  view of a batch, or its JSON lines and the sizes of both renderings;
* ``records_spans``/``header_spans``/``gather_spans``: the same walk as arrays of
  positions (each record's offset, timestamp, key, value and headers), and the
  spans copied one after the other: the Spark source's Arrow columns
  (``logfs.spark.columns``), without an object per record;
* ``key_columns``: the log cleaner's offset-map pass, the offset, key and
  tombstone flag of every record of a read chunk's batches;
* ``transactional_batches``: the walk for transaction markers
  (engine.transactions), which must see every batch header of a log;
* ``lines_layout``/``encode_lines``: the records section of a block of text
  lines, each line a value (the hot path of ``cat file >> append``);
* ``json_plain``: whether such a block is its own JSON string text (the JSON
  view's size of an append, ``engine.views.render``);
* ``key_digests``/``put_digests``: the cleaner's offset map, the MD5 of each
  key and Kafka's ``SkimpyOffsetMap.put`` of each (digest, offset) pair.

A records section of values of mixed sizes must be walked record by record:
each record's position depends on the previous record's length varint, so
that walk is compiled (its cost beside the Python walk ``_sized_walk``, and
the extension's load time and memory: docs/performance.md, "Record kernels in C").

Kernels check every byte they rely on and answer None (or -1) when anything
differs from what they expect; the caller then runs the general Python loop,
which decodes the same bytes and names what is wrong.  They run without
the GIL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from engine.records import _kernels  # type: ignore[attr-defined]  # a C extension, no stub
from engine.records.format import SPAN_ROWS, Headers

if TYPE_CHECKING:   # numpy is imported by the cleaner's kernels only: a text read or an append does not pay it
    import mmap

    import numpy as np
    import numpy.typing as npt

__all__ = ["SPAN_ROWS", "KeyColumns", "LinesLayout", "RecordColumns", "encode_lines", "gather_spans", "header_spans",
           "json_plain", "key_columns", "key_digests", "lines_layout", "put_digests", "records_columns",
           "records_jsonl", "records_spans", "records_text", "transactional_batches"]


def records_text(data: bytes | memoryview, count: int) -> bytearray | None:
    """The text view (each value and ``\\n``, a null value an empty line) of ``count`` records of an
    uncompressed records section of any layout, or None when the section is not exactly that.

    Every field is bounds-checked inside its record and every record inside
    ``data``: the length, attributes, the timestamp delta (a varlong of at most
    64 bits), the offset delta, the key and value (null, empty or bytes), each
    header (key, null or present value), nothing left in a record after its
    headers and nothing after the last record.  A walk stricter than the
    general loop (``decode._values_of``, which skips headers by the record
    length): whatever it refuses, that loop decodes or names.  The output is
    never longer than ``data``.
    """
    result: bytearray | None = _kernels.records_text(data, count)
    return result


#: what records_columns answers: offsets, timestamps, keys (None: every key null), values, headers (None: no
#: record has one), whether the offsets count up by one
RecordColumns = tuple[list[int], list[int], list[bytes | None] | None, list[bytes | None], list[Headers] | None, bool]


def records_columns(data: bytes | memoryview, count: int, base_offset: int, base_timestamp: int,
                    log_append_time: bool, max_timestamp: int) -> RecordColumns | None:
    """The records of an uncompressed records section of any layout as lists, from the walk of
    ``records_text``: (offsets, timestamps, keys or None when every key is null, values, headers or None
    when no record has one, whether the offsets count up by one from the first); None when the section is
    not exactly that, a header key is not UTF-8, or an offset or timestamp leaves 64 bits.

    The objects the general loop (``decode._records_of``) makes, made in C: each header a tuple of
    (str, bytes or None) tuples, ``()`` for none; a LogAppendTime batch's timestamps all ``max_timestamp``.
    """
    result = _kernels.records_columns(data, count, base_offset, base_timestamp, log_append_time, max_timestamp)
    found: RecordColumns | None = result
    return found


def records_jsonl(data: bytes | memoryview, count: int, base_offset: int, base_timestamp: int,
                  log_append_time: bool, max_timestamp: int, pieces: tuple[bytes, ...],
                  render: bool) -> bytes | tuple[int, int] | None:
    """The JSON lines of ``count`` records of an uncompressed records section of any layout (``render``),
    or the sizes (text view, JSON lines) without rendering; None when the section is not exactly that.

    Each line is ``engine.views.render``'s, from ``pieces`` (``render.compiled_pieces``:
    the constant bytes of a line in order): the offset (base + delta), the
    timestamp (base + delta, or ``max_timestamp`` for a LogAppendTime batch),
    the key, value and header values null, UTF-8 text escaped as orjson writes
    a string, or base64 when not UTF-8 (Python's strict decoder's answer), each
    followed by its kind's piece.  The walk checks what ``records_text`` checks,
    refuses a header key that is not UTF-8 (the decoder raises) and an offset or
    timestamp outside 64 bits.
    """
    result: bytes | tuple[int, int] | None = _kernels.records_jsonl(
        data, count, base_offset, base_timestamp, log_append_time, max_timestamp, pieces, render)
    return result


def records_spans(data: bytes | memoryview, count: int, base_offset: int, base_timestamp: int,
                  log_append_time: bool, max_timestamp: int) -> tuple[npt.NDArray[np.int64], int] | None:
    """The records of an uncompressed records section of any layout as a ``(SPAN_ROWS, count)`` int64 table
    of positions in ``data``, and the number of headers; None when the walk refuses the section.

    Row by row: the offset (base + delta), the timestamp (base + delta, or
    ``max_timestamp`` for a LogAppendTime batch), the key's position and length
    (-1 for a null key), the value's, the position of the first header and the
    header count.  The walk and its refusals are ``records_columns``'s (a
    header key that is not UTF-8, an offset or timestamp outside 64 bits),
    without a Python object per record: the general loop decodes what it
    refuses, or names what is wrong.
    """
    import numpy as np
    out = np.empty((SPAN_ROWS, count), dtype=np.int64)
    headers: int = _kernels.records_spans(data, count, base_offset, base_timestamp, log_append_time,
                                          max_timestamp, out)
    return None if headers < 0 else (out, headers)


def header_spans(data: bytes | memoryview, starts: npt.NDArray[np.int64], counts: npt.NDArray[np.int64],
                 total: int) -> npt.NDArray[np.int64] | None:
    """The ``(4, total)`` int64 table of the headers of records whose first header is at ``starts[i]`` in
    ``data``, ``counts[i]`` of them (rows 6 and 7 of ``records_spans``): each header's key position and
    length, value position and length (-1: a null value); None when they are not ``total`` headers
    inside ``data``."""
    import numpy as np
    out = np.empty((4, total), dtype=np.int64)
    found: bool = _kernels.header_spans(data, np.ascontiguousarray(starts, dtype=np.int64),
                                        np.ascontiguousarray(counts, dtype=np.int64), out, total)
    return out if found else None


def gather_spans(data: bytes | memoryview, starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
                 out: npt.NDArray[np.uint8], position: int) -> int:
    """Copy ``data[s:s + n]`` for each start ``s`` and length ``n >= 0`` (a negative length, a null, copies
    nothing) one after the other into ``out`` from ``position``; the position after the last.

    ValueError when a span is not inside ``data`` or ``out`` cannot hold them (nothing is written past it).
    """
    import numpy as np
    end: int = _kernels.gather_spans(data, np.ascontiguousarray(starts, dtype=np.int64),
                                     np.ascontiguousarray(lengths, dtype=np.int64), out, position)
    if end < 0:
        raise ValueError("a span is outside the data, or the output is too small for them")
    return end


class KeyColumns(NamedTuple):
    """The cleaner's view of the records of some batches: parallel arrays, one entry per record."""

    offsets: npt.NDArray[np.int64]
    key_starts: npt.NDArray[np.int64]      # position of the key in the buffer
    key_lengths: npt.NDArray[np.int64]     # -1: a null key
    null_values: npt.NDArray[np.bool_]     # tombstones


def key_columns(buf: bytes, batches: npt.NDArray[np.int64], records: int) -> KeyColumns | None:
    """Offsets, key positions and tombstones of every record of uncompressed data batches, in one call.

    ``batches`` holds one row per batch: (position in ``buf``, base offset,
    batch length, record count, ...); ``records`` is the sum of the counts.
    Each record is read as ``engine.records.decode.decode_key_columns`` reads
    it (its length must hold its fields and the batch must end with its last
    record); None when any batch is malformed: the caller's Python loop then
    says which and why.
    """
    import numpy as np
    table = np.ascontiguousarray(batches, dtype=np.int64)
    offsets = np.empty(records, dtype=np.int64)
    key_starts = np.empty(records, dtype=np.int64)
    key_lengths = np.empty(records, dtype=np.int64)
    null_values = np.empty(records, dtype=np.bool_)
    width = table.shape[1] if table.ndim == 2 else 4
    done = _kernels.key_columns(buf, table, width, records, offsets, key_starts, key_lengths, null_values)
    if done != records:
        return None
    return KeyColumns(offsets, key_starts, key_lengths, null_values)


def transactional_batches(buf: bytes) -> tuple[list[int], int, int]:
    """A header-only walk of the whole batches at the front of ``buf``, as ``iter_batches`` frames them.

    Returns (positions of transactional batches, position of the last whole
    batch or -1, position after it).  What is left after it (a batch that does
    not fit, a torn or damaged length) is for the caller's own walk.
    """
    found, last, end = _kernels.transactional_batches(buf)
    return found, last, end


class LinesLayout(NamedTuple):
    """What ``encode_lines`` will write for a block of lines."""

    lines: int          # lines (records)
    size: int           # bytes of the records section
    longest: int        # bytes of the longest line, its newline not counted


def lines_layout(block: bytes) -> LinesLayout | None:
    """The layout of the records section of ``block``'s lines (each ending in ``\\n``), found with libc
    ``memchr``; None when ``block`` does not end with a newline."""
    layout = _kernels.lines_layout(block)
    return None if layout is None else LinesLayout(*layout)


def json_plain(block: bytes) -> bool:
    """Whether every byte of ``block`` is a newline or printable ASCII other than ``"`` and ``\\``
    (0x20-0x7F): the bytes orjson writes as themselves in a JSON string, newlines aside.

    What ``len(orjson.dumps(block.decode("ascii"))) == len(block) + 2 + newlines``
    answers, 16 bytes at a time: 0.11 ms per MiB against 0.26-0.32 for
    orjson's dump (a second copy of the block).
    """
    plain: bool = _kernels.json_plain(block)
    return plain


def encode_lines(block: bytes, out: bytearray, position: int) -> int:
    """Write the records section of ``block``'s lines into ``out`` from ``position``; returns the end.

    Each line is a record: attributes 0, timestamp delta 0, offset delta its
    index, a null key, the line without its newline as the value (one
    ``memcpy``), no headers; byte for byte what ``encode_values`` writes for
    the same values.  ``out`` must hold ``lines_layout(block).size`` bytes
    from ``position`` (ValueError if not, nothing past it is written).
    """
    end: int = _kernels.encode_lines(block, out, position)
    return end


# -- the log cleaner's offset map: MD5 of each key and Kafka's SkimpyOffsetMap put, compiled ---------------

def key_digests(buf: bytes, starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """The MD5 digests (RFC 1321) of the keys ``buf[s:s + n]`` for each start ``s`` and length ``n`` (all
    >= 0), as one ``(count, 16)`` array: what ``hashlib.md5(key).digest()`` gives, without a bytes object
    per key."""
    import numpy as np
    out = np.empty((len(starts), 16), dtype=np.uint8)
    _kernels.key_digests(buf, np.ascontiguousarray(starts, dtype=np.int64),
                         np.ascontiguousarray(lengths, dtype=np.int64), out)
    return out


def put_digests(table: mmap.mmap, slots: int, digests: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64],
                limit: int, entries: int) -> tuple[int, int, int]:
    """``OffsetMap.put`` of each (digest, offset) pair in order, into the map's table, compiled.

    A slot is 24 bytes (the digest, then the offset big-endian) found by
    Kafka's probe sequence.  Stops before the first pair at which the map holds
    ``limit`` keys, as ``OffsetMap.put_many`` does.  Returns (pairs put,
    entries after, probes).
    """
    import numpy as np
    done, entries, probes = _kernels.put_digests(table, slots, np.ascontiguousarray(digests, dtype=np.uint8),
                                                 np.ascontiguousarray(offsets, dtype=np.int64), limit, entries)
    return done, entries, probes
