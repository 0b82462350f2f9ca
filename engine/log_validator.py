"""What an append must satisfy before it touches the log (Kafka's ``LogValidator``, ``analyzeAndValidateRecords``).

Pure checks over values and batch bytes, outside ``Log.lock``: record sizes
against ``max.message.bytes``, each batch's framing and CRC32C, keys on a
compacted topic, a write against ``segment.bytes``, and offsets that only go
up.  Each raises the engine error Kafka's broker answers with
(``RecordTooLargeError``, ``InvalidRecordError``, ``CorruptRecordError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import InvalidRecordError, RecordTooLargeError
from engine.records import HEADER_SIZE, BatchHeader, decode_batch, encode_values, validate_batch

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.config import LogConfig
    from engine.topic import TopicPartition

__all__ = ["RECORD_OVERHEAD_BOUND", "check_record_sizes", "validate_batches", "check_in_order"]

# Upper bound of a single record's overhead inside a one-record batch: record
# length, attributes, timestamp and offset deltas, key and value lengths, header
# count.  Used to skip the exact size check when every record clearly fits.
RECORD_OVERHEAD_BOUND = 19


def _longest(items: Sequence[bytes | None] | None) -> int:
    if not items:
        return 0
    try:
        return max(map(len, items))  # type: ignore[arg-type]  # a None raises TypeError, handled below
    except TypeError:
        return max((len(i) for i in items if i is not None), default=0)


def check_record_sizes(tp: TopicPartition, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                       max_bytes: int) -> None:
    """RecordTooLargeError if any record alone makes a batch over ``max.message.bytes``.

    One C-level pass finds the longest value and key; only when that bound
    is too close to the limit is each suspicious record's exact batch size
    computed.
    """
    if _longest(values) + _longest(keys) + HEADER_SIZE + RECORD_OVERHEAD_BOUND <= max_bytes:
        return
    for i, value in enumerate(values):
        key = keys[i] if keys is not None else None
        rough = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        if rough + HEADER_SIZE + RECORD_OVERHEAD_BOUND <= max_bytes:
            continue
        size = len(encode_values(0, [value], 0, None if keys is None else [key]))
        if size > max_bytes:
            raise RecordTooLargeError(
                f"The record at index {i} of the append to {tp} is {size} bytes which "
                f"exceeds the maximum configured value of {max_bytes}.")


def validate_batches(tp: TopicPartition, buf: bytes | bytearray, config: LogConfig) -> list[tuple[int, BatchHeader]]:
    """The ``(position, header)`` of every batch of a producer's append, each CRC-checked.

    Refused: a batch over ``max.message.bytes``, a keyless record on a
    compacted topic, an empty append, and a write over ``segment.bytes``.
    """
    headers = []
    pos = 0
    while pos < len(buf):
        header = validate_batch(buf, pos)
        if header.size > config.max_message_bytes:
            raise RecordTooLargeError(
                f"The record batch size in the append to {tp} is {header.size} bytes "
                f"which exceeds the maximum configured value of {config.max_message_bytes}.")
        if config.compact and not header.is_control and any(r.key is None for r in decode_batch(buf, pos, header)):
                raise InvalidRecordError(
                    f"Compacted topic cannot accept message without key in topic partition {tp}.")
        headers.append((pos, header))
        pos += header.size
    if not headers:
        raise InvalidRecordError(f"Cannot append an empty batch to {tp}")
    if len(buf) > config.segment_size:
        raise RecordTooLargeError(
            f"Message batch size is {len(buf)} bytes in append to partition {tp} which "
            f"exceeds the maximum configured segment size of {config.segment_size}.")
    return headers


def check_in_order(tp: TopicPartition, headers: Sequence[tuple[int, BatchHeader]], previous: int) -> None:
    """InvalidRecordError unless each batch starts at or after the previous one's next offset (from ``previous``)."""
    for _, header in headers:
        if header.base_offset < previous:
            raise InvalidRecordError(
                f"Out of order offsets found in append to {tp}: batch at offset "
                f"{header.base_offset} is below {previous}")
        previous = header.next_offset
