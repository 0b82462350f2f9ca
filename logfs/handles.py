"""What opening a node gives: the generic handles (bytes, views, raw files, line commands)."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from engine.errors import StorageError
from logfs.errors import AccessDeniedError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from engine.views import LogView


class Handle:
    """What an ``open()`` of a node returns; ``logfs.fs`` keeps one per file handle.

    ``direct_io`` bypasses the page cache: the kernel forwards every read to us
    and does not trust ``st_size`` for EOF, which is what generated files whose
    content changes between opens need.  ``blocking`` marks handles whose
    writes touch the disk beyond one ``os.write`` (config files, deletion
    markers, fsync) and so run off the trio thread.
    """

    direct_io = True
    #: keep the inode's cached pages at open: only for content that is a function of the inode (views)
    keep_cache = False

    @property
    def blocking(self) -> bool:
        """Whether writes run off the trio thread (a class attribute in most handles)."""
        return False

    #: reads of at least this many bytes run in a worker thread (None: always inline)
    offload_reads_from: int | None = None
    #: what ``release`` refused with no caller left to tell, (errno, reason): logfs.fs lists it in .logfs/errors
    refused_at_release: tuple[int, str] | None = None
    #: the pid of the process that opened it (0: unknown), set by logfs.fs at open
    opener = 0

    def continues_at(self, offset: int) -> bool:
        """Whether a read at ``offset`` continues the last one at a bounded cost (then served inline)."""
        return False

    def may_wait_on_store(self, offset: int, size: int) -> bool:
        """Whether a read may wait on tiered storage's remote store (then always served by a worker thread)."""
        return False

    def opened(self, flags: int) -> None:
        """The ``open(2)`` flags the handle was opened with (``O_TRUNC``, ``O_APPEND``...)."""

    def read(self, offset: int, size: int) -> bytes | memoryview:
        """Up to ``size`` bytes at ``offset``: any buffer (FUSE replies from it without a copy)."""
        return b""

    def write(self, offset: int, data: bytes) -> int:
        raise AccessDeniedError("File is read-only")

    def truncate(self, size: int) -> None:
        """``ftruncate(fd, size)`` of this opening (the node said it is writable); accepted without effect."""

    def flush(self) -> None:
        """close() of one descriptor: commit what is buffered, report its error."""

    def fsync(self) -> None:
        """fsync(): nothing is buffered outside the engine for read-only files."""

    def release(self) -> None:
        """Last descriptor closed."""

    def shutdown(self) -> None:
        """The mount stops with this opening still held: no close() of it will come."""
        self.release()


class BytesHandle(Handle):
    """A snapshot of a generated file taken at open, so one reader sees one version."""

    __slots__ = ("_content",)

    def __init__(self, content: bytes) -> None:
        self._content = content

    def read(self, offset: int, size: int) -> bytes:
        return self._content[offset:offset + size]


