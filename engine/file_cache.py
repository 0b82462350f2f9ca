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

:class:`LazyFile` is a segment's ``.log`` under the cache (the segment keeps
its path current across renames); index mappings use the cache directly
(``engine.index.AbstractIndex._mmap``).

The budget defaults to three quarters of the soft ``RLIMIT_NOFILE`` (the rest
is left to FUSE requests, sockets, checkpoints and pinned files); see
:func:`default_budget`.  :func:`set_budget` changes it (no setting of the
mount does: the budget follows ``ulimit -n``).
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

from engine.errors import StorageError, storage_error

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Never fewer than this many evictable files (a tiny ulimit still serves reads).
MIN_BUDGET = 4
#: Serialises reopening a file the cache closed (rare: only after an eviction).
_REOPEN_LOCK = threading.Lock()


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


#: The process's cache (every segment of every log): one per process, not per LogManager, because the
#: budget it keeps is the process's ``RLIMIT_NOFILE``, which every manager of the process shares.
FILE_CACHE = FileCache()


def _lazy_evictor(ref: weakref.ref[LazyFile]) -> Callable[[], None]:
    def evict() -> None:
        lazy = ref()
        if lazy is not None:
            lazy.evict()
    return evict


class LazyFile:
    """A file reopened by name after the FileCache closed it (Kafka's lazily opened ``FileRecords``).

    :meth:`get` returns the :class:`OpenFile`; hold it while using its
    descriptor.  ``path`` follows renames (the owner sets it).  A pinned file
    is never closed by the cache: its name may not lead to it any more.
    """

    __slots__ = ("path", "_flags", "_opener", "_file", "_closed", "_pinned", "_key", "_evict_cb", "__weakref__")

    def __init__(self, path: str, fd: int, flags: int, opener: Callable[[str, int], int]) -> None:
        self.path = path
        self._flags = flags                 # how it is reopened (no O_CREAT: it must exist)
        self._opener = opener               # engine.index.open_regular_file: never through a link
        self._file: OpenFile | None = OpenFile(fd)
        self._closed = False
        self._pinned = False
        self._key = object()
        self._evict_cb = _lazy_evictor(weakref.ref(self))
        FILE_CACHE.opened(self._key, self._evict_cb)

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def closed(self) -> bool:
        return self._closed

    def current(self) -> OpenFile | None:
        """The open file if it is open now (nothing is opened)."""
        return self._file

    def get(self) -> OpenFile:
        f = self._file
        if f is not None:
            if not self._pinned:
                FILE_CACHE.touch(self._key)
            return f
        with _REOPEN_LOCK:
            f = self._file
            if f is not None:
                return f
            if self._closed:
                raise StorageError(f"Log segment {self.path} is closed")
            try:
                fd = self._opener(self.path, self._flags)
            except OSError as exc:
                raise storage_error(f"Could not open {self.path} again: {exc.strerror or exc}", exc) from exc
            f = self._file = OpenFile(fd)
            if not self._pinned:
                FILE_CACHE.opened(self._key, self._evict_cb)
            return f

    def evict(self) -> None:
        if not self._pinned:
            self._file = None

    def pin(self) -> None:
        """Keep it open from now on (it is written, or about to lose its name)."""
        self._pinned = True
        self.get()
        FILE_CACHE.pin(self._key)

    def unpin(self) -> None:
        """Reopenable by name again: the FileCache may close it when over budget."""
        if self._pinned:
            self._pinned = False
            if self._file is not None:
                FILE_CACHE.opened(self._key, self._evict_cb)

    def close(self) -> None:
        self._closed = True
        f, self._file = self._file, None
        FILE_CACHE.forget(self._key)
        if f is not None:
            f.close()       # -1 first: a racing reader gets EBADF, never another file's reused descriptor

    def __del__(self) -> None:
        FILE_CACHE.forget(self._key)


def set_budget(budget: int) -> None:
    """Change the budget of :data:`FILE_CACHE`; files beyond it are closed at the next open."""
    FILE_CACHE.budget = max(MIN_BUDGET, budget)
