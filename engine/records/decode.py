"""Decoding batches: values, text, Records, columns, spans and the cleaner's key columns.

Hot path, inlined on purpose: the general loops (``_values_of``,
``_records_of``, ``decode_key_columns``) decode one- and two-byte varints
inline, since a function call costs more than the rest of a record; the public
entry points first try the layout proof of :mod:`engine.records.fastpath`.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from engine.errors import CorruptRecordError
from engine.records import compiled
from engine.records.compression import _decompress
from engine.records.fastpath import _uniform_values
from engine.records.format import (
    _EMPTY_BATCH_LENGTH,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    SPAN_ROWS,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Compression,
    Record,
    RecordBuffer,
    _new_record,
)
from engine.records.framing import read_header
from engine.records.varint import _read_varint

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import numpy as np
    import numpy.typing as npt

    from engine.records.format import Headers
    from engine.records.kernels import RecordColumns

# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

def _records_section(buf: RecordBuffer, pos: int, header: BatchHeader | None,
                     include_control: bool = False, view: bool = False) -> tuple[BatchHeader, bytes | None]:
    """Header and (decompressed) records bytes; None for a control batch.

    With ``view`` the records of an uncompressed batch are a memoryview of
    ``buf``, not a copy (the text view's fast path reads them with numpy).
    """
    if header is None:
        header = read_header(buf, pos)
    if header.magic != MAGIC:
        raise CorruptRecordError(f"Record batch has magic {header.magic}, only magic {MAGIC} is supported",
                                 position=pos)
    end = pos + header.batch_length + LOG_OVERHEAD
    if header.batch_length < _EMPTY_BATCH_LENGTH or end > len(buf):
        raise CorruptRecordError(f"Record batch of {header.size} bytes does not fit in the buffer",
                                 position=pos)
    if header.attributes & CONTROL_FLAG_MASK and not include_control:
        return header, None
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if view and not codec:
        # cast: a memoryview reads as the bytes it views (RecordBuffer's readers take both)
        return header, cast("bytes", memoryview(buf)[pos + HEADER_SIZE:end])
    data = buf[pos + HEADER_SIZE:end]
    if codec:
        try:
            data = _decompress(codec, data)
        except Exception as exc:        # every codec library has its own error type
            raise CorruptRecordError(
                f"Failed to decompress the {Compression(codec).codec_name if codec <= 4 else codec} "
                f"records of the batch at offset {header.base_offset}: {exc}", position=pos) from exc
    elif type(data) is not bytes:
        data = bytes(data)
    return header, data


def _corrupt(header: BatchHeader, pos: int, detail: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"Found invalid record structure in the batch at offset {header.base_offset}: {detail}",
        position=pos)


# --- the general loop ---------------------------------------------------------------

def _values_of(data: bytes, count: int, pos: int = 0,
               out: list[bytes | None] | None = None) -> list[bytes | None]:
    """The values of ``count`` records of an uncompressed records section from ``pos``.

    Any layout: this is where kafka-python's and Java's batches, keyed records,
    nulls and headers go, and where the fast paths hand over.  Varints of one and
    two bytes (lengths and offset deltas below 8192: nearly every record) are
    decoded inline, since a function call costs more than the rest of the
    record; longer ones go through _read_varint.  Only the record, key and value
    lengths are decoded; the timestamp and offset deltas are skipped by their
    continuation bits and the headers by the record length.
    """
    if out is None:
        out = []
    append = out.append
    read_varint = _read_varint
    for _ in range(count):
        b = data[pos]
        if b < 0x80:
            if b & 1:
                raise ValueError(f"invalid record length {(b >> 1) ^ -1}")
            end = pos + 1 + (b >> 1)
            pos += 2                    # length, attributes
        else:
            c = data[pos + 1]
            if c < 0x80:
                if b & 1:
                    raise ValueError(f"invalid record length {(((b & 0x7F) | (c << 7)) >> 1) ^ -1}")
                end = pos + 2 + (((b & 0x7F) | (c << 7)) >> 1)
                pos += 3
            else:
                size, pos = read_varint(data, pos)
                if size < 0:
                    raise ValueError(f"invalid record length {size}")
                end = pos + size
                pos += 1
        while data[pos] > 0x7F:         # timestamp delta
            pos += 1
        pos += 1
        while data[pos] > 0x7F:         # offset delta
            pos += 1
        b = data[pos + 1]               # key length
        if b == 1:
            pos += 2
        elif b < 0x80 and not b & 1:
            pos += 2 + (b >> 1)
        else:
            key_len, pos = read_varint(data, pos + 1)
            if key_len < -1:
                raise ValueError(f"invalid key length {key_len}")
            if key_len > 0:
                pos += key_len
        b = data[pos]                   # value length
        if b < 0x80:
            if b & 1:
                if b != 1:
                    raise ValueError(f"invalid value length {(b >> 1) ^ -1}")
                append(None)
                pos = end
                continue
            pos += 1
            value_end = pos + (b >> 1)
        else:
            c = data[pos + 1]
            if c < 0x80 and not b & 1:
                pos += 2
                value_end = pos + (((b & 0x7F) | (c << 7)) >> 1)
            else:
                value_len, pos = read_varint(data, pos)
                if value_len < -1:
                    raise ValueError(f"invalid value length {value_len}")
                if value_len == -1:
                    append(None)
                    pos = end
                    continue
                value_end = pos + value_len
        if value_end >= end:
            raise ValueError(f"value ending at {value_end} overruns its record ending at {end}")
        append(data[pos:value_end])
        pos = end
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes left after the last record")
    return out


def _read_headers(data: bytes, pos: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    count, pos = _read_varint(data, pos)
    if count < 0:
        raise ValueError(f"invalid number of record headers {count}")
    headers = []
    for _ in range(count):
        key_len, pos = _read_varint(data, pos)
        if key_len < 0:
            raise ValueError(f"invalid negative header key size {key_len}")
        if pos + key_len > len(data):
            raise ValueError(f"header key of {key_len} bytes overruns the records section")
        header_key = data[pos:pos + key_len].decode("utf-8")
        pos += key_len
        value_len, pos = _read_varint(data, pos)
        if value_len < -1:
            raise ValueError(f"invalid header value length {value_len}")
        if value_len == -1:
            header_value = None
        else:
            header_value = data[pos:pos + value_len]
            pos += value_len
        headers.append((header_key, header_value))
    return tuple(headers), pos


def _records_of(data: bytes, header: BatchHeader, pos: int = 0, count: int | None = None) -> list[Record]:
    """``count`` records (default: all) of an uncompressed records section from ``pos``.

    As _values_of, but complete.  Fields go into parallel lists and the Records
    are made at the end by one ``map`` of ``tuple.__new__``: NamedTuple's own
    constructor is a Python call.
    """
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers_of: list[Headers] = []
    add_offset = offsets.append
    add_timestamp = timestamps.append
    add_key = keys.append
    add_value = values.append
    add_headers = headers_of.append
    read_varint = _read_varint
    no_headers = ()
    for _ in range(header.records_count if count is None else count):
        b = data[pos]                   # length
        if b < 0x80:
            if b & 1:
                raise ValueError(f"invalid record length {(b >> 1) ^ -1}")
            end = pos + 1 + (b >> 1)
            pos += 2                    # length, attributes
        else:
            size, pos = read_varint(data, pos)
            if size < 0:
                raise ValueError(f"invalid record length {size}")
            end = pos + size
            pos += 1
        b = data[pos]                   # timestamp delta
        if b < 0x80:
            add_timestamp(base_timestamp + ((b >> 1) ^ -(b & 1)))
            pos += 1
        else:
            delta, pos = read_varint(data, pos)
            add_timestamp(base_timestamp + delta)
        b = data[pos]                   # offset delta
        if b < 0x80:
            add_offset(base_offset + ((b >> 1) ^ -(b & 1)))
            pos += 1
        else:
            delta, pos = read_varint(data, pos)
            add_offset(base_offset + delta)
        b = data[pos]                   # key
        if b == 1:
            add_key(None)
            pos += 1
        elif b < 0x80 and not b & 1:
            pos += 1
            field_end = pos + (b >> 1)
            add_key(data[pos:field_end])
            pos = field_end
        else:
            length, pos = read_varint(data, pos)
            if length < 0:
                if length < -1:
                    raise ValueError(f"invalid key length {length}")
                add_key(None)
            else:
                field_end = pos + length
                add_key(data[pos:field_end])
                pos = field_end
        b = data[pos]                   # value
        if b == 1:
            add_value(None)
            pos += 1
        elif b < 0x80 and not b & 1:
            pos += 1
            field_end = pos + (b >> 1)
            add_value(data[pos:field_end])
            pos = field_end
        else:
            c = data[pos + 1]
            if c < 0x80 and not b & 1:
                pos += 2
                field_end = pos + (((b & 0x7F) | (c << 7)) >> 1)
                add_value(data[pos:field_end])
                pos = field_end
            else:
                length, pos = read_varint(data, pos)
                if length < 0:
                    if length < -1:
                        raise ValueError(f"invalid value length {length}")
                    add_value(None)
                else:
                    field_end = pos + length
                    add_value(data[pos:field_end])
                    pos = field_end
        if data[pos] == 0:              # header count
            add_headers(no_headers)
            pos += 1
        else:
            record_headers, pos = _read_headers(data, pos)
            add_headers(record_headers)
        if pos != end:
            raise ValueError(f"record ends at {pos}, its length says {end}")
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes left after the last record")
    stamps: Iterable[int] = timestamps
    if header.attributes & TIMESTAMP_TYPE_MASK:
        # A LogAppendTime batch's records all carry the broker's time, which
        # Kafka keeps in maxTimestamp; the per-record deltas are ignored on read.
        stamps = repeat(header.max_timestamp, len(offsets))
    return list(map(_new_record, repeat(Record), zip(offsets, stamps, keys, values, headers_of)))


def _batch_timestamp(header: BatchHeader) -> int:
    """Every record's timestamp in a batch whose timestamp deltas are all 0."""
    return header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else header.base_timestamp


def _compiled_columns(data: bytes, header: BatchHeader) -> RecordColumns | None:
    """The section's records as columns from the compiled walk (``kernels.records_columns``), or None when
    the extension is not built or the walk refuses the section (the general loop then decodes it or says
    what is wrong)."""
    kernels = compiled.KERNELS
    if kernels is None:
        return None
    found: RecordColumns | None = kernels.records_columns(data, header.records_count, header.base_offset,
                                                  header.base_timestamp, bool(header.attributes & TIMESTAMP_TYPE_MASK),
                                                  header.max_timestamp)
    return found


# --- public entry points ------------------------------------------------------------

def decode_values(buf: RecordBuffer, pos: int = 0, header: BatchHeader | None = None) -> list[bytes | None]:
    """Only the values of the batch at ``pos``, in offset order (the text view's path)."""
    header, data = _records_section(buf, pos, header)
    if data is None:
        return []
    count = header.records_count
    try:
        values, taken, at = _uniform_values(data, count, False)
        if taken == count and at == len(data):
            return values
        return _values_of(data, count - taken, at, values)
    except (IndexError, ValueError) as exc:
        raise _corrupt(header, pos, str(exc)) from None


def decode_text(buf: RecordBuffer, pos: int = 0, header: BatchHeader | None = None) -> bytes | bytearray:
    """The text view of the batch at ``pos``: every value followed by ``\\n``.

    Equal to ``b"".join(v + b"\\n" for v in decode_values(...))`` with a null
    value as an empty line (b"" for a control batch), but a batch of any layout
    becomes text in one compiled walk (``kernels.records_text``) without a bytes
    object per record, and without a copy of an uncompressed batch before (a
    bytearray: the one buffer its lines were copied into).
    """
    header, data = _records_section(buf, pos, header, view=True)
    if data is None:
        return b""
    count = header.records_count
    kernels = compiled.KERNELS
    if kernels is not None:
        # the compiled walk of any layout (every producer's batches); None sends the batch to the loops below
        text = kernels.records_text(data, count)
        if text is not None:
            return cast("bytearray", text)   # cast: KERNELS is a module object, its functions untyped through it
    try:
        parts, taken, at = _uniform_values(data, count, True)
        if len(parts) == 1 and taken == count and at == len(data):
            # cast: a text chunk of _uniform_values (bytes or bytearray, its parts list[Any])
            return cast("bytearray", parts[0])
        if type(data) is not bytes:
            data = bytes(data)
        if taken < count or at != len(data):
            rest = _values_of(data, count - taken, at)
            if rest:
                if None in rest:
                    rest = [b"" if value is None else value for value in rest]
                rest.append(b"")
                parts.append(b"\n".join(cast("list[bytes]", rest)))     # no None left
    except (IndexError, ValueError) as exc:
        raise _corrupt(header, pos, str(exc)) from None
    return parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)


