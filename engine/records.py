"""Kafka's RecordBatch v2 (magic 2): the bytes of every ``.log`` file.

This is the Python counterpart of ``DefaultRecordBatch``/``DefaultRecord`` and the
parts of ``MemoryRecordsBuilder`` and ``FileLogInputStream`` the log layer needs.
A batch is a 61-byte big-endian header followed by its records::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8
    crc uint32 (CRC32C of attributes .. end) | attributes int16 | lastOffsetDelta int32
    baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16
    baseSequence int32 | recordsCount int32 | records...

and each record is ``length varint | attributes int8 | timestampDelta varlong |
offsetDelta varint | key bytes | value bytes | headers``, every varint zig-zag
encoded and a null key/value written as length -1.  Attribute bits 0-2 name the
codec that compresses the whole records section.

Why the code looks the way it does: this module is the hot path of every append
and every read of the text and JSON views, and it is pure Python.  Encoding a
batch of small records therefore never calls a function per record: the varints
come from precomputed tables (zig-zag varint bytes for 0..65535, and the constant
"attributes, timestamp delta 0, offset delta k, null key" prefix for every k), the
arithmetic runs through ``map`` over C builtins, and the batch is assembled by a
single ``b"".join``.  Decoding first tries the layout encode_values writes
(null keys, no headers, offset delta = index), proving it rather than trusting
it: fixed-size records are checked one byte column at a time with extended
slices, records of mixed sizes by re-encoding the values and comparing.  What
fails the proof goes to the general loop (one- and two-byte varints inlined),
so every batch decodes exactly as that loop decodes it, or raises
CorruptRecordError as it does.
"""

from __future__ import annotations

import logging
import struct
from bisect import bisect_left
from enum import IntEnum
from itertools import repeat
from operator import add, itemgetter
from typing import NamedTuple
from collections.abc import Iterator, Sequence

import cramjam
import lz4.frame
from crc32c import crc32c as _crc32c

from engine.errors import CorruptRecordError, InvalidConfigError, InvalidRecordError

logger = logging.getLogger(__name__)

MAGIC = 2
#: The v2 batch header, base offset .. records count (Kafka's RECORD_BATCH_OVERHEAD).
HEADER_SIZE = 61
#: Base offset (8) + batch length (4): what precedes the length-counted part.
LOG_OVERHEAD = 12

_HEADER = struct.Struct(">qiibIhiqqqhii")
#: The header up to and including the CRC: what the CRC does not cover.
_PREFIX = struct.Struct(">qiibI")
#: attributes .. records count: the part of the header the CRC covers.
_CRC_COVERED_HEADER = struct.Struct(">hiqqqhii")
_LOG_OVERHEAD = struct.Struct(">qi")
_CRC = struct.Struct(">I")

PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
#: batchLength of a batch without records: the header after the length field.
_EMPTY_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

assert _HEADER.size == HEADER_SIZE
assert _PREFIX.size + _CRC_COVERED_HEADER.size == HEADER_SIZE


class Compression(IntEnum):
    """The codec in attribute bits 0-2 (Kafka's ``CompressionType`` ids)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> Compression:
        """Map a ``compression.type`` codec name to its id.

        ``uncompressed`` is Kafka's topic-level spelling of ``none``.  The topic
        value ``producer`` (keep what the producer sent) is not a codec, so the
        caller decides what it means before asking here.
        """
        key = name.strip().lower()
        if key == "uncompressed":
            key = "none"
        try:
            return cls[key.upper()]
        except KeyError:
            raise InvalidConfigError(
                f"Unknown compression name: {name!r} (expected none, gzip, snappy, lz4 or zstd)"
            ) from None

    @property
    def codec_name(self) -> str:
        """The name kafka-dump-log prints (``none``, ``gzip``, ...)."""
        return self.name.lower()


class TimestampType(IntEnum):
    """Attribute bit 3: who stamped the records."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class Record(NamedTuple):
    """One record as the log layer sees it, with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class BatchHeader(NamedTuple):
    """The 61-byte header of a v2 batch, field for field."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the batch occupies in the log, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType.LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK \
            else TimestampType.CREATE_TIME

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The cleaner's tombstone horizon (KIP-534): the base timestamp when flagged."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG_MASK else None

    @property
    def last_sequence(self) -> int:
        """Kafka's ``lastSequence``: base sequence + last offset delta, wrapping at int32."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


_new_header = tuple.__new__
_new_record = tuple.__new__
_unpack_header = _HEADER.unpack_from


# ---------------------------------------------------------------------------
# Zig-zag varints and the precomputed tables of the encode fast path
# ---------------------------------------------------------------------------

def _zigzag_varint(n: int) -> bytes:
    """Kafka's ``ByteUtils.writeVarlong``: zig-zag, then 7 bits per byte, low first."""
    v = (n << 1) if n >= 0 else ((-n << 1) - 1)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


