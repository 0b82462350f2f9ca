"""The checkpoint files of each log dir, as the LogManager writes them (Kafka's ``LogManager`` checkpoints).

Kafka's ``LogManager`` keeps one ``recovery-point-offset-checkpoint`` and one
``log-start-offset-checkpoint`` per log dir (``recoveryPointCheckpoints``,
``logStartOffsetCheckpoints``) and writes them in ``checkpointLogRecoveryOffsets``
and ``checkpointLogStartOffsets``; the cleaner owns the third,
``cleaner-offset-checkpoint``.  :class:`LogDirCheckpoints` is that part of the
LogManager: the per-dir writers, the per-dir lock that makes the last writer
write the newest offsets, the write at shutdown, and the removal of a deleted
partition's entries before a partition of the same name is created (logfs's
addition: Kafka's entries name a partition, not its topic ID).

It owns no log: it reads the LogManager's live logs through a callable given
at construction, one atomic ``dict.copy`` each time, so it takes neither the
LogManager's lock nor any Log's (callers may hold a Log's lock).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from engine.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpointFile,
)
from engine.errors import LogDirFullError, LogfsError, StorageError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable, Mapping

    from engine.cleaner import LogCleaner
    from engine.log import Log
    from engine.topic import TopicPartition

logger = logging.getLogger("engine.manager")      # the lines keep the logger they were logged under


class LogDirCheckpoints:
    """The recovery-point and log-start-offset checkpoints of every log dir.

    ``live_logs()`` returns the LogManager's logs live now (a copy);
    ``cleaner()`` the log cleaner or None, which owns the cleaner-offset
    checkpoint.  One writer at a time per dir: OffsetCheckpointFile writes
    through a fixed ``.tmp`` name, and a map computed outside the lock could
    overwrite a newer log start offset with an older one.
    """

    def __init__(self, log_dirs: Iterable[str], live_logs: Callable[[], Iterable[Log]],
                 cleaner: Callable[[], LogCleaner | None]) -> None:
        self.log_dirs = list(log_dirs)
        self._live_logs = live_logs
        self._cleaner = cleaner
        self._locks: dict[str, threading.Lock] = {d: threading.Lock() for d in self.log_dirs}

    def _lock(self, log_dir: str) -> threading.Lock:
        return self._locks.setdefault(log_dir, threading.Lock())

    def _logs_in(self, log_dir: str) -> list[Log]:
        return [log for log in self._live_logs() if os.path.dirname(log.dir) == log_dir]

    def write_recovery_points(self, log_dir: str) -> None:
        """Write ``log_dir``'s recovery-point checkpoint from the logs live now (under the dir's lock).

        The map is taken under the lock, not before it: a map taken before a
        topic deletion and written after it would put the deleted partition's
        recovery point back, for a new topic of that name to inherit.
        """
        with self._lock(log_dir):
            logs = self._logs_in(log_dir)
            _write_checkpoint(log_dir, RECOVERY_POINT_CHECKPOINT,
                              {log.topic_partition: log.recovery_point for log in logs})

    def write_log_start_offsets(self, log_dir: str, planned: tuple[Log, int] | None = None) -> None:
        """Write ``log_dir``'s log-start-offset checkpoint; raises StorageError.

        ``planned`` is ``(log, offset)`` for a log start offset about to be
        reached by a deletion that has not moved it in memory yet.  The map is
        taken under the dir's lock, so the last writer always writes the
        newest offsets.
        """
        with self._lock(log_dir):
            offsets = moved_log_start_offsets(self._logs_in(log_dir))
            if planned is not None:
                log, offset = planned
                first_base = next(iter(log.segments.keys()), 0)
                tiered = log.remote_log_reader is not None       # its start may be below its first segment
                if (offset > first_base or tiered) and offset > offsets.get(log.topic_partition, -1):
                    offsets[log.topic_partition] = offset
            try:
                OffsetCheckpointFile(os.path.join(log_dir, LOG_START_OFFSET_CHECKPOINT)).write(offsets)
            except LogDirFullError:
                raise                  # ENOSPC stays ENOSPC for the caller (`before N` on a full disk)
            except (OSError, LogfsError) as exc:
                raise StorageError(f"Disk error while writing {LOG_START_OFFSET_CHECKPOINT} in dir {log_dir}: "
                                   f"{exc}") from exc

    def write_at_shutdown(self, log_dir: str, logs: list[Log]) -> None:
        """Both checkpoints of ``log_dir`` from its closed ``logs``; raises OSError or LogfsError."""
        OffsetCheckpointFile(os.path.join(log_dir, RECOVERY_POINT_CHECKPOINT)).write(
            {log.topic_partition: log.recovery_point for log in logs})
        with self._lock(log_dir):
            OffsetCheckpointFile(os.path.join(log_dir, LOG_START_OFFSET_CHECKPOINT)).write(
                moved_log_start_offsets(logs))

    def drop_stale_entries(self, tp: TopicPartition) -> None:
        """Drop ``tp`` from every checkpoint of every log dir, durably, before a partition ``tp`` is created.

        Kafka's checkpoints name a partition, not its topic ID: an entry left
        by a deleted topic of the same name (a crash between the rename of its
        dirs and the checkpoint rewrite of ``LogManager.delete_topic``, or a
        periodic write that raced the deletion) would give the new partition
        the old log start offset (hiding acknowledged records, which retention
        then deletes), recovery point or cleaner position.  Both generations go
        (the reader falls back to ``.prev``).  Costs a read of each checkpoint
        and nothing more unless an entry is there.  Raises StorageError (the
        partition is then not created).
        """
        for log_dir in self.log_dirs:
            for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT):
                path = os.path.join(log_dir, name)
                for _generation in range(2):
                    if not _mentions(path, tp):
                        break
                    logger.info("Dropping the entry of deleted partition %s from %s before creating it again",
                                tp, path)
                    self._rewrite_without(log_dir, name, tp)
                if _mentions(path, tp):
                    raise StorageError(f"Cannot create partition {tp}: the entry a deleted partition of that name "
                                       f"left in {path} could not be removed (see the ERROR before)")

    def _rewrite_without(self, log_dir: str, name: str, tp: TopicPartition) -> None:
        """One new generation of ``log_dir``'s checkpoint ``name`` without ``tp`` (not a live partition)."""
        cleaner = self._cleaner()
        if name == RECOVERY_POINT_CHECKPOINT:
            self.write_recovery_points(log_dir)
        elif name == LOG_START_OFFSET_CHECKPOINT:
            self.write_log_start_offsets(log_dir)
        elif cleaner is not None:
            cleaner.update_checkpoints(log_dir, partition_to_remove=tp)     # under the cleaner's lock
        else:
            checkpoint = OffsetCheckpointFile(os.path.join(log_dir, name))
            try:
                offsets = checkpoint.read()
            except (LogfsError, OSError, ValueError):
                offsets = {}
            offsets.pop(tp, None)
            checkpoint.write(offsets)