def decode_batch(buf: RecordBuffer, pos: int = 0, header: BatchHeader | None = None, *,
                 include_control: bool = False) -> list[Record]:
    """Every record of the batch at ``pos`` (decompressed).

    A control batch (transaction marker) gives [] unless ``include_control``:
    only kafka-dump-log shows what is inside one.  The uniform-layout prefix of
    the batch is decoded by the values fast path and its Records built in bulk:
    offsets count up from the base offset, one timestamp, null keys, no headers.
    """
    header, data = _records_section(buf, pos, header, include_control)
    if data is None:
        return []
    count = header.records_count
    try:
        found = _compiled_columns(data, header)
        if found is not None:
            offsets, timestamps, keys, values, headers, _ = found
            return list(map(_new_record, repeat(Record), zip(
                offsets, timestamps, repeat(None) if keys is None else keys, values,
                repeat(()) if headers is None else headers)))
        values, taken, at = _uniform_values(data, count, False)
        records = list(map(_new_record, repeat(Record), zip(
            range(header.base_offset, header.base_offset + taken), repeat(_batch_timestamp(header)),
            repeat(None), values, repeat(()))))
        if taken < count or at != len(data):
            records += _records_of(data, header, at, count - taken)
        return records
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise _corrupt(header, pos, str(exc)) from None


