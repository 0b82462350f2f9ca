"""Open segment files under a descriptor budget: an LRU of the files that may be closed and reopened.

Kafka opens a segment's files lazily (``LazyIndex``; ``FileRecords`` of
sealed segments are opened when the segment is read) so a broker carries
100,000s of segments within its ``ulimit -n``.  Here every ``.log`` descriptor
and every index mapping of a segment that is not in flight goes through one
:class:`FileCache`: opened on first use, remembered in LRU order, and closed
when more than ``budget`` are open.

Closing is safe under concurrent readers without any lock on the read path:
an open file is a :class:`OpenFile` object whose descriptor is closed when
the object is garbage-collected.  Evicting only drops the owner's reference;
a reader that took the object before keeps it (and the descriptor) alive
until its read returns, and the next use by the owner opens the file again.
Files that cannot be reopened by name (the active segment while it is written,
a segment renamed for deletion or being swapped, a deleted one still read by a
view) are *pinned*: they never enter the LRU.

The budget defaults to three quarters of the soft ``RLIMIT_NOFILE`` (the rest
is left to FUSE requests, sockets, checkpoints and pinned files); see
:func:`default_budget`.  :func:`set_budget` changes it (the mount's
``log.fd.budget`` override, tests).
"""

from __future__ import annotations

import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Never fewer than this many evictable files (a tiny ulimit still serves reads).
MIN_BUDGET = 4


class OpenFile:
    """One open descriptor, closed when the last reference to this object goes (or by :meth:`close`)."""

    __slots__ = ("fd", "__weakref__")

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


def default_budget() -> int:
    """Three quarters of the soft ``RLIMIT_NOFILE`` (at least MIN_BUDGET)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 20
    return max(MIN_BUDGET, soft * 3 // 4)


class FileCache:
    """LRU of evictable open files: ``key -> evict()``; at most ``budget`` of them are open."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = max(MIN_BUDGET, budget if budget is not None else default_budget())
        self._open: OrderedDict[object, Callable[[], None]] = OrderedDict()
        #: files that cannot be closed now; they count against the budget too
        self._pinned: set[object] = set()
        self._lock = threading.Lock()
        self.evictions = 0

    def opened(self, key: object, evict: Callable[[], None]) -> None:
        """``key`` was just opened; ``evict()`` closes it (drops the owner's reference). May evict others."""
        victims = []
        with self._lock:
            self._pinned.discard(key)
            self._open[key] = evict
            self._open.move_to_end(key)
            while len(self._open) + len(self._pinned) > self.budget and len(self._open) > 1:
                _, victim = self._open.popitem(last=False)
                victims.append(victim)
            self.evictions += len(victims)
        for victim in victims:          # outside the lock: an evict() may take its owner's lock
            victim()

    def touch(self, key: object) -> None:
        """``key`` was used: it is the most recently used now."""
        try:
            self._open.move_to_end(key)
        except KeyError:
            pass

    def forget(self, key: object) -> None:
        """``key`` was closed by its owner: it is no longer the cache's to close, nor counted."""
        with self._lock:
            self._open.pop(key, None)
            self._pinned.discard(key)

    def pin(self, key: object) -> None:
        """``key`` stays open until its owner closes it (counted against the budget, never evicted)."""
        victims = []
        with self._lock:
            self._open.pop(key, None)
            self._pinned.add(key)
            while self._open and len(self._open) + len(self._pinned) > self.budget:
                _, victim = self._open.popitem(last=False)
                victims.append(victim)
            self.evictions += len(victims)
        for victim in victims:
            victim()

    @property
    def pinned(self) -> int:
        return len(self._pinned)

    def __len__(self) -> int:
        return len(self._open)


#: The process's cache (every segment of every log).
FILE_CACHE = FileCache()


def set_budget(budget: int) -> None:
    """Change the budget of :data:`FILE_CACHE`; files beyond it are closed at the next open."""
    FILE_CACHE.budget = max(MIN_BUDGET, budget)
