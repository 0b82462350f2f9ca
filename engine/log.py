"""Log: the segments of one partition (Kafka's UnifiedLog + LocalLog; loading is engine.log_loader).

A Log owns the ordered segments of one ``<topic>-<partition>`` directory and
the three offsets that describe them: the log start offset (first offset a
reader may see), the log end offset (next offset to assign) and the recovery
point (everything below it has been fsync'ed, so recovery after a crash starts
there).

Concurrency model.  Every change (append, roll, truncation, retention,
replacement by the cleaner) happens under ``lock``, a ``threading.RLock``.
The segment map is a ``SortedDict`` that is never mutated once published:
changes build a new one and swap the reference, so a reader takes one
reference (``log.segments``) and walks it without locking, as Kafka's readers
walk a ConcurrentSkipListMap.  The log end is published as one tuple (offset,
active segment base, position) after the bytes are written, so a reader bounds
itself by a consistent end.

Flushing on roll.  Kafka schedules the flush of a rolled segment on its
scheduler; logfs has no scheduler in the engine, so the appending thread does
it itself right after it released ``lock``: other appenders and all readers go
on while the old segment is fsync'ed.  Likewise for ``flush.messages``.

Deletion is asynchronous as in Kafka: a deleted segment leaves the map at
once, its files are renamed ``.deleted`` and it is queued; the mount's
background task calls :meth:`Log.delete_expired_segment_files`, which unlinks
those whose ``file.delete.delay.ms`` elapsed.  The segment object keeps its
.log descriptor open, so a view that still holds it reads on.

Read-only logs (``Log.load(read_only=True)``, a ``--read-only`` mount) perform
no write at all, not even the ones recovery would make: the loader runs the
same recovery in memory (torn tails left out of segment sizes, indexes rebuilt
in anonymous maps, a valid ``.swap`` swapped in the segment map only, stray
``.deleted``/``.cleaned`` files left alone), so a copy of a live broker's
directory mounts without a clean-shutdown marker; every mutator of a
read-only Log raises ReadOnlyError.

Size (~980 lines): UnifiedLog and LocalLog in one class, as their state (the
segment map, the three offsets, the pending deletions) is shared by every
operation under one lock; loading lives in engine.log_loader, the checks an
append must pass in engine.log_validator, renderings in engine.views.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from sortedcontainers import SortedDict

from engine import retention
from engine.clock import SYSTEM_CLOCK, Clock
from engine.config import LogConfig
from engine.errors import (
    InvalidRecordError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    ReadOnlyError,
    RecordTooLargeError,
    StorageError,
    UnsafeFileError,
)
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
from engine.log_loader import DeletedSegmentFiles, LoadedLog, LogLoader, PendingDeletion
from engine.log_validator import RECORD_OVERHEAD_BOUND, check_in_order, check_record_sizes, validate_batches
from engine.records import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    Record,
    encode_text_lines,
    encode_values,
    iter_batches,
    validate_batch,
)
from engine.segment import FetchDataInfo, LogSegment, topic_partition_of_dir
from engine.topic import TopicPartition

logger = logging.getLogger(__name__)


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

#: ListOffsets special timestamps (Kafka's ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3

#: Kafka's LogStartOffsetIncrementReason strings.
CLIENT_RECORD_DELETION = "client delete records request"
SEGMENT_DELETION = "segment deletion"

# The same bound without any assumption on sizes (every varint at its widest
# for a 32-bit length or delta): what splitting a write relies on.
_SPLIT_RECORD_BOUND = 23
_BASE_OFFSET = struct.Struct(">q")


class LogOffsetMetadata(NamedTuple):
    """An offset with the segment and position where it starts (Kafka's LogOffsetMetadata)."""

    message_offset: int
    segment_base_offset: int
    relative_position_in_segment: int


def _compression_of(name: str) -> Compression:
    # "producer" keeps what the producer sent; logfs is its own producer and
    # writes uncompressed batches unless the topic names a codec.
    if name in ("producer", "uncompressed", "none", ""):
        return Compression.NONE
    return Compression.from_name(name)


class Log:
    """The segments of one partition and its offsets; see the module docstring for the rules."""

    def __init__(self, dir: str, config: LogConfig, loaded: LoadedLog, *, clock: Clock = SYSTEM_CLOCK,
                 topic_partition: TopicPartition | None = None, read_only: bool = False) -> None:
        self.dir = os.path.abspath(dir)
        self.read_only = read_only
        self.topic_partition = topic_partition or topic_partition_of_dir(self.dir)
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self._compression = _compression_of(config.compression_type)
        self._segments: SortedDict = loaded.segments
        self._log_start_offset = loaded.log_start_offset
        self._recovery_point = loaded.recovery_point
        self._last_flush_time = clock.milliseconds()
        self._pending: list[PendingDeletion] = list(loaded.pending_deletions)
        #: segments sealed by a roll whose trimmed indexes no flush has made durable yet
        self._sealed_unflushed: list[LogSegment] = []
        #: The one hook through which state derived from appended values is kept
        #: (the mount's view indexes, engine.views.index.attach); None: nothing is.
        self.append_observer: AppendObserver | None = None
        #: Called as ``fn(log, new_start)`` under the log's lock just before
        #: the log start offset moves up, i.e. before any segment below it is
        #: renamed ``.deleted``.  The LogManager writes the dir's
        #: log-start-offset-checkpoint here, so no crash after the move can
        #: bring deleted records back; if it raises, nothing moves.
        self.before_log_start_offset_moves: Callable[[Log, int], None] | None = None
        #: how many times records were removed from the end (truncate_to, truncate_fully_and_start_at):
        #: a reader caching bytes it read compares it to know they may be gone or replaced
        self.truncations = 0
        #: called as ``fn(log)`` under the log's lock each time the log end offset was set (an append,
        #: a truncation, a roll): readers that cache what they read learn that it may have changed
        self.end_listeners: list[Callable[[Log], None]] = []
        self._closed = False
        self._end = LogOffsetMetadata(loaded.log_end_offset, 0, 0)
        self._update_log_end_offset(loaded.log_end_offset)

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, dir: str, config: LogConfig, *, log_start_offset: int = 0, recovery_point: int = 0,
             had_clean_shutdown: bool = False, clock: Clock = SYSTEM_CLOCK,
             topic_partition: TopicPartition | None = None, read_only: bool = False) -> Log:
        """Open (creating if needed) the log in ``dir``, running Kafka's LogLoader over it.

        With ``read_only`` nothing is created or repaired on disk: the directory
        must exist, and whatever recovery it needs happens in memory.
        """
        start = time.monotonic()
        dir = os.path.abspath(dir)
        tp = topic_partition or topic_partition_of_dir(dir)
        if os.path.islink(dir):
            raise UnsafeFileError(f"Partition directory {dir} is a symbolic link: logfs never follows links in a "
                                  "log directory", paths=[dir])
        if read_only:
            if not os.path.isdir(dir):
                raise StorageError(f"Log directory {dir} does not exist (opened read-only)")
        else:
            try:
                os.makedirs(dir, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"Could not create log directory {dir}: {exc.strerror}") from exc
        loaded = LogLoader(dir, tp, config, clock, had_clean_shutdown, log_start_offset,
                           recovery_point, read_only=read_only).load()
        log = cls(dir, config, loaded, clock=clock, topic_partition=tp, read_only=read_only)
        logger.info(log._prefix + "Completed load of log with %d segments, log start offset %d and log end "
                    "offset %d in %d ms", log.num_segments, log.log_start_offset, log.log_end_offset,
                    (time.monotonic() - start) * 1000)
        return log

    @property
    def _prefix(self) -> str:
        return f"[Log partition={self.topic_partition}, dir={os.path.dirname(self.dir)}] "

    # ------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        return os.path.basename(self.dir)

    @property
    def segments(self) -> SortedDict:
        """The current segment map: never mutated after publication, so safe to walk without a lock."""
        return self._segments

    @property
    def active_segment(self) -> LogSegment:
        return self._segments.peekitem(-1)[1]

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

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
    def pending_deletion_bytes(self) -> int:
        return sum(p.segment.size for p in self._pending)

    def update_config(self, config: LogConfig) -> None:
        with self.lock:
            self.config = config
            self._compression = _compression_of(config.compression_type)

    def _check_writable(self, what: str) -> None:
        """ReadOnlyError before a read-only log is changed in any way (the mount turns it into EROFS)."""
        if self.read_only:
            raise ReadOnlyError(f"Cannot {what} the log of {self.topic_partition} in {self.dir}: "
                                "it is opened read-only")

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"The log of {self.topic_partition} in {self.dir} is closed")

    # ----------------------------------------------------- segment map (COW)
    def _publish(self, segments: SortedDict) -> None:
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

    def _update_log_end_offset(self, end: int) -> None:
        active = self.active_segment
        self._end = LogOffsetMetadata(end, active.base_offset, active.size)
        if self._recovery_point > end:
            self._recovery_point = end
        for listener in self.end_listeners:
            listener(self)

    # ---------------------------------------------------------------- append
    def append_values(self, values: Sequence[bytes | None],
                      keys: Sequence[bytes | None] | None = None) -> tuple[int, int]:
        """Append ``values`` (and keys) as one LogAppendTime batch; returns (first offset, last offset)."""
        self._check_writable("append to")
        n = len(values)
        if n == 0:
            raise InvalidRecordError(f"Cannot append an empty batch to {self.topic_partition}")
        if keys is not None and len(keys) != n:
            raise InvalidRecordError(f"{len(keys)} keys for {n} values in the append to {self.topic_partition}")
        config = self.config
        if config.compact and (keys is None or None in keys):
            raise InvalidRecordError(
                f"Compacted topic cannot accept message without key in topic partition {self.topic_partition}.")
        with self.lock:
            self._check_open()
            first = self._end.message_offset
            now = self.clock.milliseconds()
            batch = encode_values(first, values, now, keys, self._compression)
            size = len(batch)
            if size > config.max_message_bytes or self._compression != Compression.NONE:
                # An uncompressed batch within the limit proves every record alone is.
                check_record_sizes(self.topic_partition, values, keys, config.max_message_bytes)
            if size <= config.segment_size:
                rolled = self._append_encoded_locked(batch, values, keys, first, now)
            else:
                rolled = self._append_split_locked(values, keys, first, now)
            last = first + n - 1
            flush_needed = self.log_end_offset - self._recovery_point >= config.flush_messages
        self._after_append(rolled, flush_needed)
        return first, last

    def append_text_lines(self, block: bytes) -> tuple[int, int]:
        """Append the lines of ``block`` (each ending in ``\\n``) as the values of one batch without keys.

        The same batch ``append_values`` writes for the lines without their
        newlines, encoded without splitting them into Python objects
        (``encode_text_lines``): the hot path of ``cat file >> append``.
        What that path does not cover (compression, a batch over
        ``max.message.bytes`` or ``segment.bytes``) goes through
        ``append_values``, which checks and splits as for any append.
        """
        self._check_writable("append to")
        config = self.config
        if config.compact:
            raise InvalidRecordError(
                f"Compacted topic cannot accept message without key in topic partition {self.topic_partition}.")
        if self._compression == Compression.NONE:
            appended = self._append_text_lines_fast(block, config)
            if appended is not None:
                return appended
        # each line alone checked against max.message.bytes, split across segments, or compressed
        values = block.split(b"\n")
        if values.pop():
            raise InvalidRecordError(f"The last line of an append to {self.topic_partition} has no newline")
        return self.append_values(values)

    def _append_text_lines_fast(self, block: bytes, config: LogConfig) -> tuple[int, int] | None:
        """``append_text_lines`` of an uncompressed batch that needs no record checked alone and fits a
        segment; None (nothing appended) for any other."""
        with self.lock:
            self._check_open()
            first = self._end.message_offset
            now = self.clock.milliseconds()
            encoded = encode_text_lines(first, block, now)
            if encoded is None:
                return None         # no lines, or not whole ones: the general path says which
            batch, layout = encoded
            size = len(batch)
            # Like append_values: a batch within max.message.bytes proves every record alone is.
            if size > config.segment_size or (
                    size > config.max_message_bytes
                    and layout.longest + HEADER_SIZE + RECORD_OVERHEAD_BOUND > config.max_message_bytes):
                return None
            count = layout.lines
            last = first + count - 1
            segment, rolled = self._maybe_roll(size, now, first, last)
            position = segment.size
            segment.append(last, now, last, batch)
            observer = self.append_observer
            if observer is not None:
                observer.on_append_lines(segment, position, size, block, count, first, now)
            self._update_log_end_offset(last + 1)
            flush_needed = self.log_end_offset - self._recovery_point >= config.flush_messages
        self._after_append(rolled, flush_needed)
        return first, last

    def _append_encoded_locked(self, batch: bytes, values: Sequence[bytes | None],
                               keys: Sequence[bytes | None] | None, first: int, now: int) -> int | None:
        """Append one encoded batch at the log end; returns the new segment's base offset if it rolled."""
        last = first + len(values) - 1
        segment, rolled = self._maybe_roll(len(batch), now, first, last)
        position = segment.size
        segment.append(last, now, last, batch)
        observer = self.append_observer
        if observer is not None:
            observer.on_append(segment, position, len(batch), values, keys, first, now)
        self._update_log_end_offset(last + 1)
        return rolled

    def _append_split_locked(self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                             first: int, now: int) -> int | None:
        """Append a write too large for one segment as consecutive batches that each fit one.

        Kafka refuses a batch larger than ``segment.bytes``; a filesystem user
        cannot choose how ``cat`` sizes its writes, so a write that big is cut
        into batches here instead.  They are appended under the one lock hold,
        so no other writer lands between them, and a failure part-way (a full
        disk) truncates the log back to where the write began: all or nothing.
        """
        limit = self.config.segment_size - HEADER_SIZE
        chunks: list[tuple[int, int]] = []
        start, budget = 0, 0
        for i, value in enumerate(values):
            key = keys[i] if keys is not None else None
            cost = _SPLIT_RECORD_BOUND + (len(value) if value is not None else 0) \
                + (len(key) if key is not None else 0)
            if cost > limit:
                raise RecordTooLargeError(
                    f"The record at index {i} of the append to {self.topic_partition} does not fit in a "
                    f"segment of the configured size {self.config.segment_size}.")
            if budget + cost > limit and i > start:
                chunks.append((start, i))
                start, budget = i, 0
            budget += cost
        chunks.append((start, len(values)))
        rolled: int | None = None
        offset = first
        try:
            for lo, hi in chunks:
                part_values = values[lo:hi]
                part_keys = keys[lo:hi] if keys is not None else None
                batch = encode_values(offset, part_values, now, part_keys, self._compression)
                rolled = self._append_encoded_locked(batch, part_values, part_keys, offset, now) or rolled
                offset += hi - lo
        except BaseException:
            if offset > first:
                logger.warning(self._prefix + "Append of %d records failed part-way at offset %d; truncating "
                               "back to %d.", len(values), offset, first)
                self.truncate_to(first)
            raise
        return rolled

    def append_batch(self, batch: bytes, assign_offsets: bool = True) -> tuple[int, int]:
        """Append record batches built elsewhere (kafka-python, tools), validating each CRC.

        With ``assign_offsets`` the base offsets are rewritten to follow the log
        end; the base offset is outside the CRC, so the batch stays valid
        byte for byte otherwise.  Without it the batches must start at or after
        the log end (a replica's append).
        """
        self._check_writable("append to")
        buf = bytearray(batch)
        config = self.config
        headers = validate_batches(self.topic_partition, buf, config)
        with self.lock:
            self._check_open()
            end = self._end.message_offset
            if assign_offsets:
                next_offset = end
                for pos, header in headers:
                    _BASE_OFFSET.pack_into(buf, pos, next_offset)
                    next_offset += header.last_offset_delta + 1
                first, last = end, next_offset - 1
            else:
                check_in_order(self.topic_partition, headers, end)
                first, last = headers[0][1].base_offset, headers[-1][1].last_offset
            max_ts, offset_of_max = -1, first
            for pos, header in headers:
                if header.max_timestamp > max_ts:
                    max_ts = header.max_timestamp
                    offset_of_max = _BASE_OFFSET.unpack_from(buf, pos)[0] + header.last_offset_delta
            segment, rolled = self._maybe_roll(len(buf), max_ts, first, last)
            segment.append(last, max_ts, offset_of_max, bytes(buf))
            self._update_log_end_offset(last + 1)
            flush_needed = self.log_end_offset - self._recovery_point >= config.flush_messages
        self._after_append(rolled, flush_needed)
        return first, last

    def append_as_follower(self, records: bytes | memoryview) -> int:
        """Append fetched record batches byte for byte at the leader's offsets; returns the new log end.

        Kafka's ``UnifiedLog.appendAsFollower``: what a replica fetched from
        its leader is kept exactly (offsets, leader epochs, timestamps,
        producer ids, codec), so nothing is assigned or re-encoded.  Each whole
        batch is CRC-checked (``CorruptRecordError`` on damage, nothing
        appended); a short tail (a fetch response cut at its size limit) is
        left out, as the fetcher does.  The leader validated sizes and keys, so
        the local ``max.message.bytes`` and ``cleanup.policy`` do not apply.

        The first batch may start below the log end only when the log is
        empty: a leader's log start inside a batch (DeleteRecords) makes it
        return the whole batch, and the replica then starts its log at that
        batch (``Partition.appendRecordsToFollowerOrFutureReplica``); the
        caller moves the log start offset up to the leader's afterwards.
        """
        self._check_writable("append to")
        headers = [(pos, validate_batch(records, pos)) for pos, _ in iter_batches(records)]
        if not headers:
            return self.log_end_offset
        end_pos = headers[-1][0] + headers[-1][1].size
        buf = bytes(records[:end_pos])
        with self.lock:
            self._check_open()
            end = self._end.message_offset
            first_base = headers[0][1].base_offset
            if first_base < end:
                if self.size == 0 and headers[0][1].next_offset > end:
                    logger.info(self._prefix + "First offset %d fetched is below the log end offset %d of an "
                                "empty log: starting the log at %d", first_base, end, first_base)
                    self.truncate_fully_and_start_at(first_base)
                else:
                    raise InvalidRecordError(
                        f"Unexpected offset in append to {self.topic_partition}: first offset {first_base} is "
                        f"below the log end offset {end}")
            check_in_order(self.topic_partition, headers, first_base)
            rolled: int | None = None
            last = first_base
            # A fetch returns many batches at once (up to the fetch's partition bytes): each run of them
            # that fits one segment is appended on its own, rolling in between, so the replica's
            # log.segment.bytes (and so its retention) holds whatever the fetch size.
            for start, stop in _segment_runs(headers, self.config.segment_size):
                run = headers[start:stop]
                max_ts, offset_of_max = -1, run[0][1].base_offset
                for _, header in run:
                    if header.max_timestamp > max_ts:
                        max_ts, offset_of_max = header.max_timestamp, header.last_offset
                first, last = run[0][1].base_offset, run[-1][1].last_offset
                begin, finish = run[0][0], run[-1][0] + run[-1][1].size
                segment, rolled_here = self._maybe_roll(finish - begin, max_ts, first, last)
                if rolled_here is not None:
                    rolled = rolled_here
                segment.append(last, max_ts, offset_of_max, buf[begin:finish])
                self._update_log_end_offset(last + 1)
            flush_needed = self.log_end_offset - self._recovery_point >= self.config.flush_messages
        self._after_append(rolled, flush_needed)
        return last + 1

    def _maybe_roll(self, batch_size: int, max_timestamp: int, first_offset: int,
                    last_offset: int) -> tuple[LogSegment, int | None]:
        segment = self.active_segment
        now = self.clock.milliseconds()
        if (segment.size == 0 and segment.base_offset == max(first_offset, self._end.message_offset)
                and not segment.offset_index.is_full() and not segment.time_index.is_full()):
            # An empty active segment already starts here: a batch larger than log.segment.bytes goes into
            # it (a roll would delete and recreate the same segment, Kafka's "Trying to roll ... while it
            # already exists" warning).
            return segment, None
        if segment.should_roll(self.config, max_timestamp, last_offset, now, batch_size):
            logger.debug(self._prefix + "Rolling new log segment (log_size = %d/%d, offset_index_size = %d/%d, "
                         "time_index_size = %d/%d, inactive_time_ms = %d/%d).", segment.size,
                         self.config.segment_size, segment.offset_index.entries, segment.offset_index.max_entries,
                         segment.time_index.entries, segment.time_index.max_entries,
                         segment.time_waited_for_roll(now, max_timestamp), self.config.segment_ms)
            new_segment = self._roll_locked(first_offset)
            return new_segment, new_segment.base_offset
        return segment, None

    def _after_append(self, rolled_at: int | None, flush_needed: bool) -> None:
        # Outside the lock: fsync must not hold up other appenders (Kafka does this on its scheduler).
        if flush_needed:
            self.flush()
        elif rolled_at is not None:
            self.flush(rolled_at)

    # ------------------------------------------------------------------ roll
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset; the old one is flushed."""
        self._check_writable("roll")
        with self.lock:
            self._check_open()
            segment = self._roll_locked(None)
        self.flush(segment.base_offset)
        return segment

    def _roll_locked(self, expected_next_offset: int | None) -> LogSegment:
        start = time.monotonic()
        end = self._end.message_offset
        new_offset = max(expected_next_offset or 0, end)
        active = self.active_segment
        if new_offset in self._segments:
            if active.base_offset == new_offset and active.size == 0:
                # KAFKA-6388: an empty active segment whose index reports full.
                logger.warning(self._prefix + "Trying to roll a new log segment with start offset %d =max(provided "
                               "offset = %s, LEO = %d) while it already exists and is active with size 0. Size of "
                               "time index: %d, size of offset index: %d.", new_offset, expected_next_offset, end,
                               active.time_index.entries, active.offset_index.entries)
                segment = self._create_and_delete_segment(new_offset, active, "log roll")
                self._update_log_end_offset(end)
                logger.info(self._prefix + "Rolled new log segment at offset %d in %d ms.", new_offset,
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
                logger.warning(self._prefix + "Newly rolled segment file %s already exists; deleting it first", path)
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
                logger.warning(self._prefix + "Could not re-grow the indexes of the active segment %r after a "
                               "failed roll (the next append rolls again): %s", active, exc)
            raise
        self._add_segment(segment)
        if self.append_observer is not None:
            self.append_observer.on_roll(active)
        self._update_log_end_offset(end)
        logger.info(self._prefix + "Rolled new log segment at offset %d in %d ms.", new_offset,
                    (time.monotonic() - start) * 1000)
        return segment

    def _open_segment(self, base_offset: int) -> LogSegment:
        return LogSegment.open(self.dir, base_offset, self.config, self.clock,
                               topic_partition=self.topic_partition)

    def _create_and_delete_segment(self, new_offset: int, to_delete: LogSegment, reason: str) -> LogSegment:
        if new_offset == to_delete.base_offset:
            to_delete.change_file_suffixes("", DELETED_FILE_SUFFIX)
        segment = self._open_segment(new_offset)
        segments = self._segments.copy()
        segments[new_offset] = segment
        if new_offset != to_delete.base_offset:
            segments.pop(to_delete.base_offset, None)
        self._publish(segments)
        logger.info(self._prefix + "Deleting segments as part of %s: %r", reason, to_delete)
        self._schedule_deletion([to_delete])
        return segment

    # ------------------------------------------------------------------ read
    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_message: bool = True) -> FetchDataInfo:
        """Raw batches from the one holding ``start_offset`` (Kafka's LocalLog.read).

        OffsetOutOfRangeError outside [log start, log end]; at the log end (or
        ``max_offset``) the records are empty.
        """
        end = self._end
        segments = self._segments
        log_start = self._log_start_offset
        self._check_offset_in_range(start_offset, log_start, end.message_offset)
        limit = end
        if max_offset is not None and max_offset < end.message_offset:
            limit = self._offset_metadata(segments, max_offset)
        if start_offset >= limit.message_offset:
            return FetchDataInfo(start_offset, limit.segment_base_offset, limit.relative_position_in_segment, b"")
        values = segments.values()
        i = max(segments.bisect_right(start_offset) - 1, 0)
        while i < len(values):
            segment = values[i]
            if segment.base_offset < limit.segment_base_offset:
                max_position = segment.size
            elif segment.base_offset == limit.segment_base_offset:
                max_position = limit.relative_position_in_segment
            else:
                break
            info = segment.read(start_offset, max_bytes, max_position, min_one_message)
            if info is not None:
                return info
            i += 1
        return FetchDataInfo(start_offset, end.segment_base_offset, end.relative_position_in_segment, b"")

    def _check_offset_in_range(self, offset: int, log_start: int, log_end: int) -> None:
        """Kafka's OffsetOutOfRangeException for a read outside [log start, log end]."""
        if offset < log_start or offset > log_end:
            raise OffsetOutOfRangeError(
                f"Received request for offset {offset} for partition {self.topic_partition}, but we only "
                f"have log segments in the range {log_start} to {log_end}.",
                offset=offset, log_start_offset=log_start, log_end_offset=log_end)

    @staticmethod
    def _offset_metadata(segments: SortedDict, offset: int) -> LogOffsetMetadata:
        i = max(segments.bisect_right(offset) - 1, 0)
        segment = segments.values()[i]
        mapping = segment.translate_offset(offset)
        position = mapping.position if mapping is not None else segment.size
        return LogOffsetMetadata(offset, segment.base_offset, position)

    def read_records(self, start_offset: int, max_records: int = 1 << 62) -> list[Record]:
        """Decoded records from ``start_offset`` (CRC-checked), at most ``max_records``, control records skipped."""
        end = self._end
        segments = self._segments
        log_start = self._log_start_offset
        self._check_offset_in_range(start_offset, log_start, end.message_offset)
        out: list[Record] = []
        end_offset = end.message_offset
        values = segments.values()
        i = max(segments.bisect_right(start_offset) - 1, 0)
        while i < len(values) and len(out) < max_records:
            segment = values[i]
            i += 1
            if segment.base_offset > end.segment_base_offset:
                break
            limit = (end.relative_position_in_segment if segment.base_offset == end.segment_base_offset
                     else segment.size)
            mapping = segment.translate_offset(start_offset)
            if mapping is None:
                continue
            for pos, header, buf, off in segment.batches_with_bytes(mapping.position, limit):
                if header.next_offset <= start_offset:
                    continue
                records = segment.validate_and_decode(buf, off, header, pos)
                if records and (records[0].offset < start_offset or records[-1].offset >= end_offset):
                    records = [r for r in records if start_offset <= r.offset < end_offset]
                out.extend(records)
                if len(out) >= max_records:
                    break
        del out[max_records:]
        return out

    def fetch_offset_by_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """Kafka's ListOffsets: (offset, timestamp) for -2 earliest, -1 latest, -3 max timestamp, or a time.

        For a time T it is the first record with timestamp >= T (None if none);
        earliest/latest carry timestamp -1 as Kafka's NO_TIMESTAMP.
        """
        if timestamp == EARLIEST_TIMESTAMP:
            return self._log_start_offset, -1
        if timestamp == LATEST_TIMESTAMP:
            return self.log_end_offset, -1
        segments = list(self._segments.values())
        if timestamp == MAX_TIMESTAMP:
            best = max(segments, key=lambda s: s.max_timestamp_so_far)
            max_ts, offset = best.max_timestamp_so_far, best.offset_of_max_timestamp
            if max_ts < 0:
                return None
            _, position = best.offset_index.lookup(offset)
            for pos, header, buf, off in best.batches_with_bytes(position):
                if header.max_timestamp == max_ts:
                    for record in best.validate_and_decode(buf, off, header, pos):
                        if record.timestamp == max_ts and record.offset >= self._log_start_offset:
                            return record.offset, max_ts
            return None
        if timestamp < 0:
            raise InvalidRequestError(f"Invalid timestamp {timestamp} for a ListOffsets lookup")
        start = self._log_start_offset
        for segment in segments:
            if segment.largest_timestamp >= timestamp:
                found = segment.find_offset_by_timestamp(timestamp, start)
                if found is not None:
                    return found[1], found[0]
        return None

    # ----------------------------------------------------------------- flush
    def flush(self, offset: int | None = None) -> None:
        """fsync the segments holding offsets below ``offset`` (default: log end); the recovery point moves there."""
        self._check_writable("flush")
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
        logger.debug(self._prefix + "Flushed log up to offset %d (exclusive) with recovery point %d", offset, offset)

    # ---------------------------------------------------------- leader epochs
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int] | None:
        """Kafka's ``LeaderEpochFileCache.endOffsetFor`` for a replica: (the largest leader epoch <= ``epoch``
        the log holds, the offset where it ends), or None when no batch carries such an epoch.

        Kafka keeps the epochs in ``leader-epoch-checkpoint``; here they come from
        the batches' own ``partitionLeaderEpoch`` (the leader wrote it, a follower
        keeps it byte for byte), walking headers back from the log end until the
        first batch at or below ``epoch``: the last segment's headers in the
        common case, as only a follower's divergence check asks.  A batch without
        an epoch (-1, an embedded append) ends the walk: nothing below it is known.
        """
        end = self.log_end_offset
        for segment in reversed(list(self._segments.values())):
            for _, header in reversed(list(segment.batches())):
                found = header.partition_leader_epoch
                if found < 0:
                    return None
                if found <= epoch:
                    return found, end
                end = header.base_offset
        return None

    def latest_epoch(self) -> int:
        """The leader epoch of the last batch in the log (-1 when empty or unknown): a follower's
        ``lastFetchedEpoch``."""
        for segment in reversed(list(self._segments.values())):
            last = None
            for _, header in segment.batches():
                last = header
            if last is not None:
                return last.partition_leader_epoch
        return -1

    # -------------------------------------------------------------- truncate
    def truncate_to(self, offset: int) -> bool:
        """Remove every record at or above ``offset``; True if anything was removed (Kafka's truncateTo)."""
        self._check_writable("truncate")
        if offset < 0:
            raise InvalidRequestError(
                f"Cannot truncate partition {self.topic_partition} to a negative offset ({offset}).")
        with self.lock:
            self._check_open()
            if offset >= self.log_end_offset:
                logger.info(self._prefix + "Truncating to %d has no effect as the largest offset in the log is %d",
                            offset, self.log_end_offset - 1)
                return False
            logger.info(self._prefix + "Truncating to offset %d", offset)
            self.truncations += 1
            if self._segments.peekitem(0)[0] > offset:
                self.truncate_fully_and_start_at(offset)
            else:
                deletable = [s for s in self._segments.values() if s.base_offset > offset]
                if deletable:
                    logger.info(self._prefix + "Deleting segments as part of log truncation: %s",
                                ",".join(map(repr, deletable)))
                    self._remove_and_delete_segments(deletable)
                    del deletable          # their descriptors go now: the truncation below may need some
                active = self.active_segment
                try:
                    active.truncate_to(offset)
                finally:
                    # Whole batches go: if ``offset`` fell inside one, the log now ends
                    # before it (Kafka assumes batch boundaries and would leave a gap).
                    # Also after a failure: the log end is what the segment holds now.
                    end = active.next_offset
                    self._update_log_end_offset(end)
                    self._log_start_offset = min(end, self._log_start_offset)
        return True

    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and start an empty log at ``new_offset``."""
        self._check_writable("truncate")
        with self.lock:
            self._check_open()
            self.truncations += 1
            segments = list(self._segments.values())
            logger.info(self._prefix + "Deleting segments as part of log truncation: %s",
                        ",".join(map(repr, segments)))
            self._remove_and_delete_segments(segments[:-1])
            self._create_and_delete_segment(new_offset, segments[-1], "log truncation")
            self._update_log_end_offset(new_offset)
            self._log_start_offset = new_offset

    # ------------------------------------------------------------- retention
    def delete_old_segments(self) -> int:
        """Retention: segments below the log start offset, then (cleanup.policy=delete) size and time breaches."""
        self._check_writable("delete old segments of")
        with self.lock:
            self._check_open()
            total = self._delete_log_start_offset_breached_segments()
            if self.config.delete:
                total += self._delete_retention_size_breached_segments()
                total += self._delete_retention_ms_breached_segments()
        return total

    def _delete_log_start_offset_breached_segments(self) -> int:
        log_start = self._log_start_offset

        def describe(segments: list[LogSegment]) -> None:
            logger.info(self._prefix + "Deleting segments due to log start offset %d breach: %s", log_start,
                        ",".join(map(repr, segments)))
        return self._delete_old(retention.log_start_offset_breached(log_start),
                                f"log start offset {log_start} breach", describe)

    def _delete_retention_size_breached_segments(self) -> int:
        retention_bytes = self.config.retention_bytes
        size = self.size
        if retention_bytes < 0 or size < retention_bytes:
            return 0

        def describe(segments: list[LogSegment]) -> None:
            for line in retention.describe_retention_size(segments, retention_bytes, size):
                logger.info(self._prefix + line)
        return self._delete_old(retention.retention_size_breached(size, retention_bytes),
                                f"retention size in bytes {retention_bytes} breach", describe)

    def _delete_retention_ms_breached_segments(self) -> int:
        retention_ms = self.config.retention_ms
        if retention_ms < 0:
            return 0

        def describe(segments: list[LogSegment]) -> None:
            for line in retention.describe_retention_ms(segments, retention_ms):
                logger.info(self._prefix + line)
        return self._delete_old(retention.retention_ms_breached(self.clock.milliseconds(), retention_ms),
                                f"retention time {retention_ms}ms breach", describe)

    def _delete_old(self, predicate: retention.SegmentPredicate, reason: str,
                    describe: Callable[[list[LogSegment]], None]) -> int:
        deletable = retention.deletable_segments(list(self._segments.values()), predicate, self.log_end_offset)
        if not deletable:
            return 0
        logger.info(self._prefix + "Found deletable segments with base offsets [%s] due to %s",
                    ",".join(str(s.base_offset) for s in deletable), reason)
        to_delete = deletable
        if len(self._segments) == len(deletable):
            # A log always keeps an active segment: roll first so one remains.
            new_segment = self._roll_locked(None)
            if deletable[-1].base_offset == new_segment.base_offset:
                logger.warning(self._prefix + "Empty active segment at %d was deleted and recreated due to %s",
                               new_segment.base_offset, reason)
                to_delete = deletable[:-1]
        if to_delete:
            segments = self._segments
            next_base = segments.keys()[segments.bisect_right(to_delete[-1].base_offset)]
            self._increment_log_start_offset(next_base, SEGMENT_DELETION)
            describe(to_delete)
            self._remove_and_delete_segments(to_delete)
        return len(deletable)

    def maybe_increment_log_start_offset(self, new_start: int, reason: str = CLIENT_RECORD_DELETION) -> None:
        """DeleteRecords: move the log start offset up to ``new_start`` (never past the log end).

        Segments wholly below the new start are deleted at once, through the
        same asynchronous path as retention, so they leave the namespace now.
        """
        self._check_writable("move the log start offset of")
        with self.lock:
            self._check_open()
            if new_start < 0:
                raise InvalidRequestError(
                    f"Cannot increment the log start offset of partition {self.topic_partition} to a negative "
                    f"offset {new_start}")
            if new_start > self.log_end_offset:
                raise InvalidRequestError(
                    f"Cannot increment the log start offset to {new_start} of partition {self.topic_partition} "
                    f"since it is larger than the log end offset {self.log_end_offset}")
            if self._increment_log_start_offset(new_start, reason):
                self._delete_log_start_offset_breached_segments()

    def _increment_log_start_offset(self, new_start: int, reason: str) -> bool:
        if new_start > self._log_start_offset:
            if self.before_log_start_offset_moves is not None:
                self.before_log_start_offset_moves(self, new_start)
            self._log_start_offset = new_start
            logger.info(self._prefix + "Incremented log start offset to %d due to %s", new_start, reason)
            return True
        return False

    def _remove_and_delete_segments(self, to_delete: Sequence[LogSegment]) -> None:
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
        self._check_writable("delete segment files of")
        now = self.clock.milliseconds() if now_ms is None else now_ms
        with self.lock:
            due = [p.segment for p in self._pending if p.due_ms <= now]
            if not due:
                return 0
            self._pending = [p for p in self._pending if p.due_ms > now]
        logger.info(self._prefix + "Deleting segment files %s", ", ".join(map(repr, due)))
        for segment in due:
            segment.delete_if_exists()
        return len(due)

    # ---------------------------------------------------------- replacement
    def replace_segments(self, new_segments: Sequence[LogSegment], old_segments: Sequence[LogSegment]) -> None:
        """Swap cleaned segments in for old ones, crash-safely (Kafka's LocalLog.replaceSegments).

        ``.cleaned`` -> ``.swap`` in descending offset order, add them, rename the
        old ones ``.deleted`` (queued), then drop the ``.swap`` suffix.  A crash at
        any point is completed or rolled back by the LogLoader.
        """
        self._check_writable("replace segments of")
        with self.lock:
            self._check_open()
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
            self._update_log_end_offset(self.log_end_offset)

    # ------------------------------------------------------------- lifecycle
    def rename_dir(self, new_name: str) -> None:
        """Rename the partition directory (e.g. ``topic-0.<id>-delete``); segments follow."""
        self._check_writable("rename")
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
        self._check_writable("delete")
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
        logger.info(self._prefix + "Deleted log for partition %s in %s.", self.topic_partition, self.dir)

    def __repr__(self) -> str:
        return (f"Log(dir={self.dir}, topicPartition={self.topic_partition}, logStartOffset="
                f"{self._log_start_offset}, logEndOffset={self.log_end_offset})")


def _segment_runs(headers: Sequence[tuple[int, BatchHeader]], segment_bytes: int) -> list[tuple[int, int]]:
    """``headers`` cut into consecutive runs ``[start, stop)`` of at most ``segment_bytes`` each (a batch
    larger than that is a run of its own): what one follower append puts into one segment."""
    runs: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, (_, header) in enumerate(headers):
        if i > start and size + header.size > segment_bytes:
            runs.append((start, i))
            start, size = i, 0
        size += header.size
    runs.append((start, len(headers)))
    return runs