class BatchColumns(NamedTuple):
    """The records of one batch as parallel columns (what the JSON-lines view renders from).

    ``offsets`` is a ``range`` when the offsets count up from the base offset
    with no gap (every batch the log writes itself), else a list.  ``keys`` and
    ``headers`` are lists parallel to ``values``, or None when every key is
    null / no record has a header: the common case costs no column at all.
    """

    offsets: Sequence[int]
    timestamps: list[int]
    keys: list[bytes | None] | None
    values: list[bytes | None]
    headers: list[tuple[tuple[str, bytes | None], ...]] | None


def decode_columns(buf: RecordBuffer, pos: int = 0, header: BatchHeader | None = None) -> BatchColumns:
    """The records of the batch at ``pos`` as columns, without a Record object per record.

    Equal field for field to :func:`decode_batch` (the hypothesis test in
    tests/unit/test_records_columns.py proves it): the compiled walk
    (``kernels.records_columns``) makes the columns of any layout; without the
    extension, or for a section it refuses, the uniform-layout prefix comes
    from the same values fast path, whose layout fixes offsets, timestamp, null
    keys and no headers, so those columns are built in bulk; anything else
    (keyed records, headers, other producers' batches) is decoded by the
    general loop and transposed.  A control batch gives empty columns.
    """
    header, data = _records_section(buf, pos, header)
    if data is None:
        return BatchColumns(range(0), [], None, [], None)
    count = header.records_count
    # the compiled walk first, any layout (also faster than the uniform path below for logfs's own batches)
    found = _compiled_columns(data, header)
    if found is not None:
        found_offsets, found_timestamps, found_keys, found_values, found_headers, contiguous = found
        start = found_offsets[0] if count else header.base_offset
        return BatchColumns(range(start, start + count) if contiguous else found_offsets, found_timestamps,
                            found_keys, found_values, found_headers)
    try:
        # The text fast path turns fixed-size records into "value\n" runs with
        # extended-slice deletes, all in C; one split then yields the values,
        # which is exact when the piece count shows that no value held a newline.
        parts, taken, at = _uniform_values(data, count, True)
        if taken == count and at == len(data):
            text = parts[0] if len(parts) == 1 else b"".join(parts)
            values: list[Any] = text.split(b"\n")     # Any: the lines of bytes or bytearray text, then the values
            if len(values) == count + 1:
                values.pop()
            else:
                values = _uniform_values(data, count, False)[0]
            return BatchColumns(range(header.base_offset, header.base_offset + count),
                                [_batch_timestamp(header)] * count, None, values, None)
        values, taken, at = _uniform_values(data, count, False)
        rest = _records_of(data, header, at, count - taken)
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise _corrupt(header, pos, str(exc)) from None
    offset_list = list(range(header.base_offset, header.base_offset + taken))
    timestamps = [_batch_timestamp(header)] * taken
    keys: list[bytes | None] = [None] * taken
    headers: list[Headers] = [()] * taken
    if rest:
        rest_offsets, rest_timestamps, rest_keys, rest_values, rest_headers = zip(*rest)
        offset_list += rest_offsets
        timestamps += rest_timestamps
        keys += rest_keys
        values += rest_values
        headers += rest_headers
    offsets: Sequence[int] = offset_list
    if offset_list and offset_list[-1] - offset_list[0] == len(offset_list) - 1 \
            and offset_list == list(range(offset_list[0], offset_list[0] + len(offset_list))):
        offsets = range(offset_list[0], offset_list[0] + len(offset_list))     # counting up by one
    return BatchColumns(offsets, timestamps, None if keys.count(None) == len(keys) else keys,
                        values, headers if any(headers) else None)


