"""LocalLog: the segments of one partition on local disk and its log end (Kafka's ``LocalLog``).

A LocalLog owns the ordered segments of one ``<topic>-<partition>``
directory, the log end offset (next offset to assign) and the recovery point
(everything below it has been fsync'ed, so recovery after a crash starts
there), and does what changes their files: roll, flush, asynchronous deletion,
the cleaner's crash-safe replacement, renaming the directory, closing and
deleting.  :class:`engine.log.Log` (Kafka's ``UnifiedLog``) *has* a LocalLog,
as in Kafka, and adds what clients see: the log start offset, appends, reads,
truncation and retention.  The two share this object's ``lock``: every
operation of the Log that changes its LocalLog (an append rolls, retention
deletes segments) takes it and calls the LocalLog's public methods under it
(the ``*_locked`` ones, and those that say they run under ``lock``).

Concurrency model.  Every change (append, roll, truncation, retention,
replacement by the cleaner) happens under ``lock``, a ``threading.RLock``.
The segment map is a ``SortedDict`` that is never mutated once published:
changes build a new one and swap the reference (:meth:`LocalLog._publish`),
so a reader takes one reference (``log.segments``) and walks it without
locking, as Kafka's readers walk a ConcurrentSkipListMap.  The log end is
published as one tuple (offset, active segment base, position) after the bytes
are written (:meth:`LocalLog.update_log_end_offset`), so a reader bounds
itself by a consistent end.

Flushing on roll.  Kafka schedules the flush of a rolled segment on its
scheduler; logfs has no scheduler in the engine, so the appending thread calls
:meth:`LocalLog.flush` itself right after it released ``lock``: other
appenders and all readers go on while the old segment is fsync'ed.  Likewise
for ``flush.messages``.

Deletion is asynchronous as in Kafka: a deleted segment leaves the map at
once, its files are renamed ``.deleted`` and it is queued; the mount's
background task calls :meth:`LocalLog.delete_expired_segment_files`, which
unlinks those whose ``file.delete.delay.ms`` elapsed.  The segment object
keeps its .log descriptor open, so a view that still holds it reads on.

Every mutator of a read-only log raises ReadOnlyError (:meth:`check_writable`)
before it touches anything.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import TYPE_CHECKING, NamedTuple, Protocol

from engine.clock import SYSTEM_CLOCK, Clock
from engine.errors import ReadOnlyError, StorageError
from engine.files import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    fsync_dir,
    log_file_path,
    offset_index_file_path,
    time_index_file_path,
    unlink_if_exists,
)
from engine.log_loader import DeletedSegmentFiles, LoadedLog, PendingDeletion
from engine.segment import LogSegment, topic_partition_of_dir

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sortedcontainers import SortedDict

    from engine.config import LogConfig
    from engine.topic import TopicPartition

#: The Log's logger: one name (engine.log) for everything a partition's log says, what operators filter on.
logger = logging.getLogger("engine.log")


class AppendObserver(Protocol):
    """Told of each batch the log encodes itself from values, right after it is written (under ``Log.lock``).

    Batches appended already encoded (``append_batch``, the cleaner's copies)
    are not reported: state derived from them is rebuilt from the bytes.
    """

    def on_append(self, segment: LogSegment, position: int, batch_size: int,
                  values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                  first: int, timestamp: int) -> None: ...

    def on_append_lines(self, segment: LogSegment, position: int, batch_size: int, block: bytes, count: int,
                        first: int, timestamp: int) -> None:
        """Like ``on_append`` for a batch of ``Log.append_text_lines``: its values are the ``count`` lines of
        ``block`` (each ending in ``\\n``), its keys null."""

    def on_roll(self, segment: LogSegment) -> None:
        """``segment`` was sealed (it stopped being the active segment) or the log is closing (under ``Log.lock``)."""


class LogOffsetMetadata(NamedTuple):
    """An offset with the segment and position where it starts (Kafka's LogOffsetMetadata)."""

    message_offset: int
    segment_base_offset: int
    relative_position_in_segment: int


class LocalLog:
    """The segments of one partition on disk, its log end and recovery point; see the module docstring."""

    def __init__(self, dir: str, config: LogConfig, loaded: LoadedLog, *, clock: Clock = SYSTEM_CLOCK,
                 topic_partition: TopicPartition | None = None, read_only: bool = False) -> None:
        self.dir = os.path.abspath(dir)
        self.read_only = read_only
        self.topic_partition = topic_partition or topic_partition_of_dir(self.dir)
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self._segments: SortedDict = loaded.segments
        self._recovery_point = loaded.recovery_point
        self._last_flush_time = clock.milliseconds()
        self._pending: list[PendingDeletion] = list(loaded.pending_deletions)
        #: segments sealed by a roll whose trimmed indexes no flush has made durable yet
        self._sealed_unflushed: list[LogSegment] = []
        #: The one hook through which state derived from appended values is kept
        #: (the mount's view indexes, engine.views.index.attach); None: nothing is.
        self.append_observer: AppendObserver | None = None
        #: called under ``lock`` each time the log end offset was set (an append, a truncation, a roll):
        #: the owning Log tells the readers that cache what they read that it may have changed
        self.on_log_end_moved: Callable[[], None] | None = None
        self._closed = False
        self._end = LogOffsetMetadata(loaded.log_end_offset, 0, 0)
        self.update_log_end_offset(loaded.log_end_offset)

    # -------------------------------------------------------- properties
    @property
    def log_prefix(self) -> str:
        return f"[Log partition={self.topic_partition}, dir={os.path.dirname(self.dir)}] "

    @property
    def name(self) -> str:
        return os.path.basename(self.dir)

    @property
    def segments(self) -> SortedDict:
        """The current segment map: never mutated after publication, so safe to walk without a lock."""
        return self._segments

    @property
    def active_segment(self) -> LogSegment:
        active: LogSegment = self._segments.peekitem(-1)[1]
        return active

    @property
    def log_end_offset(self) -> int:
        return self._end.message_offset

    @property
    def log_end_offset_metadata(self) -> LogOffsetMetadata:
        return self._end

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size(self) -> int:
        return sum(segment.size for segment in self._segments.values())

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    @property
    def unflushed_messages(self) -> int:
        return self.log_end_offset - self._recovery_point

    @property
    def last_flush_time(self) -> int:
        return self._last_flush_time

    @property
    def pending_deletion_segments(self) -> int:
        return len(self._pending)

    @property
    def pending_deletions(self) -> list[PendingDeletion]:
        """The segments renamed ``.deleted`` whose files wait for ``file.delete.delay.ms`` (a copy)."""
        return list(self._pending)

    @property
    def pending_deletion_bytes(self) -> int:
        return sum(p.segment.size for p in self._pending)

    def check_writable(self, what: str) -> None:
        """ReadOnlyError before a read-only log is changed in any way (the mount turns it into EROFS)."""
        if self.read_only:
            raise ReadOnlyError(f"Cannot {what} the log of {self.topic_partition} in {self.dir}: "
                                "it is opened read-only")

    def check_open(self) -> None:
        if self._closed:
            raise StorageError(f"The log of {self.topic_partition} in {self.dir} is closed")

    # ------------------------------------------------- segment map (COW)
    def _publish(self, segments: SortedDict) -> None:
        """Install a new segment map (under ``lock``): a map once published is never mutated again."""
        self._segments = segments

    def _add_segment(self, segment: LogSegment) -> None:
        segments = self._segments.copy()
        segments[segment.base_offset] = segment
        self._publish(segments)

    def _segments_in_range(self, from_offset: int, to_offset: int) -> list[LogSegment]:
        """Segments that may hold offsets in [from, to): from the one holding ``from`` on (Kafka's values(from, to))."""
        segments = self._segments
        lo = max(segments.bisect_right(from_offset) - 1, 0)
        hi = segments.bisect_left(to_offset)
        return list(segments.values()[lo:hi])

    def update_log_end_offset(self, end: int) -> None:
        """Publish the log end (under ``lock``, after the bytes below it are written) and tell the listeners."""
        active = self.active_segment
        self._end = LogOffsetMetadata(end, active.base_offset, active.size)
        if self._recovery_point > end:
            self._recovery_point = end
        if self.on_log_end_moved is not None:
            self.on_log_end_moved()

    # -------------------------------------------------------------- roll
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset; the old one is flushed."""
        self.check_writable("roll")
        with self.lock:
            self.check_open()
            segment = self.roll_locked(None)
        self.flush(segment.base_offset)
        return segment

    def roll_locked(self, expected_next_offset: int | None) -> LogSegment:
        start = time.monotonic()
        end = self._end.message_offset
        new_offset = max(expected_next_offset or 0, end)
        active = self.active_segment
        if new_offset in self._segments:
            if active.base_offset == new_offset and active.size == 0:
                # KAFKA-6388: an empty active segment whose index reports full.
                logger.warning(self.log_prefix + "Trying to roll a new log segment with start offset %d =max(provided "
                               "offset = %s, LEO = %d) while it already exists and is active with size 0. Size of "
                               "time index: %d, size of offset index: %d.", new_offset, expected_next_offset, end,
                               active.time_index.entries, active.offset_index.entries)
                segment = self.create_and_delete_segment(new_offset, active, "log roll")
                self.update_log_end_offset(end)
                logger.info(self.log_prefix + "Rolled new log segment at offset %d in %d ms.", new_offset,
                            (time.monotonic() - start) * 1000)
                return segment
            raise StorageError(
                f"Trying to roll a new log segment for topic partition {self.topic_partition} with start offset "
                f"{new_offset} =max(provided offset = {expected_next_offset}, LEO = {end}) while it already "
                f"exists. Existing segment is {self._segments[new_offset]}.")
        if new_offset < active.base_offset:
            raise StorageError(
                f"Trying to roll a new log segment for topic partition {self.topic_partition} with start offset "
                f"{new_offset} lower than start offset of the active segment {active}")
        paths = (log_file_path(self.dir, new_offset), offset_index_file_path(self.dir, new_offset),
                 time_index_file_path(self.dir, new_offset))
        for path in paths:
            if os.path.exists(path):
                logger.warning(self.log_prefix + "Newly rolled segment file %s already exists; deleting it first", path)
                os.unlink(path)
        # All or nothing: the new segment is opened before the active one is sealed,
        # so a roll that fails (EMFILE, ENOSPC) leaves the log exactly as it was.
        try:
            segment = self._open_segment(new_offset)
        except BaseException:
            for path in paths:
                unlink_if_exists(path, ignore_errors=True)
            raise
        try:
            active.on_becoming_inactive_segment()
            # Its trimmed indexes are fsynced by the next flush, whatever the recovery point.
            self._sealed_unflushed.append(active)
        except BaseException:
            segment.close_handlers()
            for path in paths:
                unlink_if_exists(path, ignore_errors=True)
            try:
                active.resize_indexes(active.max_index_size)      # room again for the next append
            except Exception as exc:
                logger.warning(self.log_prefix + "Could not re-grow the indexes of the active segment %r after a "
                               "failed roll (the next append rolls again): %s", active, exc)
            raise
        self._add_segment(segment)
        if self.append_observer is not None:
            self.append_observer.on_roll(active)
        self.update_log_end_offset(end)
        logger.info(self.log_prefix + "Rolled new log segment at offset %d in %d ms.", new_offset,
                    (time.monotonic() - start) * 1000)
        return segment

    def _open_segment(self, base_offset: int) -> LogSegment:
        return LogSegment.open(self.dir, base_offset, self.config, self.clock,
                               topic_partition=self.topic_partition)

    def create_and_delete_segment(self, new_offset: int, to_delete: LogSegment, reason: str) -> LogSegment:
        if new_offset == to_delete.base_offset:
            to_delete.change_file_suffixes("", DELETED_FILE_SUFFIX)
        segment = self._open_segment(new_offset)
        segments = self._segments.copy()
        segments[new_offset] = segment
        if new_offset != to_delete.base_offset:
            segments.pop(to_delete.base_offset, None)
        self._publish(segments)
        logger.info(self.log_prefix + "Deleting segments as part of %s: %r", reason, to_delete)
        self._schedule_deletion([to_delete])
        return segment

    # ------------------------------------------------------------- flush
    def flush(self, offset: int | None = None) -> None:
        """fsync the segments holding offsets below ``offset`` (default: log end); the recovery point moves there."""
        self.check_writable("flush")
        end = self.log_end_offset
        offset = end if offset is None else min(offset, end)
        with self.lock:
            sealed, self._sealed_unflushed = self._sealed_unflushed, []
            recovery_point = self._recovery_point
        if offset <= recovery_point:
            # The records are durable already (writers that fsync), but a segment sealed
            # since had its indexes trimmed: that must survive a power loss too.
            for segment in sealed:
                if self._segments.get(segment.base_offset) is segment:      # not deleted meanwhile
                    segment.flush()
            return
        to_flush = self._segments_in_range(recovery_point, offset)
        for segment in sealed:
            if segment not in to_flush and self._segments.get(segment.base_offset) is segment:
                segment.flush()
        for segment in to_flush:
            segment.flush()
        if any(s.base_offset >= recovery_point for s in to_flush):
            fsync_dir(self.dir, missing_ok=True)       # new segment files must survive a crash too
        with self.lock:
            if offset > self._recovery_point:
                self._recovery_point = offset
                self._last_flush_time = self.clock.milliseconds()
        logger.debug(self.log_prefix + "Flushed log up to offset %d (exclusive) with recovery point %d", offset, offset)

    # ---------------------------------------------------------- deletion
    def remove_and_delete_segments(self, to_delete: Sequence[LogSegment]) -> None:
        segments = self._segments.copy()
        for segment in to_delete:
            if segments.get(segment.base_offset) is segment:
                del segments[segment.base_offset]
        self._publish(segments)
        self._schedule_deletion(to_delete)

    def _schedule_deletion(self, to_delete: Sequence[LogSegment]) -> None:
        due = self.clock.milliseconds() + self.config.file_delete_delay_ms
        for segment in to_delete:
            if not segment.has_suffix(DELETED_FILE_SUFFIX):
                segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
            # Only the .log descriptor waits for the delay (views that opened the segment
            # read on through it); its index maps go now (DeletedSegmentFiles).
            self._pending.append(PendingDeletion(due, DeletedSegmentFiles(segment)))

    def delete_expired_segment_files(self, now_ms: int | None = None) -> int:
        """Unlink ``.deleted`` segments whose ``file.delete.delay.ms`` has elapsed; returns how many."""
        self.check_writable("delete segment files of")
        now = self.clock.milliseconds() if now_ms is None else now_ms
        with self.lock:
            due = [p.segment for p in self._pending if p.due_ms <= now]
            if not due:
                return 0
            self._pending = [p for p in self._pending if p.due_ms > now]
        logger.info(self.log_prefix + "Deleting segment files %s", ", ".join(map(repr, due)))
        for segment in due:
            segment.delete_if_exists()
        return len(due)

    # ------------------------------------------------------- replacement
    def replace_segments(self, new_segments: Sequence[LogSegment], old_segments: Sequence[LogSegment]) -> None:
        """Swap cleaned segments in for old ones, crash-safely (Kafka's LocalLog.replaceSegments).

        ``.cleaned`` -> ``.swap`` in descending offset order, add them, rename the
        old ones ``.deleted`` (queued), then drop the ``.swap`` suffix.  A crash at
        any point is completed or rolled back by the LogLoader.
        """
        self.check_writable("replace segments of")
        with self.lock:
            self.check_open()
            new_sorted = sorted(new_segments, key=lambda s: s.base_offset)
            current = self._segments
            old_sorted = sorted((s for s in old_segments if current.get(s.base_offset) is s),
                                key=lambda s: s.base_offset)
            segments = current.copy()
            renamed = False
            for segment in reversed(new_sorted):
                if segment.has_suffix(CLEANED_FILE_SUFFIX):
                    segment.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
                    renamed = True
                segment.topic_partition = self.topic_partition
                segments[segment.base_offset] = segment
            if renamed:
                # The .swap names are on disk before any old segment is renamed .deleted:
                # a power loss that kept a .deleted but lost a .swap (still .cleaned, which
                # the loader discards) would lose the records of both.
                fsync_dir(self.dir, missing_ok=True)
            new_bases = {s.base_offset for s in new_sorted}
            for segment in old_sorted:
                if segment.base_offset not in new_bases:
                    del segments[segment.base_offset]
            self._publish(segments)
            self._schedule_deletion(old_sorted)
            for segment in new_sorted:
                if segment.has_suffix(SWAP_FILE_SUFFIX):
                    segment.change_file_suffixes(SWAP_FILE_SUFFIX, "")
            fsync_dir(self.dir, missing_ok=True)
            self.update_log_end_offset(self.log_end_offset)

    # --------------------------------------------------------- lifecycle
    def rename_dir(self, new_name: str) -> None:
        """Rename the partition directory (e.g. ``topic-0.<id>-delete``); segments follow."""
        self.check_writable("rename")
        with self.lock:
            new_dir = os.path.join(os.path.dirname(self.dir), new_name)
            if new_dir == self.dir:
                return
            try:
                os.rename(self.dir, new_dir)
            except OSError as exc:
                raise StorageError(f"Error while renaming dir for {self.topic_partition} in log dir "
                                   f"{os.path.dirname(self.dir)}: {exc.strerror}") from exc
            self.dir = new_dir
            for segment in self._segments.values():
                segment.update_parent_dir(new_dir)
            for pending in self._pending:
                pending.segment.update_parent_dir(new_dir)

    def close(self) -> None:
        """Close every segment: the active one gets its final time index entry and trimmed indexes."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            if self.append_observer is not None and not self.read_only:
                self.append_observer.on_roll(self.active_segment)     # its state at a clean close
            for segment in self._segments.values():
                segment.close()
            for pending in self._pending:
                pending.segment.close_handlers()

    def delete(self) -> None:
        """Delete every segment file and the directory now (a deleted topic's final step)."""
        self.check_writable("delete")
        with self.lock:
            segments = list(self._segments.values())
            pending, self._pending = self._pending, []
            for segment in segments:
                segment.delete_if_exists()
                segment.close_handlers()
            for deleted in pending:
                deleted.segment.delete_if_exists()
                deleted.segment.close_handlers()
            self._closed = True
            shutil.rmtree(self.dir, ignore_errors=True)
        logger.info(self.log_prefix + "Deleted log for partition %s in %s.", self.topic_partition, self.dir)
