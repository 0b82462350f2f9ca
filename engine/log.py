"""Log: the log of one partition as clients see it (Kafka's ``UnifiedLog``).

A Log has a :class:`engine.local_log.LocalLog` (the segments on disk, the
log end offset and the recovery point, roll, flush, deletion, replacement; see
that module for the concurrency model: one ``RLock`` for every change, a
copy-on-write segment map and a published log end for readers that take no
lock), as Kafka's ``UnifiedLog`` has one, and adds what clients see: the log
start offset (first offset a reader may see), appends (one pipeline for
values, text lines, batches built elsewhere and a follower's fetched
batches), reads, ListOffsets, leader epochs, truncation and retention.
Loading is :mod:`engine.log_loader` (Kafka's ``LogLoader``), the checks an
append must pass :mod:`engine.log_validator`, renderings :mod:`engine.views`.

Locking rules of this part: every mutator takes ``lock`` and checks the log is
open (``_check_open``) under it; a read takes no lock but one snapshot of the
log end, the segment map and the log start offset, and bounds itself by them.
The flush an append needs (a roll, ``flush.messages``) runs after ``lock`` is
released (``_after_append``), so fsync holds up no other appender.  The log
start offset moves only under ``lock``, after ``before_log_start_offset_moves``
(the LogManager's checkpoint) returned.

Read-only logs (``Log.load(read_only=True)``, a ``--read-only`` mount) perform
no write at all, not even the ones recovery would make: the loader runs the
same recovery in memory (torn tails left out of segment sizes, indexes rebuilt
in anonymous maps, a valid ``.swap`` swapped in the segment map only, stray
``.deleted``/``.cleaned`` files left alone), so a copy of a live broker's
directory mounts without a clean-shutdown marker; every mutator of a
read-only Log raises ReadOnlyError.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from typing import TYPE_CHECKING, Protocol

from engine import retention
from engine.clock import SYSTEM_CLOCK, Clock
from engine.errors import (
    InvalidRecordError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
    UnsafeFileError,
)
from engine.local_log import AppendObserver, LocalLog, LogOffsetMetadata
from engine.log_append import AppendBuilder, AppendOrigin, AppendRun, LogAppendInfo
from engine.log_loader import LoadedLog, LogLoader
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
from engine.transactions import READ_UNCOMMITTED_ISOLATION, ReadIsolation, TransactionState

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sortedcontainers import SortedDict

    from engine.config import LogConfig
    from engine.topic import TopicPartition


class RemoteSegments(Protocol):
    """What a Log asks of its copies in remote storage (engine.remote.remote_segment.RemoteLogReader)."""

    def segments_map(self, local: SortedDict, log_start: int) -> SortedDict:
        """The remote segments below the first of ``local``, then ``local``."""

    def highest_copied_offset(self) -> int:
        """The last offset held by a finished copy, -1 when none."""

    def forget_segments_map(self) -> None:
        """Drop the map ``segments_map`` keeps: local segments just deleted are held by nothing then (their
        pinned descriptors, and so their disk space, go with them)."""

    def local_segments_deleted(self, segments: Sequence[LogSegment]) -> None:
        """Local retention deleted ``segments``, whose copies serve their records now: what another layer
        derived from their bytes (their ``attachment``) goes to the copies, so the first view of them reads
        nothing of the store to size them."""


__all__ = ["CLIENT_RECORD_DELETION", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "LEADER_LOG_START_OFFSET",
           "MAX_TIMESTAMP", "SEGMENT_DELETION", "AppendObserver", "AppendOrigin", "Log", "LogAppendInfo",
           "LogOffsetMetadata"]

logger = logging.getLogger(__name__)

#: ListOffsets special timestamps (Kafka's ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3

#: Kafka's LogStartOffsetIncrementReason strings.
CLIENT_RECORD_DELETION = "client delete records request"
SEGMENT_DELETION = "segment deletion"
#: a follower's log start following its leader's (retention or DeleteRecords on the leader)
LEADER_LOG_START_OFFSET = "leader log start offset"

# The same bound without any assumption on sizes (every varint at its widest
# for a 32-bit length or delta): what splitting a write relies on.
_SPLIT_RECORD_BOUND = 23
_BASE_OFFSET = struct.Struct(">q")


def _compression_of(name: str) -> Compression:
    # "producer" keeps what the producer sent; logfs is its own producer and
    # writes uncompressed batches unless the topic names a codec.
    if name in ("producer", "uncompressed", "none", ""):
        return Compression.NONE
    return Compression.from_name(name)


class Log:
    """The log of one partition as clients see it; see the module docstring for the rules.

    It holds its :class:`LocalLog` (``local_log``: the segments, the log end,
    the recovery point) and shares its ``lock``; the LocalLog's state is read
    and changed only through its public members.
    """

    def __init__(self, dir: str, config: LogConfig, loaded: LoadedLog, *, clock: Clock = SYSTEM_CLOCK,
                 topic_partition: TopicPartition | None = None, read_only: bool = False) -> None:
        self.local_log = LocalLog(dir, config, loaded, clock=clock, topic_partition=topic_partition,
                                  read_only=read_only)
        #: the one lock of every change to the log, its LocalLog's (see the module docstring)
        self.lock = self.local_log.lock
        self.clock = clock
        self.read_only = read_only
        self.topic_partition = self.local_log.topic_partition
        #: called as ``fn(log)`` under ``lock`` each time the log end offset was set (an append, a
        #: truncation, a roll): readers that cache what they read learn that it may have changed
        self.end_listeners: list[Callable[[Log], None]] = []
        self.local_log.on_log_end_moved = self._log_end_moved
        self._compression = _compression_of(config.compression_type)
        self._log_start_offset = loaded.log_start_offset
        #: Called as ``fn(log, new_start)`` under the log's lock just before
        #: the log start offset moves up, i.e. before any segment below it is
        #: renamed ``.deleted``.  The LogManager writes the dir's
        #: log-start-offset-checkpoint here, so no crash after the move can
        #: bring deleted records back; if it raises, nothing moves.
        self.before_log_start_offset_moves: Callable[[Log, int], None] | None = None
        #: how many times records were removed from the end (truncate_to, truncate_fully_and_start_at):
        #: a reader caching bytes it read compares it to know they may be gone or replaced
        self.truncations = 0
        #: how views read this log (set by its LogManager from ``isolation.level``; engine.transactions)
        self.read_isolation: ReadIsolation = READ_UNCOMMITTED_ISOLATION
        #: the aborted-transaction walk of a read_committed log, made on first use
        #: (engine.transactions.read_committed_state, under its lock)
        self.transaction_state: TransactionState | None = None
        #: tiered storage (KIP-405): the copies of this partition in the mount's remote storage, set by
        #: the LogManager when it has one; readers see them below the local log start (reader_segments),
        #: and local retention deletes only what they hold
        self.remote_log_reader: RemoteSegments | None = None

    # ----------------------------------------------------------- loading
    @classmethod
    def load(cls, dir: str, config: LogConfig, *, log_start_offset: int = 0, recovery_point: int = 0,
             had_clean_shutdown: bool = False, clock: Clock = SYSTEM_CLOCK,
             topic_partition: TopicPartition | None = None, read_only: bool = False) -> Log:
        """Open (creating if needed) the log in ``dir``, running Kafka's LogLoader over it.

        With ``read_only`` nothing is created or repaired on disk: the directory
        must exist, and whatever recovery it needs happens in memory.
        """
        start = time.monotonic()
        log_dir = os.path.abspath(dir)
        tp = topic_partition or topic_partition_of_dir(log_dir)
        if os.path.islink(log_dir):
            raise UnsafeFileError(f"Partition directory {log_dir} is a symbolic link: logfs never follows links in a "
                                  "log directory", paths=[log_dir])
        if read_only:
            if not os.path.isdir(log_dir):
                raise StorageError(f"Log directory {log_dir} does not exist (opened read-only)")
        else:
            try:
                os.makedirs(log_dir, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"Could not create log directory {log_dir}: {exc.strerror}") from exc
        loaded = LogLoader(log_dir, tp, config, clock, had_clean_shutdown, log_start_offset,
                           recovery_point, read_only=read_only).load()
        log = cls(log_dir, config, loaded, clock=clock, topic_partition=tp, read_only=read_only)
        logger.info(log._prefix + "Completed load of log with %d segments, log start offset %d and log end "
                    "offset %d in %d ms", log.num_segments, log.log_start_offset, log.log_end_offset,
                    (time.monotonic() - start) * 1000)
        return log

    # -------------------------------------------------------- properties
    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def config(self) -> LogConfig:
        return self.local_log.config

    def update_config(self, config: LogConfig) -> None:
        with self.lock:
            self.local_log.config = config
            self._compression = _compression_of(config.compression_type)

    @property
    def _prefix(self) -> str:
        return self.local_log.log_prefix

    def _log_end_moved(self) -> None:
        for listener in self.end_listeners:
            listener(self)

    # What the LocalLog holds, as readers of the log ask for it.
    @property
    def dir(self) -> str:
        return self.local_log.dir

    @property
    def name(self) -> str:
        return self.local_log.name

    @property
    def segments(self) -> SortedDict:
        """The current segment map: never mutated after publication, so safe to walk without a lock."""
        return self.local_log.segments

    @property
    def local_log_start_offset(self) -> int:
        """Kafka's ``localLogStartOffset``: the first offset held by a local segment (the log start when the
        local segments hold it: always, unless tiered storage's local retention deleted copied segments)."""
        segments = self.local_log.segments
        first = segments.peekitem(0)[0] if segments else self._log_start_offset
        return max(first, self._log_start_offset)

    @property
    def has_remote_only_records(self) -> bool:
        """Whether some records are held only by remote log segments (below the local log start): reading
        them reads tiered storage's store."""
        return self._log_start_offset < self.local_log_start_offset

    def reader_segments(self) -> SortedDict:
        """The segments readers see: the remote log segments below the local log start (tiered storage),
        then the local ones; ``segments`` itself when there are no remote ones to add.  Never mutated; the
        same object while nothing changed (views compare maps by identity)."""
        local = self.local_log.segments
        reader = self.remote_log_reader
        if reader is None or not local or self._log_start_offset >= local.peekitem(0)[0]:
            return local
        return reader.segments_map(local, self._log_start_offset)

    @property
    def active_segment(self) -> LogSegment:
        return self.local_log.active_segment

    @property
    def log_end_offset(self) -> int:
        return self.local_log.log_end_offset

    @property
    def log_end_offset_metadata(self) -> LogOffsetMetadata:
        return self.local_log.log_end_offset_metadata

    @property
    def recovery_point(self) -> int:
        return self.local_log.recovery_point

    @property
    def size(self) -> int:
        return self.local_log.size

    @property
    def num_segments(self) -> int:
        return self.local_log.num_segments

    @property
    def unflushed_messages(self) -> int:
        return self.local_log.unflushed_messages

    @property
    def last_flush_time(self) -> int:
        return self.local_log.last_flush_time

    @property
    def pending_deletion_segments(self) -> int:
        return self.local_log.pending_deletion_segments

    @property
    def pending_deletion_bytes(self) -> int:
        return self.local_log.pending_deletion_bytes

    @property
    def append_observer(self) -> AppendObserver | None:
        """The one hook through which state derived from appended values is kept (the mount's view indexes)."""
        return self.local_log.append_observer

    @append_observer.setter
    def append_observer(self, observer: AppendObserver | None) -> None:
        self.local_log.append_observer = observer

    # What the LocalLog does, as the log's users ask for it.
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset; the old one is flushed."""
        return self.local_log.roll()

    def flush(self, offset: int | None = None) -> None:
        """fsync the segments below ``offset`` (default: the log end); the recovery point moves there."""
        self.local_log.flush(offset)

    def delete_expired_segment_files(self, now_ms: int | None = None) -> int:
        return self.local_log.delete_expired_segment_files(now_ms)

    def replace_segments(self, new_segments: Sequence[LogSegment], old_segments: Sequence[LogSegment]) -> None:
        self.local_log.replace_segments(new_segments, old_segments)

    def rename_dir(self, new_name: str) -> None:
        self.local_log.rename_dir(new_name)

    def close(self) -> None:
        self.local_log.close()

    def delete(self) -> None:
        self.local_log.delete()

    # ------------------------------------------------------------ append
    def append(self, build: AppendBuilder, origin: AppendOrigin = AppendOrigin.CLIENT) -> LogAppendInfo:
        """The one append pipeline (Kafka's ``UnifiedLog.append``): every write to the log goes through it.

        Under ``lock``: ``build(log end offset, now)`` makes the batches
        (assigning offsets from the log end for a client, keeping a leader's
        for a replica) as runs that each go into one segment; each run rolls
        the active segment when it must (``_maybe_roll``), is appended, is
        reported to the ``append_observer`` (batches the log encoded itself),
        and advances the log end.  After ``lock`` is released the flush the
        append needs (a roll, ``flush.messages``) runs.  A client append is
        all or nothing: a failure after some of its runs were written (a
        full disk) truncates the log back to where it began.  A failure in
        ``build`` writes nothing.
        """
        self.local_log.check_writable("append to")
        with self.lock:
            self.local_log.check_open()
            runs = build(self.log_end_offset, self.clock.milliseconds())
            begin = self.log_end_offset
            rolled: int | None = None
            max_ts, offset_of_max, size = -1, runs[0].first_offset, 0
            try:
                for run in runs:
                    segment, rolled_here = self._maybe_roll(len(run.data), run.max_timestamp, run.first_offset,
                                                            run.last_offset)
                    rolled = rolled_here if rolled_here is not None else rolled
                    position = segment.size
                    segment.append(run.last_offset, run.max_timestamp, run.offset_of_max_timestamp, run.data)
                    observer = self.append_observer
                    if observer is not None and run.report is not None:
                        run.report(observer, segment, position)
                    self.local_log.update_log_end_offset(run.last_offset + 1)
                    if run.max_timestamp > max_ts:
                        max_ts, offset_of_max = run.max_timestamp, run.offset_of_max_timestamp
                    size += len(run.data)
            except BaseException:
                if origin is AppendOrigin.CLIENT and self.log_end_offset > begin:
                    logger.warning(self._prefix + "Append of %d batches failed part-way at offset %d; truncating "
                                   "back to %d.", len(runs), self.log_end_offset, begin)
                    self.truncate_to(begin)
                raise
            flush_needed = self.log_end_offset - self.local_log.recovery_point >= self.config.flush_messages
        self._after_append(rolled, flush_needed)
        return LogAppendInfo(runs[0].first_offset, runs[-1].last_offset, max_ts, offset_of_max, size, origin)

    def append_values(self, values: Sequence[bytes | None],
                      keys: Sequence[bytes | None] | None = None) -> tuple[int, int]:
        """Append ``values`` (and keys) as one LogAppendTime batch; returns (first offset, last offset)."""
        n = len(values)
        if n == 0:
            raise InvalidRecordError(f"Cannot append an empty batch to {self.topic_partition}")
        if keys is not None and len(keys) != n:
            raise InvalidRecordError(f"{len(keys)} keys for {n} values in the append to {self.topic_partition}")
        config = self.config
        if config.compact and (keys is None or None in keys):
            raise InvalidRecordError(
                f"Compacted topic cannot accept message without key in topic partition {self.topic_partition}.")
        info = self.append(lambda first, now: self._value_runs(values, keys, first, now))
        return info.first_offset, info.last_offset

    def append_text_lines(self, block: bytes) -> tuple[int, int]:
        """Append the lines of ``block`` (each ending in ``\\n``) as the values of one batch without keys.

        The same batch ``append_values`` writes for the lines without their
        newlines, encoded without splitting them into Python objects
        (``encode_text_lines``): the hot path of ``cat file >> append``.
        What that encoding does not cover (compression, a batch over
        ``max.message.bytes`` or ``segment.bytes``) is built as
        ``append_values`` builds it, which checks and splits as for any append.
        """
        if self.config.compact:
            raise InvalidRecordError(
                f"Compacted topic cannot accept message without key in topic partition {self.topic_partition}.")
        info = self.append(lambda first, now: self._text_line_runs(block, first, now))
        return info.first_offset, info.last_offset

    def append_batch(self, batch: bytes, assign_offsets: bool = True) -> tuple[int, int]:
        """Append record batches built elsewhere (kafka-python, tools), validating each CRC.

        With ``assign_offsets`` the base offsets are rewritten to follow the log
        end; the base offset is outside the CRC, so the batch stays valid
        byte for byte otherwise.  Without it the batches must start at or after
        the log end (a replica's append).
        """
        self.local_log.check_writable("append to")
        buf = bytearray(batch)
        headers = validate_batches(self.topic_partition, buf, self.config)

        def build(end: int, _now: int) -> list[AppendRun]:
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
            return [AppendRun(bytes(buf), first, last, max_ts, offset_of_max, None)]

        info = self.append(build)
        return info.first_offset, info.last_offset

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
        self.local_log.check_writable("append to")
        headers = [(pos, validate_batch(records, pos)) for pos, _ in iter_batches(records)]
        if not headers:
            return self.log_end_offset
        end_pos = headers[-1][0] + headers[-1][1].size
        buf = bytes(records[:end_pos])

        def build(end: int, _now: int) -> list[AppendRun]:
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
            # A fetch returns many batches at once (up to the fetch's partition bytes): each run of them
            # that fits one segment is appended on its own, rolling in between, so the replica's
            # log.segment.bytes (and so its retention) holds whatever the fetch size.
            runs = []
            for start, stop in _segment_runs(headers, self.config.segment_size):
                run = headers[start:stop]
                max_ts, offset_of_max = -1, run[0][1].base_offset
                for _, header in run:
                    if header.max_timestamp > max_ts:
                        max_ts, offset_of_max = header.max_timestamp, header.last_offset
                begin, finish = run[0][0], run[-1][0] + run[-1][1].size
                runs.append(AppendRun(buf[begin:finish], run[0][1].base_offset, run[-1][1].last_offset, max_ts,
                                      offset_of_max, None))
            return runs

        return self.append(build, AppendOrigin.REPLICATION).last_offset + 1

    # The builders: each runs under ``lock`` inside ``append``, given the log end offset and the time.

    def _text_line_runs(self, block: bytes, first: int, now: int) -> list[AppendRun]:
        """The batch of ``append_text_lines``: encoded from ``block`` directly when it is uncompressed,
        needs no record checked alone and fits a segment, else as ``_value_runs`` builds the lines."""
        config = self.config
        encoded = encode_text_lines(first, block, now) if self._compression == Compression.NONE else None
        if encoded is not None:
            batch, layout = encoded
            size = len(batch)
            # Like _value_runs: a batch within max.message.bytes proves every record alone is.
            if size <= config.segment_size and (
                    size <= config.max_message_bytes
                    or layout.longest + HEADER_SIZE + RECORD_OVERHEAD_BOUND <= config.max_message_bytes):
                count = layout.lines
                last = first + count - 1

                def report(observer: AppendObserver, segment: LogSegment, position: int) -> None:
                    observer.on_append_lines(segment, position, size, block, count, first, now)

                return [AppendRun(batch, first, last, now, last, report)]
        # no lines, not whole ones, compressed, or a record to check alone or split across segments
        values = block.split(b"\n")
        if values.pop():
            raise InvalidRecordError(f"The last line of an append to {self.topic_partition} has no newline")
        if not values:
            raise InvalidRecordError(f"Cannot append an empty batch to {self.topic_partition}")
        return self._value_runs(values, None, first, now)

    def _value_runs(self, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                    first: int, now: int) -> list[AppendRun]:
        """One LogAppendTime batch of ``values`` (and keys) from offset ``first``, or consecutive batches
        that each fit a segment when one would not.

        Kafka refuses a batch larger than ``segment.bytes``; a filesystem user
        cannot choose how ``cat`` sizes its writes, so a write that big is cut
        into batches here instead, appended under the one lock hold (no other
        writer lands between them) and all or nothing (``append``).
        """
        config = self.config
        batch = encode_values(first, values, now, keys, self._compression)
        if len(batch) > config.max_message_bytes or self._compression != Compression.NONE:
            # An uncompressed batch within the limit proves every record alone is.
            check_record_sizes(self.topic_partition, values, keys, config.max_message_bytes)
        if len(batch) <= config.segment_size:
            return [self._value_run(batch, values, keys, first, now)]
        limit = config.segment_size - HEADER_SIZE
        chunks: list[tuple[int, int]] = []
        start, budget = 0, 0
        for i, value in enumerate(values):
            key = keys[i] if keys is not None else None
            cost = _SPLIT_RECORD_BOUND + (len(value) if value is not None else 0) \
                + (len(key) if key is not None else 0)
            if cost > limit:
                raise RecordTooLargeError(
                    f"The record at index {i} of the append to {self.topic_partition} does not fit in a "
                    f"segment of the configured size {config.segment_size}.")
            if budget + cost > limit and i > start:
                chunks.append((start, i))
                start, budget = i, 0
            budget += cost
        chunks.append((start, len(values)))
        runs = []
        offset = first
        for lo, hi in chunks:
            part_values = values[lo:hi]
            part_keys = keys[lo:hi] if keys is not None else None
            part = encode_values(offset, part_values, now, part_keys, self._compression)
            runs.append(self._value_run(part, part_values, part_keys, offset, now))
            offset += hi - lo
        return runs

    @staticmethod
    def _value_run(batch: bytes, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                   first: int, now: int) -> AppendRun:
        last = first + len(values) - 1

        def report(observer: AppendObserver, segment: LogSegment, position: int) -> None:
            observer.on_append(segment, position, len(batch), values, keys, first, now)

        return AppendRun(batch, first, last, now, last, report)

    def _maybe_roll(self, batch_size: int, max_timestamp: int, first_offset: int,
                    last_offset: int) -> tuple[LogSegment, int | None]:
        segment = self.active_segment
        now = self.clock.milliseconds()
        if (segment.size == 0 and segment.base_offset == max(first_offset, self.log_end_offset)
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
            new_segment = self.local_log.roll_locked(first_offset)
            return new_segment, new_segment.base_offset
        return segment, None

    def _after_append(self, rolled_at: int | None, flush_needed: bool) -> None:
        # Outside the lock: fsync must not hold up other appenders (Kafka does this on its scheduler).
        if flush_needed:
            self.flush()
        elif rolled_at is not None:
            self.flush(rolled_at)

    # -------------------------------------------------------------- read
    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_message: bool = True) -> FetchDataInfo:
        """Raw batches from the one holding ``start_offset`` (Kafka's LocalLog.read).

        OffsetOutOfRangeError outside [log start, log end]; at the log end (or
        ``max_offset``) the records are empty.
        """
        end = self.local_log.log_end_offset_metadata
        segments = self.local_log.segments
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
            info: FetchDataInfo | None = segment.read(start_offset, max_bytes, max_position, min_one_message)
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
        """Decoded records from ``start_offset`` (CRC-checked), at most ``max_records``, control records skipped.

        Below the local log start they come from the remote log segments (tiered storage)."""
        end = self.local_log.log_end_offset_metadata
        segments = self.reader_segments()
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
        segments = list(self.local_log.segments.values())
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
        for segment in self.reader_segments().values():     # below the local log start: remote segments
            if segment.largest_timestamp >= timestamp:
                found = segment.find_offset_by_timestamp(timestamp, start)
                if found is not None:
                    return found[1], found[0]
        return None

    # ----------------------------------------------------- leader epochs
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
        for segment in reversed(list(self.local_log.segments.values())):
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
        for segment in reversed(list(self.local_log.segments.values())):
            last = None
            for _, header in segment.batches():
                last = header
            if last is not None:
                epoch: int = last.partition_leader_epoch
                return epoch
        return -1

    # ---------------------------------------------------------- truncate
    def truncate_to(self, offset: int) -> bool:
        """Remove every record at or above ``offset``; True if anything was removed (Kafka's truncateTo)."""
        self.local_log.check_writable("truncate")
        if offset < 0:
            raise InvalidRequestError(
                f"Cannot truncate partition {self.topic_partition} to a negative offset ({offset}).")
        with self.lock:
            self.local_log.check_open()
            if offset >= self.log_end_offset:
                logger.info(self._prefix + "Truncating to %d has no effect as the largest offset in the log is %d",
                            offset, self.log_end_offset - 1)
                return False
            logger.info(self._prefix + "Truncating to offset %d", offset)
            self.truncations += 1
            if self.local_log.segments.peekitem(0)[0] > offset:
                self.truncate_fully_and_start_at(offset)
            else:
                deletable = [s for s in self.local_log.segments.values() if s.base_offset > offset]
                if deletable:
                    logger.info(self._prefix + "Deleting segments as part of log truncation: %s",
                                ",".join(map(repr, deletable)))
                    self.local_log.remove_and_delete_segments(deletable)
                    del deletable          # their descriptors go now: the truncation below may need some
                active = self.active_segment
                try:
                    active.truncate_to(offset)
                finally:
                    # Whole batches go: if ``offset`` fell inside one, the log now ends
                    # before it (Kafka assumes batch boundaries and would leave a gap).
                    # Also after a failure: the log end is what the segment holds now.
                    end = active.next_offset
                    self.local_log.update_log_end_offset(end)
                    self._log_start_offset = min(end, self._log_start_offset)
        return True

    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and start an empty log at ``new_offset``."""
        self.local_log.check_writable("truncate")
        with self.lock:
            self.local_log.check_open()
            self.truncations += 1
            segments = list(self.local_log.segments.values())
            logger.info(self._prefix + "Deleting segments as part of log truncation: %s",
                        ",".join(map(repr, segments)))
            self.local_log.remove_and_delete_segments(segments[:-1])
            self.local_log.create_and_delete_segment(new_offset, segments[-1], "log truncation")
            self.local_log.update_log_end_offset(new_offset)
            self._log_start_offset = new_offset

    # --------------------------------------------------------- retention
    def delete_old_segments(self) -> int:
        """Retention: segments below the log start offset, then (cleanup.policy=delete) size and time breaches.

        With tiered storage (a ``remote_log_reader`` and ``remote.storage.enable``), ``retention.*`` bound
        the whole log, remote segments included: a breach moves the log start offset (the copies below it
        are deleted by the RemoteLogManager's next round); then ``local.retention.*`` delete local segments
        whose copy is finished, moving only the local log start (Kafka's ``deleteOldSegments`` of a tiered
        log).
        """
        self.local_log.check_writable("delete old segments of")
        with self.lock:
            self.local_log.check_open()
            total = self._delete_log_start_offset_breached_segments()
            if self.config.delete:
                if self._tiered():
                    total += self._delete_tiered_retention_breaches()
                else:
                    total += self._delete_retention_size_breached_segments()
                    total += self._delete_retention_ms_breached_segments()
            if total and self.remote_log_reader is not None:
                self.remote_log_reader.forget_segments_map()
        return total

    def _tiered(self) -> bool:
        return self.remote_log_reader is not None and self.config.remote_storage_enable

    def _delete_tiered_retention_breaches(self) -> int:
        """Total retention over remote and local segments, then local retention of the copied ones."""
        reader = self.remote_log_reader
        assert reader is not None
        config = self.config
        segments = list(self.reader_segments().values())
        total = 0
        now = self.clock.milliseconds()
        predicates = []
        if config.retention_bytes >= 0:
            size = sum(s.size for s in segments)
            if size >= config.retention_bytes:
                predicates.append((retention.retention_size_breached(size, config.retention_bytes),
                                   f"retention size in bytes {config.retention_bytes} breach"))
        if config.retention_ms >= 0:
            predicates.append((retention.retention_ms_breached(now, config.retention_ms),
                               f"retention time {config.retention_ms}ms breach"))
        for predicate, reason in predicates:
            segments = list(self.reader_segments().values())
            deletable = retention.deletable_segments(segments, predicate, self.log_end_offset)
            if not deletable:
                continue
            next_base = (segments[len(deletable)].base_offset if len(deletable) < len(segments)
                         else self.log_end_offset)
            if deletable[-1] is self.active_segment:
                continue        # the whole log is due: left to the local path, which rolls first
            logger.info(self._prefix + "Moving the log start offset to %d due to %s (tiered storage: %d "
                        "segments, remote and local)", next_base, reason, len(deletable))
            if self._increment_log_start_offset(next_base, SEGMENT_DELETION):
                total += len(deletable)
                total += self._delete_log_start_offset_breached_segments()
        # local retention: only segments whose copy is finished (their last offset at or below the
        # highest offset copied) may go; the log start stays, the local log start moves
        highest = reader.highest_copied_offset()
        local_bytes, local_ms = config.effective_local_retention_bytes, config.effective_local_retention_ms
        local_predicates = []
        if local_bytes >= 0:
            local_size = self.size
            if local_size >= local_bytes:
                local_predicates.append((retention.retention_size_breached(local_size, local_bytes),
                                         f"local retention size in bytes {local_bytes} breach"))
        if local_ms >= 0:
            local_predicates.append((retention.retention_ms_breached(now, local_ms),
                                     f"local retention time {local_ms}ms breach"))
        for predicate, reason in local_predicates:
            def copied(segment: LogSegment, next_segment: LogSegment | None,
                       predicate: retention.SegmentPredicate = predicate) -> bool:
                return segment.next_offset - 1 <= highest and predicate(segment, next_segment)
            deletable = retention.deletable_segments(list(self.local_log.segments.values()), copied,
                                                     self.log_end_offset)
            if not deletable or len(deletable) == len(self.local_log.segments):
                continue
            logger.info(self._prefix + "Deleting local segments with base offsets [%s] due to %s: their "
                        "copies in remote storage serve them (local log start offset %d)",
                        ",".join(str(s.base_offset) for s in deletable), reason, deletable[-1].next_offset)
            if self.before_log_start_offset_moves is not None:
                # the log start stays, now below the first local segment: checkpointed before that is so,
                # or a crash would restart the log at its first local segment
                self.before_log_start_offset_moves(self, self._log_start_offset)
            self.local_log.remove_and_delete_segments(deletable)
            reader.local_segments_deleted(deletable)
            total += len(deletable)
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
        deletable = retention.deletable_segments(list(self.local_log.segments.values()), predicate, self.log_end_offset)
        if not deletable:
            return 0
        logger.info(self._prefix + "Found deletable segments with base offsets [%s] due to %s",
                    ",".join(str(s.base_offset) for s in deletable), reason)
        to_delete = deletable
        if len(self.local_log.segments) == len(deletable):
            # A log always keeps an active segment: roll first so one remains.
            new_segment = self.local_log.roll_locked(None)
            if deletable[-1].base_offset == new_segment.base_offset:
                logger.warning(self._prefix + "Empty active segment at %d was deleted and recreated due to %s",
                               new_segment.base_offset, reason)
                to_delete = deletable[:-1]
        if to_delete:
            segments = self.local_log.segments
            next_base = segments.keys()[segments.bisect_right(to_delete[-1].base_offset)]
            self._increment_log_start_offset(next_base, SEGMENT_DELETION)
            describe(to_delete)
            self.local_log.remove_and_delete_segments(to_delete)
        return len(deletable)

    def maybe_increment_log_start_offset(self, new_start: int, reason: str = CLIENT_RECORD_DELETION) -> None:
        """DeleteRecords: move the log start offset up to ``new_start`` (never past the log end).

        Segments wholly below the new start are deleted at once, through the
        same asynchronous path as retention, so they leave the namespace now.
        A follower's start that follows its leader's (``LEADER_LOG_START_OFFSET``)
        and moves into the non-empty active segment rolls it at the log end first:
        the leader deleted those records, and only a closed segment can be deleted
        when the start passes it (at once if it is already past: the leader's log
        emptied).  Rolls are then as frequent as the leader's log start moves.
        """
        self.local_log.check_writable("move the log start offset of")
        with self.lock:
            self.local_log.check_open()
            if new_start < 0:
                raise InvalidRequestError(
                    f"Cannot increment the log start offset of partition {self.topic_partition} to a negative "
                    f"offset {new_start}")
            if new_start > self.log_end_offset:
                raise InvalidRequestError(
                    f"Cannot increment the log start offset to {new_start} of partition {self.topic_partition} "
                    f"since it is larger than the log end offset {self.log_end_offset}")
            if self._increment_log_start_offset(new_start, reason):
                active = self.active_segment
                if reason == LEADER_LOG_START_OFFSET and new_start > active.base_offset and active.size > 0:
                    logger.info(self._prefix + "Rolling the active segment at %d: the leader's log start %d is "
                                "past its base offset %d", self.log_end_offset, new_start, active.base_offset)
                    self.local_log.roll_locked(None)
                self._delete_log_start_offset_breached_segments()
                if self.remote_log_reader is not None:
                    self.remote_log_reader.forget_segments_map()

    def _increment_log_start_offset(self, new_start: int, reason: str) -> bool:
        if new_start > self._log_start_offset:
            if self.before_log_start_offset_moves is not None:
                self.before_log_start_offset_moves(self, new_start)
            self._log_start_offset = new_start
            logger.info(self._prefix + "Incremented log start offset to %d due to %s", new_start, reason)
            return True
        return False

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
