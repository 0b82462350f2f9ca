"""Framing and validation of the batches in a buffer: header reads, CRC checks, a shallow batch walk.

:func:`iter_batches` walks batches already in memory.  Readers of a ``.log``
file do not use it: they all go through the one chunked reader,
:mod:`engine.records.reader` (read a chunk, walk its batches, grow when one
does not fit), so framing, CRC and corruption errors are the same everywhere.
The header-only walk of ``LogSegment._walk`` (offset and timestamp
translation) stays in :mod:`engine.segment`: it skips batch bodies unread.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from crc32c import crc32c as _crc32c

from engine.errors import CorruptRecordError
from engine.records.format import (
    _EMPTY_BATCH_LENGTH,
    ATTRIBUTES_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    RecordBuffer,
    _new_header,
    _unpack_header,
)

if TYPE_CHECKING:
    from collections.abc import Iterator


def read_header(buf: RecordBuffer, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos``; checks only that 61 bytes are there."""
    try:
        return _new_header(BatchHeader, _unpack_header(buf, pos))
    except struct.error:
        raise CorruptRecordError(
            f"Found {max(len(buf) - pos, 0)} bytes at the end of the log, fewer than a "
            f"record batch header ({HEADER_SIZE} bytes)", position=pos) from None


def _too_small(batch_length: int, path: str | None, position: int) -> CorruptRecordError:
    """A length field too small to be a batch: nothing after it can be found."""
    return CorruptRecordError(f"Record batch size {batch_length + LOG_OVERHEAD} is smaller than the minimum "
                              f"allowed ({HEADER_SIZE})", path=path, position=position)


def framing_error(header: BatchHeader, path: str | None, position: int) -> CorruptRecordError | None:
    """The damage a header's framing shows (a length too small to be a batch, another magic), or None.

    The one framing check of every reader: :func:`validate_batch` and the chunked
    reader (:func:`engine.records.reader.read_chunks`) word the same damage alike.
    """
    if header.batch_length < _EMPTY_BATCH_LENGTH:
        return _too_small(header.batch_length, path, position)
    if header.magic != MAGIC:
        return CorruptRecordError(f"Record batch has magic {header.magic}, only magic {MAGIC} is supported",
                                  path=path, position=position)
    return None


def validate_batch(buf: RecordBuffer, pos: int = 0, *, path: str | None = None) -> BatchHeader:
    """Check framing, magic and CRC32C of the batch at ``pos`` (Kafka's ``ensureValid``)."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise CorruptRecordError(
            f"Record batch header is truncated: {max(available, 0)} of {HEADER_SIZE} bytes",
            path=path, position=pos)
    header = _new_header(BatchHeader, _unpack_header(buf, pos))
    error = framing_error(header, path, pos)
    if error is not None:
        raise error
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


def iter_batches(buf: RecordBuffer, start: int = 0, end: int | None = None, *,
                 lenient: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """Walk the batches in ``buf[start:end]``, yielding (position, header).

    A shallow walk as ``FileLogInputStream`` does it: headers only, no CRC.  A
    tail shorter than a header or than the batch it announces is a torn write
    and ends the walk silently; a length field too small to be a batch cannot be
    skipped over and raises CorruptRecordError, unless ``lenient`` (the tools,
    which report what they find up to the damage), where it ends the walk too.
    """
    limit = len(buf) if end is None else min(end, len(buf))
    pos = start
    while pos + HEADER_SIZE <= limit:
        header = _new_header(BatchHeader, _unpack_header(buf, pos))
        batch_length = header.batch_length
        if batch_length < _EMPTY_BATCH_LENGTH:
            if lenient:
                return
            raise _too_small(batch_length, None, pos)
        next_pos = pos + LOG_OVERHEAD + batch_length
        if next_pos > limit:
            return
        yield pos, header
        pos = next_pos
