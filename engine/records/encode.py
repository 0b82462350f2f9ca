"""Encoding batches: the log's own appends, arbitrary records, and the cleaner's rebuild of a batch.

Hot path: ``_encode_unkeyed`` and ``_encode_keyed`` never call a Python
function per record (tables from :mod:`engine.records.varint`, ``map`` over C
builtins, one ``b"".join``); the general encoder handles what falls out of them.
"""

from __future__ import annotations

from operator import add
from typing import TYPE_CHECKING, Any

from crc32c import crc32c as _crc32c

from engine.errors import InvalidRecordError
from engine.records import compiled
from engine.records.compression import _compress
from engine.records.format import (
    _CRC_COVERED_HEADER,
    _EMPTY_BATCH_LENGTH,
    _PREFIX,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_SIZE,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    Compression,
    Record,
    TimestampType,
)
from engine.records.varint import (
    _LENGTH_1,
    _LENGTH_2,
    _LENGTH_3,
    _NULL,
    _PREFIX_KEYED,
    _PREFIX_KEYED_LEN1,
    _PREFIX_NULL_KEY,
    _TABLE_SIZE,
    _hc0_varint_piece,
    _varint,
    _varint_len,
    _varint_piece,
)

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from engine.records.kernels import LinesLayout

#: Blocks of lines from this size on are encoded by the compiled kernels (above the size where they start to
#: cost less than ``bytes.split`` and ``encode_values``: docs/performance.md, "Figures behind the code").
COMPILED_FROM = 4096


