"""Reading one offset range from the raw segment files (``readFormat=segments``)."""

from __future__ import annotations

import bisect
import logging
import os
from typing import TYPE_CHECKING, Any

from engine.errors import (
    CorruptRecordError,
    StorageError,
)
from engine.files import segment_file_name
from engine.index import offset_index_file_position
from engine.records import (
    HEADER_SIZE,
    MAGIC,
    decode_spans,
    read_header,
    validate_batch,
)
from engine.records.reader import read_chunks
from logfs.spark.columns import ColumnBuilder
from logfs.spark.mount_client import partition_state, readable_start, skip_deleted
from logfs.spark.read_jsonl import read_range_jsonl

if TYPE_CHECKING:  # pragma: no cover - imported lazily where used
    from collections.abc import Iterator, Sequence

    import pyarrow as pa

    from logfs.spark.options import SourceOptions
    from logfs.spark.planning import OffsetRangePartition

log = logging.getLogger(__name__)

#: Bytes per read() of a ``.log`` file: large enough that the mount's per-request
#: cost vanishes, small enough that a task's memory stays bounded.
_SEGMENT_READ_BYTES = 4 << 20
#: How often one task re-lists a partition's segments after a file vanished under it
#: before giving up (each re-list follows a retention or cleaner pass that completed).
_MAX_RELISTS = 50
#: Records per Arrow batch handed to Spark (about one read's worth of small records).
_FLUSH_RECORDS = 1 << 15
#: Bytes of records sections behind one Arrow batch at most (its columns have int32 offsets).
_FLUSH_SECTION_BYTES = 256 << 20


def _segment_file(mount: str, topic: str, partition: int, base_offset: int, suffix: str) -> str:
    return os.path.join(mount, topic, str(partition), "segments", segment_file_name(base_offset, suffix))


