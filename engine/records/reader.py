"""The one chunked batch reader over a ``.log``: read a chunk, walk its batches, grow when one does not fit.

Kafka reads a segment through ``FileRecords.batchesFrom`` (``FileLogInputStream``)
and the cleaner through its own growing buffer (``LogCleaner.growBuffersOrFail``).
Here every reader of ``.log`` bytes that needs whole batches goes through
:func:`read_chunks` (or its per-batch form :func:`read_batches`): the segment's
whole-batch walk (recovery, view index rebuilds, decoding), the mount's view
rendering, the cleaner's two passes, the Spark source's segment reader and the
offline tools.  So the framing checks, the CRC check and the wording and
position of a corruption error are the same everywhere: a
:class:`~engine.errors.CorruptRecordError` names the file and the byte of the
file (never of a buffer) where the bad batch starts.

The reader is given a ``read(position, size) -> bytes`` (``os.pread`` on a
descriptor, usually) and a range.  With a known ``end`` (a segment's published
size) the walk is *strict*: every batch before it is whole, so a batch crossing
it or a short tail is damage.  Without one (``end=None``: a file read until
EOF, or a recovery walk with ``strict=False``) a short tail is a batch still
being written, or torn by a crash, and ends the walk silently.

A chunk holds whole batches only.  When the first batch at the read position
does not fit, the next read is that batch's size (``grow`` may refuse or
account for it: the cleaner's buffer limit).  With ``verify_crc`` every batch
is CRC32C-checked lazily: the batches before a corrupt one are yielded first
(a reader serves them), then the error is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from crc32c import crc32c as _crc32c

from engine.errors import CorruptRecordError
from engine.records.format import ATTRIBUTES_OFFSET, HEADER_SIZE, LOG_OVERHEAD, BatchHeader, _new_header, _unpack_header
from engine.records.framing import framing_error, validate_batch

#: ``read(position, size)``: at most ``size`` bytes of the file at ``position``.
ReadAt = Callable[[int, int], bytes]


class BatchChunk(NamedTuple):
    """Whole batches read in one go: ``buf`` starts at file ``position``; ``batches`` are (offset in buf, header)."""

    position: int
    buf: bytes
    batches: list[tuple[int, BatchHeader]]
    end: int            # file position after the last batch of the chunk


def _damaged(detail: str, path: str | None, position: int) -> CorruptRecordError:
    return CorruptRecordError(detail, path=path, position=position)


def _past_end(size: int, end: int, path: str | None, position: int) -> CorruptRecordError:
    """A batch of ``size`` bytes at ``position`` that runs past ``end``, the valid data's end."""
    return _damaged(f"Record batch of {size} bytes runs past the end of the valid data at byte {end} (the file is "
                    "cut short or the batch length is damaged)", path, position)