class ViewHandle(Handle):
    """Reads of a ``LogView``: the hot path of ``cat records``.

    A large read that must look its position up (a first read, a seek, a
    segment's view index to load) may take tens of milliseconds; done in a
    worker thread it lets appends and small requests on the trio thread
    interleave with it (the GIL switches every few ms) for the price of one
    thread hop per read.  Small reads (``head``, ``wc``'s 16 KiB) and reads
    that continue the view's cursor (``continues_at``: a sequential reader,
    the kernel's readahead; at most one 1 MiB request's batches) stay inline,
    where the hop would dominate (docs/performance.md, "Figures behind the
    code").

    Without ``direct_io`` the opening keeps the pages the kernel cached for the
    inode (``keep_cache``): a view's inode is one rendering whose bytes only
    grow at the end (``ViewIdentity``; a deletion or a clean below it gives
    the name a new inode), and a change of its size or mtime makes the kernel
    drop them (see ``logfs.fs``).
    """

    __slots__ = ("_view", "direct_io", "keep_cache")
    offload_reads_from = 128 * 1024

    def __init__(self, view: LogView, direct_io: bool) -> None:
        self._view = view
        self.direct_io = direct_io
        self.keep_cache = not direct_io

    def read(self, offset: int, size: int) -> bytes | memoryview:
        return self._whole(self._view.read_buffer(offset, size), offset, size)

    def continues_at(self, offset: int) -> bool:
        return self._view.continues_at(offset)

    def may_wait_on_store(self, offset: int, size: int) -> bool:
        return self._view.may_wait_on_store(offset, size)

    def _whole(self, data: bytes | memoryview, position: int, size: int) -> bytes | memoryview:
        """``data`` read at view ``position``: through the page cache, short of ``size`` only at the view's end.

        A short answer means end of file to the kernel, which fills the rest of
        the request's pages with zeros and keeps them.  So what the view holds
        after ``data`` (an append rendered since) is added; and the view answers
        a read that meets a damaged batch with the good bytes before it (direct
        I/O hands them to the reader, whose next read fails with EIO), which
        through the page cache would end the file there, the reader stopping
        without an error: a page-cache opening fails the whole request with the
        damaged batch's error instead (EIO, logged with its ``.log`` and
        position); the kernel then reads page by page up to the damaged one.
        """
        if not self.keep_cache or len(data) >= size:
            return data
        pieces = [data]
        got = len(data)
        while got < size:
            more = self._view.read_buffer(position + got, size - got)    # a damaged batch: CorruptRecordError
            if not more:
                if position + got >= self._view.size():
                    break
                more = self._view.read_buffer(position + got, size - got)   # the view grew since that read
                if not more:
                    raise StorageError(f"Read of {size} bytes at {position} of a view ended after {got} bytes "
                                       "before its end")
            pieces.append(more)
            got += len(more)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class RawFileHandle(Handle):
    """A segment file as on disk (``.log``, ``.index``, ``.timeindex``), up to its used size.

    ``size`` gives the bytes that hold data at the moment of the read: the
    valid batches of a ``.log`` and the written entries of an index (the
    active segment's indexes are preallocated to ``segment.index.bytes`` and
    its ``.log`` may be preallocated too; Kafka trims them at the roll).
    """

    __slots__ = ("_fd", "_size")

    def __init__(self, fd: int, size: Callable[[], int]) -> None:
        self._fd = fd
        self._size = size

    def read(self, offset: int, size: int) -> bytes:
        end = self._size()
        if offset >= end:
            return b""
        return os.pread(self._fd, min(size, end - offset), offset)

    def release(self) -> None:
        os.close(self._fd)


class RemoteFileHandle(Handle):
    """A file of a remote log segment (``segments/<base>.log`` of a copy only in the store), read-only.

    Every read runs in a worker thread (it may wait for the store, up to the
    engine's bound); the engine answers with the copy's bytes or an error with
    the store's errno, never a short read before the file's end.
    """

    __slots__ = ("_read",)
    offload_reads_from = 0

    def __init__(self, read: Callable[[int, int], bytes]) -> None:
        self._read = read

    def read(self, offset: int, size: int) -> bytes:
        return self._read(offset, size)


class LineHandle(Handle):
    """A control file written in lines (``delete``, ``groups/<group>``, ``config``): what they share.

    The complete lines of each ``write()`` go to :meth:`take_lines` together,
    so its error is that write's error; the unfinished last line is kept for
    the next write (:meth:`check_rest` may refuse it) and taken at close
    (:meth:`_pop_rest`, under the lock).  Reads return the file as it was at open.
    """

    blocking = True

    def __init__(self, content: bytes = b"") -> None:
        self._content = content
        self._partial = b""
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        return self._content[offset:offset + size]

    def write(self, offset: int, data: bytes) -> int:
        with self._lock:
            lines = (self._partial + data).split(b"\n")
            rest = lines.pop()
            self.take_lines(lines)
            self.check_rest(rest)
            self._partial = rest
        return len(data)

    def take_lines(self, lines: list[bytes]) -> None:
        """The complete lines of one write (under the lock); raising fails that write."""
        raise NotImplementedError

    def check_rest(self, rest: bytes) -> None:
        """The unfinished last line after a write (under the lock); raising fails that write."""

    def _pop_rest(self) -> bytes:
        """The unfinished last line, taken away at close (b"" when blank); call under the lock."""
        rest, self._partial = self._partial, b""
        return rest if rest.strip() else b""


class LineCommandHandle(LineHandle):
    """Line-oriented control file (``delete``).

    The complete lines of each ``write()`` are applied together, so one
    ``echo`` is all-or-nothing and its error is that write's error; a last line
    without a newline is applied when the descriptor is closed (flush).
    """

    def __init__(self, apply: Callable[[list[bytes]], None], content: bytes = b"") -> None:
        super().__init__(content)
        self._apply = apply

    def take_lines(self, lines: list[bytes]) -> None:
        lines = [line for line in lines if line.strip()]
        if lines:
            self._apply(lines)

    def flush(self) -> None:
        with self._lock:
            rest = self._pop_rest()
            if rest:
                self._apply([rest])

    release = flush
