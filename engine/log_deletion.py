"""Asynchronous deletion of partition directories (Kafka's ``logsToBeDeleted`` and ``deleteLogs``).

A deleted topic leaves the namespace at once: each partition directory is
renamed ``<topic>-<partition>.<uuid>-delete`` and queued here, and the
kafka-delete-logs job removes it once ``file.delete.delay.ms`` has passed.  A
``-delete`` dir found at startup (a crash before its removal) is queued the
same way, without a Log (it was never loaded: nothing to recover).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from engine.errors import LogfsError

if TYPE_CHECKING:
    from engine.log import Log
    from engine.topic import TopicPartition

logger = logging.getLogger(__name__)


class PendingDeletion(NamedTuple):
    """A partition directory renamed ``-delete`` and waiting for ``file.delete.delay.ms``."""

    path: str
    log: Log | None          # None for a dir found at startup (never loaded: nothing to recover)
    scheduled_ms: int
    delay_ms: int
    topic_partition: TopicPartition | None


class LogDeletionQueue:
    """The ``-delete`` dirs waiting for removal; thread-safe (its lock is taken last, never held across I/O)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[PendingDeletion] = deque()

    def schedule(self, pending: PendingDeletion) -> None:
        with self._lock:
            self._queue.append(pending)

    def paths(self) -> list[str]:
        """Paths of ``-delete`` dirs waiting for removal."""
        with self._lock:
            return [p.path for p in self._queue]

    def delete_due(self, now: int) -> tuple[int, list[str]]:
        """Remove the dirs whose delay has passed at ``now``; returns (deleted, failures).

        A failure is logged and leaves the dir queued, to be retried at the next run.
        """
        with self._lock:
            due = [p for p in self._queue if p.scheduled_ms + p.delay_ms <= now]
            for pending in due:
                self._queue.remove(pending)
        deleted = 0
        failures: list[str] = []
        for pending in due:
            try:
                if pending.log is not None:
                    pending.log.delete()        # logs "Deleted log for partition ..." itself
                else:
                    shutil.rmtree(pending.path)
                    logger.info("Deleted log directory %s.", pending.path)
                deleted += 1
            except FileNotFoundError:
                deleted += 1
            except (OSError, LogfsError) as exc:
                logger.error("Exception while deleting %s in dir %s, will retry: %s",
                             pending.path, os.path.dirname(pending.path), exc)
                failures.append(f"{pending.path}: {exc}")
                self.schedule(pending)
        return deleted, failures
