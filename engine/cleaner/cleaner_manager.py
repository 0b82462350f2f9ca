"""Which log the cleaner works on next, and where each log's cleaning got to (Kafka's ``LogCleanerManager``).

Every log directory holds a ``cleaner-offset-checkpoint``: for each compacted
partition, the *first dirty offset*, below which the log has been cleaned at
least once (the "clean" section, or tail) and from which on it has not (the
"dirty" section, or head).  Each round the manager computes, for every compacted
log, the range of offsets that may be cleaned now, ``[first dirty offset, first
uncleanable offset)``, and its *dirty ratio*: cleanable bytes over clean plus
cleanable bytes.  The log with the largest ratio above its
``min.cleanable.dirty.ratio`` is the *filthiest*; it is handed to one cleaner
worker and marked in progress so that no other worker (and no retention pass)
touches it until ``done_cleaning`` writes the new checkpoint.

The cleaning state machine is Kafka's: a partition is absent (idle),
in progress, aborted (a deletion asked the worker to stop; the worker notices
between reads and unwinds), or paused ``n`` times (nothing may clean it).
``abort_cleaning`` blocks until a running clean has stopped, which is what topic
deletion needs before it renames the partition's directory.

The active segment is never cleaned, so appends never wait for the cleaner.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from engine.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from engine.clock import SYSTEM_CLOCK, Clock
from engine.errors import LogfsError

if TYPE_CHECKING:   # pragma: no cover - imported for annotations only
    from collections.abc import Callable, Iterable, Sequence

    from engine.log import Log
    from engine.segment import LogSegment
    from engine.topic import TopicPartition

logger = logging.getLogger(__name__)


class LogCleaningAbortedError(LogfsError):
    """Kafka's LogCleaningAbortedException: the cleaning of a partition was aborted (deletion, shutdown)."""


class LogCleaningStateError(LogfsError):
    """A cleaning state transition that Kafka's state machine does not allow."""


# -- cleaning states (Kafka's LogCleaningState) ---------------------------------------------

class _InProgress:
    def __repr__(self) -> str:
        return "LogCleaningInProgress"


class _Aborted:
    def __repr__(self) -> str:
        return "LogCleaningAborted"


LOG_CLEANING_IN_PROGRESS = _InProgress()
LOG_CLEANING_ABORTED = _Aborted()


@dataclass(frozen=True)
class LogCleaningPaused:
    """Paused ``paused_count`` times; each ``resume_cleaning`` undoes one pause."""

    paused_count: int


# -- segment ranges (Kafka's LocalLog.logSegments / nonActiveLogSegmentsFrom) ---------------

def log_segments(log: Log, from_offset: int, to_offset: int) -> list[LogSegment]:
    """The segments that may hold offsets in ``[from_offset, to_offset)``, in offset order.

    As Kafka's ``logSegments(from, to)``: the segment whose base offset is the
    floor of ``from_offset`` (or the first) up to, not including, the first
    segment starting at or after ``to_offset``.  One snapshot of the
    copy-on-write segment map is read, so no lock is needed.
    """
    if from_offset >= to_offset:
        return []
    segments = log.segments
    lo = max(segments.bisect_right(from_offset) - 1, 0)
    hi = segments.bisect_left(to_offset)
    values = segments.values()
    return [values[i] for i in range(lo, hi)]


def non_active_segments_from(log: Log, from_offset: int) -> list[LogSegment]:
    """Segments from the one holding ``from_offset`` up to, not including, the active segment."""
    segments = log.segments
    if not segments:
        return []
    active_base = segments.peekitem(-1)[0]
    if from_offset > active_base:
        return []
    return log_segments(log, from_offset, active_base)


# -- what to clean ---------------------------------------------------------------------------

class OffsetsToClean(NamedTuple):
    """The cleanable range of a log, and whether its checkpoint was invalid and must be reset."""

    first_dirty_offset: int
    first_uncleanable_dirty_offset: int
    force_update_checkpoint: bool = False


