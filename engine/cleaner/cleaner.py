"""Cleaning one log (Kafka's ``Cleaner``): map the dirty section, group segments, copy through the record filter.

See the package docstring (engine.cleaner) for the rules of a clean.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
import weakref
from itertools import compress
from operator import ge
from typing import TYPE_CHECKING, cast

import numpy as np

from engine.cleaner.cleaner_manager import LogToClean, log_segments
from engine.cleaner.stats import CleanerStats
from engine.cleaner.throttler import GilYield, Throttler
from engine.clock import SYSTEM_CLOCK, Clock
from engine.errors import CorruptRecordError, LogfsError
from engine.files import CLEANED_FILE_SUFFIX, log_file_path, offset_index_file_path, time_index_file_path
from engine.records import LOG_OVERHEAD, BatchHeader, Record, compiled, decode_batch, decode_key_columns, rebuild_batch
from engine.records.format import COMPRESSION_CODEC_MASK, CONTROL_FLAG_MASK, TRANSACTIONAL_FLAG_MASK
from engine.records.reader import BatchChunk, read_chunks
from engine.segment import LogSegment
from engine.transactions import AbortedTxn, TransactionState

if TYPE_CHECKING:   # pragma: no cover
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from engine.cleaner.offset_map import OffsetMap
    from engine.log import Log
    from engine.topic import TopicPartition

logger = logging.getLogger("engine.cleaner")     # one logger for the package: what operators filter on

_INT32_MAX = 0x7FFFFFFF

#: (offsets, keys, indexes of null values) of one data batch: records.decode_key_columns
KeyColumns = tuple[list[int], list[bytes | None], list[int]]


class LogCleaningError(LogfsError):
    """An unexpected failure while cleaning one log; the partition is marked uncleanable."""


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
        #: what the last build_offset_map saw, so that the copy pass need not read keys again
        self._mapped: MappedRange | None = None

    def _info(self, msg: str, *args: object) -> None:
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
        groups = self.group_segments_by_size(log_segments(log, 0, end_offset), log.config.segment_size,
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
        self._mapped = None
        special: set[int] = set()
        dirty = log_segments(log, start, end)
        self._info("Building offset map for log %s for %d segments in offset range [%d, %d).",
                   log.name, len(dirty), start, end)
        next_starts = [s.base_offset for s in dirty[1:]] + [end]
        for index, (segment, next_start) in enumerate(zip(dirty, next_starts)):
            self.check_done(log.topic_partition)
            if self._build_offset_map_for_segment(log, segment, offset_map, start, next_start, stats, aborted,
                                                  special):
                logger.debug("%sOffset map is full, %d segments fully mapped, segment with base offset %d "
                             "is partially mapped", self._prefix, index, segment.base_offset)
                break
        self._mapped = MappedRange(offset_map, start, special)
        self._info("Offset map for log %s complete.", log.name)

    def _build_offset_map_for_segment(self, log: Log, segment: LogSegment, offset_map: OffsetMap,
                                      start: int, next_segment_start: int, stats: CleanerStats,
                                      aborted: AbortedTransactions, special: set[int] | None = None) -> bool:
        """Add the keys of one segment; True if the map filled up before its end.

        Works a read chunk at a time: the keys and offsets of every batch in the
        chunk (no values, no Record objects) go into one :meth:`OffsetMap.put_many`.
        When the chunk cannot reach the map's load factor, only each key's last
        offset in the chunk is put, which leaves the map as putting every record
        would; otherwise the records are put one by one, batch by batch, so the
        map stops at exactly the record where Kafka's would.  The base offsets
        of mapped batches that the copy pass cannot judge by offsets alone (a
        tombstone, a keyless record, offsets other than ``base_offset ..`` in
        order) go into ``special``.
        """
        tp = log.topic_partition
        max_desired_map_size = int(offset_map.slots * self.dup_buffer_load_factor)
        position = segment.offset_index.lookup(start)[1]
        end = segment.size
        pause = self.gil_yield
        try:
            for batch_chunk in self._chunks(log, segment, position, end, tp, verify_crc=False):
                chunk = batch_chunk.buf
                stats.map_bytes_read += batch_chunk.end - batch_chunk.position
                mapped = _map_chunk_compiled(batch_chunk, start, aborted, special)
                if mapped is not None:
                    digests, key_offsets, batch_ends, records = mapped
                    stats.map_messages_read += records
                    pause()
                    if batch_ends and not self._put_chunk_digests(offset_map, digests, key_offsets, batch_ends,
                                                                  max_desired_map_size):
                        return True
                    continue
                offsets = []
                keys = []
                # (number of keys up to the end of the batch, its last offset) per mapped batch
                batch_ends = []
                for pos, header in batch_chunk.batches:
                    last_offset = header.base_offset + header.last_offset_delta
                    if last_offset < start:
                        continue
                    if header.is_control:
                        stats.map_messages_read += 1
                    elif aborted.contains(header):
                        stats.map_messages_read += header.records_count     # never supersedes anything
                    else:
                        batch_offsets, batch_keys, tombstones = decode_key_columns(chunk, pos, header)
                        stats.map_messages_read += len(batch_offsets)
                        keyless = None in batch_keys
                        base = header.base_offset
                        if (special is not None and base >= start
                                and (tombstones or keyless
                                     or batch_offsets != [*range(base, base + header.records_count)])):
                            special.add(base)
                        if base < start or keyless:
                            pairs = [(o, k) for o, k in zip(batch_offsets, batch_keys)
                                     if k is not None and o >= start]
                            batch_offsets = [o for o, _ in pairs]
                            batch_keys = [k for _, k in pairs]
                        offsets += batch_offsets
                        keys += cast("list[bytes]", batch_keys)     # keyless records were left out above
                    batch_ends.append((len(keys), last_offset))
                    pause()
                if batch_ends and not self._put_chunk(offset_map, keys, offsets, batch_ends,
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
        if offset_map.size + len(latest) < max_desired_map_size:
            # Even if every key is new, the map stays below the load factor. (Reaching it exactly
            # is not enough: Kafka stops at the next record after that, even a known key's.)
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

    @staticmethod
    def _put_chunk_digests(offset_map: OffsetMap, digests: np.ndarray, offsets: np.ndarray,
                           batch_ends: list[tuple[int, int]], max_desired_map_size: int) -> bool:
        """:meth:`_put_chunk` of keys given by their digests, put one by one in compiled code: the map
        stops at exactly the record :meth:`_put_chunk` stops at, with the same latest offset."""
        done = offset_map.put_digests(digests, offsets, max_desired_map_size)
        if done == len(offsets):
            offset_map.update_latest_offset(batch_ends[-1][1])
            return True
        # Stopped inside the batch holding key ``done``: the batches before it were wholly put.
        whole = bisect.bisect_right([key_count for key_count, _ in batch_ends], done)
        if whole and done == batch_ends[whole - 1][0]:
            offset_map.update_latest_offset(batch_ends[whole - 1][1])    # nothing of the next batch went in
        return False

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

        Per read chunk: validate every batch; a batch the map pass read whole
        with no tombstone and no keyless record is judged by its offsets alone
        (:meth:`_offset_retention`: its keys were decoded once, by the map pass);
        for the other batches in the mapped range read the keys and offsets, look
        up their distinct keys in the map at once (:meth:`OffsetMap.get_many`),
        and decide retention record by record from those columns.  Only batches
        that lose a record or get a delete horizon are decoded and re-encoded;
        the others are copied byte for byte, undecoded.
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
        try:
            for batch_chunk in self._chunks(log, source, 0, source.size, tp, verify_crc=True):
                chunk = batch_chunk.buf
                batches = batch_chunk.batches
                by_offset = self._offset_retention(batches, offset_map, aborted)
                if len(by_offset) == len(batches):
                    # Every batch of the chunk is decided by offsets: only those keeping a record are visited.
                    self._copy_decided_by_offsets(chunk, batches, by_offset, dest, stats, transactions)
                    continue
                columns, latest_of = self._key_lookup(chunk, batches, offset_map, latest_offset, by_offset)
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
                        fast = by_offset.get(pos)
                        if fast is not None:
                            # Mapped, no tombstone, no keyless record: a record stays exactly when
                            # its offset is the latest of its key, i.e. one of the map's offsets.
                            kept_count, first, hits = fast
                            count = header.records_count
                            stats.read_messages(count, size)
                            if not kept_count:
                                continue
                            self._copy_kept(dest, chunk, pos, header, kept_count, hits[first:first + count], stats)
                            continue
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
        finally:
            self._restore_buffers()

    def _copy_decided_by_offsets(self, chunk: bytes, batches: list[tuple[int, BatchHeader]],
                                 by_offset: dict[int, tuple[int, int, np.ndarray]], dest: LogSegment,
                                 stats: CleanerStats, transactions: CleanedTransactions) -> None:
        """``clean_into`` of a chunk whose every batch :meth:`_offset_retention` decided: no control batch,
        no aborted one, no tombstone, no keyless record.

        The same outcome as the per-batch loop, without its per-batch Python
        for the batches that lose every record (most of them, in a log with far
        more records than keys): they are counted in bulk and skipped.
        """
        pause = self.gil_yield
        read_count = 0
        for pos, header in batches:
            if header.attributes & TRANSACTIONAL_FLAG_MASK:
                transactions.on_data_batch(header)
            kept_count, first, hits = by_offset[pos]
            count = header.records_count
            read_count += count
            if not kept_count:
                continue
            pause()
            self._copy_kept(dest, chunk, pos, header, kept_count, hits[first:first + count], stats)
        last_pos, last_header = batches[-1]
        stats.read_messages(read_count, last_pos + last_header.batch_length + LOG_OVERHEAD - batches[0][0])
        pause()

    def _copy_kept(self, dest: LogSegment, chunk: bytes, pos: int, header: BatchHeader, kept_count: int,
                   mask: np.ndarray, stats: CleanerStats) -> None:
        """Copy a batch decided by offsets that keeps ``kept_count`` of its records (``mask``) into ``dest``:
        its original bytes when it keeps them all (Kafka's writeOriginalBatch), else rebuilt from them."""
        count = header.records_count
        if kept_count == count:
            out = chunk[pos:pos + header.batch_length + LOG_OVERHEAD]
            stats.recopy_messages(count, len(out))
            max_ts, max_ts_offset = header.max_timestamp, header.last_offset
        else:
            kept = list(compress(decode_batch(chunk, pos, header), mask.tolist()))
            out = rebuild_batch(header, kept, delete_horizon_ms=header.delete_horizon_ms)
            stats.recopy_messages(len(kept), len(out))
            max_ts, max_ts_offset = _max_timestamp(kept)
        self._append(dest, out, header.last_offset, max_ts, max_ts_offset)

    def _offset_retention(self, batches: list[tuple[int, BatchHeader]], offset_map: OffsetMap,
                          aborted: AbortedTransactions) -> dict[int, tuple[int, int, np.ndarray]]:
        """Retention of the chunk's batches that offsets alone decide: position -> (records kept, index of
        the batch's first record in the mask, the chunk's mask of kept records).

        A batch fully inside the range the last :meth:`build_offset_map` mapped,
        whose records it read as ``base_offset ..`` in order with a key and a
        value each, keeps exactly the records whose offset is in the map (the
        map holds the latest offset of every key).  All such batches of a chunk
        are looked up in one sorted search over the map's offsets; their keys
        are neither decoded nor hashed again.
        """
        mapped = self._mapped
        if mapped is None or not mapped.covers(offset_map):
            return {}
        start, special, latest = mapped.start, mapped.special, mapped.latest_offset
        # the header's fields, not its properties: this runs once per batch of the log
        chosen = [(pos, header) for pos, header in batches
                  if not header.attributes & CONTROL_FLAG_MASK and header.records_count
                  and header.base_offset >= start and header.base_offset + header.last_offset_delta <= latest
                  and header.records_count == header.last_offset_delta + 1
                  and header.base_offset not in special]
        if aborted:
            chosen = [(pos, header) for pos, header in chosen if not aborted.contains(header)]
        if not chosen:
            return {}
        bases = np.array([header.base_offset for _, header in chosen], dtype=np.int64)
        counts = np.array([header.records_count for _, header in chosen], dtype=np.int64)
        ends = np.cumsum(counts)
        firsts = ends - counts
        offsets = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(bases - firsts, counts)
        offsets_in_map = mapped.offsets()
        if len(offsets_in_map):
            found = np.searchsorted(offsets_in_map, offsets)
            found[found == len(offsets_in_map)] = 0
            hits = offsets_in_map[found] == offsets
        else:
            hits = np.zeros(len(offsets), dtype=bool)
        kept = np.add.reduceat(hits.astype(np.int64), firsts).tolist()
        # the batch's mask is hits[first:first + records_count], sliced only for a batch that is rebuilt
        return {pos: (kept_count, first, hits) for (pos, _), kept_count, first in zip(chosen, kept, firsts.tolist())}

    def _key_lookup(self, chunk: bytes, batches: list[tuple[int, BatchHeader]], offset_map: OffsetMap,
                    latest_offset: int, skip: Mapping[int, object] | None = None
                    ) -> tuple[dict[int, KeyColumns], dict[bytes | None, int]]:
        """Key columns of the chunk's mapped data batches (by position) and key -> offset in the map.

        Batches in ``skip`` (decided by offsets, :meth:`_offset_retention`) are left out.

        A keyless record maps to an offset no record has, so that it is never
        retained (it is counted as invalid by :func:`_retained`).
        """
        columns: dict[int, KeyColumns] = {}
        keys: list[bytes | None] = []
        pause = self.gil_yield
        for pos, header in batches:
            if header.base_offset <= latest_offset and not header.is_control and (skip is None or pos not in skip):
                batch_columns = decode_key_columns(chunk, pos, header)
                columns[pos] = batch_columns
                keys += batch_columns[1]
                pause()
        distinct = dict.fromkeys(keys)
        distinct.pop(None, None)
        # cast: the None key was popped just above
        latest_of = dict(zip(distinct, offset_map.get_many(cast("list[bytes]", list(distinct)))))
        latest_of[None] = _NEVER_RETAINED
        return columns, latest_of

    def _append(self, dest: LogSegment, data: bytes, largest_offset: int, max_timestamp: int,
                offset_of_max_timestamp: int) -> None:
        # `dest` is not in the log yet: nobody else sees it until replace_segments, so no lock.
        # Its view index (engine.views) is rebuilt by one scan on first use, as after a remount.
        dest.append(largest_offset, max_timestamp, offset_of_max_timestamp, data)
        self.throttler.maybe_throttle(len(data))

    # -- buffers -----------------------------------------------------------------------------

    def _chunks(self, log: Log, segment: LogSegment, start: int, end: int, tp: TopicPartition, *,
                verify_crc: bool) -> Iterator[BatchChunk]:
        """The shared chunked reader over ``segment`` (engine.records.reader), throttled and abortable.

        Between chunks the clean may be aborted (``check_done``) and the I/O is
        throttled; a batch larger than the read buffer grows it as Kafka's
        ``growBuffersOrFail`` does.
        """
        max_message_bytes = log.config.max_message_bytes

        def grow(chunk_size: int, batch_size: int, position: int) -> int:
            return self._grow_buffers_or_fail(segment, position, batch_size, max_message_bytes)

        position = start
        while position < end:
            self.check_done(tp)
            chunks = read_chunks(segment.read_bytes, position, end, self._read_buffer_size, path=segment.log_path,
                                 verify_crc=verify_crc, grow=grow)
            batch_chunk = next(chunks, None)
            if batch_chunk is None:
                return
            self.throttler.maybe_throttle(len(batch_chunk.buf))
            yield batch_chunk
            position = batch_chunk.end

    def _grow_buffers_or_fail(self, segment: LogSegment, position: int, next_batch_size: int,
                              max_log_message_size: int) -> int:
        """The next batch did not fit in the read buffer: grow it (Kafka's ``growBuffersOrFail``)."""
        bytes_left = segment.size - position
        where = f"log segment {segment.log_path} at position {position}"
        if self._read_buffer_size >= max_log_message_size:
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
        new_size = self._read_buffer_size
        while new_size < next_batch_size and new_size < max_buffer_size:
            new_size = min(new_size * 2, max_buffer_size)
        if new_size < next_batch_size:
            raise CorruptRecordError(f"This log contains a message larger than maximum allowable size of "
                                     f"{max_buffer_size}.", path=segment.log_path, position=position)
        self._info("Growing cleaner I/O buffers from %d bytes to %d bytes.", self._read_buffer_size, new_size)
        self._read_buffer_size = new_size
        return new_size

    def _restore_buffers(self) -> None:
        self._read_buffer_size = self.io_buffer_size


class MappedRange:
    """What one :meth:`Cleaner.build_offset_map` saw: where it started, its special batches, its offsets."""

    __slots__ = ("offset_map", "start", "special", "latest_offset", "entries", "_offsets")

    def __init__(self, offset_map: OffsetMap, start: int, special: set[int]) -> None:
        self.offset_map = offset_map
        self.start = start
        self.special = special
        self.latest_offset = offset_map.latest_offset
        self.entries = offset_map.size
        self._offsets: np.ndarray | None = None

    def covers(self, offset_map: OffsetMap) -> bool:
        """True while ``offset_map`` is the map that was built and nothing was put into it since."""
        return (offset_map is self.offset_map and offset_map.latest_offset == self.latest_offset
                and offset_map.size == self.entries)

    def offsets(self) -> np.ndarray:
        """The map's offsets, sorted (read from the map once, at the first use)."""
        if self._offsets is None:
            self._offsets = self.offset_map.latest_offsets()
        return self._offsets


class AbortedTransactions:
    """Which data batches belong to aborted transactions: per producer, sorted ranges first offset .. marker."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self, aborted: Iterable[AbortedTxn] = ()) -> None:
        ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in aborted:
            ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        self._firsts = {pid: [first for first, _ in sorted(r)] for pid, r in ranges.items()}
        self._lasts = {pid: [last for _, last in sorted(r)] for pid, r in ranges.items()}

    def __bool__(self) -> bool:
        """Whether there is any aborted transaction (most logs have none)."""
        return bool(self._firsts)

    def contains(self, header: BatchHeader) -> bool:
        """True for a transactional data batch inside one of its producer's aborted transactions."""
        if not self._firsts:        # no aborted transaction at all: the common case, no header flag read
            return False
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


_NOT_PLAIN = COMPRESSION_CODEC_MASK | CONTROL_FLAG_MASK


def _map_chunk_compiled(batch_chunk: BatchChunk, start: int, aborted: AbortedTransactions,
                        special: set[int] | None) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], int] | None:
    """The map pass over one read chunk in one compiled walk (engine.records.kernels.key_columns) and one
    compiled hash of its keys (``key_digests``).

    Returns what the per-batch loop of ``_build_offset_map_for_segment``
    gathers (the keys' MD5 digests and offsets to put, keyless records left
    out; the batch ends; the records read) and adds to ``special`` the same batches, or None
    when the chunk has anything that loop treats apart (a compressed, control
    or aborted batch, one below ``start``, an empty one, a malformed record):
    the loop then does the chunk.  Measured on 1,000,000 records in batches
    of 10 (``bench_cleaner.py engine``): the map pass's record walk went from
    3.1 s in Python (``decode_key_columns`` per batch) to 0.1 s.
    """
    kernels = compiled.KERNELS
    if kernels is None:         # the C extension is not built: the batch loop
        return None
    batches = batch_chunk.batches
    if not batches or batches[0][1].base_offset < start:
        return None
    # comprehensions, not a loop with appends: this runs once per batch of the log (0.14 s -> 0.05 s
    # of the 1M-record case)
    if any(header.attributes & _NOT_PLAIN or not header.records_count for _, header in batches):
        return None
    if aborted and any(aborted.contains(header) for _, header in batches):
        return None
    table = np.array([(pos, header.base_offset, header.batch_length, header.records_count, header.last_offset_delta)
                      for pos, header in batches], dtype=np.int64)
    counts = table[:, 3]
    records = int(counts.sum())
    columns = kernels.key_columns(batch_chunk.buf, table, records)
    if columns is None:
        return None
    firsts = np.cumsum(counts) - counts           # index of each batch's first record
    keyed = columns.key_lengths >= 0
    if special is not None:
        # a batch the copy pass cannot judge by offsets alone: a tombstone, a keyless record, offsets
        # other than base .. base + count - 1
        expected = np.repeat(table[:, 1] - firsts, counts) + np.arange(records)
        odd = columns.null_values | ~keyed | (columns.offsets != expected)
        special.update(table[np.add.reduceat(odd, firsts) > 0, 1].tolist())
    digests = kernels.key_digests(batch_chunk.buf, columns.key_starts[keyed], columns.key_lengths[keyed])
    ends = np.cumsum(keyed)[firsts + counts - 1]
    batch_ends = list(zip(ends.tolist(), (table[:, 1] + table[:, 4]).tolist()))
    return digests, columns.offsets[keyed], batch_ends, records


def _retained(offsets: list[int], keys: list[bytes | None], tombstones: list[int],
              latest_of: Mapping[bytes | None, int], latest_offset: int, retain_deletes: bool,
              stats: CleanerStats) -> list[bool]:
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
                        latest_of: Mapping[bytes | None, int], latest_offset: int) -> int:
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