def decode_key_columns(buf: bytes, pos: int, header: BatchHeader) -> tuple[list[int], list[bytes | None], list[int]]:
    """(offsets, keys, indexes of null values) of the data batch at ``pos``: the log cleaner's view.

    All the cleaner needs to build its offset map and decide retention, read
    without building Records or copying values: each record is skipped by its
    length after its key and the first byte of its value length.  Compressed
    batches are decoded whole.  The batch must be framed (``iter_batches``),
    so it is whole in ``buf``; a malformed record raises CorruptRecordError.
    """
    if header.attributes & COMPRESSION_CODEC_MASK:
        records = decode_batch(buf, pos, header)
        return ([r.offset for r in records], [r.key for r in records],
                [i for i, r in enumerate(records) if r.value is None])
    base_offset = header.base_offset
    p = pos + HEADER_SIZE
    stop = pos + header.batch_length + LOG_OVERHEAD
    offsets: list[int] = []
    keys: list[bytes | None] = []
    tombstones: list[int] = []
    add_offset = offsets.append
    add_key = keys.append
    varint = _read_varint
    try:
        for index in range(header.records_count):
            b = buf[p]                      # record length; an odd zig-zag varint is negative
            if b & 0x81 == 0:
                record_end = p + 1 + (b >> 1)
                p += 2                      # length, attributes
            elif b & 1 == 0 and buf[p + 1] < 0x80:      # records of 64 to 8191 bytes
                record_end = p + 2 + (((b & 0x7F) | (buf[p + 1] << 7)) >> 1)
                p += 3
            else:
                length, p = varint(buf, p)
                if length < 0:
                    raise ValueError(f"invalid record length {length}")
                record_end = p + length
                p += 1
            while buf[p] >= 0x80:           # timestamp delta: not needed
                p += 1
            b = buf[p + 1]                  # offset delta
            if b < 0x80:
                add_offset(base_offset + ((b >> 1) ^ -(b & 1)))
                p += 2
            else:
                delta, p = varint(buf, p + 1)
                add_offset(base_offset + delta)
            b = buf[p]                      # key length, key
            if b == 1:
                add_key(None)
                p += 1
            elif b < 0x80 and not b & 1:
                p += 1
                key_end = p + (b >> 1)
                add_key(buf[p:key_end])
                p = key_end
            else:
                length, p = varint(buf, p)
                if length < 0:
                    raise ValueError(f"invalid key length {length}")
                key_end = p + length
                add_key(buf[p:key_end])
                p = key_end
            if p >= record_end or record_end > stop:
                raise ValueError(f"record at {p - pos} overruns its length or the batch")
            if buf[p] == 1:                 # value length -1: a tombstone
                tombstones.append(index)
            p = record_end
    except (IndexError, ValueError) as exc:
        raise CorruptRecordError(f"Found invalid record structure in the batch at offset {base_offset}: {exc}",
                                 position=pos) from None
    if p != stop:
        raise CorruptRecordError(f"Found invalid record structure in the batch at offset {base_offset}: "
                                 f"{stop - p} bytes left after the last record", position=pos)
    return offsets, keys, tombstones


