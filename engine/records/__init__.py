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

The package is cut along the format's jobs: :mod:`~engine.records.format`
(header layout, attribute bits, ``BatchHeader``, ``Record``),
:mod:`~engine.records.varint` (varints and the encode tables),
:mod:`~engine.records.compression`, :mod:`~engine.records.encode` (including
the cleaner's ``rebuild_batch``), :mod:`~engine.records.framing` (header reads,
CRC validation, the batch walk), :mod:`~engine.records.fastpath` (the layout
proof) and :mod:`~engine.records.decode` (the general loops and the public
decoders).  Everything public is re-exported here: import from
``engine.records``.
"""

from engine.records.decode import (
    BatchColumns,
    BatchSpans,
    decode_batch,
    decode_columns,
    decode_key_columns,
    decode_spans,
    decode_text,
    decode_values,
)
from engine.records.encode import encode_records, encode_text_lines, encode_values, rebuild_batch
from engine.records.format import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
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
from engine.records.framing import iter_batches, read_header, validate_batch

__all__ = [
    "ATTRIBUTES_OFFSET", "COMPRESSION_CODEC_MASK", "CONTROL_FLAG_MASK",
    "DELETE_HORIZON_FLAG_MASK", "HEADER_SIZE", "LOG_OVERHEAD", "MAGIC",
    "NO_PARTITION_LEADER_EPOCH", "NO_PRODUCER_EPOCH", "NO_PRODUCER_ID", "NO_SEQUENCE", "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_FLAG_MASK",
    "BatchColumns", "BatchHeader", "BatchSpans", "Compression", "Record", "TimestampType",
    "decode_batch", "decode_columns", "decode_key_columns", "decode_spans", "decode_text", "decode_values",
    "encode_records", "encode_text_lines", "encode_values", "iter_batches", "read_header", "rebuild_batch",
    "validate_batch",
]