#: Table bound: lengths and offset deltas below it come from the tables.
_TABLE_SIZE = 1 << 16
#: _VARINT[n]: the zig-zag varint of n (n >= 0), i.e. 2n in 1, 2 or 3 bytes;
#: spelled out per width because import time matters for the command line.
_VARINT: list[bytes] = (
    [bytes((n << 1,)) for n in range(64)]
    + [bytes((((n << 1) & 0x7F) | 0x80, n >> 6)) for n in range(64, 8192)]
    + [bytes((((n << 1) & 0x7F) | 0x80, ((n >> 6) & 0x7F) | 0x80, n >> 13)) for n in range(8192, _TABLE_SIZE)]
)
#: _VARINT_LEN[n] == len(_VARINT[n]).
_VARINT_LEN: list[int] = [1] * 64 + [2] * (8192 - 64) + [3] * (_TABLE_SIZE - 8192)
#: The previous record's empty header count (0) followed by this record's length:
#: lets one table piece end one record and start the next.
_HC0_VARINT: list[bytes] = list(map(add, repeat(b"\x00"), _VARINT))
#: attributes 0, timestamp delta 0, offset delta k: front of record k when keyed.
_PREFIX_KEYED: list[bytes] = list(map(add, repeat(b"\x00\x00"), _VARINT))
#: attributes 0, timestamp delta 0, offset delta k, null key: the constant
#: front of record k in a batch written by encode_values without keys.
_PREFIX_NULL_KEY: list[bytes] = list(map(add, _PREFIX_KEYED, repeat(b"\x01")))
#: len(_PREFIX_KEYED[k]) + 1 (the record's trailing header count).
_PREFIX_KEYED_LEN1: list[int] = [3 + n for n in _VARINT_LEN]


def _length_piece_table(prefix_len: int) -> list[bytes | None]:
    """Value length L -> the length piece of an unkeyed record with that value.

    A record's length depends only on its value's length and on how many bytes
    its offset delta takes (1 below 64, 2 below 8192, 3 below 65536), so three
    tables indexed by L replace the per-record arithmetic.  None marks lengths
    beyond _VARINT, which makes the join fail and the general path take over.
    """
    bodies = list(map(add, _VARINT_LEN, range(prefix_len + 1, prefix_len + 1 + _TABLE_SIZE)))
    in_range = bisect_left(bodies, _TABLE_SIZE)     # bodies only grow with the length
    table: list[bytes | None] = list(map(_HC0_VARINT.__getitem__, bodies[:in_range]))
    return table + [None] * (_TABLE_SIZE - in_range)


_LENGTH_1 = _length_piece_table(4).__getitem__      # offset delta < 64
_LENGTH_2 = _length_piece_table(5).__getitem__      # offset delta < 8192
_LENGTH_3 = _length_piece_table(6).__getitem__      # offset delta < 65536
_varint_piece = _VARINT.__getitem__
_varint_len = _VARINT_LEN.__getitem__
_hc0_varint_piece = _HC0_VARINT.__getitem__
_NULL = b"\x01"     # zig-zag varint of -1: a null key or value


def _varint(n: int) -> bytes:
    return _VARINT[n] if 0 <= n < _TABLE_SIZE else _zigzag_varint(n)


def _read_varint(buf, pos: int) -> tuple[int, int]:
    """Decode the zig-zag varint at ``pos``; returns (value, position after it)."""
    shift = 0
    raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint is longer than 10 bytes")


# ---------------------------------------------------------------------------
# Compression of the records section
# ---------------------------------------------------------------------------

