"""Which consumer group is consuming which partition through an open file (``consume/<group>``).

Kafka assigns a partition to one consumer of a group at a time; the mount
does the same for the files of ``<topic>/<p>/consume/``: a second opening of
one group's partition while the first is open fails with EBUSY.  The
namespace keeps one :class:`GroupLeases` for the mount (logfs.groups takes
and gives back the holds).
"""

from __future__ import annotations

import errno as _errno
import threading
from typing import TYPE_CHECKING

from engine.errors import LogfsError
from logfs.errors import RetryAfterRelease

if TYPE_CHECKING:
    from engine.topic import TopicPartition

__all__ = ["GroupBusyError", "GroupLeases", "Lease", "ReleasePendingError"]


class GroupBusyError(LogfsError):
    """A second opening of one group's partition while the first is open (one consumer per partition)."""

    errno = _errno.EBUSY


class ReleasePendingError(GroupBusyError, RetryAfterRelease):
    """The holding file was closed and its release is on its way: ``logfs.fs`` retries the open."""


class Lease:
    """One open file's hold of a (group, partition); ``closing`` once a ``close()`` of it was seen."""

    __slots__ = ("closing",)

    def __init__(self) -> None:
        self.closing = False


class GroupLeases:
    """Which (group, partition) is being consumed by an open file.

    A hold lasts until the open file's last descriptor is closed (FUSE's
    ``release``), not its first ``close()`` (``flush``): a child process that
    inherited the descriptor closing its copy must not let a second reader of
    the group in while the parent still reads.  Since ``release`` reaches the
    mount asynchronously after the last ``close()`` returned, an opening that
    finds a hold whose file saw a ``close()`` since its last read gets
    :class:`ReleasePendingError`, which ``logfs.fs`` retries for a moment.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, TopicPartition], Lease] = {}
        self._lock = threading.Lock()

    def acquire(self, group: str, tp: TopicPartition) -> Lease:
        with self._lock:
            held = self._held.get((group, tp))
            if held is not None:
                error = ReleasePendingError if held.closing else GroupBusyError
                raise error(
                    f"Partition {tp} is already being consumed by group {group} (one reader per group and "
                    "partition, as Kafka assigns a partition to one consumer of a group)")
            lease = self._held[(group, tp)] = Lease()
            return lease

    def release(self, group: str, tp: TopicPartition, lease: Lease) -> None:
        with self._lock:
            if self._held.get((group, tp)) is lease:
                del self._held[(group, tp)]