def _assemble(base_offset: int, attributes: int, last_offset_delta: int, base_timestamp: int,
              max_timestamp: int, count: int, records: bytes, compression: int,
              producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
              base_sequence: int = NO_SEQUENCE,
              partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> bytes:
    """Wrap a records section in its header: compress, CRC32C, lengths."""
    if compression:
        records = _compress(compression, records)
        attributes |= compression
    tail = _CRC_COVERED_HEADER.pack(attributes, last_offset_delta, base_timestamp, max_timestamp,
                                    producer_id, producer_epoch, base_sequence, count)
    crc = _crc32c(records, _crc32c(tail))
    prefix = _PREFIX.pack(base_offset, _EMPTY_BATCH_LENGTH + len(records),
                          partition_leader_epoch, MAGIC, crc)
    return b"".join((prefix, tail, records))


def _encode_unkeyed(values: Sequence[bytes]) -> bytes:
    """Records section for non-null values, null keys, timestamp delta 0, no headers.

    The section is four pieces per record -- [previous header count + length,
    prefix k, value length, value] -- laid into one list by extended-slice
    assignment and joined once; every piece comes from a table through a C-level
    ``map``.  A value too long for the tables raises IndexError or TypeError,
    and a non-bytes value TypeError: the caller then takes the general path.
    """
    n = len(values)
    lens = list(map(len, values))
    # Any: pieces from the tables and the values as given (a null value is let through: the join refuses it)
    parts: list[Any] = [None] * (4 * n)
    parts[1::4] = _PREFIX_NULL_KEY[:n]
    parts[2::4] = map(_varint_piece, lens)
    parts[3::4] = values
    if n <= 64:
        parts[0::4] = map(_LENGTH_1, lens)
    else:
        length_pieces = list(map(_LENGTH_1, lens[:64]))
        length_pieces += map(_LENGTH_2, lens[64:8192])
        if n > 8192:
            length_pieces += map(_LENGTH_3, lens[8192:])
        parts[0::4] = length_pieces
    parts[0] = parts[0][1:]             # the first record has no predecessor
    parts.append(b"\x00")               # the last record's header count
    return b"".join(parts)


def _encode_keyed(values: Sequence[bytes], keys: Sequence[bytes]) -> bytes:
    """Like _encode_unkeyed for non-null keys and values (compacted topics); a null raises TypeError."""
    n = len(values)
    value_lens = list(map(len, values))
    key_lens = list(map(len, keys))
    body = map(add,
               map(add, map(add, value_lens, map(_varint_len, value_lens)),
                   map(add, key_lens, map(_varint_len, key_lens))),
               _PREFIX_KEYED_LEN1[:n])
    parts: list[Any] = [None] * (6 * n)     # Any: as in _encode_unkeyed
    parts[0::6] = map(_hc0_varint_piece, body)
    parts[1::6] = _PREFIX_KEYED[:n]
    parts[2::6] = map(_varint_piece, key_lens)
    parts[3::6] = keys
    parts[4::6] = map(_varint_piece, value_lens)
    parts[5::6] = values
    parts[0] = parts[0][1:]
    parts.append(b"\x00")
    return b"".join(parts)


def _encode_general(offset_deltas: Sequence[int], timestamp_deltas: Sequence[int],
                    keys: Sequence[bytes | None], values: Sequence[bytes | None],
                    headers: Sequence[Sequence[tuple[str, bytes | None]]] | None) -> bytes:
    """Records section for anything: nulls, headers, large fields, any deltas."""
    out: list[bytes] = []
    append = out.append
    varint = _varint
    for i, value in enumerate(values):
        key = keys[i]
        parts = [b"\x00", varint(timestamp_deltas[i]), varint(offset_deltas[i])]
        if key is None:
            parts.append(_NULL)
        else:
            parts.append(varint(len(key)))
            parts.append(key)
        if value is None:
            parts.append(_NULL)
        else:
            parts.append(varint(len(value)))
            parts.append(value)
        record_headers = headers[i] if headers is not None else ()
        parts.append(varint(len(record_headers)))
        for header_key, header_value in record_headers:
            if not isinstance(header_key, str):
                raise InvalidRecordError(f"Record header key must be a string, got {type(header_key).__name__}")
            raw_key = header_key.encode("utf-8")
            parts.append(varint(len(raw_key)))
            parts.append(raw_key)
            if header_value is None:
                parts.append(_NULL)
            else:
                parts.append(varint(len(header_value)))
                parts.append(header_value)
        body = b"".join(parts)
        append(varint(len(body)))
        append(body)
    return b"".join(out)


def _check_bytes(items: Sequence[object], what: str) -> None:
    for item in items:
        if item is not None and not isinstance(item, (bytes, bytearray, memoryview)):
            raise InvalidRecordError(f"Record {what} must be bytes or None, got {type(item).__name__}")


def encode_values(base_offset: int, values: Sequence[bytes | None], timestamp: int,
                  keys: Sequence[bytes | None] | None = None,
                  compression: Compression = Compression.NONE) -> bytes:
    """One batch of records at offsets ``base_offset ..``, all stamped ``timestamp``.

    This is the broker side of an append with ``LogAppendTime``: attribute bit 3
    set, no producer id/epoch/sequence, no partition leader epoch.
    """
    n = len(values)
    if n == 0:
        raise InvalidRecordError("A record batch must hold at least one record")
    if keys is not None and len(keys) != n:
        raise InvalidRecordError(f"{len(keys)} keys for {n} values")
    records = None
    if n <= _TABLE_SIZE:
        # len(None) raises TypeError, so null values, non-bytes values and
        # fields beyond the tables all drop out of the fast paths the same way.
        try:
            # Nulls are let through on purpose: len(None) is the TypeError above.
            records = _encode_unkeyed(values) if keys is None else _encode_keyed(values, keys)  # type: ignore[arg-type]
        except (TypeError, IndexError):
            records = None
    if records is None:
        _check_bytes(values, "value")
        if keys is not None:
            _check_bytes(keys, "key")
        records = _encode_general(range(n), [0] * n, keys if keys is not None else [None] * n,
                                  values, None)
    return _assemble(base_offset, TIMESTAMP_TYPE_MASK, n - 1, timestamp, timestamp, n,
                     records, int(compression))


def encode_text_lines(base_offset: int, block: bytes, timestamp: int) -> tuple[bytearray, LinesLayout] | None:
    """One batch of ``block``'s lines (each ending in ``\\n``) as values, as ``encode_values`` encodes them.

    The hot path of ``cat file >> append``: the lines are never split into
    Python objects; one compiled pass finds them and one writes the records
    (``engine.records.kernels``).  Returns the batch and the lines' layout,
    or None for the caller to encode with ``encode_values``: ``block`` is
    shorter than that, or does not end with a newline, or the kernels are
    not built (``engine.records.compiled``).
    """
    kernels = compiled.KERNELS
    if len(block) < COMPILED_FROM or kernels is None:
        return None
    layout = kernels.lines_layout(block)
    if layout is None or layout.lines == 0:
        return None
    out = bytearray(HEADER_SIZE + layout.size)
    kernels.encode_lines(block, out, HEADER_SIZE)
    count = layout.lines
    _CRC_COVERED_HEADER.pack_into(out, _PREFIX.size, TIMESTAMP_TYPE_MASK, count - 1, timestamp, timestamp,
                                  NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, count)
    crc = _crc32c(memoryview(out)[_PREFIX.size:])
    _PREFIX.pack_into(out, 0, base_offset, _EMPTY_BATCH_LENGTH + layout.size, NO_PARTITION_LEADER_EPOCH, MAGIC,
                      crc)
    # Not copied to bytes: with the copy alive beside it, both 1 MiB buffers
    # come from fresh mmaps and every page of them faults in again.
    return out, layout


def encode_records(records: Sequence[Record], *, compression: Compression = Compression.NONE,
                   timestamp_type: TimestampType = TimestampType.CREATE_TIME) -> bytes:
    """One batch holding ``records`` with their own offsets, timestamps, keys and headers.

    The base offset is the first record's; offsets need not be contiguous (the
    cleaner writes batches with holes), only increasing.  As Kafka's builder does,
    the base timestamp is the first record's and the max timestamp the largest.
    """
    if not records:
        raise InvalidRecordError("A record batch must hold at least one record")
    base_offset = records[0].offset
    base_timestamp = records[0].timestamp
    offset_deltas = []
    timestamp_deltas = []
    previous = base_offset - 1
    for record in records:
        if record.offset <= previous:
            raise InvalidRecordError(
                f"Offsets in a batch must increase: {record.offset} follows {previous}")
        previous = record.offset
        offset_deltas.append(record.offset - base_offset)
        timestamp_deltas.append(record.timestamp - base_timestamp)
    last_delta = offset_deltas[-1]
    if last_delta > 0x7FFFFFFF:
        raise InvalidRecordError(f"Offset span {last_delta} of a batch does not fit in an int32")
    keys = [r.key for r in records]
    values = [r.value for r in records]
    _check_bytes(keys, "key")
    _check_bytes(values, "value")
    body = _encode_general(offset_deltas, timestamp_deltas, keys, values, [r.headers for r in records])
    attributes = TIMESTAMP_TYPE_MASK if timestamp_type == TimestampType.LOG_APPEND_TIME else 0
    max_timestamp = max(r.timestamp for r in records)
    return _assemble(base_offset, attributes, last_delta, base_timestamp, max_timestamp,
                     len(records), body, int(compression))


def rebuild_batch(header: BatchHeader, records: Sequence[Record], *,
                  delete_horizon_ms: int | None = None) -> bytes:
    """``records`` (a subset of the batch ``header`` heads, in order) as that batch again.

    The log cleaner's re-write of a batch that lost records or gains a delete
    horizon, as Kafka's ``MemoryRecords.buildRetainedRecordsInto`` does it: the
    base offset and last offset delta, producer id, epoch and base sequence,
    partition leader epoch, codec, timestamp type and the transactional and
    control flags stay the original's (an idempotent producer's sequence and the
    log end offset must survive compaction), only the records and the
    timestamps change.

    With ``delete_horizon_ms`` (KIP-534) the base timestamp holds the delete
    horizon and attribute bit 6 says so; every record's timestamp delta is then
    relative to the horizon (it may be negative), so readers that compute
    ``baseTimestamp + delta`` -- Kafka's, kafka-python's and ours -- read the
    same timestamps.  Without it the base timestamp is the first record's.  The
    max timestamp is the largest record timestamp, or for LogAppendTime the
    original's (the broker's time, which readers give every record).
    """
    if not records:
        raise InvalidRecordError("A record batch must hold at least one record")
    base_offset = header.base_offset
    if delete_horizon_ms is None:
        base_timestamp = records[0].timestamp
        attributes = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)
    else:
        base_timestamp = delete_horizon_ms
        attributes = (header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)
                      | DELETE_HORIZON_FLAG_MASK)
    previous = base_offset - 1
    offset_deltas = []
    for record in records:
        if record.offset <= previous or record.offset > header.last_offset:
            raise InvalidRecordError(f"Record offset {record.offset} is out of order or outside the batch "
                                     f"[{base_offset}, {header.last_offset}]")
        previous = record.offset
        offset_deltas.append(record.offset - base_offset)
    timestamp_deltas = [record.timestamp - base_timestamp for record in records]
    keys = [r.key for r in records]
    values = [r.value for r in records]
    _check_bytes(keys, "key")
    _check_bytes(values, "value")
    body = _encode_general(offset_deltas, timestamp_deltas, keys, values, [r.headers for r in records])
    if header.attributes & TIMESTAMP_TYPE_MASK:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(r.timestamp for r in records)
    return _assemble(base_offset, attributes, header.last_offset_delta, base_timestamp, max_timestamp,
                     len(records), body, header.attributes & COMPRESSION_CODEC_MASK,
                     header.producer_id, header.producer_epoch, header.base_sequence,
                     header.partition_leader_epoch)