#: xerial snappy-java's stream header (SnappyCodec): marker -126, "SNAPPY", NUL,
#: version 1, minimum compatible version 1.  Kafka's Java client writes snappy
#: through SnappyOutputStream, so that framing is what a broker's logs hold.
_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024
_BLOCK_LEN = struct.Struct(">i")
#: Kafka's default zstd level (ZstdCompression.DEFAULT_LEVEL).
_ZSTD_LEVEL = 3


def _snappy_compress_xerial(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    for start in range(0, len(data), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK_SIZE]))
        parts.append(_BLOCK_LEN.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes) -> bytes:
    """Decode xerial-framed snappy (Java and kafka-python producers) or a raw block."""
    if data[:8] != _XERIAL_HEADER[:8]:
        return bytes(cramjam.snappy.decompress_raw(data))
    # The version fields after the magic are ignored, as kafka-python does: some
    # producers write them little-endian.
    parts = []
    pos = len(_XERIAL_HEADER)
    end = len(data)
    view = memoryview(data)
    while pos < end:
        (block_len,) = _BLOCK_LEN.unpack_from(data, pos)
        pos += 4
        if block_len < 0 or pos + block_len > end:
            raise ValueError(f"xerial snappy block of {block_len} bytes overruns the stream")
        parts.append(bytes(cramjam.snappy.decompress_raw(view[pos:pos + block_len])))
        pos += block_len
    return b"".join(parts)


def _compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        return _snappy_compress_xerial(data)
    if codec == Compression.LZ4:
        # The LZ4 frame as Kafka's Lz4BlockOutputStream writes it: independent
        # 64 KB blocks, no content size.  Kafka's reader refuses linked blocks
        # ("Dependent block stream is unsupported"), which cramjam writes.
        return lz4.frame.compress(data, block_linked=False, store_size=False,
                                  block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL))
    raise InvalidRecordError(f"Unknown compression codec id {codec}")


def _decompress(codec: int, data) -> bytes:
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.decompress(data))
    if codec == Compression.SNAPPY:
        return _snappy_decompress(bytes(data))
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"unknown compression codec id {codec}")


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------

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
    parts: list = [None] * (4 * n)
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
    """Like _encode_unkeyed for non-null keys and values (compacted topics)."""
    n = len(values)
    value_lens = list(map(len, values))
    key_lens = list(map(len, keys))
    body = map(add,
               map(add, map(add, value_lens, map(_varint_len, value_lens)),
                   map(add, key_lens, map(_varint_len, key_lens))),
               _PREFIX_KEYED_LEN1[:n])
    parts: list = [None] * (6 * n)
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


def _check_bytes(items: Sequence, what: str) -> None:
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
            if keys is None:
                records = _encode_unkeyed(values)
            else:
                records = _encode_keyed(values, keys)
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


# ---------------------------------------------------------------------------
# Framing and validation
# ---------------------------------------------------------------------------