def read_chunks(read: ReadAt, start: int, end: int | None, chunk_size: int, *, path: str | None = None,
                strict: bool = True, verify_crc: bool = False,
                grow: Callable[[int, int, int], int] | None = None) -> Iterator[BatchChunk]:
    """Chunks of whole batches of the file from ``start`` up to ``end`` (EOF when None).

    ``grow(chunk_size, batch_size, position)`` is called when the batch at
    ``position`` is larger than the chunk; it returns the size to read next
    (at least ``batch_size``) or raises.  Without it the read is the batch's
    size.  The chunk size of later reads stays ``chunk_size``.
    """
    strict = strict and end is not None
    pos = start
    want = chunk_size
    while True:
        if end is not None:
            if pos >= end:
                return
            size = min(want, end - pos)
        else:
            size = want
        buf = read(pos, size)
        n = len(buf)
        eof = n < size                  # the file ends inside the range asked for
        batches: list[tuple[int, BatchHeader]] = []
        off = 0
        error: CorruptRecordError | None = None
        pending = 0                     # size of a batch that does not fit in this buffer
        view = memoryview(buf) if verify_crc else None
        while off + HEADER_SIZE <= n:
            header = _new_header(BatchHeader, _unpack_header(buf, off))
            error = framing_error(header, path, pos + off)
            if error is not None:
                break
            batch_end = off + LOG_OVERHEAD + header.batch_length
            if end is not None and pos + batch_end > end:
                if strict:
                    error = _past_end(batch_end - off, end, path, pos + off)
                else:
                    eof = True          # a torn tail ends a lenient walk
                break
            if batch_end > n:
                pending = batch_end - off
                break
            if view is not None and _crc32c(view[off + ATTRIBUTES_OFFSET:batch_end]) != header.crc:
                try:
                    validate_batch(buf, off)        # words the error
                    raise CorruptRecordError("Record batch is corrupt")  # pragma: no cover
                except CorruptRecordError as exc:
                    error = _damaged(exc.detail, path, pos + off)
                break
            batches.append((off, header))
            off = batch_end
        if view is not None:
            view.release()
        if batches:
            yield BatchChunk(pos, buf, batches, pos + off)
            pos += off
        if error is not None:
            raise error
        left = n - off
        if eof or (end is not None and pos + HEADER_SIZE > end and pos < end):
            # ignore: strict implies end is not None (read_chunks sets strict = strict and end is not None)
            if strict and (left > 0 or pos < end):  # type: ignore[operator]
                raise _damaged(f"The {end - pos} bytes up to the segment's valid size {end} do not hold "  # type: ignore[operator]
                               "a whole record batch (the file is cut short or damaged)", path, pos)
            return                      # a torn tail (or nothing) at the end of the file
        if batches:
            want = chunk_size
        elif pending:
            want = grow(chunk_size, pending, pos) if grow is not None else pending
        else:                           # pragma: no cover - a buffer of >= HEADER_SIZE bytes holds a header
            return


def read_batches(read: ReadAt, start: int, end: int | None, chunk_size: int, *, path: str | None = None,
                 strict: bool = True, verify_crc: bool = False,
                 grow: Callable[[int, int, int], int] | None = None
                 ) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
    """Whole batches one by one: (file position, header, buffer, offset of the batch in the buffer)."""
    for chunk in read_chunks(read, start, end, chunk_size, path=path, strict=strict, verify_crc=verify_crc,
                             grow=grow):
        base, buf = chunk.position, chunk.buf
        for off, header in chunk.batches:
            yield base + off, header, buf, off


def read_headers(read: ReadAt, start: int, end: int, chunk_size: int, *, path: str | None = None,
                 strict: bool = True) -> Iterator[tuple[int, BatchHeader]]:
    """Batch headers only, one by one over [start, end): (file position, header).

    The header-only walk of offset and timestamp translation (Kafka's
    ``FileRecords.searchForOffsetFromPosition`` walks ``batchesFrom`` reading
    headers only): small ``chunk_size`` reads that skip over batch bodies
    without reading them, so a large batch is never dragged in to find the
    next header.  Framing checks and their errors are those of
    :func:`read_chunks`; see the module docstring for ``strict``.
    """
    pos = start
    buf = b""
    buf_start = start
    while pos + HEADER_SIZE <= end:
        off = pos - buf_start
        if off + HEADER_SIZE > len(buf):
            buf = read(pos, min(chunk_size, end - pos))
            buf_start, off = pos, 0
            if len(buf) < HEADER_SIZE:
                _short_tail(pos, end, strict, path)
                return
        header = _new_header(BatchHeader, _unpack_header(buf, off))
        error = framing_error(header, path, pos)
        if error is not None:
            raise error
        size = LOG_OVERHEAD + header.batch_length
        if pos + size > end:
            if strict:
                raise _past_end(size, end, path, pos)
            return                      # a torn tail ends a lenient walk
        yield pos, header
        pos += size
    if pos < end:
        _short_tail(pos, end, strict, path)


def _short_tail(pos: int, end: int, strict: bool, path: str | None) -> None:
    """Fewer bytes than a header where ``end`` says there is a batch: damage in a strict walk."""
    if strict:
        raise _damaged(f"The {end - pos} bytes up to the segment's valid size {end} do not hold "
                       "a whole record batch (the file is cut short or damaged)", path, pos)
