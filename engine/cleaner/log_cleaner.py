"""The cleaner of a whole broker (Kafka's ``LogCleaner``): workers, their offset maps, scheduling, metrics."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from engine.cleaner.cleaner import _INT32_MAX, Cleaner
from engine.cleaner.cleaner_manager import LastCleaning, LogCleanerManager, LogCleaningAbortedError, LogToClean
from engine.cleaner.offset_map import OffsetMap
from engine.cleaner.stats import CleanerStats, CleanerTotals, mb, run_dict
from engine.cleaner.throttler import Throttler
from engine.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:   # pragma: no cover
    from collections.abc import Callable, Iterable, Sequence

    from engine.config import BrokerConfig
    from engine.log import Log
    from engine.topic import TopicPartition

logger = logging.getLogger("engine.cleaner")     # one logger for the package: what operators filter on


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

    Built from its parts, as Kafka's (``config, logDirs, logs, time``): the
    broker config, the log dirs, a callable returning the live logs (the
    LogManager passes its ``all_logs``), and the clock.  It knows nothing of
    the LogManager, which owns it.
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
            # The map's touched pages go back to the system until the next clean (clear() drops them,
            # MADV_DONTNEED): an idle mount does not keep up to log.cleaner.dedupe.buffer.size resident
            # (10,000 keys touched 35 MB of the default 128 MiB map).
            cleaner.offset_map.clear()
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
        read_mb = mb(stats.bytes_read)
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
            mb(stats.map_bytes_read), index_secs, mb(stats.map_bytes_read) / index_secs,
            100 * index_secs / elapsed,
            100 * stats.buffer_utilization,
            read_mb, clean_secs, read_mb / clean_secs, 100 * clean_secs / elapsed,
            read_mb, stats.messages_read,
            mb(stats.bytes_written), stats.messages_written,
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

    def pause_cleaning_for_non_compacted_partitions(self) -> list[tuple[TopicPartition, Log]]:
        return self.manager.pause_cleaning_for_non_compacted_partitions()

    def cleaner_state(self, log: Log) -> dict[str, object]:
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

    def metrics(self) -> dict[str, Any]:     # a JSON document (.logfs/stats.json), read member by member
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
            "last_run": {str(worker): run_dict(s) for worker, s in sorted(last.items())},
        }
