"""LogSegment: one ``.log`` file with its ``.index`` and ``.timeindex`` (Kafka's LogSegment + FileRecords).

A segment is the unit of rolling, retention, recovery and cleaning.  Behaviour
follows Kafka's ``LogSegment``:

* the offset index is sparse: an entry (the batch's *last* offset, its
  position) whenever more than ``index.interval.bytes`` of log went by since
  the previous entry, and the time index gets ``(max timestamp so far, its
  offset)`` at the same points; a final time index entry is written when the
  segment stops being active;
* indexes are preallocated to what the segment can hold (:func:`index_bytes_needed`)
  and trimmed to their entries when the segment becomes inactive or is closed;
* ``recover()`` validates every batch and truncates at the first torn or
  corrupt one, rebuilding both indexes from what survives.

Unix semantics for readers: the ``.log`` is read with ``os.pread`` on a file
descriptor, so a segment deleted (or replaced by the cleaner) under a reader
keeps serving the bytes the reader opened.  The descriptor of a sealed segment
under its own name may be closed by the process's descriptor budget
(:mod:`engine.file_cache`) and is reopened by name on next use; a segment being
written, renamed or deleted keeps its descriptor (pinned).  The descriptor is
closed by :meth:`close` or when the object is garbage-collected.

Read-only segments (a ``--read-only`` mount) open the .log ``O_RDONLY`` and map
both indexes read-only, so nothing can change a byte or an mtime on disk: every
mutator raises :class:`~engine.errors.ReadOnlyError` before touching a file.

Concurrency: appends happen under ``Log.lock`` (one writer).  Reads never lock:
they bound themselves by a snapshot of :attr:`size`, which is published only
after the bytes are written, so a reader never sees a partial batch.

Size (~900 lines): one class whose parts (append, read and translate,
recovery, truncation, file renames) all work on the same private state (size,
next offset, max timestamp, index byte counter); cutting them apart would
publish that state.  What needs none of it lives apart: the load-time checks
of the indexes against the .log (:mod:`engine.segment_checks`), both batch
walks (:mod:`engine.records.reader`), file names and suffixes
(:mod:`engine.files`), the descriptor budget (:mod:`engine.file_cache`).
"""

from __future__ import annotations

import errno
import logging
import os
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, TypeVar

from engine import records as _records
from engine.clock import SYSTEM_CLOCK, Clock
from engine.errors import (
    CorruptRecordError,
    InvalidRequestError,
    LogDirFullError,
    ReadOnlyError,
    StorageError,
    UnsafeFileError,
    storage_error,
)
from engine.file_cache import LazyFile, OpenFile
from engine.files import (
    DELETE_DIR_SUFFIX,
    DELETED_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    log_file_path,
    offset_index_file_path,
    remove_view_index_file,
    time_index_file_path,
)
from engine.index import OffsetIndex, TimeIndex, open_regular_file
from engine.records import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, Record, validate_batch
from engine.records.reader import read_batches, read_headers
from engine.topic import TopicPartition, parse_topic_partition_dir

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

    from engine.config import LogConfig
    from engine.records.format import RecordBuffer

log = logging.getLogger(__name__)

_IndexT = TypeVar("_IndexT", OffsetIndex, TimeIndex)


_INT32_MAX = 0x7FFFFFFF
#: Below this an index file is not made smaller (one page: nothing to gain, see index_bytes_needed).
_MIN_INDEX_BYTES = 4096