def _write_checkpoint(log_dir: str, name: str, offsets: Mapping[TopicPartition, int]) -> None:
    """Write one checkpoint; logs and re-raises a failure (LogDirFullError or StorageError)."""
    try:
        OffsetCheckpointFile(os.path.join(log_dir, name)).write(offsets)
    except (OSError, LogfsError) as exc:
        logger.error("Disk error while writing %s in dir %s: %s", name, log_dir, exc)
        if isinstance(exc, LogfsError):
            raise
        raise StorageError(f"Disk error while writing {name} in dir {log_dir}: {exc}") from exc


def _mentions(path: str, tp: TopicPartition) -> bool:
    """Whether the checkpoint ``path`` or its previous generation holds an entry for ``tp``.

    An unreadable generation counts as holding it: it cannot be shown not to.  Both are read while no
    write of the checkpoint is under way (a periodic checkpoint write races a topic's creation).
    """
    try:
        generations = OffsetCheckpointFile(path).read_generations()
    except (LogfsError, OSError, ValueError):
        return True
    return any(tp in offsets for offsets in generations)


def moved_log_start_offsets(logs: Iterable[Log]) -> dict[TopicPartition, int]:
    """Log start offsets that differ from the first segment's base offset (the only ones Kafka checkpoints):
    above it (retention, DeleteRecords), or below it (tiered storage deleted local segments whose copies
    hold the offsets from the log start on)."""
    offsets = {}
    for log in logs:
        segments = log.segments
        first_base = next(iter(segments.keys())) if len(segments) else 0
        if log.log_start_offset != first_base or log.remote_log_reader is not None:
            offsets[log.topic_partition] = log.log_start_offset
    return offsets