class BatchSpans(NamedTuple):
    """The records of one batch as positions in ``data`` (``decode_spans``), no Python object per record.

    ``table`` is ``kernels.records_spans``'s ``(SPAN_ROWS, count)`` int64 table:
    offsets, timestamps, key position and length (-1: null), value position
    and length (-1: null), first header position, header count.  ``headers``
    is the ``(4, total)`` table of every header (key position and length,
    value position and length, -1 a null value) when asked for, else None.
    ``unrepresentable`` marks the records whose offset or timestamp leaves 64
    bits (only a section the compiled walk refuses has any; their entries in
    ``table`` are clamped to 64 bits), None when there is none.
    """

    data: bytes | memoryview
    table: npt.NDArray[np.int64]
    headers: npt.NDArray[np.int64] | None
    unrepresentable: npt.NDArray[np.bool_] | None = None


def decode_spans(buf: RecordBuffer, pos: int = 0, header: BatchHeader | None = None, *,
                 with_headers: bool = False) -> BatchSpans:
    """The records of the batch at ``pos`` as spans of its (decompressed) records section.

    The same records as :func:`decode_columns`, field for field (a control
    batch gives none): the compiled walk (``kernels.records_spans``) reads any
    layout into arrays of positions in the records section, which stays
    undecoded (an uncompressed batch is a view of ``buf``, not a copy).  A
    section the walk refuses, or every section without the extension, is
    decoded by ``decode_columns``, which raises the same CorruptRecordError
    for a damaged one; its keys, values and headers are then laid one after
    the other in a new buffer that the spans point into.
    """
    import numpy as np
    header, data = _records_section(buf, pos, header, view=True)
    if data is None:
        return BatchSpans(b"", np.empty((SPAN_ROWS, 0), dtype=np.int64),
                          np.empty((4, 0), dtype=np.int64) if with_headers else None)
    kernels = compiled.KERNELS
    if kernels is not None:
        found = kernels.records_spans(data, header.records_count, header.base_offset, header.base_timestamp,
                                      bool(header.attributes & TIMESTAMP_TYPE_MASK), header.max_timestamp)
        if found is not None:
            table, total = found
            headers = None
            if with_headers:
                headers = kernels.header_spans(data, table[6], table[7], total)
            if not with_headers or headers is not None:
                return BatchSpans(data, table, headers)
    return _spans_of_columns(decode_columns(buf, pos, header), with_headers)


