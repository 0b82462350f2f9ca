"""RecordBatch v2 (magic 2): the header layout, its attribute bits and the types the log layer passes around.

The byte layout of a batch and of its records is described in
:mod:`engine.records`; this module holds the constants and the header struct
every other part of the package (and the segment, the cleaner, the tools) reads.
"""

from __future__ import annotations

import mmap
import struct
from enum import IntEnum
from typing import NamedTuple

from engine.errors import InvalidConfigError

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

#: Where the CRC-covered part of a batch starts.
ATTRIBUTES_OFFSET = 21
#: batchLength of a batch without records: the header after the length field.
_EMPTY_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

#: Rows of the span table of a batch's records (``kernels.records_spans``, ``decode.decode_spans``): offset,
#: timestamp, key position, key length (-1: null), value position, value length (-1: null), position of the
#: first header, header count.
SPAN_ROWS = 8

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


#: a record's headers: (key, value or None) pairs, in order
Headers = tuple[tuple[str, bytes | None], ...]


class Record(NamedTuple):
    """One record as the log layer sees it, with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


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


#: The bytes a batch is read from: a chunk read from a file, a slice of one, a view of a buffer, or a mapping
#: of a file (tests/unit/test_records.py reads batches from each)
RecordBuffer = bytes | bytearray | memoryview | mmap.mmap

_new_header = tuple.__new__
_new_record = tuple.__new__
_unpack_header = _HEADER.unpack_from