def index_bytes_needed(segment_bytes: int, segment_index_bytes: int) -> int:
    """The size an index of a segment of ``segment_bytes`` is preallocated to: what it can ever hold.

    Kafka preallocates every index to ``segment.index.bytes`` (10 MiB by
    default).  A segment holds at most one offset index entry per batch and
    one time index entry per batch plus the final one, and a batch is at least
    ``HEADER_SIZE`` bytes, so a small segment never needs more than a page.
    The first write into a large sparse mapping pays for the whole mapping, so
    a tiny segment gets a small index and its roll stays cheap
    (docs/performance.md, "Figures behind the code").  For the default segment
    size the result is ``segment.index.bytes``, as in Kafka.
    """
    needed = (max(segment_bytes, 0) // HEADER_SIZE + 2) * 12      # 12: the wider (time index) entry
    return min(segment_index_bytes, max(_MIN_INDEX_BYTES, needed))


class _Unknown(Enum):
    """The "not loaded yet" sentinel of lazily read fields (an Enum member, so ``is`` checks narrow the type)."""

    UNKNOWN = 0


_UNKNOWN: Final = _Unknown.UNKNOWN

# Header-only scans (offset translation) read this much at a time: a few batches
# of a typical index interval without dragging whole large batches in.
_HEADER_SCAN_CHUNK = 16 * 1024
# Full scans (recovery, view index rebuild) read big sequential chunks.
_BODY_SCAN_CHUNK = 4 * 1024 * 1024


class FetchDataInfo(NamedTuple):
    """Raw batch bytes of a read and where they start (Kafka's FetchDataInfo + LogOffsetMetadata)."""

    fetch_offset: int
    segment_base_offset: int
    position: int
    records: bytes


class LogOffsetPosition(NamedTuple):
    """A batch found by offset: its last offset, position in the .log and size in bytes."""

    offset: int
    position: int
    size: int


def replace_suffix(path: str, old_suffix: str, new_suffix: str) -> str:
    if not path.endswith(old_suffix):
        raise StorageError(f"Expected file {path} to end with suffix {old_suffix!r}")
    return path[:len(path) - len(old_suffix)] + new_suffix


def topic_partition_of_dir(dir: str) -> TopicPartition:
    """The partition a log directory holds, including ``topic-p.<uuid>-delete`` dirs."""
    name = os.path.basename(os.path.normpath(dir))
    if name.endswith(DELETE_DIR_SUFFIX) and "." in name:
        name = name[:name.rindex(".")]
    return parse_topic_partition_dir(name)


class SegmentAttachment:
    """The base of what another layer keeps on a segment, derived from its bytes (the mount's view indexes:
    ``engine.views.index.SegmentViews``).

    The segment holds at most one, in :attr:`LogSegment.attachment`, and knows nothing of it beyond this: it
    never reads it, drops it when bytes it already holds change (truncation, recovery), after which its owner
    rebuilds it by a scan as after a remount, and it goes with the segment.
    """

    __slots__ = ()


class LogSegment:
    """One segment of a partition's log: ``<base>.log`` + ``.index`` + ``.timeindex``."""

    #: a local file (engine.remote.remote_segment.RemoteLogSegment, a copy in remote storage, says True)
    remote = False
    #: what another layer derives from this segment's bytes (see :class:`SegmentAttachment`); None when nothing
    attachment: SegmentAttachment | None

    def read_ahead(self) -> None:
        """A sequential reader is about to read this segment from its start: nothing to do for a local file
        (the page cache reads ahead); a remote log segment fetches its first chunks."""

    def __init__(self, dir: str, base_offset: int, config: LogConfig, clock: Clock = SYSTEM_CLOCK, *,
                 file_suffix: str = "", file_already_exists: bool = False,
                 preallocate: bool = False, topic_partition: TopicPartition | None = None,
                 read_only: bool = False) -> None:
        self.dir = dir
        self.read_only = read_only
        self.base_offset = base_offset
        self.clock = clock
        self.index_interval_bytes: int = config.index_interval_bytes
        self._segment_index_bytes: int = config.segment_index_bytes
        self._segment_bytes: int = config.segment_size
        self.max_index_size: int = index_bytes_needed(config.segment_size, config.segment_index_bytes)
        self.roll_jitter_ms = 0
        log_path = log_file_path(dir, base_offset, file_suffix)
        self._topic_partition = topic_partition
        self._preallocated = preallocate and not file_already_exists and not read_only
        # Read-only: no O_CREAT either, a missing .log is an error rather than a new file.
        # Never through a link, never anything but a regular file (engine.index.open_regular_file);
        # permissions come from the process umask (private by default, see logfs.cli).
        flags = os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT
        try:
            fd = open_regular_file(log_path, flags, 0o666)
        except UnsafeFileError:
            raise
        except OSError as exc:
            raise storage_error(f"Could not open log file {log_path}: {exc.strerror}", exc) from exc
        # The descriptor closes when the last reference to its OpenFile goes: the
        # segment's (dropped by the FileCache when over budget, reopened by name on
        # next use, see _log) and any reader's in flight.  A view holding a deleted
        # segment keeps reading it: a segment renamed or deleted is pinned (_pin).
        self._lazy = LazyFile(log_path, fd, os.O_RDONLY if read_only else os.O_RDWR, open_regular_file)
        try:
            if self._preallocated:
                os.posix_fallocate(fd, 0, max(config.segment_size, 1))
                self._size = 0
            else:
                self._size = os.fstat(fd).st_size
            if self._size > self._segment_bytes:       # written under a larger segment.bytes
                self.max_index_size = index_bytes_needed(self._size, self._segment_index_bytes)
            #: True when an index file of a read-only segment is missing: an empty
            #: in-memory index stands in for it until recover() fills it
            self.indexes_missing = False
            #: an OffsetIndex, or a _ScanOnlyIndex once it was found to disagree with the .log
            self.offset_index: OffsetIndex | _ScanOnlyIndex = self._open_index(
                OffsetIndex, offset_index_file_path(dir, base_offset, file_suffix))
            self.time_index = self._open_index(TimeIndex, time_index_file_path(dir, base_offset, file_suffix))
        except BaseException:
            self._close_fd()
            raise
        self._created = clock.milliseconds()
        self._bytes_since_last_index_entry = 0
        self._next_offset: int | None = None if self._size else base_offset
        self._max_timestamp_and_offset: tuple[int, int] | Literal[_Unknown.UNKNOWN] = _UNKNOWN
        self._rolling_based_timestamp: int | Literal[_Unknown.UNKNOWN] | None = _UNKNOWN if self._size else None
        self._damage_logged = False      # read_next_offset logs damage once per segment
        self._index_distrusted = False   # translate_offset found the offset index wrong (logged once)
        self.attachment = None

    def _open_index(self, kind: type[_IndexT], path: str) -> _IndexT:
        if self.read_only and not os.path.lexists(path):
            self.indexes_missing = True
            return kind(path, self.base_offset, self.max_index_size, in_memory=True)
        return kind(path, self.base_offset, self.max_index_size, writable=not self.read_only)

    @classmethod
    def open(cls, dir: str, base_offset: int, config: LogConfig, clock: Clock = SYSTEM_CLOCK, *,
             file_suffix: str = "", file_already_exists: bool = False, preallocate: bool = False,
             topic_partition: TopicPartition | None = None, read_only: bool = False) -> LogSegment:
        """Open (creating if missing) the segment at ``base_offset`` in ``dir``.

        With ``read_only`` the three files must exist and are never written:
        the .log is opened ``O_RDONLY`` and the indexes are mapped read-only
        (CorruptIndexError if an index is missing).
        """
        return cls(dir, base_offset, config, clock, file_suffix=file_suffix,
                   file_already_exists=file_already_exists, preallocate=preallocate,
                   topic_partition=topic_partition, read_only=read_only)

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"Cannot {what} segment {self.log_path}: it was opened read-only")

    # ------------------------------------------------------------------ basics
    @property
    def size(self) -> int:
        """Bytes of valid batches in the .log (published after each write completes)."""
        return self._size

    @property
    def topic_partition(self) -> TopicPartition:
        if self._topic_partition is None:
            try:
                self._topic_partition = topic_partition_of_dir(self.dir)
            except Exception:
                self._topic_partition = TopicPartition(os.path.basename(self.dir), 0)
        return self._topic_partition

    @topic_partition.setter
    def topic_partition(self, tp: TopicPartition) -> None:
        self._topic_partition = tp

    @property
    def next_offset(self) -> int:
        """The offset after the last batch (base offset if empty); read once, then cached."""
        nxt = self._next_offset
        if nxt is None:
            nxt = self._next_offset = self.read_next_offset()
        return nxt

    def read_next_offset(self) -> int:
        """Kafka's readNextOffset: from the last offset index entry, walk to the last batch.

        Damage on the way (a sealed segment cut mid-batch) does not fail the
        caller here: the offset after the last whole batch is returned and the
        damage logged once; reads that reach it fail with CorruptRecordError.
        """
        size = self._size
        _, position = self.offset_index.lookup(self.offset_index.last_offset)
        if position > size:
            position = 0
        last: BatchHeader | None = None
        try:
            for _, header in self._headers(position, size):
                last = header
        except CorruptRecordError as exc:
            self._log_damage_once(exc)
        return last.next_offset if last is not None else self.base_offset

    def _log_damage_once(self, exc: CorruptRecordError) -> None:
        if not self._damage_logged:
            self._damage_logged = True
            log.error("Log segment %s is damaged at byte %d: %s; reads reaching it fail with EIO",
                      exc.path or self.log_path, exc.position, exc.detail)

    def _can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    # ------------------------------------------------------------- timestamps
    def _max_ts_and_offset(self) -> tuple[int, int]:
        value = self._max_timestamp_and_offset
        if value is _UNKNOWN:
            value = self._max_timestamp_and_offset = self.time_index.last_entry
        return value

    @property
    def max_timestamp_so_far(self) -> int:
        return self._max_ts_and_offset()[0]

    @property
    def offset_of_max_timestamp(self) -> int:
        return self._max_ts_and_offset()[1]

    @property
    def largest_timestamp(self) -> int:
        """The largest record timestamp, or the file's mtime when no record has one (Kafka)."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self.last_modified

    @property
    def last_modified(self) -> int:
        f = self._lazy.current()
        try:
            st = os.fstat(f.fd) if f is not None and f.fd >= 0 else os.stat(self.log_path)
        except OSError as exc:
            raise StorageError(f"Could not stat {self.log_path}: {exc.strerror}") from exc
        return st.st_mtime_ns // 1_000_000

    def set_last_modified(self, ms: int) -> None:
        self._check_writable("set the modification time of")
        ns = ms * 1_000_000
        f = self._lazy.current()
        if f is not None and f.fd >= 0:
            os.utime(f.fd, ns=(ns, ns))
        else:
            os.utime(self.log_path, ns=(ns, ns), follow_symlinks=False)
        for path in (self.offset_index.path, self.time_index.path):
            if os.path.lexists(path):
                os.utime(path, ns=(ns, ns), follow_symlinks=False)

    def _first_batch_timestamp(self) -> int | None:
        ts = self._rolling_based_timestamp
        if ts is _UNKNOWN:
            ts = None
            for _, header in self._headers(0, self._size):
                ts = header.max_timestamp
                break
            self._rolling_based_timestamp = ts
        return ts

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        """Time since the first batch's timestamp (Kafka's rollingBasedTimestamp), else since creation."""
        ts = self._first_batch_timestamp()
        if ts is not None and ts >= 0:
            return message_timestamp - ts
        return now_ms - self._created

    def should_roll(self, config: LogConfig, max_timestamp_in_batch: int, max_offset_in_batch: int,
                    now_ms: int, batch_size: int) -> bool:
        """Kafka's shouldRoll: size, segment.ms since the first batch, full indexes, offset overflow."""
        size = self._size
        reached_roll_ms = (self.time_waited_for_roll(now_ms, max_timestamp_in_batch)
                           > config.segment_ms - self.roll_jitter_ms)
        return (size > config.segment_size - batch_size
                or (size > 0 and reached_roll_ms)
                or self.offset_index.is_full()
                or self.time_index.is_full()
                or not self._can_convert_to_relative_offset(max_offset_in_batch))

    # ----------------------------------------------------------------- append
    def append(self, largest_offset: int, largest_timestamp: int, offset_of_max_timestamp: int,
               records: bytes | bytearray) -> None:
        """Append batch bytes whose last offset is ``largest_offset`` (Kafka's LogSegment.append).

        On ENOSPC the .log is truncated back and
        LogDirFullError raised: nothing partial stays in the file.
        """
        self._check_writable("append to")
        n = len(records)
        if n == 0:
            return
        position = self._size
        if not self._can_convert_to_relative_offset(largest_offset):
            raise StorageError(
                f"Detected offset overflow at offset {largest_offset} in segment {self}")
        self._write(records, position)
        previous_max = max_ts = self._max_ts_and_offset()
        if largest_timestamp > max_ts[0]:
            max_ts = (largest_timestamp, offset_of_max_timestamp)
        indexed = self._bytes_since_last_index_entry > self.index_interval_bytes
        if indexed:
            try:
                self.offset_index.append(largest_offset, position)
                self.time_index.maybe_append(max_ts[0], max_ts[1])
            except BaseException:
                # e.g. ENOSPC allocating an index page: undo the whole append so
                # no batch sits in the file beyond what the indexes and size say.
                first_offset = int.from_bytes(records[:8], "big", signed=True)
                self.offset_index.truncate_to(first_offset)
                self.time_index.truncate_to(first_offset)
                self._truncate_file(position)
                raise
            self._bytes_since_last_index_entry = 0
        if previous_max is not max_ts:
            self._max_timestamp_and_offset = max_ts
        if position == 0:
            self._rolling_based_timestamp = largest_timestamp
        self._bytes_since_last_index_entry += n
        self._next_offset = largest_offset + 1
        self._size = position + n           # publish: readers may now see the batch

    def _write(self, data: bytes | bytearray, position: int) -> None:
        if not self._lazy.pinned:
            self._pin()                     # written to: the active segment (or the cleaner's output)
        f = self._log()
        fd = f.fd
        try:
            written = os.pwrite(fd, data, position)
            if written < len(data):
                view = memoryview(data)
                while written < len(data):
                    written += os.pwrite(fd, view[written:], position + written)
        except OSError as exc:
            try:
                os.ftruncate(fd, position)      # nothing partial may stay behind
            except OSError:
                log.error("Failed to truncate %s back to %d bytes after a failed append",
                          self.log_path, position)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise LogDirFullError(
                    f"No space left on device while appending {len(data)} bytes to {self.log_path}"
                ) from exc
            raise StorageError(f"I/O error appending to {self.log_path}: {exc.strerror}") from exc

    # ------------------------------------------------------------------- read
    def read_bytes(self, position: int, size: int) -> bytes:
        """Raw bytes of the .log; works after the file was deleted (the descriptor is kept)."""
        if size <= 0:
            return b""
        f = self._log()
        try:
            return os.pread(f.fd, size, position)
        except OSError as exc:
            raise StorageError(f"I/O error reading {self.log_path} at {position}: {exc.strerror}") from exc

    def _damaged(self, detail: str, position: int) -> CorruptRecordError:
        return CorruptRecordError(detail, path=self.log_path, position=position)

    def _headers(self, start: int, end: int, strict: bool = True) -> Iterator[tuple[int, BatchHeader]]:
        """Header-only walk of [start, end): (position, header), for offset and timestamp translation.

        Small reads (``_HEADER_SCAN_CHUNK``) that skip over batch bodies
        (:func:`engine.records.reader.read_headers`).  ``strict`` walks end at a
        boundary the segment published (its size, or a log end position): every
        batch before it is whole, so one crossing it is damage, never a batch
        still being written.  Only recovery walks are not strict.
        """
        f = self._log()                     # held for the walk: the descriptor stays open under it
        fd = f.fd
        yield from read_headers(lambda position, size: os.pread(fd, size, position), start, end,
                                _HEADER_SCAN_CHUNK, path=self.log_path, strict=strict)

    def _batches_with_bytes(self, start: int, end: int,
                            strict: bool = True) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        """Whole-batch walk of [start, end): (position, header, buffer, offset in buffer); see _headers.

        Through the shared chunked reader (:func:`engine.records.reader.read_batches`,
        ``_BODY_SCAN_CHUNK`` at a time), so every batch yielded is whole in its
        buffer (recovery, decoding, view index rebuilds) and damage is reported
        as every other reader reports it.
        """
        return read_batches(self.read_bytes, start, end, _BODY_SCAN_CHUNK, path=self.log_path, strict=strict)

    def batches(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch from ``start_position`` up to the current size."""
        return self._headers(start_position, self._size)

    def batches_with_bytes(self, start_position: int = 0,
                           end_position: int | None = None) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        """Whole batches for decoding: (position, header, buffer, offset of the batch in buffer)."""
        end = self._size if end_position is None else min(end_position, self._size)
        return self._batches_with_bytes(start_position, end)

    def translate_offset(self, offset: int, starting_position: int = 0) -> LogOffsetPosition | None:
        """The first batch whose last offset is >= ``offset`` (index lookup, then a short scan).

        The index is checked against the log on the way: the batch at an
        entry's position starts at or below the entry's offset.  An entry that
        lands inside a batch, beyond the file or on a batch above the wanted
        offset means the index does not belong to this log: it is logged at
        ERROR once and the walk starts over from ``starting_position`` (never a
        wrong answer, only a slower one); see engine.segment_checks.
        """
        size = self._size
        index_offset, position = self.offset_index.lookup(offset)
        start = max(position, starting_position)
        first = True
        try:
            for pos, header in self._headers(start, size):
                if first and position > starting_position and header.base_offset > index_offset:
                    raise self._damaged(f"the batch at the index position starts at offset {header.base_offset}, "
                                        f"above the index entry's offset {index_offset}", pos)
                first = False
                last = header.base_offset + header.last_offset_delta
                if last >= offset:
                    return LogOffsetPosition(last, pos, LOG_OVERHEAD + header.batch_length)
        except CorruptRecordError as exc:
            if not first or position <= starting_position:
                raise                       # damage in the .log itself: EIO with file and position
            self._distrust_index(exc, index_offset, position)
            for pos, header in self._headers(starting_position, size):
                last = header.base_offset + header.last_offset_delta
                if last >= offset:
                    return LogOffsetPosition(last, pos, LOG_OVERHEAD + header.batch_length)
        return None

    def _distrust_index(self, exc: CorruptRecordError, index_offset: int, position: int) -> None:
        """An index entry disagrees with the log: log once, then serve by scanning (rebuilt at next load)."""
        if not self._index_distrusted:
            self._index_distrusted = True
            log.error("Offset index %s disagrees with log %s: its entry (offset %d, position %d) does not "
                      "point at a batch holding that offset (%s); reading this segment without it",
                      self.offset_index.path, self.log_path, index_offset, position, exc.detail)
        # Reads of this segment scan from the start from now on.
        self.offset_index = _ScanOnlyIndex(self.offset_index)

    def read(self, start_offset: int, max_size: int, max_position: int | None = None,
             min_one_message: bool = False) -> FetchDataInfo | None:
        """Raw bytes from the batch holding ``start_offset``, at most ``max_size`` of them.

        None when no batch of this segment reaches ``start_offset``.  As in
        Kafka the last batch may be cut short by ``max_size`` (readers stop at a
        short tail); ``min_one_message`` widens the limit to the first batch.
        ``max_position`` bounds the read (Kafka's high-watermark position); None
        means the segment's current size, not Kafka's "nothing".
        """
        if max_size < 0:
            raise InvalidRequestError(f"Invalid max size {max_size} for log read from segment {self}")
        size = self._size
        mapping = self.translate_offset(start_offset)
        if mapping is None:
            return None
        limit = size if max_position is None else min(max_position, size)
        adjusted = max(max_size, mapping.size) if min_one_message else max_size
        if adjusted == 0 or limit <= mapping.position:
            return FetchDataInfo(start_offset, self.base_offset, mapping.position, b"")
        fetch_size = min(limit - mapping.position, adjusted)
        return FetchDataInfo(start_offset, self.base_offset, mapping.position,
                             self.read_bytes(mapping.position, fetch_size))

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with timestamp >= ``timestamp`` and offset >= start."""
        _, ts_offset = self.time_index.lookup(timestamp)
        _, position = self.offset_index.lookup(max(ts_offset, starting_offset))
        for pos, header, buf, off in self._batches_with_bytes(position, self._size):
            if header.max_timestamp >= timestamp and header.next_offset > starting_offset:
                for record in self._decode(buf, off, header, pos):
                    if record.timestamp >= timestamp and record.offset >= starting_offset:
                        return record.timestamp, record.offset
        return None

    def _decode(self, buf: RecordBuffer, off: int, header: BatchHeader, position: int) -> list[Record]:
        try:
            return _records.decode_batch(buf, off, header)
        except CorruptRecordError as exc:
            raise exc.at(self.log_path, position) from None

    def validate_and_decode(self, buf: RecordBuffer, off: int, header: BatchHeader,
                            position: int) -> list[Record]:
        """CRC-check then decode one batch; CorruptRecordError names this file and position."""
        try:
            validate_batch(buf, off)
        except CorruptRecordError as exc:
            raise exc.at(self.log_path, position) from None
        return self._decode(buf, off, header, position)

    # --------------------------------------------------------------- recovery
    def sanity_check(self) -> None:
        """Raise CorruptIndexError if either index fails its sanity check (the loader then recovers)."""
        self.offset_index.sanity_check()
        self.time_index.sanity_check()

    def recover(self, truncate: bool = True, in_memory: bool = False, report: bool = True) -> int:
        """Validate every batch, truncate at the first invalid one, rebuild the indexes.

        Returns the number of invalid bytes found at the end.  Beyond Kafka's
        ensureValid (size, magic, CRC32C), a batch must not go back in offsets:
        the base offset is outside the CRC, so this is the only check that
        catches a flipped bit there.

        ``truncate=False`` leaves the .log as it is: a sealed segment whose
        index is rebuilt keeps its bytes after damage (reads reaching it fail
        with EIO rather than the bytes silently going away).  A read-only
        segment recovers only with ``in_memory=True``: its indexes are rebuilt
        in anonymous maps and the invalid tail is left out of :attr:`size`,
        never cut from the file.
        ``report=False`` leaves the WARNING about invalid messages to the caller.
        """
        if not in_memory:
            self._check_writable("recover")
        self.max_index_size = max(self.max_index_size,
                                  index_bytes_needed(self.file_size(), self._segment_index_bytes))
        if in_memory:
            self.offset_index = OffsetIndex(self.offset_index.path, self.base_offset, self.max_index_size,
                                            in_memory=True)
            self.time_index = TimeIndex(self.time_index.path, self.base_offset, self.max_index_size,
                                        in_memory=True)
        else:
            self.offset_index.truncate()
            self.offset_index.resize(self.max_index_size)
            self.time_index.truncate()
            self.time_index.resize(self.max_index_size)
        file_size = self.file_size()
        if self._preallocated:
            file_size = min(file_size, self._size)
        valid_bytes = 0
        last_index_entry = 0
        max_ts = (-1, -1)
        next_offset = self.base_offset
        damage: CorruptRecordError | None = None
        try:
            for _pos, header, buf, off in self._batches_with_bytes(0, file_size, strict=False):
                validate_batch(buf, off)
                if header.base_offset < next_offset:
                    raise CorruptRecordError(
                        f"Batch base offset {header.base_offset} is below the previous batch's "
                        f"next offset {next_offset}")
                last_offset = header.base_offset + header.last_offset_delta
                if not self._can_convert_to_relative_offset(last_offset):
                    raise CorruptRecordError(
                        f"Batch last offset {last_offset} cannot be stored relative to base offset "
                        f"{self.base_offset}")
                if header.max_timestamp > max_ts[0]:
                    max_ts = (header.max_timestamp, last_offset)
                if valid_bytes - last_index_entry > self.index_interval_bytes:
                    self.offset_index.append(last_offset, valid_bytes)
                    self.time_index.maybe_append(max_ts[0], max_ts[1])
                    last_index_entry = valid_bytes
                valid_bytes += LOG_OVERHEAD + header.batch_length
                next_offset = last_offset + 1
        except CorruptRecordError as exc:
            damage = exc
            if truncate and report:
                log.warning("Found invalid messages in log segment %s at byte offset %d: %s",
                            self.log_path, valid_bytes, exc.detail)
        truncated = file_size - valid_bytes
        if truncated > 0 and not truncate:
            log.error("Log segment %s is damaged at byte %d of %d (%s): its index is rebuilt up to there and "
                      "the bytes after it are kept; reads reaching them fail with EIO", self.log_path,
                      valid_bytes, file_size, damage.detail if damage else "a batch runs past the end of the file")
        elif truncated > 0 and in_memory:
            log.info("Ignoring %d invalid bytes at the end of segment %s (read-only: recovered in memory, "
                     "the file is not changed)", truncated, self.log_path)
        elif truncated > 0:
            log.debug("Truncated %d invalid bytes at the end of segment %s during recovery",
                      truncated, self.log_path)
            self._truncate_file(valid_bytes)
        self._size = valid_bytes if truncate else file_size
        if not in_memory:
            self.offset_index.trim_to_valid_size()
        if max_ts[0] >= 0:
            self.time_index.maybe_append(max_ts[0], max_ts[1], skip_full_check=True)
        if not in_memory:
            self.time_index.trim_to_valid_size()
        self.indexes_missing = False
        self._max_timestamp_and_offset = max_ts if max_ts[0] >= 0 else (-1, self.base_offset)
        self._bytes_since_last_index_entry = valid_bytes - last_index_entry
        self._next_offset = next_offset
        self._rolling_based_timestamp = _UNKNOWN if valid_bytes else None
        self.attachment = None               # derived from the old bytes: rebuilt on first use
        return truncated

    def _truncate_file(self, size: int) -> None:
        f = self._log()
        try:
            os.ftruncate(f.fd, size)
        except OSError as exc:
            raise StorageError(f"Could not truncate {self.log_path} to {size}: {exc.strerror}") from exc

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset >= ``offset``; returns bytes removed (Kafka's truncateTo)."""
        self._check_writable("truncate")
        mapping = self.translate_offset(offset)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        if mapping is None:
            truncated = 0
        else:
            truncated = self._size - mapping.position
            self._truncate_file(mapping.position)
            self._size = mapping.position
        if self._size == 0:
            self._created = self.clock.milliseconds()
            self._rolling_based_timestamp = None
        self._bytes_since_last_index_entry = 0
        self._next_offset = None
        self._max_timestamp_and_offset = self._read_largest_timestamp()
        self.attachment = None
        # The segment becomes (or stays) the active one: give its indexes room again.
        # Last, as it needs new descriptors (mmap): when they run out (EMFILE) the
        # records are gone all the same, and a full index only makes the next append roll.
        self.resize_indexes(self.max_index_size)
        return truncated

    def _read_largest_timestamp(self) -> tuple[int, int]:
        """The last time index entry, or a larger timestamp found after it (Kafka's readLargestTimestamp)."""
        ts, off = self.time_index.last_entry
        _, position = self.offset_index.lookup(off)
        for _, header in self._headers(min(position, self._size), self._size):
            if header.max_timestamp > ts:
                ts, off = header.max_timestamp, header.base_offset + header.last_offset_delta
        return (ts, off)

    # -------------------------------------------------------------- lifecycle
    def on_becoming_inactive_segment(self) -> None:
        """Write the final time index entry and trim both indexes (and a preallocated .log)."""
        self._check_writable("deactivate")
        ts, off = self._max_ts_and_offset()
        if ts >= 0:
            self.time_index.maybe_append(ts, off, skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self._trim_preallocated()
        if self.log_path.endswith(LOG_FILE_SUFFIX):
            self._lazy.unpin()          # sealed: the FileCache may close it while unused

    def _trim_preallocated(self) -> None:
        if self._preallocated and not self._lazy.closed:
            self._truncate_file(self._size)
            os.fsync(self._log().fd)    # the size a power loss brings back is the trimmed one
            self._preallocated = False

    def flush(self) -> None:
        """fsync the .log and both indexes (Kafka's LogSegment.flush)."""
        if self.read_only:
            return          # nothing was written, so nothing can be lost
        f = self._log()
        try:
            os.fsync(f.fd)
        except OSError as exc:
            raise StorageError(f"Error while flushing {self.log_path}: {exc.strerror}") from exc
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        """Final time index entry, close (and trim) the indexes, close the .log descriptor."""
        try:
            if self._max_timestamp_and_offset is not _UNKNOWN and not self.read_only:
                ts, off = self._max_timestamp_and_offset
                if ts >= 0:
                    self.time_index.maybe_append(ts, off, skip_full_check=True)
        except Exception as exc:       # Kafka swallows this too: the index is rebuilt if wrong
            log.warning("Failed to append the final time index entry of %s: %s", self, exc)
        for index in (self.offset_index, self.time_index):
            try:
                index.close()
            except Exception as exc:
                log.warning("Error closing %s: %s", index.path, exc)
        try:
            self._trim_preallocated()
        finally:
            self._close_fd()

    def close_handlers(self) -> None:
        """Release the index maps and the descriptor without touching the files."""
        for index in (self.offset_index, self.time_index):
            try:
                index.close_handler()
            except Exception as exc:
                log.warning("Error closing handler of %s: %s", index.path, exc)
        self._close_fd()

    def _close_fd(self) -> None:
        self._lazy.close()

    # ------------------------------------------------------------ the .log descriptor
    @property
    def log_path(self) -> str:
        return self._lazy.path

    @log_path.setter
    def log_path(self, path: str) -> None:
        self._lazy.path = path

    def _log(self) -> OpenFile:
        """The open .log (reopened by name if the FileCache closed it); hold it while using its fd."""
        return self._lazy.get()

    def _pin(self) -> None:
        self._lazy.pin()

    def file_size(self) -> int:
        """The .log file's length on disk (fstat)."""
        f = self._log()
        try:
            return os.fstat(f.fd).st_size
        except OSError as exc:
            raise StorageError(f"Could not stat {self.log_path}: {exc.strerror}") from exc

    def delete_if_exists(self) -> None:
        """Unlink the three files; the .log descriptor stays open so open views read on."""
        self._check_writable("delete")
        self._pin()                     # open views read on after the unlink
        # One line per segment: a compaction or retention run deletes hundreds of
        # segments, and a file already gone (an index never created, a crash
        # between two unlinks) is what "if exists" means, not a failure.
        deleted = []
        try:
            os.unlink(self.log_path)
            deleted.append("log")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"Delete of log {self.log_path} failed: {exc.strerror}") from exc
        for kind, index in (("offset index", self.offset_index), ("time index", self.time_index)):
            if index.delete_if_exists():
                deleted.append(kind)
        remove_view_index_file(self.dir, self.base_offset)
        if deleted:
            log.info("Deleted %s of segment %s.", ", ".join(deleted), self.log_path)
        else:
            log.debug("Segment %s was already deleted.", self.log_path)

    @property
    def deleted(self) -> bool:
        return not any(os.path.lexists(p) for p in
                       (self.log_path, self.offset_index.path, self.time_index.path))

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename the .log and both indexes from ``old_suffix`` to ``new_suffix`` (.deleted, .cleaned, .swap)."""
        self._check_writable("rename")
        self._pin()                     # a reader keeps its descriptor across the rename
        new_log_path = replace_suffix(self.log_path, old_suffix, new_suffix)
        try:
            os.rename(self.log_path, new_log_path)
        except OSError as exc:
            raise StorageError(f"Failed to rename {self.log_path} to {new_log_path}: {exc.strerror}") from exc
        self.log_path = new_log_path
        self.offset_index.rename_to(replace_suffix(self.offset_index.path, old_suffix, new_suffix))
        self.time_index.rename_to(replace_suffix(self.time_index.path, old_suffix, new_suffix))
        if new_suffix == DELETED_FILE_SUFFIX:
            # No new view reads a deleted segment (open ones hold its index in memory): the mount's
            # view index file goes now, not with the files after file.delete.delay.ms, which a
            # restart in between would leave behind for ever.
            remove_view_index_file(self.dir, self.base_offset)
        if new_suffix == "":
            self._lazy.unpin()          # under its final name again (the cleaner's swap)

    def has_suffix(self, suffix: str) -> bool:
        return (self.log_path.endswith(suffix) and self.offset_index.path.endswith(suffix)
                and self.time_index.path.endswith(suffix))

    def update_parent_dir(self, dir: str) -> None:
        """Point at the files' new directory after the partition directory was renamed."""
        self.dir = dir
        self.log_path = os.path.join(dir, os.path.basename(self.log_path))
        self.offset_index.update_parent_dir(dir)
        self.time_index.update_parent_dir(dir)

    def resize_indexes(self, size: int) -> None:
        """Give both indexes ``size`` bytes again (the active segment after a load)."""
        self._check_writable("resize the indexes of")
        for index in (self.offset_index, self.time_index):
            index.resize(max(size, index.size_in_bytes))       # never below the entries it holds

    def __repr__(self) -> str:
        ts = self._max_timestamp_and_offset
        largest = ts[0] if ts is not _UNKNOWN else -1
        try:
            modified = self.last_modified
        except StorageError:
            modified = -1
        return (f"LogSegment(baseOffset={self.base_offset}, size={self._size}, "
                f"lastModifiedTime={modified}, largestRecordTimestamp={largest})")


class _ScanOnlyIndex:
    """An offset index found to disagree with its log, kept only for what is written to it.

    Lookups answer "from the start of the segment" so every reader scans the
    .log instead of trusting a wrong position; appends, truncation and closing
    still reach the file.  The next load checks the index against the log and
    rebuilds it (LogLoader).
    """

    def __init__(self, index: OffsetIndex | _ScanOnlyIndex) -> None:
        self._index = index.__dict__.get("_index", index)

    def lookup(self, target_offset: int) -> tuple[int, int]:
        return (self._index.base_offset, 0)

    def fetch_upper_bound_offset(self, fetch_position: int, fetch_size: int) -> None:
        return None

    def __getattr__(self, name: str) -> Any:     # Any: whatever the wrapped index has
        return getattr(self._index, name)