def _spans_of_columns(columns: BatchColumns, with_headers: bool) -> BatchSpans:
    """``decode_spans``'s answer built from decoded columns: fields laid out in a new buffer."""
    import numpy as np
    count = len(columns.values)
    table = np.zeros((SPAN_ROWS, count), dtype=np.int64)
    low, high = -(1 << 63), (1 << 63) - 1
    unrepresentable = None
    for row, column in ((0, columns.offsets), (1, columns.timestamps)):
        if any(not low <= value <= high for value in column):
            # Python ints past 64 bits (the general loop decodes them): clamped, which keeps their order
            # against any offset of 64 bits, and marked, so that a reader taking one of them fails as it would
            unrepresentable = np.zeros(count, dtype=np.bool_) if unrepresentable is None else unrepresentable
            unrepresentable |= np.array([not low <= value <= high for value in column], dtype=np.bool_)
            column = [min(max(value, low), high) for value in column]
        table[row] = np.fromiter(column, dtype=np.int64, count=count)
    parts: list[bytes] = []
    at = 0
    header_rows: list[tuple[int, int, int, int]] = []

    def place(field: bytes | None) -> tuple[int, int]:
        nonlocal at
        if field is None:
            return at, -1
        parts.append(field)
        at += len(field)
        return at - len(field), len(field)

    for i in range(count):
        table[2, i], table[3, i] = place(None if columns.keys is None else columns.keys[i])
        table[4, i], table[5, i] = place(columns.values[i])
        record_headers = () if columns.headers is None else columns.headers[i]
        table[7, i] = len(record_headers)
        if with_headers:
            for name, value in record_headers:
                header_rows.append((*place(name.encode()), *place(value)))
    headers = None
    if with_headers:
        headers = np.array(header_rows, dtype=np.int64).reshape(-1, 4).T.copy()
    return BatchSpans(b"".join(parts), table, headers, unrepresentable)