def cleanable_offsets(log: Log, last_clean_offset: int | None, now_ms: int) -> OffsetsToClean:
    """Kafka's ``LogCleanerManager.cleanableOffsets``.

    The first dirty offset is the checkpointed one, reset to the log start offset
    when it is missing, below the log start (retention or DeleteRecords removed
    the cleaned part) or beyond the log end (the tail was lost in a crash).  The
    first uncleanable offset is the lowest of the active segment's base offset
    and the base offset of the first dirty segment holding a record younger than
    ``min.compaction.lag.ms``; there are no transactions, so the last stable
    offset is the log end offset and never the lowest.
    """
    log_start = log.log_start_offset
    checkpoint_dirty_offset = log_start if last_clean_offset is None else last_clean_offset
    force_update = False
    if checkpoint_dirty_offset < log_start:
        if not (log.config.compact and log.config.delete):
            logger.warning("Resetting first dirty offset of %s to log start offset %d since the "
                           "checkpointed offset %d is invalid.", log.name, log_start, checkpoint_dirty_offset)
        first_dirty, force_update = log_start, True
    elif checkpoint_dirty_offset > log.log_end_offset:
        logger.warning("The last checkpoint dirty offset for partition %s is %d, which is larger than the "
                       "log end offset %d. Resetting to the log start offset %d.",
                       log.name, checkpoint_dirty_offset, log.log_end_offset, log_start)
        first_dirty, force_update = log_start, True
    else:
        first_dirty = checkpoint_dirty_offset

    segments = log.segments
    active_base = segments.peekitem(-1)[0]
    candidates = [log.log_end_offset, active_base]
    min_compaction_lag_ms = max(log.config.min_compaction_lag_ms, 0)
    if min_compaction_lag_ms > 0:
        horizon = now_ms - min_compaction_lag_ms
        for segment in non_active_segments_from(log, first_dirty):
            uncleanable = segment.largest_timestamp > horizon
            logger.debug("Checking if log segment may be cleaned: log='%s' segment.baseOffset=%d "
                         "segment.largestTimestamp=%d; now - compactionLag=%d; is uncleanable=%s",
                         log.name, segment.base_offset, segment.largest_timestamp, horizon, uncleanable)
            if uncleanable:
                candidates.append(segment.base_offset)
                break
    first_uncleanable = min(candidates)
    logger.debug("Finding range of cleanable offsets for log=%s. Last clean offset=%s now=%d => "
                 "firstDirtyOffset=%d firstUncleanableOffset=%d activeSegment.baseOffset=%d",
                 log.name, last_clean_offset, now_ms, first_dirty, first_uncleanable, active_base)
    return OffsetsToClean(first_dirty, max(first_dirty, first_uncleanable), force_update)


def calculate_cleanable_bytes(log: Log, first_dirty_offset: int, uncleanable_offset: int) -> tuple[int, int]:
    """(first uncleanable offset rounded to a segment boundary, cleanable bytes) - Kafka's helper.

    Cleaning works on whole segments, so the uncleanable offset is moved to the
    base offset of the segment holding it (or the active segment's).
    """
    non_active = non_active_segments_from(log, uncleanable_offset)
    first_uncleanable = non_active[0].base_offset if non_active else log.segments.peekitem(-1)[0]
    cleanable = sum(s.size for s in log_segments(log, min(first_dirty_offset, first_uncleanable),
                                                  first_uncleanable))
    return first_uncleanable, cleanable