def index_position(index_path: str, base_offset: int, target_offset: int) -> int:
    """Byte position in the ``.log`` from which a scan finds ``target_offset`` (0 without help).

    The search is :func:`engine.index.offset_index_file_position`; a missing
    ``.index`` (the segment was just deleted) gives 0.
    """
    try:
        fd = os.open(index_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        return offset_index_file_position(fd, base_offset, target_offset)
    finally:
        os.close(fd)


class _StaleIndex(Exception):
    """The ``.index`` position does not start a batch of the ``.log`` that is open.

    Happens when the cleaner swapped the segment between opening the ``.log`` and
    reading its ``.index``; the scan then starts at the beginning of the file.
    """


class SegmentRangeReader:
    """One Spark task's offset range read from ``MOUNT/<topic>/<p>/segments/<base>.log``.

    The mount serves a segment file's bytes as they are on disk, so this is the
    consumer side of Kafka's fetch path moved into the Spark worker: find the
    segment holding the next offset, skip to the nearest indexed batch, walk the
    batches, check each one's CRC (Kafka's ``ensureValid``) before decoding it,
    and keep the records in ``[from, until)``.

    Offsets, not files, identify records.  ``next_offset`` is the first offset not
    yet emitted and only grows, so no offset is emitted twice or out of order.
    Retention may delete, and the cleaner replace, segment files between planning
    and reading: a file that is gone when opened makes the reader list the
    segments again and continue from ``next_offset`` in whatever segment holds it
    now.  A file already open stays readable (the mount reads the inode it
    opened), and its records are the ones a consumer fetching before the
    deletion or the clean would have seen.  Records below the log start offset
    at read time are data loss, handled by ``failOnDataLoss``.
    """

    def __init__(self, opts: SourceOptions, rng: OffsetRangePartition) -> None:
        self.opts = opts
        self.topic = rng.topic
        self.partition = rng.partition
        self.next_offset = rng.from_offset
        self.until_offset = rng.until_offset
        self.builder = ColumnBuilder(rng.topic, rng.partition, opts.include_headers)
        self._relists = 0

    @property
    def _name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def _list_segments(self) -> list[int]:
        """Base offsets of the segments now; applies failOnDataLoss to the log start offset."""
        state = partition_state(self.opts.mount, self.topic, self.partition)
        log_start = readable_start(state)
        if self.next_offset < log_start:
            self.next_offset = skip_deleted(self.opts.fail_on_data_loss, self._name, self.next_offset,
                                            log_start, int(state["log_end_offset"]))
        # the remote log segments below the local log start (tiered storage) first: segments/ serves their files
        return sorted(int(s["base_offset"]) for s in (*state.get("remote_segments", ()), *state["segments"]))

    def _relist(self, why: str) -> list[int]:
        self._relists += 1
        if self._relists > _MAX_RELISTS:
            raise StorageError(f"Gave up reading {self._name} at offset {self.next_offset}: its segments "
                               f"changed {_MAX_RELISTS} times while one task read them ({why})")
        log.info("[logfs source] %s; listing the segments of %s again to continue from offset %d",
                 why, self._name, self.next_offset)
        return self._list_segments()

    def _segment_for(self, bases: Sequence[int], after: int | None) -> int | None:
        """The segment to read next: the one holding next_offset, past ``after`` (the one finished)."""
        first = 0 if after is None else bisect.bisect_right(bases, after)
        if first >= len(bases):
            return None
        holding = bisect.bisect_right(bases, self.next_offset, lo=first) - 1
        return bases[max(holding, first)]

    def batches(self) -> Iterator[pa.RecordBatch]:
        bases = self._list_segments()
        after: int | None = None       # base offset of the segment read to its end
        listing_is_fresh = True
        while self.next_offset < self.until_offset:
            base = self._segment_for(bases, after)
            if base is None:
                if listing_is_fresh:
                    break               # no segment holds [next, until): removed by the cleaner
                bases, listing_is_fresh = self._relist("Read past the last known segment"), True
                continue
            path = _segment_file(self.opts.mount, self.topic, self.partition, base, ".log")
            try:
                # opened outside the `with` below so that only the open's FileNotFoundError relists
                segment = open(path, "rb", buffering=0)  # noqa: SIM115
            except FileNotFoundError:
                bases, listing_is_fresh, after = self._relist(f"Segment file {path} was deleted"), True, None
                continue
            with segment:
                start = 0
                if self.next_offset > base:
                    start = index_position(_segment_file(self.opts.mount, self.topic, self.partition,
                                                         base, ".index"), base, self.next_offset)
                try:
                    yield from self._read_segment(segment, path, base, start)
                except _StaleIndex:
                    log.info("[logfs source] Index of %s does not match its log (replaced by the cleaner?); "
                             "scanning it from the start", path)
                    yield from self._read_segment(segment, path, base, 0)
            after, listing_is_fresh = base, False
        last = self.builder.flush()
        if last is not None:
            yield last

    # Any: an open binary file
    def _read_segment(self, segment: Any, path: str, base: int, start: int) -> Iterator[pa.RecordBatch]:
        """Walk one ``.log`` from byte ``start``, adding the wanted records to the builder.

        Batches come from the shared chunked reader (engine.records.reader:
        framing and CRC checked, errors naming the file and its byte), read
        until the end of the file: a torn tail is not part of the log.
        """
        until = self.until_offset
        builder = self.builder
        fd = segment.fileno()

        def read(position: int, size: int) -> bytes:
            return os.pread(fd, size, position)

        if start:
            # A position from the index is trusted once the batch there proves to be one of
            # this segment's (magic, base offset in range, CRC): see _StaleIndex.
            self._check_index_position(read(start, 64 << 10), base)
        try:
            for chunk in read_chunks(read, start, None, _SEGMENT_READ_BYTES, path=path, verify_crc=True):
                buf = chunk.buf
                for pos, header in chunk.batches:
                    if header.next_offset <= self.next_offset:
                        continue         # before the range, or emitted: skipped without decoding
                    if header.base_offset >= until:
                        return
                    try:
                        # a control batch gives no records
                        spans = decode_spans(buf, pos, header, with_headers=builder.include_headers)
                    except CorruptRecordError as exc:
                        raise exc.at(path, chunk.position + pos) from None
                    offsets = spans.table[0]
                    if len(offsets):
                        # offsets increase (with gaps in a compacted batch): bisect, as the old lists were
                        lo = bisect.bisect_left(offsets, self.next_offset)
                        hi = bisect.bisect_left(offsets, until)
                        if hi > lo:
                            if builder.section_bytes + len(spans.data) > _FLUSH_SECTION_BYTES and len(builder):
                                yield builder.flush()
                            builder.add(spans, lo, hi, header.timestamp_type)
                    self.next_offset = header.next_offset
                    if self.next_offset >= until:
                        return
                if len(builder) >= _FLUSH_RECORDS:
                    yield builder.flush()
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"{exc.detail} while reading {self._name}", path=path,
                                     position=exc.position) from exc

    def _check_index_position(self, buf: bytes, base: int) -> None:
        """Raise _StaleIndex unless ``buf`` starts with a valid batch at or before next_offset."""
        if not buf:
            raise _StaleIndex()
        try:
            header = validate_batch(buf, 0)
        except CorruptRecordError:
            if len(buf) >= HEADER_SIZE and read_header(buf).magic == MAGIC \
                    and read_header(buf).size > len(buf):
                return           # larger than this read; it is checked when decoded
            raise _StaleIndex() from None
        if not base <= header.base_offset <= self.next_offset:
            raise _StaleIndex()


def read_range(opts: SourceOptions, rng: OffsetRangePartition) -> Iterator[pa.RecordBatch]:
    """Yield the records of one offset range as Arrow batches of the Kafka schema.

    ``readFormat=segments`` (the default) decodes the raw ``.log`` files in this
    worker; ``readFormat=jsonl`` parses the mount's rendered JSON-lines view.
    """
    if opts.read_format == "jsonl":
        return read_range_jsonl(opts, rng)
    return SegmentRangeReader(opts, rng).batches()
