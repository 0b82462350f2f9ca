"""Kafka's sparse segment indexes: ``AbstractIndex``, ``OffsetIndex`` and ``TimeIndex``.

Each segment ``<base>.log`` has two companions that map a key to a point in the
log without reading it:

* ``<base>.index`` (:class:`OffsetIndex`): 8-byte entries, a 4-byte offset
  relative to the segment's base offset and the 4-byte byte position of the batch
  in the ``.log``;
* ``<base>.timeindex`` (:class:`TimeIndex`): 12-byte entries, an 8-byte
  timestamp and the 4-byte relative offset of the first batch at or after it.

Both are big-endian, byte for byte what a Kafka broker writes, and both behave as
Kafka's: a new file is preallocated to ``segment.index.bytes`` rounded down to the
entry size and memory-mapped; an existing file is taken to hold
``length // entry_size`` entries.  That last rule is deliberate: after a clean
shutdown Kafka trims every index to its valid size, so a file that is still at
its preallocated length was left by a crash, and its junk tail is what
:meth:`sanity_check` catches before the log loader rebuilds the index.

Concurrency follows Kafka's: mutations (append, truncate, resize, close) hold the
index's lock; lookups take no lock.  A lookup reads the entry count, then the
current mapping, and only ever touches entries below that count.  Mappings are
never closed in place: resizing or closing drops the index's reference and
CPython unmaps the old region when the last reader lets go of it, so a reader
racing a roll never sees a closed map.

Size (~850 lines): Kafka's AbstractIndex with its two subclasses, kept together
as in Kafka because both share the mapping, locking, resizing and durability
code of the base class and differ only in their entry format and lookups.
"""

from __future__ import annotations

import errno as _errno
import logging
import mmap
import os
import stat
import struct
import threading
import weakref
from collections.abc import Callable
from typing import Any

from engine.errors import (
    CorruptIndexError,
    InvalidConfigError,
    InvalidRequestError,
    LogDirFullError,
    LogfsError,
    StorageError,
    UnsafeFileError,
    storage_error,
)
from engine.file_cache import FILE_CACHE

logger = logging.getLogger(__name__)

__all__ = ["OffsetIndex", "TimeIndex", "InvalidOffsetError", "IndexFullError", "IndexOffsetOverflowError",
           "WARM_SECTION_BYTES"]

#: Kafka's ``AbstractIndex.warmEntries``: lookups are almost always for the tail of
#: the index (consumers near the end of the log), so the last 8 KiB -- two pages --
#: are searched first and stay in the page cache, instead of a cold binary search
#: that touches a page at every step from the start of the file.
WARM_SECTION_BYTES = 8192

_INT32_MAX = 2**31 - 1
_PAGE_SIZE = mmap.PAGESIZE