def read_header(buf, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos``; checks only that 61 bytes are there."""
    try:
        return _new_header(BatchHeader, _unpack_header(buf, pos))
    except struct.error:
        raise CorruptRecordError(
            f"Found {max(len(buf) - pos, 0)} bytes at the end of the log, fewer than a "
            f"record batch header ({HEADER_SIZE} bytes)", position=pos) from None


def validate_batch(buf, pos: int = 0, *, path: str | None = None) -> BatchHeader:
    """Check framing, magic and CRC32C of the batch at ``pos`` (Kafka's ``ensureValid``)."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise CorruptRecordError(
            f"Record batch header is truncated: {max(available, 0)} of {HEADER_SIZE} bytes",
            path=path, position=pos)
    header = _new_header(BatchHeader, _unpack_header(buf, pos))
    if header.magic != MAGIC:
        raise CorruptRecordError(f"Record batch has magic {header.magic}, only magic {MAGIC} is supported",
                                 path=path, position=pos)
    if header.batch_length < _EMPTY_BATCH_LENGTH:
        raise CorruptRecordError(
            f"Record batch size {header.size} is smaller than the minimum allowed ({HEADER_SIZE})",
            path=path, position=pos)
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError(
            f"Record batch is truncated: {available} of {header.size} bytes present",
            path=path, position=pos)
    if header.records_count < 0 or header.last_offset_delta < 0:
        raise CorruptRecordError(
            f"Record batch has invalid record count {header.records_count} "
            f"or last offset delta {header.last_offset_delta}", path=path, position=pos)
    with memoryview(buf) as view:
        computed = _crc32c(view[pos + ATTRIBUTES_OFFSET:end])
    if computed != header.crc:
        raise CorruptRecordError(
            f"Record batch is corrupt (stored crc = {header.crc}, computed crc = {computed})",
            path=path, position=pos)
    return header


def iter_batches(buf, start: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Walk the batches in ``buf[start:end]``, yielding (position, header).

    A shallow walk as ``FileLogInputStream`` does it: headers only, no CRC.  A
    tail shorter than a header or than the batch it announces is a torn write
    and ends the walk silently; a length field too small to be a batch cannot be
    skipped over and raises CorruptRecordError.
    """
    limit = len(buf) if end is None else min(end, len(buf))
    pos = start
    while pos + HEADER_SIZE <= limit:
        header = _new_header(BatchHeader, _unpack_header(buf, pos))
        batch_length = header.batch_length
        if batch_length < _EMPTY_BATCH_LENGTH:
            raise CorruptRecordError(
                f"Record batch size {batch_length + LOG_OVERHEAD} is smaller than the minimum "
                f"allowed ({HEADER_SIZE})", position=pos)
        next_pos = pos + LOG_OVERHEAD + batch_length
        if next_pos > limit:
            return
        yield pos, header
        pos = next_pos


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------

def _records_section(buf, pos: int, header: BatchHeader | None,
                     include_control: bool = False) -> tuple[BatchHeader, bytes | None]:
    """Header and (decompressed) records bytes; None for a control batch."""
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
    data = buf[pos + HEADER_SIZE:end]
    codec = header.attributes & COMPRESSION_CODEC_MASK
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


def _fixed_size_segment(data: bytes, p: int, lo: int, stop: int, w: int) -> tuple[int, int, int] | None:
    """(record size, frame size, value size) if records lo..stop-1 from ``p`` are one size and verified.

    The first record fixes the size; then each byte column of the frame (one
    byte of every record, taken with one extended slice) must equal what
    encode_values writes: the same byte in every record, except the offset
    delta's, which must count up from ``lo``.  None when anything differs.
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
    delta_first = length_len + 2
    delta_columns = _OFFSET_DELTA_COLUMNS[w]        # segments start where their width does
    for k in range(frame_len):
        if delta_first <= k < delta_first + w:
            expected = delta_columns[k - delta_first][:count]
        else:
            expected = frame[k:k + 1] * count
        if data[p + k:end:size] != expected:
            return None
    if data[p + size - 1:end:size] != bytes(count):     # header counts
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


_VALUE_LENGTH_BY_SIZE = {w: _value_length_by_size_table(w) for _, _, w in _WIDTH_RANGES}


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
            by_size = _VALUE_LENGTH_BY_SIZE[w]
            for _ in range((hi if hi < count else count) - lo):
                b = data[p]
                if b < 0x80:
                    e = p + 1 + (b >> 1)
                else:
                    e = p + 2 + (((b & 0x7F) | (data[p + 1] << 7)) >> 1)
                append(data[e - 1 - by_size[e - p]:e - 1])
                p = e
        if p != len(data) or _encode_unkeyed(values) != data:
            return None
    except (IndexError, TypeError):     # ran off the end / a size no such record has
        return None
    return values


def _uniform_values(data: bytes, count: int, text: bool) -> tuple[list, int, int]:
    """Decode the uniform-layout prefix of a records section.

    Returns (parts, records taken, position after them).  Without ``text`` the
    parts are the values; with it they are chunks of the text view (values each
    followed by a newline).  A fixed-size segment becomes text without one bytes
    object per record: a bytearray copy gets its header-count column overwritten
    with newlines, then loses its frame columns one extended-slice ``del`` at a
    time (each del leaves the next column at the front of every record).  A
    batch with a segment of mixed sizes is taken whole by _sized_walk, or up to
    that segment only.
    """
    parts: list = []
    p = 0
    for lo, hi, w in _WIDTH_RANGES:
        if lo >= count:
            break
        stop = hi if hi < count else count
        fixed = _fixed_size_segment(data, p, lo, stop, w)
        if fixed is None:
            values = _sized_walk(data, count)
            if values is None:          # the general loop goes on from this segment
                return parts, lo, p
            if text:
                values.append(b"")
                return [b"\n".join(values)], count, len(data)
            return values, count, len(data)
        size, frame_len, value_len = fixed
        end = p + (stop - lo) * size
        if text:
            chunk = bytearray(data[p:end])
            chunk[size - 1::size] = b"\n" * (stop - lo)
            for step in range(size, size - frame_len, -1):
                del chunk[::step]
            parts.append(chunk)
        else:
            parts += [data[s:s + value_len] for s in range(p + frame_len, end, size)]
        p = end
    return parts, min(count, _TABLE_SIZE), p


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
    headers_of: list[tuple] = []
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
    if header.attributes & TIMESTAMP_TYPE_MASK:
        # A LogAppendTime batch's records all carry the broker's time, which
        # Kafka keeps in maxTimestamp; the per-record deltas are ignored on read.
        timestamps = repeat(header.max_timestamp, len(offsets))
    return list(map(_new_record, repeat(Record), zip(offsets, timestamps, keys, values, headers_of)))


def _batch_timestamp(header: BatchHeader) -> int:
    """Every record's timestamp in a batch whose timestamp deltas are all 0."""
    return header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else header.base_timestamp


# --- public entry points ------------------------------------------------------------

def decode_values(buf, pos: int = 0, header: BatchHeader | None = None) -> list[bytes | None]:
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


def decode_text(buf, pos: int = 0, header: BatchHeader | None = None) -> bytes:
    """The text view of the batch at ``pos``: every value followed by ``\\n``.

    Equal to ``b"".join(v + b"\\n" for v in decode_values(...))`` with a null
    value as an empty line (b"" for a control batch), but a batch written by
    encode_values with fixed-size values becomes text without a bytes object
    per record.
    """
    header, data = _records_section(buf, pos, header)
    if data is None:
        return b""
    count = header.records_count
    try:
        parts, taken, at = _uniform_values(data, count, True)
        if taken < count or at != len(data):
            rest = _values_of(data, count - taken, at)
            if rest:
                if None in rest:
                    rest = [b"" if value is None else value for value in rest]
                rest.append(b"")
                parts.append(b"\n".join(rest))
    except (IndexError, ValueError) as exc:
        raise _corrupt(header, pos, str(exc)) from None
    return parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)


def decode_batch(buf, pos: int = 0, header: BatchHeader | None = None, *,
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


def decode_columns(buf, pos: int = 0, header: BatchHeader | None = None) -> BatchColumns:
    """The records of the batch at ``pos`` as columns, without a Record object per record.

    Equal field for field to :func:`decode_batch` (the hypothesis test in
    tests/test_records_columns.py proves it): the uniform-layout prefix comes
    from the same values fast path, whose layout fixes offsets, timestamp, null
    keys and no headers, so those columns are built in bulk; anything else
    (keyed records, headers, other producers' batches) is decoded by the
    general loop and transposed.  A control batch gives empty columns.
    """
    header, data = _records_section(buf, pos, header)
    if data is None:
        return BatchColumns(range(0), [], None, [], None)
    count = header.records_count
    try:
        # The text fast path turns fixed-size records into "value\n" runs with
        # extended-slice deletes, all in C; one split then yields the values,
        # which is exact when the piece count shows that no value held a newline.
        parts, taken, at = _uniform_values(data, count, True)
        if taken == count and at == len(data):
            text = parts[0] if len(parts) == 1 else b"".join(parts)
            values = text.split(b"\n")
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
    offsets = list(range(header.base_offset, header.base_offset + taken))
    timestamps = [_batch_timestamp(header)] * taken
    keys: list[bytes | None] = [None] * taken
    headers: list = [()] * taken
    if rest:
        rest_offsets, rest_timestamps, rest_keys, rest_values, rest_headers = zip(*rest)
        offsets += rest_offsets
        timestamps += rest_timestamps
        keys += rest_keys
        values += rest_values
        headers += rest_headers
    if offsets and offsets[-1] - offsets[0] == len(offsets) - 1:
        offsets = range(offsets[0], offsets[0] + len(offsets))     # increasing, so gap-free
    return BatchColumns(offsets, timestamps, None if keys.count(None) == len(keys) else keys,
                        values, headers if any(headers) else None)


def decode_key_columns(buf, pos: int, header: BatchHeader) -> tuple[list[int], list[bytes | None], list[int]]:
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