@dataclass
class LogToClean:
    """A compacted log with its cleanable range and sizes (Kafka's ``LogToClean``)."""

    topic_partition: TopicPartition
    log: Log
    first_dirty_offset: int
    uncleanable_offset: int
    clean_bytes: int = field(init=False)
    first_uncleanable_offset: int = field(init=False)
    cleanable_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        # Kafka counts logSegments(-1, firstDirtyOffset): every segment that may hold clean records.
        self.clean_bytes = sum(s.size for s in log_segments(self.log, -1, self.first_dirty_offset))
        self.first_uncleanable_offset, self.cleanable_bytes = calculate_cleanable_bytes(
            self.log, self.first_dirty_offset, self.uncleanable_offset)

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        """The dirty ratio: cleanable bytes over clean plus cleanable bytes."""
        total = self.total_bytes
        return self.cleanable_bytes / total if total else 0.0


class LastCleaning(NamedTuple):
    """What the last finished clean of a log did (for the mount's ``state`` and stats)."""

    time_ms: int
    first_dirty_offset: int
    end_offset: int
    bytes_read: int
    bytes_written: int
    records_read: int
    records_written: int
    elapsed_ms: int


# -- the manager -----------------------------------------------------------------------------

class LogCleanerManager:
    """Chooses logs to clean, tracks cleaning state, and owns the ``cleaner-offset-checkpoint`` files.

    ``logs`` is called each time the set of logs is needed (it is a live view
    of the LogManager's logs, e.g. ``log_manager.all_logs``) so that topics
    created or deleted since the last round are seen.  Every method is
    thread-safe; one lock guards the state map and the checkpoint files, as in
    Kafka.
    """

    def __init__(self, log_dirs: Sequence[str], logs: Callable[[], Iterable[Log]],
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.log_dirs = [os.path.abspath(d) for d in log_dirs]
        self._logs = logs
        self.clock = clock
        self._checkpoints = {d: OffsetCheckpointFile(os.path.join(d, CLEANER_OFFSET_CHECKPOINT))
                             for d in self.log_dirs}
        self._in_progress: dict[TopicPartition, object] = {}
        self._uncleanable: dict[str, set[TopicPartition]] = {}
        self._last_cleaning: dict[TopicPartition, LastCleaning] = {}
        self._lock = threading.RLock()
        self._paused_cleaning_cond = threading.Condition(self._lock)
        #: dirty ratio of the filthiest log seen by the last grab (Kafka's max-dirty-percent gauge)
        self.dirtiest_log_cleanable_ratio = 0.0
        #: when grab_filthiest_log last ran (Kafka's time-since-last-run-ms gauge)
        self.time_of_last_run_ms = clock.milliseconds()

    # -- logs and checkpoints ----------------------------------------------------------------

    def _current_logs(self) -> dict[TopicPartition, Log]:
        # Never called with self._lock held: the LogManager takes its own lock to list its
        # logs, and it may hold that lock while it calls abort_cleaning (topic deletion).
        return {log.topic_partition: log for log in self._logs()}

    @staticmethod
    def _parent_dir(log: Log) -> str:
        return os.path.dirname(os.path.abspath(log.dir))

    def _read_checkpoint(self, checkpoint: OffsetCheckpointFile, log_dir: str) -> dict[TopicPartition, int]:
        try:
            return checkpoint.read()
        except (LogfsError, OSError) as exc:       # corrupt, unreadable, a planted link
            # Losing the clean/dirty boundary only costs a full re-clean; never lose the log over it.
            logger.error("Failed to access checkpoint file %s in dir %s: %s",
                         CLEANER_OFFSET_CHECKPOINT, log_dir, exc)
            return {}

    @staticmethod
    def _write_checkpoint(checkpoint: OffsetCheckpointFile, log_dir: str,
                          offsets: dict[TopicPartition, int]) -> None:
        try:
            checkpoint.write(offsets)
        except (OSError, LogfsError) as exc:
            # As in Kafka: the log dir's failure surfaces elsewhere; the state machine must go on.
            logger.error("Failed to access checkpoint file %s in dir %s: %s",
                         CLEANER_OFFSET_CHECKPOINT, log_dir, exc)

    def all_cleaner_checkpoints(self) -> dict[TopicPartition, int]:
        """The first dirty offset of every partition, over all log dirs."""
        with self._lock:
            result: dict[TopicPartition, int] = {}
            for log_dir, checkpoint in self._checkpoints.items():
                result.update(self._read_checkpoint(checkpoint, log_dir))
            return result

    def update_checkpoints(self, log_dir: str, partition_to_update_or_add: tuple[TopicPartition, int] | None = None,
                           partition_to_remove: TopicPartition | None = None, *,
                           live_partitions: Iterable[TopicPartition] | None = None) -> None:
        """Rewrite ``log_dir``'s checkpoint: drop partitions that no longer exist, apply one change."""
        log_dir = os.path.abspath(log_dir)
        live = self._current_logs() if live_partitions is None else live_partitions
        with self._lock:
            checkpoint = self._checkpoints.get(log_dir)
            if checkpoint is None:
                return
            live = set(live)
            current = {tp: offset for tp, offset in self._read_checkpoint(checkpoint, log_dir).items()
                       if tp in live}
            if partition_to_remove is not None:
                current.pop(partition_to_remove, None)
            if partition_to_update_or_add is not None:
                tp, offset = partition_to_update_or_add
                current[tp] = offset
            self._write_checkpoint(checkpoint, log_dir, current)

    def maybe_truncate_checkpoint(self, log_dir: str, tp: TopicPartition, offset: int) -> None:
        """Lower ``tp``'s first dirty offset to ``offset`` after the log was truncated below it."""
        log_dir = os.path.abspath(log_dir)
        with self._lock:
            checkpoint = self._checkpoints.get(log_dir)
            if checkpoint is None:
                return
            existing = self._read_checkpoint(checkpoint, log_dir)
            if existing.get(tp, 0) > offset:
                existing[tp] = offset
                self._write_checkpoint(checkpoint, log_dir, existing)

    # -- choosing a log ----------------------------------------------------------------------

    def grab_filthiest_log(self, now_ms: int | None = None) -> LogToClean | None:
        """The compacted log with the largest dirty ratio above its threshold, marked in progress.

        Logs already in progress or paused, and partitions marked uncleanable
        after an unexpected failure, are skipped; so are empty logs.
        """
        logs = self._current_logs()
        with self._lock:
            now = self.clock.milliseconds() if now_ms is None else now_ms
            self.time_of_last_run_ms = now
            last_clean = self.all_cleaner_checkpoints()
            dirty_logs: list[LogToClean] = []
            for tp, log in logs.items():
                if not log.config.compact or tp in self._in_progress or self._is_uncleanable(log, tp):
                    continue
                offsets = cleanable_offsets(log, last_clean.get(tp), now)
                if offsets.force_update_checkpoint:
                    self.update_checkpoints(self._parent_dir(log),
                                            partition_to_update_or_add=(tp, offsets.first_dirty_offset),
                                            live_partitions=logs)
                ltc = LogToClean(tp, log, offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset)
                if ltc.total_bytes > 0:
                    dirty_logs.append(ltc)
            self.dirtiest_log_cleanable_ratio = max((ltc.cleanable_ratio for ltc in dirty_logs), default=0.0)
            cleanable = [ltc for ltc in dirty_logs if ltc.cleanable_ratio > ltc.log.config.min_cleanable_dirty_ratio]
            if not cleanable:
                return None
            filthiest = max(cleanable, key=lambda ltc: ltc.cleanable_ratio)
            self._in_progress[filthiest.topic_partition] = LOG_CLEANING_IN_PROGRESS
            return filthiest

    def dirty_ratio(self, log: Log, now_ms: int | None = None) -> float:
        """The log's current dirty ratio (0.0 for an empty log), for the mount's ``state``."""
        now = self.clock.milliseconds() if now_ms is None else now_ms
        offsets = cleanable_offsets(log, self.all_cleaner_checkpoints().get(log.topic_partition), now)
        return LogToClean(log.topic_partition, log, offsets.first_dirty_offset,
                          offsets.first_uncleanable_dirty_offset).cleanable_ratio

    def cleaner_state(self, log: Log) -> dict[str, object]:
        """The cleaner's view of one log: position (first dirty offset), dirty ratio, last cleaning."""
        tp = log.topic_partition
        with self._lock:
            position = self.all_cleaner_checkpoints().get(tp)
            state = self._in_progress.get(tp)
            last = self._last_cleaning.get(tp)
        return {
            "cleaner_position": position,
            "dirty_ratio": round(self.dirty_ratio(log), 6) if log.config.compact else 0.0,
            "cleaning_state": None if state is None else repr(state),
            "uncleanable": self._is_uncleanable(log, tp),
            "last_cleaning": None if last is None else last._asdict(),
        }

    def last_cleaning(self, tp: TopicPartition) -> LastCleaning | None:
        with self._lock:
            return self._last_cleaning.get(tp)

    # -- retention of compacted logs ---------------------------------------------------------

    def deletable_logs(self) -> list[tuple[TopicPartition, Log]]:
        """Compacted logs not being cleaned, marked in progress for a retention pass by the cleaner.

        Retention of ``compact,delete`` logs (and log-start-offset cleanup of
        compacted ones) runs in the cleaner worker, as in Kafka, so it can never
        race a clean of the same log.
        """
        logs = self._current_logs()
        with self._lock:
            result = [(tp, log) for tp, log in logs.items()
                      if tp not in self._in_progress and log.config.compact
                      and not self._is_uncleanable(log, tp)]
            for tp, _ in result:
                self._in_progress[tp] = LOG_CLEANING_IN_PROGRESS
            return result

    def done_deleting(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._finish(tp)

    def pause_cleaning_for_non_compacted_partitions(self) -> list[tuple[TopicPartition, Log]]:
        """Non-compacted logs not in progress, paused so that retention can work on them safely.

        The LogManager's retention pass uses this (and ``resume_cleaning``
        afterwards) when the cleaner is enabled, so a topic switched between
        ``delete`` and ``compact`` is never cleaned and retained at once.
        """
        logs = self._current_logs()
        with self._lock:
            result = [(tp, log) for tp, log in logs.items()
                      if not log.config.compact and tp not in self._in_progress]
            for tp, _ in result:
                self._in_progress[tp] = LogCleaningPaused(1)
            return result

    # -- state machine -----------------------------------------------------------------------

    def cleaning_state(self, tp: TopicPartition) -> object | None:
        with self._lock:
            return self._in_progress.get(tp)

    def abort_cleaning(self, tp: TopicPartition) -> None:
        """Abort a running clean of ``tp`` and wait until it has stopped (then allow cleaning again).

        Called before a partition is deleted, so that no worker is writing
        ``.cleaned`` files in its directory when it is renamed.
        """
        with self._lock:
            self.abort_and_pause_cleaning(tp)
            self.resume_cleaning([tp])

    def abort_and_pause_cleaning(self, tp: TopicPartition) -> None:
        """Stop any clean of ``tp`` and keep it from being cleaned until resumed; blocks until stopped."""
        with self._lock:
            state = self._in_progress.get(tp)
            if state is None:
                self._in_progress[tp] = LogCleaningPaused(1)
            elif state is LOG_CLEANING_IN_PROGRESS:
                self._in_progress[tp] = LOG_CLEANING_ABORTED
            elif isinstance(state, LogCleaningPaused):
                self._in_progress[tp] = LogCleaningPaused(state.paused_count + 1)
            else:
                raise LogCleaningStateError(
                    f"Compaction for partition {tp} cannot be aborted and paused since it is in {state!r} state.")
            while not isinstance(self._in_progress.get(tp), LogCleaningPaused):
                self._paused_cleaning_cond.wait(0.1)

    def resume_cleaning(self, partitions: Iterable[TopicPartition]) -> None:
        """Undo one pause of each partition."""
        with self._lock:
            for tp in partitions:
                state = self._in_progress.get(tp)
                if not isinstance(state, LogCleaningPaused):
                    raise LogCleaningStateError(
                        f"Compaction for partition {tp} cannot be resumed since it is "
                        f"{'not paused' if state is None else f'in {state!r} state'}.")
                if state.paused_count == 1:
                    del self._in_progress[tp]
                else:
                    self._in_progress[tp] = LogCleaningPaused(state.paused_count - 1)

    def check_cleaning_aborted(self, tp: TopicPartition) -> None:
        """Raise LogCleaningAbortedError if the clean of ``tp`` was asked to stop."""
        with self._lock:
            if self._in_progress.get(tp) is LOG_CLEANING_ABORTED:
                raise LogCleaningAbortedError(f"The cleaning of {tp} was aborted")

    def is_cleaning_aborted(self, tp: TopicPartition) -> bool:
        with self._lock:
            return self._in_progress.get(tp) is LOG_CLEANING_ABORTED

    def done_cleaning(self, tp: TopicPartition, log_dir: str, end_offset: int,
                      last_cleaning: LastCleaning | None = None) -> None:
        """Checkpoint ``end_offset`` as ``tp``'s first dirty offset and leave the in-progress state.

        An aborted clean checkpoints nothing: it becomes paused and wakes the
        thread waiting in ``abort_and_pause_cleaning``.
        """
        with self._lock:
            state = self._in_progress.get(tp)
            if state is LOG_CLEANING_IN_PROGRESS:
                # Only this entry changes: listing the live logs here would need the
                # LogManager's lock, which a deletion waiting in abort_cleaning may hold.
                checkpoint = self._checkpoints.get(os.path.abspath(log_dir))
                if checkpoint is not None:
                    offsets = self._read_checkpoint(checkpoint, log_dir)
                    offsets[tp] = end_offset
                    self._write_checkpoint(checkpoint, log_dir, offsets)
                if last_cleaning is not None:
                    self._last_cleaning[tp] = last_cleaning
            self._finish(tp)

    def _finish(self, tp: TopicPartition) -> None:
        state = self._in_progress.get(tp)
        if state is LOG_CLEANING_IN_PROGRESS:
            del self._in_progress[tp]
        elif state is LOG_CLEANING_ABORTED:
            self._in_progress[tp] = LogCleaningPaused(1)
            self._paused_cleaning_cond.notify_all()
        elif state is None:
            raise LogCleaningStateError(f"State for partition {tp} should exist.")
        else:
            raise LogCleaningStateError(f"In-progress partition {tp} cannot be in {state!r} state.")

    # -- uncleanable partitions --------------------------------------------------------------

    def mark_partition_uncleanable(self, log_dir: str, tp: TopicPartition) -> None:
        """Stop choosing ``tp`` after an unexpected failure; other logs go on being cleaned."""
        with self._lock:
            self._uncleanable.setdefault(os.path.abspath(log_dir), set()).add(tp)

    def uncleanable_partitions(self, log_dir: str) -> set[TopicPartition]:
        with self._lock:
            return set(self._uncleanable.get(os.path.abspath(log_dir), ()))

    def _is_uncleanable(self, log: Log, tp: TopicPartition) -> bool:
        with self._lock:
            return tp in self._uncleanable.get(self._parent_dir(log), ())

    def maintain_uncleanable_partitions(self) -> None:
        """Forget uncleanable marks (and last-clean stats) of partitions that no longer exist."""
        live = set(self._current_logs())
        with self._lock:
            for log_dir in list(self._uncleanable):
                self._uncleanable[log_dir] &= live
                if not self._uncleanable[log_dir]:
                    del self._uncleanable[log_dir]
            for tp in list(self._last_cleaning):
                if tp not in live:
                    del self._last_cleaning[tp]