#: Flags of every open of a segment or index file: never through a symbolic link
#: (a planted ``00000000000000000100.index -> /etc/passwd`` must not be written),
#: never blocking on a FIFO, never inherited by a child process.
SAFE_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_regular_file(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses symbolic links and anything but a regular file.

    ``O_NOFOLLOW`` makes the kernel refuse a link in the last component
    (ELOOP); the ``fstat`` after the open refuses a FIFO, a device or a
    directory of the same name.  Raises :class:`UnsafeFileError` naming the
    file, or the ``OSError`` of the open for anything else (ENOENT, EACCES...).
    """
    try:
        fd = os.open(path, flags | SAFE_OPEN_FLAGS, mode)
    except OSError as exc:
        if exc.errno == _errno.ELOOP:
            raise UnsafeFileError(f"{path} is a symbolic link: logfs never follows links in a log directory",
                                  paths=[path]) from None
        raise
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{path} is not a regular file (mode {stat.filemode(st.st_mode)})", paths=[path])
    return fd


_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
#: An ``.index`` entry: 4-byte offset relative to the segment's base offset, 4-byte position in the ``.log``.
OFFSET_INDEX_ENTRY = struct.Struct(">ii")
#: A ``.timeindex`` entry: 8-byte timestamp, 4-byte offset relative to the segment's base offset.
TIME_INDEX_ENTRY = struct.Struct(">qi")
_OFFSET_ENTRY = OFFSET_INDEX_ENTRY
_TIME_ENTRY = TIME_INDEX_ENTRY


def offset_index_file_position(fd: int, base_offset: int, target_offset: int) -> int:
    """Byte position in the ``.log`` from which a scan finds ``target_offset``, from an ``.index`` file.

    For readers that do not map the index (the Spark source reads it through
    the mount): a binary search with one 8-byte ``pread`` per probe, since the
    active segment's index is preallocated (mostly zeros) and reading it whole
    would cost more than the scan it saves.  Entries past the written ones are
    zeros; a relative offset of 0 after the first slot marks them.  0 when no
    entry is at or below the target.
    """
    size = OFFSET_INDEX_ENTRY.size
    unpack = OFFSET_INDEX_ENTRY.unpack
    relative = target_offset - base_offset
    lo, hi, position = 0, os.fstat(fd).st_size // size, 0
    while lo < hi:
        mid = (lo + hi) // 2
        entry = os.pread(fd, size, mid * size)
        if len(entry) < size:
            hi = mid
            continue
        entry_relative, entry_position = unpack(entry)
        if (mid == 0 or entry_relative > 0) and entry_relative <= relative:
            position, lo = entry_position, mid + 1
        else:
            hi = mid
    return position


class InvalidOffsetError(LogfsError):
    """Kafka's ``InvalidOffsetException``: an index append that is not increasing."""

    errno = _errno.EINVAL


class IndexFullError(InvalidOffsetError):
    """An append to an index that has no free slot; the segment should have rolled."""


class IndexOffsetOverflowError(LogfsError):
    """Kafka's ``IndexOffsetOverflowException``: the offset does not fit in 32 bits relative to the base."""

    errno = _errno.EINVAL


#: ``struct.Struct.unpack_from`` of an index entry or field: (buffer, offset) -> the unpacked tuple.
_UnpackFrom = Callable[[mmap.mmap, int], tuple[Any, ...]]


def _search(mm: mmap.mmap, entries: int, target: int, unpack_from: _UnpackFrom, entry_size: int, field: int,
            warm_entries: int, smallest_upper_bound: bool) -> int:
    """Kafka's ``indexSlotRangeFor``: the slot of the largest entry whose field is <= target
    (or, with ``smallest_upper_bound``, the smallest whose field is >= target); -1 if none.

    The warm section (the last ``WARM_SECTION_BYTES`` of entries) is tried first,
    so the common lookup near the end never faults in the cold head of the file.
    """
    if entries == 0:
        return -1
    first_hot = entries - 1 - warm_entries
    if first_hot < 0:
        first_hot = 0
    if unpack_from(mm, first_hot * entry_size + field)[0] < target:
        lo, hi = first_hot, entries - 1
    else:
        if unpack_from(mm, field)[0] > target:
            return 0 if smallest_upper_bound else -1
        lo, hi = 0, first_hot
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        found = unpack_from(mm, mid * entry_size + field)[0]
        if found > target:
            hi = mid - 1
        elif found < target:
            lo = mid
        else:
            return mid
    if smallest_upper_bound:
        if unpack_from(mm, lo * entry_size + field)[0] >= target:
            return lo       # the entry the search began at holds the target itself (one entry, or slot 0)
        return -1 if lo == entries - 1 else lo + 1
    return lo


def _evictor(ref: weakref.ref[AbstractIndex]) -> Callable[[], None]:
    def evict() -> None:
        index = ref()
        if index is not None:
            index._evict()
    return evict


class AbstractIndex:
    """The mmap'ed file, its sizing and its lifecycle, shared by both indexes.

    ``entries`` is the number of valid entries, ``max_entries`` what the mapped
    file can hold; the file's length is ``length``.  Subclasses supply the entry
    layout and the ordering checks.
    """

    entry_size: int = 0
    #: byte offset of the 4-byte relative offset inside an entry
    _relative_offset_field: int = 0
    _kind = "index"

    def __init__(self, path: str, base_offset: int, max_index_size: int = -1, writable: bool = True,
                 in_memory: bool = False) -> None:
        self.path = os.fspath(path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        # An in-memory index (a read-only mount rebuilding a missing or damaged
        # index) takes entries like a writable one but never opens its file.
        self._in_memory = in_memory
        self.writable = writable or in_memory
        self._lock = threading.RLock()
        # The mapping is evictable (engine.file_cache): ``_mmap`` maps the file again
        # on first use after the FileCache dropped it, so sealed segments' indexes hold
        # no descriptor while unused (a Python mmap keeps a dup of its file's descriptor).
        self._mm: mmap.mmap | None = None
        self._evicted = False
        self._closed = False
        #: the file's size changed (a trim, a re-grow) since the last flush: the next flush fsyncs the file,
        #: as a msync of the mapping (or of no mapping, for an index trimmed to nothing) may not persist it
        self._size_unsynced = False
        self._cache_key = object()
        self._evict_cb = _evictor(weakref.ref(self))
        self._mmap = None
        self._warm_entries = WARM_SECTION_BYTES // self.entry_size
        if in_memory:
            rounded = self._round_down(max_index_size)
            if rounded < self.entry_size:
                raise InvalidConfigError(f"Invalid max index size {max_index_size} for {self.path}")
            self._mmap = mmap.mmap(-1, rounded)
            self.length = rounded
            self.max_entries = rounded // self.entry_size
            self._entries = 0
        else:
            newly_created = self._create_if_missing()
            self._map_file()
            # A new file has no entries; an existing one is assumed full of valid ones
            # (Kafka sets the buffer position to the rounded-down length): a clean
            # shutdown trimmed it, and an unclean one is caught by sanity_check.
            self._entries = 0 if newly_created else self.max_entries
        self._log_loaded(max_index_size, self._refresh_last())

    # -- file and mapping -------------------------------------------------------------------

    def _create_if_missing(self) -> bool:
        """Kafka's ``createNewFile`` + preallocation; True if this call created the file."""
        if os.path.lexists(self.path):      # a dangling link is not "missing": _map_file refuses it
            return False
        if not self.writable:
            raise CorruptIndexError(f"{self._kind.capitalize()} file {self.path} does not exist "
                                    "and the index was opened read-only")
        rounded = self._round_down(self.max_index_size)
        if rounded < self.entry_size:
            raise InvalidConfigError(
                f"Invalid max index size {self.max_index_size} for {self.path}: "
                f"it must hold at least one {self.entry_size}-byte entry")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | SAFE_OPEN_FLAGS, 0o666)
        except FileExistsError:
            return False       # created concurrently: open it as an existing index
        try:
            # Sparse: blocks are allocated as entries are written (see _reserve).
            os.ftruncate(fd, rounded)
        finally:
            os.close(fd)
        return True

    def _map_file(self) -> None:
        try:
            fd = open_regular_file(self.path, os.O_RDWR if self.writable else os.O_RDONLY)
        except FileNotFoundError as exc:
            raise CorruptIndexError(f"{self._kind.capitalize()} file {self.path} does not exist") from exc
        try:
            length = os.fstat(fd).st_size
            # mmap cannot map zero bytes: an empty index (trimmed with no entries)
            # simply has no mapping, and every read path checks entries first.
            if length:
                access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
                self._mmap = mmap.mmap(fd, length, access=access)
            else:
                self._mmap = None
        finally:
            os.close(fd)   # the mapping keeps its own reference to the file
        self.length = length
        self.max_entries = length // self.entry_size

    def __del__(self) -> None:
        # not a weakref.finalize: one per index of 100,000s of segments would cost memory
        key = self.__dict__.get("_cache_key")
        if key is not None:
            FILE_CACHE.forget(key)

    @property
    def _mmap(self) -> mmap.mmap | None:
        mm = self._mm
        if mm is None:
            if self._evicted and not self._closed:
                return self._remap()
            return None
        FILE_CACHE.touch(self._cache_key)
        return mm

    @_mmap.setter
    def _mmap(self, mm: mmap.mmap | None) -> None:
        self._mm = mm
        self._evicted = False
        if mm is not None and not self._in_memory:
            FILE_CACHE.opened(self._cache_key, self._evict_cb)
        else:
            FILE_CACHE.forget(self._cache_key)

    def _evict(self) -> None:
        """Drop the mapping (FileCache): a reader inside it keeps it until it returns; next use maps again."""
        if self._mm is not None and not self._in_memory:
            self._evicted = True
            self._mm = None

    def _remap(self) -> mmap.mmap | None:
        with self._lock:
            mm = self._mm
            if mm is not None or not self._evicted or self._closed:
                return mm
            try:
                fd = open_regular_file(self.path, os.O_RDWR if self.writable else os.O_RDONLY)
            except OSError as exc:
                raise storage_error(f"Could not open {self._kind} {self.path} again: {exc.strerror or exc}",
                                    exc) from exc
            try:
                # the file's own length: never a mapping beyond its end (a concurrent resize
                # truncates the file before it maps it)
                length = min(os.fstat(fd).st_size, self.length)
                access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
                mm = mmap.mmap(fd, length, access=access) if length else None
            finally:
                os.close(fd)
            if mm is None:
                self._evicted = False
                return None
            self._mmap = mm
            return mm

    def _round_down(self, size: int) -> int:
        return (size // self.entry_size) * self.entry_size if size > 0 else 0

    def _reserve(self, position: int) -> None:
        """Allocate disk blocks before the first write into a new page of the mapping.

        The file is sparse, and a store into an unallocated page of a full disk is
        a SIGBUS that would kill the mount; allocating the block first turns it
        into ENOSPC here, before anything is written.  One call per page, i.e.
        every 512 offset-index entries.
        """
        end = position + self.entry_size - 1
        if position and (end // _PAGE_SIZE) == ((position - 1) // _PAGE_SIZE):
            return
        if self._in_memory:
            return
        try:
            fd = open_regular_file(self.path, os.O_RDWR)
        except OSError as exc:
            raise StorageError(f"Error while appending to index {self.path}: {exc}") from exc
        try:
            os.posix_fallocate(fd, position, self.entry_size)
        except OSError as exc:
            if exc.errno == _errno.ENOSPC:
                raise LogDirFullError(f"No space left to append to index {self.path}") from exc
            if exc.errno not in (_errno.EOPNOTSUPP, _errno.EINVAL):
                raise StorageError(f"Error while appending to index {self.path}: {exc}") from exc
        finally:
            os.close(fd)

    def _mapped(self) -> mmap.mmap:
        mm = self._mmap
        if mm is None:
            raise StorageError(f"{self._kind.capitalize()} {self.path} is closed")
        return mm

    # -- state ------------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def in_memory(self) -> bool:
        """True when the entries live only in memory (nothing of it is ever written to its file)."""
        return self._in_memory

    def entries_bytes(self) -> bytes:
        """The valid entries as stored (a copy)."""
        mm = self._mmap
        return bytes(mm[:self._entries * self.entry_size]) if mm is not None and self._entries else b""

    @property
    def size_in_bytes(self) -> int:
        """Bytes of valid entries: what the file will be trimmed to."""
        return self._entries * self.entry_size

    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    def relative_offset(self, offset: int) -> int:
        relative = offset - self.base_offset
        if relative < 0 or relative > _INT32_MAX:
            raise IndexOffsetOverflowError(f"Integer overflow for offset: {offset} ({self.path})")
        return relative

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    # -- sizing -----------------------------------------------------------------------------

    def resize(self, new_size: int) -> bool:
        """Set the file (and mapping) to ``new_size`` rounded down to the entry size.

        Returns False when it already has that size.  Used to trim an index when
        its segment stops being active and to re-grow the active segment's index
        after a restart.
        """
        with self._lock:
            rounded = self._round_down(new_size)
            if rounded == self.length:
                logger.debug("Index %s was not resized because it already has size %d", self.path, rounded)
                return False
            if rounded < self._entries * self.entry_size:
                raise InvalidRequestError(
                    f"Cannot resize {self._kind} {self.path} to {rounded} bytes: "
                    f"it holds {self._entries} entries of {self.entry_size} bytes")
            if self._in_memory:
                # A copy into a new anonymous map: the old one is dropped, not closed (see below).
                mm = mmap.mmap(-1, rounded) if rounded else None
                if mm is not None and self._mmap is not None:
                    keep = self._entries * self.entry_size
                    mm[:keep] = self._mmap[:keep]
                self._mmap = mm
                self.length = rounded
                self.max_entries = rounded // self.entry_size
                self._closed = False
                return True
            if not self.writable:
                raise InvalidRequestError(f"Cannot resize {self._kind} {self.path}: opened read-only")
            fd = open_regular_file(self.path, os.O_RDWR)
            try:
                os.ftruncate(fd, rounded)
                self._size_unsynced = True
                # The old mapping is dropped, not closed: a lock-free reader may
                # still be inside it, and it only reads entries that survive.
                self._mmap = mmap.mmap(fd, rounded, access=mmap.ACCESS_WRITE) if rounded else None
            finally:
                os.close(fd)
            self.length = rounded
            self.max_entries = rounded // self.entry_size
            self._closed = False
            logger.debug("Resized %s to %d, position is %d and limit is %d", self.path, rounded,
                         self._entries * self.entry_size, rounded)
            return True

    def trim_to_valid_size(self) -> None:
        """Shrink the file to its valid entries (a segment that stops being active)."""
        with self._lock:
            self.resize(self._entries * self.entry_size)

    def reset(self) -> None:
        """Remove every entry and re-grow to ``max_index_size`` (before a rebuild)."""
        with self._lock:
            self.truncate()
            self.resize(self.max_index_size)

    def _truncate_to_entries(self, entries: int) -> None:
        with self._lock:
            self._entries = entries
            self._refresh_last()
            logger.debug("Truncated %s %s to %d entries; position is now %d", self._kind, self.path,
                         entries, entries * self.entry_size)

    def _refresh_last(self) -> int:
        """Refresh the subclass's cached last entry (on open, and after the entry count changed);
        returns the offset of that entry (the base offset when empty)."""
        return self.base_offset

    def truncate(self) -> None:
        """Remove all entries."""
        self._truncate_to_entries(0)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry for an offset >= ``offset`` (log truncation).

        Both layouts keep their entries ordered by relative offset (the time
        index because it only appends increasing timestamps for increasing
        offsets), so one search over the offset field serves both.
        """
        field = self._relative_offset_field
        with self._lock:
            entries = self._entries
            relative = offset - self.base_offset
            slot = -1
            if entries:
                slot = _search(self._mapped(), entries, relative, _I32.unpack_from, self.entry_size, field,
                               self._warm_entries, False)
            if slot < 0:
                new_entries = 0
            elif _I32.unpack_from(self._mapped(), slot * self.entry_size + field)[0] == relative:
                new_entries = slot
            else:
                new_entries = slot + 1
            self._truncate_to_entries(new_entries)

    # -- lifecycle --------------------------------------------------------------------------

    def flush(self) -> None:
        """Write dirty pages of the mapping to disk (Kafka's ``mmap.force``), and the file's size if it changed.

        A sealed segment's trimmed index must come back trimmed after a power
        loss: one that comes back at its preallocated size, zero-filled, is
        rebuilt at the next load (issue 18).
        """
        with self._lock:
            if not self.writable or self._in_memory:
                return
            mm = self._mmap
            if mm is not None and not self._size_unsynced:
                mm.flush()
            if self._size_unsynced:         # the fsync writes the mapping's dirty pages too (one page cache)
                try:
                    fd = open_regular_file(self.path, os.O_RDONLY)
                except FileNotFoundError:
                    return          # deleted meanwhile: nothing left to make durable
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._size_unsynced = False

    def close(self) -> None:
        """Trim to the valid entries, make that durable, and release the mapping (a clean shutdown).

        Durable before the clean-shutdown marker is written: the marker makes
        the next load trust the indexes as they are on disk.
        """
        with self._lock:
            if self.writable and not self._closed and not self._in_memory:
                self.trim_to_valid_size()
                self.flush()
            self.close_handler()

    def close_handler(self) -> None:
        """Release the mapping without trimming (the files are about to go away)."""
        with self._lock:
            self._mmap = None
            self._closed = True

    def delete_if_exists(self) -> bool:
        """Release the mapping and unlink the file; False if it was already gone."""
        self.close_handler()
        if self._in_memory:
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True

    def rename_to(self, new_path: str) -> None:
        """Rename the file (segment suffixes: ``.deleted``, ``.cleaned``, ``.swap``).

        Like Kafka, the index follows the new name even when the rename fails, so
        a later delete goes where the caller expects.
        """
        new_path = os.fspath(new_path)
        try:
            os.replace(self.path, new_path)
        finally:
            self.path = new_path

    def update_parent_dir(self, parent_dir: str) -> None:
        """Follow a renamed partition directory (the file itself moved with it)."""
        self.path = os.path.join(parent_dir, os.path.basename(self.path))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(path={self.path!r}, base_offset={self.base_offset}, "
                f"entries={self._entries}, max_entries={self.max_entries})")

    def _log_loaded(self, max_index_size: int, last_offset: int) -> None:
        """Kafka's DEBUG line of an index opened (its last offset as the subclass knows it)."""
        logger.debug("Loaded index file %s with maxEntries = %d, maxIndexSize = %d, entries = %d, "
                     "lastOffset = %d, file position = %d", self.path, self.max_entries, max_index_size,
                     self._entries, last_offset, self._entries * self.entry_size)


class OffsetIndex(AbstractIndex):
    """Kafka's ``OffsetIndex``: relative offset -> byte position in the segment's ``.log``.

    Sparse: the segment adds an entry every ``index.interval.bytes`` of log, so a
    lookup lands at most that many bytes before the wanted batch.
    """

    entry_size = 8
    _kind = "index"

    def _read_last_offset(self) -> int:
        if self._entries == 0:
            return self.base_offset
        relative: int = _I32.unpack_from(self._mapped(), (self._entries - 1) * 8)[0]
        return self.base_offset + relative

    def _refresh_last(self) -> int:
        self._last_offset = self._read_last_offset()
        return self._last_offset

    @property
    def last_offset(self) -> int:
        """The offset of the last entry; the base offset when empty."""
        return self._last_offset

    def sanity_check(self) -> None:
        """Kafka's checks, plus one: with two or more entries the last must exceed the first.

        Kafka only checks that the last offset is not below the base offset, which a
        zero-filled preallocated tail passes (relative offset 0).  Entries are
        strictly increasing, so ``last > first`` holds for every valid index, costs
        two reads, and catches that tail.
        """
        entries = self._entries
        if entries and self._last_offset < self.base_offset:
            raise CorruptIndexError(
                f"Corrupt index found, index file {self.path} has non-zero size but the last offset is "
                f"{self._last_offset} which is less than the base offset {self.base_offset}")
        if entries >= 2:
            first = self.base_offset + _I32.unpack_from(self._mapped(), 0)[0]
            if self._last_offset <= first:
                raise CorruptIndexError(
                    f"Corrupt index found, index file {self.path} has {entries} entries but the last offset "
                    f"{self._last_offset} is not larger than the first offset {first}")
        if self.length % self.entry_size:
            raise CorruptIndexError(
                f"Index file {self.path} is corrupt, found {self.length} bytes which is neither positive "
                f"nor a multiple of {self.entry_size}")

    def append(self, offset: int, position: int) -> None:
        """Add ``offset -> position``; offsets must strictly increase."""
        with self._lock:
            if not self.writable:
                raise InvalidRequestError(f"Cannot append to index {self.path}: opened read-only")
            entries = self._entries
            if entries >= self.max_entries:
                raise IndexFullError(f"Attempt to append to a full index (size = {entries}) {self.path}")
            if entries and offset <= self._last_offset:
                raise InvalidOffsetError(
                    f"Attempt to append an offset {offset} to position {entries} no larger than the last "
                    f"offset appended ({self._last_offset}) to {self.path}")
            relative = self.relative_offset(offset)
            if not 0 <= position <= _INT32_MAX:
                raise InvalidOffsetError(f"Position {position} of offset {offset} does not fit in index {self.path}")
            pos = entries * 8
            self._reserve(pos)
            _OFFSET_ENTRY.pack_into(self._mapped(), pos, relative, position)
            self._last_offset = offset
            self._entries = entries + 1   # published last: readers see only complete entries

    def lookup(self, target_offset: int, _unpack: _UnpackFrom = _I32.unpack_from,
               _unpack_entry: _UnpackFrom = _OFFSET_ENTRY.unpack_from) -> tuple[int, int]:
        """The ``(offset, position)`` of the largest entry <= target, else ``(base_offset, 0)``."""
        # The hot path of every view read: _search inlined, entry count read before
        # the mapping (see the module docstring).
        entries = self._entries
        base = self.base_offset
        if entries == 0:
            return (base, 0)
        mm = self._mmap
        if mm is None:
            mm = self._mapped()
        target = target_offset - base
        lo = entries - 1 - self._warm_entries
        if lo < 0:
            lo = 0
        if _unpack(mm, lo << 3)[0] < target:
            hi = entries - 1
        elif _unpack(mm, 0)[0] > target:
            return (base, 0)
        else:
            hi, lo = lo, 0
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            found = _unpack(mm, mid << 3)[0]
            if found > target:
                hi = mid - 1
            elif found < target:
                lo = mid
            else:
                lo = mid
                break
        relative, position = _unpack_entry(mm, lo << 3)
        return (base + relative, position)

    def entry(self, n: int) -> tuple[int, int]:
        """The ``n``-th entry as ``(offset, position)``."""
        if not 0 <= n < self._entries:
            raise InvalidRequestError(
                f"Attempt to fetch the {n}th entry from index {self.path}, which has size {self._entries}")
        relative, position = _OFFSET_ENTRY.unpack_from(self._mapped(), n * 8)
        return (self.base_offset + relative, position)

    def fetch_upper_bound_offset(self, fetch_position: int, fetch_size: int) -> tuple[int, int] | None:
        """The first entry whose position is >= ``fetch_position + fetch_size``, if any.

        Bounds a read of ``fetch_size`` bytes to whole indexed batches.
        """
        entries = self._entries
        if entries == 0:
            return None
        mm = self._mapped()
        slot = _search(mm, entries, fetch_position + fetch_size, _I32.unpack_from, 8, 4,
                       self._warm_entries, True)
        if slot < 0:
            return None
        relative, position = _OFFSET_ENTRY.unpack_from(mm, slot * 8)
        return (self.base_offset + relative, position)



class TimeIndex(AbstractIndex):
    """Kafka's ``TimeIndex``: timestamp -> relative offset of the first batch reaching it.

    Only ever-increasing timestamps are stored, so a binary search over the
    timestamps answers "first offset whose timestamp is >= T" (ListOffsets,
    ``since/<T>``) and time retention reads the segment's largest timestamp.
    The last slot is reserved for the entry written when the segment rolls.
    """

    entry_size = 12
    _relative_offset_field = 8
    _kind = "time index"

    def _read_last_entry(self) -> tuple[int, int]:
        if self._entries == 0:
            return (-1, self.base_offset)
        timestamp, relative = _TIME_ENTRY.unpack_from(self._mapped(), (self._entries - 1) * 12)
        return (timestamp, self.base_offset + relative)

    def _refresh_last(self) -> int:
        self._last_entry = self._read_last_entry()
        return self._last_entry[1]

    @property
    def last_entry(self) -> tuple[int, int]:
        """``(timestamp, offset)`` of the last entry; ``(-1, base_offset)`` when empty."""
        return self._last_entry

    def is_full(self) -> bool:
        # One slot is kept for the entry LogSegment.on_becoming_inactive_segment adds at roll.
        return self._entries >= self.max_entries - 1

    def resize(self, new_size: int) -> bool:
        with self._lock:
            if super().resize(new_size):
                self._last_entry = self._read_last_entry()
                return True
            return False

    def sanity_check(self) -> None:
        """Kafka's checks: the last timestamp not below the first, the last offset not below the
        base, whole entries -- tightened, as for the offset index, to "last timestamp above the
        first" with two or more entries, which an all-zero preallocated file fails."""
        entries = self._entries
        last_timestamp, last_offset = self._last_entry
        if entries:
            first_timestamp = _I64.unpack_from(self._mapped(), 0)[0]
            if last_timestamp < first_timestamp or (entries >= 2 and last_timestamp == first_timestamp):
                raise CorruptIndexError(
                    f"Corrupt time index found, time index file ({self.path}) has {entries} entries but the last "
                    f"timestamp is {last_timestamp} which is not larger than the first timestamp {first_timestamp}")
            if last_offset < self.base_offset:
                raise CorruptIndexError(
                    f"Corrupt time index found, time index file ({self.path}) has non-zero size but the last "
                    f"offset is {last_offset} which is less than the first offset {self.base_offset}")
        if self.length % self.entry_size:
            raise CorruptIndexError(
                f"Time index file {self.path} is corrupt, found {self.length} bytes which is neither positive "
                f"nor a multiple of {self.entry_size}")

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Add ``timestamp -> offset`` if the timestamp is larger than the last one.

        A timestamp not above the last is ignored rather than refused: the same
        entry is offered again when a segment is closed or rolled, and the index
        must stay strictly increasing for its binary search.  An offset below the
        last one is a caller bug and raises :class:`InvalidOffsetError`.
        """
        with self._lock:
            if not self.writable:
                raise InvalidRequestError(f"Cannot append to time index {self.path}: opened read-only")
            entries = self._entries
            if not skip_full_check and entries >= self.max_entries - 1:
                raise IndexFullError(f"Attempt to append to a full time index (size = {entries}) {self.path}")
            last_timestamp, last_offset = self._last_entry
            if entries and offset < last_offset:
                raise InvalidOffsetError(
                    f"Attempt to append an offset ({offset}) to slot {entries} no larger than the last offset "
                    f"appended ({last_offset}) to {self.path}")
            if timestamp <= last_timestamp:
                return
            if entries >= self.max_entries:
                raise IndexFullError(f"Attempt to append to a full time index (size = {entries}) {self.path}")
            relative = self.relative_offset(offset)
            pos = entries * 12
            self._reserve(pos)
            _TIME_ENTRY.pack_into(self._mapped(), pos, timestamp, relative)
            self._last_entry = (timestamp, offset)
            self._entries = entries + 1

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """``(timestamp, offset)`` of the largest entry with timestamp <= target, else ``(-1, base_offset)``."""
        entries = self._entries
        if entries == 0:
            return (-1, self.base_offset)
        mm = self._mmap
        if mm is None:
            mm = self._mapped()
        slot = _search(mm, entries, target_timestamp, _I64.unpack_from, 12, 0, self._warm_entries, False)
        if slot < 0:
            return (-1, self.base_offset)
        timestamp, relative = _TIME_ENTRY.unpack_from(mm, slot * 12)
        return (timestamp, self.base_offset + relative)

    def entry(self, n: int) -> tuple[int, int]:
        """The ``n``-th entry as ``(timestamp, offset)``."""
        if not 0 <= n < self._entries:
            raise InvalidRequestError(
                f"Attempt to fetch the {n}th entry from time index {self.path} which has size {self._entries}")
        timestamp, relative = _TIME_ENTRY.unpack_from(self._mapped(), n * 12)
        return (timestamp, self.base_offset + relative)

