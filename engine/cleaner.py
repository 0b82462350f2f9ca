"""Log compaction: keep only the latest record of each key (Kafka's ``LogCleaner`` and ``Cleaner``).

A compacted log is split at its *first dirty offset* into a clean tail, cleaned
before, and a dirty head.  One round of cleaning:

1. builds an :class:`~engine.offset_map.OffsetMap` of key -> latest offset over
   the dirty section, from the first dirty offset up to the first uncleanable
   offset, or only as far as the map has room for (the rest stays dirty);
2. groups every segment below the end of the mapped range, clean and dirty,
   into runs whose sizes fit one segment (``groupSegmentsBySize``);
3. copies each group into ONE new segment named after the group's first
   segment with the suffix ``.cleaned``, keeping a record only if no later
   record of its key exists in the map; a tombstone (null value) is kept until
   its batch's *delete horizon* has passed and dropped after; keyless records
   are dropped;
4. swaps the new segment in with ``Log.replace_segments`` (``.cleaned`` ->
   ``.swap`` -> final name, old segments -> ``.deleted``), so that a crash at
   any point leaves either the old segments or the new one, never a mix;
5. checkpoints the end of the mapped range as the new first dirty offset.

Records keep their offsets, order, timestamps and headers; a batch that loses
no record and needs no delete horizon is copied byte for byte, otherwise its
survivors are re-written as the same batch (base and last offset, producer id,
epoch and sequence, codec, timestamp type, transactional and control flags:
:func:`~engine.records.rebuild_batch`).  Each new segment keeps the
modification time of the last segment it replaces, as Kafka's does.

The delete horizon is KIP-534's (Kafka 3.1+, KAFKA-8522): the first clean that
retains a tombstone, or a transaction marker whose transaction has no record
left, re-writes its batch with the *delete horizon* -- the time of that clean
plus ``delete.retention.ms`` -- in the batch's base timestamp and attribute
bit 6.  A later clean drops the tombstone (the marker: the whole control batch)
once its time is at or past that horizon.  A consumer that reads the log
within ``delete.retention.ms`` of the first clean therefore still sees the
deletion, and a tombstone on a topic that keeps being written expires after
``delete.retention.ms`` instead of riding along in every re-cleaned segment
(the legacy rule, ``delete.retention.ms`` before the last modified time of the
clean section, kept refreshing with each clean).  Kafka keeps the legacy
horizon only for batches older than magic 2, which logfs neither writes nor
reads, so here it only appears in the log lines, as in Kafka's.

Transactions (in a Kafka broker's data; logfs writes none): as Kafka's
cleaner, the batches of aborted transactions neither enter the offset map (an
aborted record never supersedes a committed one) nor survive a clean.  Kafka
finds them in its ``.txnindex`` files; here :mod:`engine.transactions` derives
the same list from the markers, walking the log incrementally across cleans.
A marker is eligible for its delete horizon only when no data batch of its
producer was read since that producer's previous marker in the clean (Kafka's
``CleanedTransactionMetadata``): a commit marker stays while its transaction
has records, an abort marker until the clean after the one that removed its
aborted records.  Removing a marker earlier would change what a
``read_committed`` reader sees.  A transaction with no marker at all (a broker
stopped mid-transaction) is cleaned like plain records.

The engine starts no threads: :meth:`LogCleaner.clean_once` does one unit of
work (clean the filthiest log, then retention of compacted logs) and returns,
and the mount calls it from ``log.cleaner.threads`` trio tasks through
``trio.to_thread.run_sync``, backing off ``log.cleaner.backoff.ms`` when it
returns None.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from itertools import compress
from operator import ge
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable, Sequence

from engine.cleaner_manager import (LastCleaning, LogCleanerManager, LogCleaningAbortedError, LogToClean,
                                    log_segments)
from engine.clock import SYSTEM_CLOCK, Clock
from engine.errors import CorruptRecordError, LogfsError
from engine.offset_map import OffsetMap
from engine.records import (LOG_OVERHEAD, BatchHeader, Record, decode_batch, decode_key_columns, iter_batches,
                            read_header, rebuild_batch, validate_batch)
from engine.segment import CLEANED_FILE_SUFFIX, LogSegment, log_file_path, offset_index_file_path, \
    time_index_file_path
from engine.topic import TopicPartition
from engine.transactions import AbortedTxn, TransactionState

if TYPE_CHECKING:   # pragma: no cover
    from engine.config import BrokerConfig
    from engine.log import Log

logger = logging.getLogger(__name__)

_INT32_MAX = 0x7FFFFFFF
#: Kafka's cleaner throttler checks its rate every 300 ms.
THROTTLER_CHECK_INTERVAL_MS = 300


class LogCleaningError(LogfsError):
    """An unexpected failure while cleaning one log; the partition is marked uncleanable."""


# -- throttling --------------------------------------------------------------------------------

class Throttler:
    """Sleeps just enough to hold a process to ``desired_rate_per_sec`` units (Kafka's ``Throttler``).

    Shared by all cleaner workers, so ``log.cleaner.io.max.bytes.per.second``
    bounds their sum, as in Kafka.  The rate is measured over periods of
    ``check_interval_ms``; a period that ran too fast is followed by a sleep.
    """

    def __init__(self, desired_rate_per_sec: float, check_interval_ms: int = THROTTLER_CHECK_INTERVAL_MS,
                 *, nanoseconds: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.desired_rate_per_sec = float(desired_rate_per_sec)
        self._check_interval_ns = check_interval_ms * 1_000_000
        self._nanoseconds = nanoseconds
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start_ns = nanoseconds()
        self._observed_so_far = 0.0
        #: total milliseconds slept, for stats and tests
        self.throttled_ms = 0

    def maybe_throttle(self, observed: float) -> None:
        rate = self.desired_rate_per_sec
        with self._lock:
            self._observed_so_far += observed
            now = self._nanoseconds()
            elapsed_ns = now - self._period_start_ns
            if elapsed_ns > self._check_interval_ns and self._observed_so_far > 0:
                rate_in_secs = self._observed_so_far * 1e9 / elapsed_ns
                if rate_in_secs > rate:
                    sleep_ms = round(self._observed_so_far / (rate / 1000.0) - elapsed_ns // 1_000_000)
                    if sleep_ms > 0:
                        logger.debug("Natural rate is %.1f per second but desired rate is %.1f, sleeping "
                                     "for %d ms to compensate.", rate_in_secs, rate, sleep_ms)
                        self._sleep(sleep_ms / 1000.0)
                        self.throttled_ms += sleep_ms
                self._period_start_ns = self._nanoseconds()
                self._observed_so_far = 0.0


class GilYield:
    """Lets other threads take the GIL at least every ``interval`` seconds of cleaning.

    The cleaner runs in a worker thread of the mount, whose trio thread serves
    every FUSE request.  When the trio thread wakes up (a request arrived, a
    system call returned) while the cleaner computes, it waits for the GIL
    until the interpreter forces a switch after ``sys.getswitchinterval()``
    (5 ms), and a small append that blocks a few times waits that long each
    time.  ``time.sleep(pause)`` releases the GIL and gives up the CPU, so the
    waiting thread takes over; with ``pause=0`` that costs about a
    microsecond when nobody waits.  Measured on a clean of 200k records, the
    wake-up delay of a thread sleeping 1 ms in a loop went from p50 2-5 ms to
    p50 0.2 ms with ``interval`` = 1 ms (scripts/bench_cleaner.py ``gil``).
    Called once per batch by the cleaner's loops.
    """

    __slots__ = ("interval", "pause", "_deadline", "_clock", "_sleep")

    def __init__(self, interval: float = 0.001, pause: float = 0.0, *,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval = interval
        self.pause = pause
        self._clock = clock
        self._sleep = sleep
        self._deadline = clock() + interval

    def __call__(self) -> None:
        if self._clock() >= self._deadline:
            self._sleep(self.pause)
            self._deadline = self._clock() + self.interval


# -- statistics ----------------------------------------------------------------------------------

@dataclass
class CleanerStats:
    """What one round of cleaning did (Kafka's ``CleanerStats``), plus which log and range."""

    topic_partition: TopicPartition | None = None
    first_dirty_offset: int = -1
    end_offset: int = -1
    start_time: float = field(default_factory=time.monotonic)
    map_complete_time: float = -1.0
    end_time: float = -1.0
    bytes_read: int = 0
    bytes_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    messages_read: int = 0
    invalid_messages_read: int = 0
    messages_written: int = 0
    buffer_utilization: float = 0.0
    segments_cleaned: int = 0
    groups: int = 0
    #: batches given a delete horizon (KIP-534) by this clean
    horizons_set: int = 0
    #: tombstones and transaction markers dropped because their delete horizon had passed
    deletes_expired: int = 0
    #: records of aborted transactions dropped
    aborted_records_removed: int = 0

    def read_messages(self, count: int, size: int) -> None:
        self.messages_read += count
        self.bytes_read += size

    def recopy_messages(self, count: int, size: int) -> None:
        self.messages_written += count
        self.bytes_written += size

    def index_done(self) -> None:
        self.map_complete_time = time.monotonic()

    def all_done(self) -> None:
        self.end_time = time.monotonic()

    @property
    def elapsed_secs(self) -> float:
        return max(self.end_time - self.start_time, 1e-9)

    @property
    def elapsed_index_secs(self) -> float:
        return max(self.map_complete_time - self.start_time, 1e-9)

    @property
    def messages_dropped(self) -> int:
        return self.messages_read - self.messages_written


@dataclass
class CleanerTotals:
    """Running sums over every finished clean of this cleaner (what the mount's metrics export).

    Kafka exposes only last-run gauges; cumulative counters let a Prometheus
    ``rate()`` show cleaning throughput and how much compaction removes.
    """

    runs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    segments_cleaned: int = 0
    elapsed_secs: float = 0.0
    horizons_set: int = 0
    deletes_expired: int = 0
    aborted_records_removed: int = 0

    def add(self, stats: CleanerStats) -> None:
        self.runs += 1
        self.horizons_set += stats.horizons_set
        self.deletes_expired += stats.deletes_expired
        self.aborted_records_removed += stats.aborted_records_removed
        self.bytes_read += stats.bytes_read
        self.bytes_written += stats.bytes_written
        self.records_read += stats.messages_read
        self.records_written += stats.messages_written
        self.segments_cleaned += stats.segments_cleaned
        self.elapsed_secs += stats.elapsed_secs

    @property
    def records_dropped(self) -> int:
        return self.records_read - self.records_written


def _mb(size: float) -> float:
    return size / (1024 * 1024)


# -- the cleaner ----------------------------------------------------------------------------------

class Cleaner:
    """The logic of cleaning one log with one offset map (one per worker).

    ``io_buffer_size`` is the read chunk (Kafka: ``log.cleaner.io.buffer.size /
    threads / 2``); it doubles up to ``max(max.message.bytes, max_io_buffer_size)``
    when one batch does not fit, and shrinks back after each segment.
    ``check_done(tp)`` raises LogCleaningAbortedError when the clean must stop; it
    is called between reads, so an abort takes effect within one chunk.
    """

    def __init__(self, id: int, offset_map: OffsetMap, io_buffer_size: int, max_io_buffer_size: int,
                 dup_buffer_load_factor: float, throttler: Throttler, clock: Clock = SYSTEM_CLOCK,
                 check_done: Callable[[TopicPartition], None] = lambda tp: None) -> None:
        if offset_map.slots * dup_buffer_load_factor <= 1:
            raise LogCleaningError(
                "offset map is too small to fit in even a single message, so log cleaning will never make "
                "progress. You can increase log.cleaner.dedupe.buffer.size or decrease log.cleaner.threads")
        self.id = id
        self.offset_map = offset_map
        self.io_buffer_size = max(io_buffer_size, 1)
        self.max_io_buffer_size = max_io_buffer_size
        self.dup_buffer_load_factor = dup_buffer_load_factor
        self.throttler = throttler
        self.clock = clock
        self.check_done = check_done
        self._read_buffer_size = self.io_buffer_size
        self._prefix = f"Cleaner {id}: "
        #: each log's walk of its transaction markers, continued at the next clean of the log
        self._transaction_states: weakref.WeakKeyDictionary[Log, TransactionState] = weakref.WeakKeyDictionary()
        #: called once per batch in the inner loops, so that appends are not starved of the GIL
        self.gil_yield = GilYield()

    def _info(self, msg: str, *args) -> None:
        logger.info(self._prefix + msg, *args)

    # -- entry point ------------------------------------------------------------------------

    def clean(self, cleanable: LogToClean) -> CleanerStats:
        """Clean the log; the stats carry the first offset not cleaned (``end_offset``)."""
        return self.do_clean(cleanable, self.clock.milliseconds())

    def do_clean(self, cleanable: LogToClean, current_time_ms: int) -> CleanerStats:
        """Clean at ``current_time_ms``: the time compared with, and used to set, delete horizons."""
        log = cleanable.log
        self._info("Beginning cleaning of log %s", log.name)
        # Kafka's horizon for batches older than magic 2 (none here): logged as Kafka logs it.
        clean_section = log_segments(log, 0, cleanable.first_dirty_offset)
        delete_horizon_ms = (clean_section[-1].last_modified - log.config.delete_retention_ms
                             if clean_section else 0)
        stats = CleanerStats(topic_partition=cleanable.topic_partition,
                             first_dirty_offset=cleanable.first_dirty_offset)

        self._info("Building offset map for %s...", log.name)
        upper_bound_offset = cleanable.first_uncleanable_offset
        aborted = self.aborted_transactions(log)
        self.build_offset_map(log, cleanable.first_dirty_offset, upper_bound_offset, self.offset_map, stats,
                              aborted)
        # An empty dirty section maps nothing (latest offset -1): never move the checkpoint back.
        end_offset = max(self.offset_map.latest_offset + 1, cleanable.first_dirty_offset)
        stats.index_done()

        cleanable_section = log_segments(log, 0, cleanable.first_uncleanable_offset)
        cleanable_horizon_ms = cleanable_section[-1].last_modified if cleanable_section else 0
        self._info("Cleaning log %s (cleaning prior to %s, discarding tombstones prior to upper bound "
                   "deletion horizon %s)...", log.name, _date(cleanable_horizon_ms), _date(delete_horizon_ms))
        groups = self.group_segments_by_size(log_segments(log, 0, end_offset), log.config.segment_bytes,
                                             log.config.segment_index_bytes,
                                             cleanable.first_uncleanable_offset)
        transactions = CleanedTransactions()    # carried from group to group, as Kafka does
        for group in groups:
            self.clean_segments(log, group, self.offset_map, stats, delete_horizon_ms, current_time_ms,
                                transactions, aborted)
            stats.groups += 1
            stats.segments_cleaned += len(group)
        stats.buffer_utilization = self.offset_map.utilization
        stats.end_offset = end_offset
        stats.all_done()
        return stats

    def aborted_transactions(self, log: Log) -> AbortedTransactions:
        """The aborted transactions of ``log`` as of now (Kafka's ``collectAbortedTransactions``)."""
        state = self._transaction_states.get(log)
        if state is None:
            state = self._transaction_states[log] = TransactionState(log)
        return AbortedTransactions(state.aborted_transactions())

    # -- phase 1: the offset map ------------------------------------------------------------

    def build_offset_map(self, log: Log, start: int, end: int, offset_map: OffsetMap,
                         stats: CleanerStats, aborted: AbortedTransactions | None = None) -> None:
        """Map key -> latest offset for ``[start, end)``, stopping when the map reaches its capacity.

        On return ``offset_map.latest_offset + 1`` is where cleaning must stop:
        every record below it has been seen by the map.  The records of aborted
        transactions are left out, as Kafka leaves them out.
        """
        if aborted is None:
            aborted = self.aborted_transactions(log)
        offset_map.clear()
        dirty = log_segments(log, start, end)
        self._info("Building offset map for log %s for %d segments in offset range [%d, %d).",
                   log.name, len(dirty), start, end)
        next_starts = [s.base_offset for s in dirty[1:]] + [end]
        for index, (segment, next_start) in enumerate(zip(dirty, next_starts)):
            self.check_done(log.topic_partition)
            if self._build_offset_map_for_segment(log, segment, offset_map, start, next_start, stats, aborted):
                logger.debug("%sOffset map is full, %d segments fully mapped, segment with base offset %d "
                             "is partially mapped", self._prefix, index, segment.base_offset)
                break
        self._info("Offset map for log %s complete.", log.name)

    def _build_offset_map_for_segment(self, log: Log, segment: LogSegment, offset_map: OffsetMap,
                                      start: int, next_segment_start: int, stats: CleanerStats,
                                      aborted: AbortedTransactions) -> bool:
        """Add the keys of one segment; True if the map filled up before its end.

        Works a read chunk at a time: the keys and offsets of every batch in the
        chunk (no values, no Record objects) go into one :meth:`OffsetMap.put_many`.
        When the chunk cannot reach the map's load factor, only each key's last
        offset in the chunk is put, which leaves the map as putting every record
        would; otherwise the records are put one by one, batch by batch, so the
        map stops at exactly the record where Kafka's would.
        """
        tp = log.topic_partition
        max_desired_map_size = int(offset_map.slots * self.dup_buffer_load_factor)
        position = segment.offset_index.lookup(start)[1]
        end = segment.size
        pause = self.gil_yield
        try:
            while position < end:
                self.check_done(tp)
                chunk = segment.read_bytes(position, min(self._read_buffer_size, end - position))
                self.throttler.maybe_throttle(len(chunk))
                consumed = 0
                offsets: list[int] = []
                keys: list[bytes] = []
                # (number of keys up to the end of the batch, its last offset) per mapped batch
                batch_ends: list[tuple[int, int]] = []
                for pos, header in iter_batches(chunk):
                    consumed = pos + header.batch_length + LOG_OVERHEAD
                    last_offset = header.base_offset + header.last_offset_delta
                    if last_offset < start:
                        continue
                    if header.is_control:
                        stats.map_messages_read += 1
                    elif aborted.contains(header):
                        stats.map_messages_read += header.records_count     # never supersedes anything
                    else:
                        batch_offsets, batch_keys, _ = decode_key_columns(chunk, pos, header)
                        stats.map_messages_read += len(batch_offsets)
                        if header.base_offset < start or None in batch_keys:
                            pairs = [(o, k) for o, k in zip(batch_offsets, batch_keys)
                                     if k is not None and o >= start]
                            batch_offsets = [o for o, _ in pairs]
                            batch_keys = [k for _, k in pairs]
                        offsets += batch_offsets
                        keys += batch_keys
                    batch_ends.append((len(keys), last_offset))
                    pause()
                position += consumed
                stats.map_bytes_read += consumed
                if consumed == 0:
                    self._grow_buffers_or_fail(segment, position, chunk, log.config.max_message_bytes)
                elif batch_ends and not self._put_chunk(offset_map, keys, offsets, batch_ends,
                                                        max_desired_map_size):
                    return True
            # Offsets may have gaps (an earlier clean): the whole segment is covered.
            offset_map.update_latest_offset(next_segment_start - 1)
            return False
        finally:
            self._restore_buffers()

    @staticmethod
    def _put_chunk(offset_map: OffsetMap, keys: list[bytes], offsets: list[int],
                   batch_ends: list[tuple[int, int]], max_desired_map_size: int) -> bool:
        """Put one chunk's keys; False if the map reached ``max_desired_map_size`` first."""
        latest = dict(zip(keys, offsets))       # each key's last offset in the chunk
        if offset_map.size + len(latest) <= max_desired_map_size:
            # Even if every key is new, the map stays within the load factor.
            offset_map.put_many(list(latest), list(latest.values()))
            offset_map.update_latest_offset(batch_ends[-1][1])
            return True
        # Kafka stops at the load factor even for a key already in the map, so the
        # stopping record depends on the order of puts: put every record.
        done = 0
        for key_count, last_offset in batch_ends:
            if key_count > done:
                put = offset_map.put_many(keys[done:key_count], offsets[done:key_count],
                                          max_desired_map_size)
                if put < key_count - done:
                    return False
                done = key_count
            offset_map.update_latest_offset(last_offset)
        return True

    # -- phase 2: grouping -------------------------------------------------------------------

    @staticmethod
    def group_segments_by_size(segments: Sequence[LogSegment], max_size: int, max_index_size: int,
                               first_uncleanable_offset: int) -> list[list[LogSegment]]:
        """Consecutive runs of segments that fit into one segment (Kafka's ``groupSegmentsBySize``).

        A run's .log sizes sum to at most ``segment.bytes``, each of its index
        sizes to at most ``segment.index.bytes``, and its offsets stay within
        an int32 of the run's base (relative offsets in the index are 4 bytes).
        Cleaning many small segments into one keeps the segment count from
        growing with every round.
        """
        grouped: list[list[LogSegment]] = []
        segs = list(segments)
        i = 0
        while i < len(segs):
            group = [segs[i]]
            log_size = segs[i].size
            index_size = segs[i].offset_index.size_in_bytes
            time_index_size = segs[i].time_index.size_in_bytes
            i += 1
            while i < len(segs):
                nxt = segs[i]
                # The last offset of `nxt` is bounded by the next base offset (cheap), or by the
                # first uncleanable offset for the last segment.
                last_offset = segs[i + 1].base_offset - 1 if i + 1 < len(segs) else first_uncleanable_offset - 1
                if not (log_size + nxt.size <= max_size
                        and index_size + nxt.offset_index.size_in_bytes <= max_index_size
                        and time_index_size + nxt.time_index.size_in_bytes <= max_index_size
                        and (nxt.size == 0 or last_offset - group[-1].base_offset <= _INT32_MAX)):
                    break
                group.append(nxt)
                log_size += nxt.size
                index_size += nxt.offset_index.size_in_bytes
                time_index_size += nxt.time_index.size_in_bytes
                i += 1
            grouped.append(group)
        return grouped

    # -- phase 3: copying --------------------------------------------------------------------

    def clean_segments(self, log: Log, segments: Sequence[LogSegment], offset_map: OffsetMap,
                       stats: CleanerStats, delete_horizon_ms: int, current_time_ms: int | None = None,
                       transactions: CleanedTransactions | None = None,
                       aborted: AbortedTransactions | None = None) -> None:
        """Clean a group of segments into one ``.cleaned`` segment and swap it in.

        ``delete_horizon_ms`` is Kafka's legacy horizon (logged only);
        ``current_time_ms`` the clean's time, which KIP-534 horizons are
        compared with and set from.
        """
        if current_time_ms is None:
            current_time_ms = self.clock.milliseconds()
        if transactions is None:
            transactions = CleanedTransactions()
        base_offset = segments[0].base_offset
        _delete_cleaned_files(log.dir, base_offset)
        cleaned = LogSegment.open(log.dir, base_offset, log.config, log.clock, file_suffix=CLEANED_FILE_SUFFIX,
                                  topic_partition=log.topic_partition)
        try:
            for segment in segments:
                retain_deletes = segment.last_modified > delete_horizon_ms
                self._info("Cleaning %s in log %s into %d with an upper bound deletion horizon %d computed "
                           "from the segment last modified time of %d,%s deletes.", segment, log.name,
                           base_offset, delete_horizon_ms, segment.last_modified,
                           "retaining" if retain_deletes else "discarding")
                self.clean_into(log, segment, cleaned, offset_map, retain_deletes, stats,
                                current_time_ms=current_time_ms, transactions=transactions, aborted=aborted)
            cleaned.on_becoming_inactive_segment()
            cleaned.flush()         # on disk before it may replace anything
            # The replaced segments' age decides when tombstones in it pass the delete horizon.
            cleaned.set_last_modified(segments[-1].last_modified)
            self._info("Swapping in cleaned segment %s for segment(s) %s in log %s", cleaned,
                       list(segments), log.name)
            log.replace_segments([cleaned], list(segments))
        except BaseException:
            # Aborted (deletion, shutdown) or failed: nothing of this group was swapped in.
            try:
                cleaned.delete_if_exists()
                cleaned.close()
            except Exception as exc:     # the loader removes stray .cleaned files at the next start
                logger.warning("%sFailed to remove %s after an aborted clean: %s", self._prefix,
                               cleaned.log_path, exc)
            raise

    def clean_into(self, log: Log, source: LogSegment, dest: LogSegment, offset_map: OffsetMap,
                   retain_deletes: bool, stats: CleanerStats, *, current_time_ms: int | None = None,
                   transactions: CleanedTransactions | None = None,
                   aborted: AbortedTransactions | None = None) -> None:
        """Copy the records of ``source`` that must survive into ``dest``, batch by batch.

        ``retain_deletes`` is Kafka's legacy flag for batches older than magic
        2 and has no effect on v2 batches: a tombstone or marker is kept while
        its batch has no delete horizon or ``current_time_ms`` is before it,
        and the first clean that keeps one sets the horizon (KIP-534).

        Per read chunk: validate every batch, read the keys and offsets of those
        in the mapped range, look up their distinct keys in the map at once
        (:meth:`OffsetMap.get_many`), and decide retention record by record from
        those columns.  Only batches that lose a record or get a delete horizon
        are decoded and re-encoded; the others are copied byte for byte,
        undecoded.
        """
        tp = log.topic_partition
        latest_offset = offset_map.latest_offset
        now = self.clock.milliseconds() if current_time_ms is None else current_time_ms
        new_horizon = now + log.config.delete_retention_ms
        if transactions is None:
            transactions = CleanedTransactions()
        if aborted is None:
            aborted = self.aborted_transactions(log)
        pause = self.gil_yield
        position = 0
        end = source.size
        try:
            while position < end:
                self.check_done(tp)
                chunk = source.read_bytes(position, min(self._read_buffer_size, end - position))
                self.throttler.maybe_throttle(len(chunk))
                consumed = 0
                batches: list[tuple[int, BatchHeader]] = []
                for pos, header in iter_batches(chunk):
                    consumed = pos + header.batch_length + LOG_OVERHEAD
                    try:
                        validate_batch(chunk, pos)
                    except CorruptRecordError as exc:
                        raise exc.at(source.log_path, position + pos) from None
                    batches.append((pos, header))
                columns, latest_of = self._key_lookup(chunk, batches, offset_map, latest_offset)
                # One append per retained batch: LogSegment.append indexes the position it
                # writes at under the batch's last offset, which is what Kafka's index holds
                # (DumpLogSegments checks every entry against the batch found there).
                for pos, header in batches:
                    pause()
                    size = header.batch_length + LOG_OVERHEAD
                    if header.is_control:
                        stats.read_messages(header.records_count, size)
                        # A marker whose transaction has no record left may go once its horizon passed.
                        can_discard = transactions.on_control_batch(header)
                        horizon = header.delete_horizon_ms
                        if header.records_count == 0:
                            continue            # emptied by an earlier clean
                        if can_discard and horizon is not None and horizon <= now:
                            stats.deletes_expired += 1
                            continue
                        if can_discard and horizon is None:
                            kept = decode_batch(chunk, pos, header, include_control=True)
                            out = rebuild_batch(header, kept, delete_horizon_ms=new_horizon)
                            stats.horizons_set += 1
                        else:
                            out = chunk[pos:pos + size]
                        last_offset = header.last_offset
                        stats.recopy_messages(header.records_count, len(out))
                        max_ts, max_ts_offset = header.max_timestamp, header.last_offset
                    else:
                        transactions.on_data_batch(header)
                        if aborted.contains(header):
                            # An aborted transaction's records go at the first clean, as in Kafka.
                            stats.read_messages(header.records_count, size)
                            stats.aborted_records_removed += header.records_count
                            continue
                        horizon = header.delete_horizon_ms
                        # KIP-534: tombstones stay until the batch's horizon (none yet: until set).
                        batch_retains_deletes = horizon is None or now < horizon
                        batch_columns = columns.get(pos)
                        if batch_columns is None:       # beyond the mapped range: every record stays
                            batch_columns = decode_key_columns(chunk, pos, header)
                            stats.read_messages(len(batch_columns[0]), size)
                            retained = None
                            has_tombstone = bool(batch_columns[2])
                        else:
                            retained = _retained(*batch_columns, latest_of, latest_offset, batch_retains_deletes,
                                                 stats)
                            stats.read_messages(len(retained), size)
                            if not batch_retains_deletes:
                                stats.deletes_expired += _expired_tombstones(*batch_columns, retained, latest_of,
                                                                             latest_offset)
                            if True not in retained:
                                continue
                            has_tombstone = any(retained[i] for i in batch_columns[2])
                        set_horizon = has_tombstone and horizon is None
                        last_offset = header.last_offset        # rebuild_batch keeps the batch's offsets
                        if (retained is None or False not in retained) and not set_horizon:
                            # Nothing removed: the original bytes, not decoded (Kafka's writeOriginalBatch,
                            # whose time index entry names the batch's max timestamp and last offset).
                            out = chunk[pos:pos + size]
                            stats.recopy_messages(len(batch_columns[0]), len(out))
                            max_ts, max_ts_offset = header.max_timestamp, header.last_offset
                        else:
                            records = decode_batch(chunk, pos, header)
                            kept = records if retained is None else list(compress(records, retained))
                            if set_horizon:
                                horizon = new_horizon
                                stats.horizons_set += 1
                            out = rebuild_batch(header, kept, delete_horizon_ms=horizon)
                            stats.recopy_messages(len(kept), len(out))
                            max_ts, max_ts_offset = _max_timestamp(kept)
                    self._append(dest, out, last_offset, max_ts, max_ts_offset)
                position += consumed
                if consumed == 0:
                    self._grow_buffers_or_fail(source, position, chunk, log.config.max_message_bytes)
        finally:
            self._restore_buffers()

    def _key_lookup(self, chunk: bytes, batches: list[tuple[int, BatchHeader]], offset_map: OffsetMap,
                    latest_offset: int) -> tuple[dict[int, tuple], dict]:
        """Key columns of the chunk's mapped data batches (by position) and key -> offset in the map.

        A keyless record maps to an offset no record has, so that it is never
        retained (it is counted as invalid by :func:`_retained`).
        """
        columns: dict[int, tuple] = {}
        keys: list[bytes | None] = []
        pause = self.gil_yield
        for pos, header in batches:
            if header.base_offset <= latest_offset and not header.is_control:
                batch_columns = decode_key_columns(chunk, pos, header)
                columns[pos] = batch_columns
                keys += batch_columns[1]
                pause()
        distinct = dict.fromkeys(keys)
        distinct.pop(None, None)
        latest_of = dict(zip(distinct, offset_map.get_many(list(distinct))))
        latest_of[None] = _NEVER_RETAINED
        return columns, latest_of

    def _append(self, dest: LogSegment, data: bytes, largest_offset: int, max_timestamp: int,
                offset_of_max_timestamp: int) -> None:
        # `dest` is not in the log yet: nobody else sees it until replace_segments, so no lock.
        # Its view index (engine.views) is rebuilt by one scan on first use, as after a remount.
        dest.append(largest_offset, max_timestamp, offset_of_max_timestamp, data)
        self.throttler.maybe_throttle(len(data))

    # -- buffers -----------------------------------------------------------------------------

    def _grow_buffers_or_fail(self, segment: LogSegment, position: int, chunk: bytes,
                              max_log_message_size: int) -> None:
        """The next batch did not fit in the read buffer: grow it (Kafka's ``growBuffersOrFail``)."""
        bytes_left = segment.size - position
        where = f"log segment {segment.log_path} at position {position}"
        if len(chunk) >= bytes_left and len(chunk) < self._read_buffer_size:
            raise CorruptRecordError(f"Log segment may be corrupt, truncated batch at the end of {where}",
                                     path=segment.log_path, position=position)
        if self._read_buffer_size >= max_log_message_size:
            next_batch_size = read_header(chunk).size
            if next_batch_size <= self._read_buffer_size:
                raise CorruptRecordError(f"Batch size {next_batch_size} < buffer size "
                                         f"{self._read_buffer_size}, but not processed for {where}",
                                         path=segment.log_path, position=position)
            if next_batch_size > bytes_left:
                raise CorruptRecordError(f"Log segment may be corrupt, batch size {next_batch_size} > "
                                         f"{bytes_left} bytes left in segment for {where}",
                                         path=segment.log_path, position=position)
            max_size = next_batch_size
        else:
            max_size = max_log_message_size
        max_buffer_size = max(max_size, self.max_io_buffer_size)
        if self._read_buffer_size >= max_buffer_size:
            raise CorruptRecordError(f"This log contains a message larger than maximum allowable size of "
                                     f"{max_buffer_size}.", path=segment.log_path, position=position)
        new_size = min(self._read_buffer_size * 2, max_buffer_size)
        self._info("Growing cleaner I/O buffers from %d bytes to %d bytes.", self._read_buffer_size, new_size)
        self._read_buffer_size = new_size

    def _restore_buffers(self) -> None:
        self._read_buffer_size = self.io_buffer_size


class AbortedTransactions:
    """Which data batches belong to aborted transactions: per producer, sorted ranges first offset .. marker."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self, aborted: Iterable[AbortedTxn] = ()) -> None:
        ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in aborted:
            ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        self._firsts = {pid: [first for first, _ in sorted(r)] for pid, r in ranges.items()}
        self._lasts = {pid: [last for _, last in sorted(r)] for pid, r in ranges.items()}

    def contains(self, header: BatchHeader) -> bool:
        """True for a transactional data batch inside one of its producer's aborted transactions."""
        if not header.is_transactional or header.is_control:
            return False
        firsts = self._firsts.get(header.producer_id)
        if firsts is None:
            return False
        i = bisect.bisect_right(firsts, header.base_offset) - 1
        return i >= 0 and header.base_offset <= self._lasts[header.producer_id][i]


class CleanedTransactions:
    """Which transaction markers a clean may expire (Kafka's ``CleanedTransactionMetadata``, by producer).

    A marker (commit or abort) may be given a delete horizon, and later be
    removed, only if no data batch of its producer -- kept or, for an aborted
    transaction, dropped by this clean -- was read since that producer's
    previous marker in this clean: its transaction has no record left.
    """

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: set[int] = set()

    def on_data_batch(self, header: BatchHeader) -> None:
        if header.is_transactional:
            self._open.add(header.producer_id)

    def on_control_batch(self, header: BatchHeader) -> bool:
        """True if the marker's transaction has no record left in the log."""
        if header.producer_id in self._open:
            self._open.discard(header.producer_id)
            return False
        return True


#: the map offset given to keyless records in the copy pass: above every real offset
_NEVER_RETAINED = 1 << 63


def _retained(offsets: list[int], keys: list[bytes | None], tombstones: list[int], latest_of: dict,
              latest_offset: int, retain_deletes: bool, stats: CleanerStats) -> list[bool]:
    """Which records of one batch survive: the latest of their key, tombstones only if retained.

    A record above the map's latest offset was not seen by the map and stays;
    a keyless record within it is invalid in a compacted log and goes.
    """
    if not offsets:
        return []
    if offsets[-1] <= latest_offset:
        # The whole batch was mapped: one C-level comparison per record.
        retained = list(map(ge, offsets, map(latest_of.__getitem__, keys)))
        stats.invalid_messages_read += keys.count(None)
    else:
        retained = [offset > latest_offset or offset >= latest_of[key] for offset, key in zip(offsets, keys)]
        stats.invalid_messages_read += sum(1 for offset, key in zip(offsets, keys)
                                           if key is None and offset <= latest_offset)
    if tombstones and not retain_deletes:
        for index in tombstones:
            if offsets[index] <= latest_offset:
                retained[index] = False
    return retained


def _expired_tombstones(offsets: list[int], keys: list[bytes | None], tombstones: list[int], retained: list[bool],
                        latest_of: dict, latest_offset: int) -> int:
    """Tombstones of one batch that were the latest of their key and go only because of their horizon."""
    return sum(1 for i in tombstones
               if not retained[i] and offsets[i] <= latest_offset and offsets[i] >= latest_of[keys[i]])


def _max_timestamp(records: list[Record]) -> tuple[int, int]:
    """(max timestamp, offset of its first record) of retained records."""
    best_ts, best_offset = -1, records[0].offset
    for record in records:
        if record.timestamp > best_ts:
            best_ts, best_offset = record.timestamp, record.offset
    return best_ts, best_offset


def _delete_cleaned_files(dir: str, base_offset: int) -> None:
    """Remove a ``.cleaned`` left by an earlier failed clean of the same group (Kafka does the same)."""
    for path in (log_file_path(dir, base_offset, CLEANED_FILE_SUFFIX),
                 offset_index_file_path(dir, base_offset, CLEANED_FILE_SUFFIX),
                 time_index_file_path(dir, base_offset, CLEANED_FILE_SUFFIX)):
        try:
            os.unlink(path)
            logger.info("Deleted stale cleaned file %s.", path)
        except FileNotFoundError:
            pass


def _date(ms: int) -> str:
    """Kafka prints java.util.Date: 'Mon Nov 20 22:13:20 UTC 2023'."""
    return time.strftime("%a %b %d %H:%M:%S %Z %Y", time.localtime(ms / 1000.0))


# -- the cleaner of a whole broker ----------------------------------------------------------------

class LogCleaner:
    """``log.cleaner.threads`` workers' cleaners and offset maps, and the LogCleanerManager.

    Each call of :meth:`clean_once` borrows one idle worker (its Cleaner and
    its OffsetMap of ``log.cleaner.dedupe.buffer.size / threads`` bytes), so the
    mount can run one trio task per worker, each calling ``clean_once`` in a
    worker thread; when every worker is busy the call returns None at once.

    :meth:`shutdown` waits until every borrowed worker is back, as Kafka's
    ``LogCleaner.shutdown`` joins its threads: the LogManager closes the logs
    only after it returns, so no clean writes into a closed log.
    """

    def __init__(self, config: BrokerConfig, log_dirs: Sequence[str], logs: Callable[[], Iterable[Log]],
                 clock: Clock = SYSTEM_CLOCK, *, sleep: Callable[[float], None] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.manager = LogCleanerManager(log_dirs, logs, clock)
        # log.cleaner.threads=0 is valid in Kafka and means no cleaner workers at all.
        threads = int(config.log_cleaner_threads)
        #: set by shutdown(); a throttled worker sleeps on it so that shutdown wakes it at once
        self._shutting_down = threading.Event()
        throttle_sleep = sleep if sleep is not None else self._shutting_down.wait
        self.throttler = Throttler(float(config.log_cleaner_io_max_bytes_per_second), sleep=throttle_sleep)
        per_thread = int(config.log_cleaner_dedupe_buffer_size) // max(threads, 1)
        map_memory = min(per_thread, _INT32_MAX)
        if per_thread > _INT32_MAX:
            logger.warning("Cannot use more than 2G of cleaner buffer space per cleaner thread, ignoring "
                           "excess buffer space...")
        load_factor = float(config.log_cleaner_io_buffer_load_factor)
        io_buffer = int(config.log_cleaner_io_buffer_size) // max(threads, 1) // 2
        self.cleaners = [
            Cleaner(i, OffsetMap(map_memory, load_factor), io_buffer, int(config.message_max_bytes),
                    load_factor, self.throttler, clock, self._check_done)
            for i in range(threads)]
        self._idle = list(reversed(self.cleaners))
        self._lock = threading.Lock()
        #: notified whenever a worker is returned to the idle list (shutdown waits on it)
        self._worker_returned = threading.Condition(self._lock)
        self._running = True
        #: stats of the last clean, per worker id
        self.last_stats: dict[int, CleanerStats] = {}
        #: sums over every finished clean (under self._lock)
        self.totals = CleanerTotals()

    @classmethod
    def for_log_manager(cls, log_manager) -> LogCleaner:
        """The cleaner of a LogManager's logs, with its broker config and clock."""
        return cls(log_manager.config, log_manager.log_dirs, log_manager.all_logs, log_manager.clock)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    def shutdown(self, timeout: float | None = None) -> bool:
        """Abort every clean in progress and wait until its worker has stopped; True if all stopped.

        A clean notices the shutdown at its next read (one I/O buffer at most)
        and unwinds: its ``.cleaned`` segment is deleted and the old segments
        stay, or, if the swap had already begun, ``replace_segments`` finishes
        it.  Later ``clean_once`` calls do nothing.  Idempotent; must not be
        called from a cleaner worker itself.
        """
        with self._lock:
            first = self._running
            self._running = False
        if first:
            logger.info("Shutting down the log cleaner.")
        self._shutting_down.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._worker_returned:
            while len(self._idle) < len(self.cleaners):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    logger.warning("The log cleaner did not stop within %.1f s: %d worker(s) still cleaning",
                                   timeout, len(self.cleaners) - len(self._idle))
                    return False
                self._worker_returned.wait(remaining)
        if first:
            logger.info("Shutdown of the log cleaner completed.")
        return True

    def _check_done(self, tp: TopicPartition) -> None:
        if not self._running:
            raise LogCleaningAbortedError(f"The log cleaner is shutting down; cleaning of {tp} stopped")
        self.manager.check_cleaning_aborted(tp)

    # -- the unit of work --------------------------------------------------------------------

    def clean_once(self) -> CleanerStats | None:
        """Clean the filthiest log (if any is dirty enough), then apply retention to compacted logs.

        Returns the stats of the clean, or None when nothing was cleaned (no
        log dirty enough, every worker busy, or shut down): the caller then
        waits ``log.cleaner.backoff.ms`` before calling again.
        """
        with self._lock:
            # Checked under the lock that shutdown() waits on: a worker is either
            # borrowed before shutdown looks, or never after it.
            if not self._running or not self._idle:
                return None
            cleaner = self._idle.pop()
        try:
            stats = self._clean_filthiest_log(cleaner)
            self.manager.maintain_uncleanable_partitions()
            return stats
        finally:
            with self._worker_returned:
                self._idle.append(cleaner)
                self._worker_returned.notify_all()

    def _clean_filthiest_log(self, cleaner: Cleaner) -> CleanerStats | None:
        stats = None
        cleanable = self.manager.grab_filthiest_log()
        if cleanable is not None:
            try:
                stats = self._clean_log(cleaner, cleanable)
            except Exception as exc:
                logger.warning("Unexpected exception thrown when cleaning log %s. Marking its partition (%s) "
                               "as uncleanable", cleanable.log, cleanable.topic_partition, exc_info=exc)
                self.manager.mark_partition_uncleanable(os.path.dirname(os.path.abspath(cleanable.log.dir)),
                                                        cleanable.topic_partition)
        if self._running:
            self._delete_old_segments_of_compacted_logs()
        return stats

    def _clean_log(self, cleaner: Cleaner, cleanable: LogToClean) -> CleanerStats | None:
        tp = cleanable.topic_partition
        log = cleanable.log
        start_offset = end_offset = cleanable.first_dirty_offset
        stats = None
        try:
            stats = cleaner.clean(cleanable)
            end_offset = stats.end_offset
            with self._lock:
                self.last_stats[cleaner.id] = stats
                self.totals.add(stats)
            self._record_stats(cleaner.id, log.name, start_offset, end_offset, stats)
        except LogCleaningAbortedError:
            logger.info("Cleaner %d: Cleaning of log %s was aborted", cleaner.id, log.name)
            stats = None
        finally:
            last = None
            if stats is not None:
                last = LastCleaning(self.clock.milliseconds(), start_offset, end_offset, stats.bytes_read,
                                    stats.bytes_written, stats.messages_read, stats.messages_written,
                                    int(stats.elapsed_secs * 1000))
            self.manager.done_cleaning(tp, os.path.dirname(os.path.abspath(log.dir)), end_offset, last)
        return stats

    def _delete_old_segments_of_compacted_logs(self) -> None:
        deletable = self.manager.deletable_logs()
        try:
            for tp, log in deletable:
                try:
                    log.delete_old_segments()
                except Exception as exc:
                    logger.warning("Unexpected exception thrown when deleting old segments of log %s. Marking "
                                   "its partition (%s) as uncleanable", log, tp, exc_info=exc)
                    self.manager.mark_partition_uncleanable(os.path.dirname(os.path.abspath(log.dir)), tp)
        finally:
            self.manager.done_deleting(tp for tp, _ in deletable)

    @staticmethod
    def _record_stats(id: int, name: str, start: int, end: int, stats: CleanerStats) -> None:
        elapsed = stats.elapsed_secs
        index_secs = min(stats.elapsed_index_secs, elapsed)
        clean_secs = max(elapsed - index_secs, 1e-9)
        read_mb = _mb(stats.bytes_read)
        logger.info(
            "\n\tLog cleaner thread %d cleaned log %s (dirty section = [%d, %d])\n"
            "\t%.1f MB of log processed in %.1f seconds (%.1f MB/sec).\n"
            "\tIndexed %.1f MB in %.1f seconds (%.1f Mb/sec, %.1f%% of total time)\n"
            "\tBuffer utilization: %.1f%%\n"
            "\tCleaned %.1f MB in %.1f seconds (%.1f Mb/sec, %.1f%% of total time)\n"
            "\tStart size: %.1f MB (%d messages)\n"
            "\tEnd size: %.1f MB (%d messages)\n"
            "\t%.1f%% size reduction (%.1f%% fewer messages)\n",
            id, name, start, end,
            read_mb, elapsed, read_mb / elapsed,
            _mb(stats.map_bytes_read), index_secs, _mb(stats.map_bytes_read) / index_secs,
            100 * index_secs / elapsed,
            100 * stats.buffer_utilization,
            read_mb, clean_secs, read_mb / clean_secs, 100 * clean_secs / elapsed,
            read_mb, stats.messages_read,
            _mb(stats.bytes_written), stats.messages_written,
            100.0 * (1.0 - stats.bytes_written / stats.bytes_read) if stats.bytes_read else 0.0,
            100.0 * (1.0 - stats.messages_written / stats.messages_read) if stats.messages_read else 0.0)
        if stats.invalid_messages_read > 0:
            logger.warning("\tFound %d invalid messages during compaction.", stats.invalid_messages_read)

    # -- what the LogManager and the mount call ----------------------------------------------

    def abort_cleaning(self, tp: TopicPartition) -> None:
        """Stop a running clean of ``tp`` and wait for it (before the partition is deleted)."""
        self.manager.abort_cleaning(tp)

    def abort_and_pause_cleaning(self, tp: TopicPartition) -> None:
        self.manager.abort_and_pause_cleaning(tp)

    def resume_cleaning(self, partitions: Iterable[TopicPartition]) -> None:
        self.manager.resume_cleaning(partitions)

    def update_checkpoints(self, log_dir: str, partition_to_remove: TopicPartition | None = None) -> None:
        """Drop ``partition_to_remove`` (a deleted partition) from ``log_dir``'s cleaner checkpoint."""
        self.manager.update_checkpoints(log_dir, partition_to_remove=partition_to_remove)

    def maybe_truncate_checkpoint(self, log_dir: str, tp: TopicPartition, offset: int) -> None:
        self.manager.maybe_truncate_checkpoint(log_dir, tp, offset)

    def pause_cleaning_for_non_compacted_partitions(self):
        return self.manager.pause_cleaning_for_non_compacted_partitions()

    def cleaner_state(self, log: Log) -> dict:
        """The fields the mount's ``state`` file shows: cleaner position, dirty ratio, last cleaning."""
        return self.manager.cleaner_state(log)

    @property
    def max_dirty_percent(self) -> int:
        return int(100 * self.manager.dirtiest_log_cleanable_ratio)

    def _last_stats(self) -> list[CleanerStats]:
        with self._lock:     # workers replace entries while a scrape iterates
            return list(self.last_stats.values())

    @property
    def max_buffer_utilization_percent(self) -> int:
        return int(100 * max((s.buffer_utilization for s in self._last_stats()), default=0.0))

    @property
    def max_clean_time_secs(self) -> int:
        return int(max((s.elapsed_secs for s in self._last_stats()), default=0.0))

    @property
    def time_since_last_run_ms(self) -> int:
        return max(self.clock.milliseconds() - self.manager.time_of_last_run_ms, 0)

    def metrics(self) -> dict:
        """Kafka's ``kafka.log:type=LogCleaner`` gauges, the sums over all cleans, and each worker's last run.

        One consistent snapshot for ``.logfs/stats.json`` and ``.logfs/metrics``.
        """
        with self._lock:
            totals = CleanerTotals(**vars(self.totals))
            last = dict(self.last_stats)
            busy = len(self.cleaners) - len(self._idle)
        return {
            "threads": len(self.cleaners),
            "busy_threads": busy,
            "running": self._running,
            "max_dirty_percent": self.max_dirty_percent,
            "max_buffer_utilization_percent": int(100 * max((s.buffer_utilization for s in last.values()),
                                                            default=0.0)),
            "max_clean_time_secs": int(max((s.elapsed_secs for s in last.values()), default=0.0)),
            "time_since_last_run_ms": self.time_since_last_run_ms,
            "uncleanable_partitions": sum(len(self.manager.uncleanable_partitions(d))
                                          for d in self.manager.log_dirs),
            "totals": {**vars(totals), "elapsed_secs": round(totals.elapsed_secs, 6),
                       "records_dropped": totals.records_dropped},
            "last_run": {str(worker): _run_dict(s) for worker, s in sorted(last.items())},
        }


def _run_dict(stats: CleanerStats) -> dict:
    """One clean's figures in the units an operator reads (bytes, records, seconds, MB/s)."""
    tp = stats.topic_partition
    return {
        "topic_partition": None if tp is None else str(tp),
        "first_dirty_offset": stats.first_dirty_offset,
        "end_offset": stats.end_offset,
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "records_read": stats.messages_read,
        "records_written": stats.messages_written,
        "records_dropped": stats.messages_dropped,
        "segments_cleaned": stats.segments_cleaned,
        "horizons_set": stats.horizons_set,
        "deletes_expired": stats.deletes_expired,
        "aborted_records_removed": stats.aborted_records_removed,
        "duration_secs": round(stats.elapsed_secs, 6),
        "mb_per_sec": round(_mb(stats.bytes_read) / stats.elapsed_secs, 3),
        "buffer_utilization": round(stats.buffer_utilization, 6),
    }
