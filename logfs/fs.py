"""The ``pyfuse3.Operations`` of the mount: inodes, attributes, handles and errnos.

Everything a name means lives in the namespace (``logfs.namespace``, ``logfs.dirs``,
``logfs.nodes``); this module only maps it onto FUSE:

* an inode table: one inode per node object, for as long as the kernel
  remembers it (lookup counts, ``forget``) or a handle is open.  The namespace
  returns the same node for a name while it is the same file (see
  ``logfs.namespace``), so one path is one inode; a forgotten content node
  leaves the namespace's table too, so lookups cost no memory over time;
* attributes: entry and attribute timeouts are the node's: 0 for files whose
  size grows with every append (the kernel asks again at every path walk and
  ``fstat``), ``STABLE_TIMEOUT_S`` for the stable names (directories,
  ``append``, ``delete``), whose deletion with their topic is invalidated
  (``_topic_deleted``); ``st_blocks`` is what a file stores (``du``);
* errno translation: an ``engine.errors.LogfsError`` becomes
  ``FUSEError(exc.errno)`` and one log line naming the cause (SPEC.md section
  7), the same refusal repeated within a minute (a tool polling a bad name)
  logged once; each refusal logged at INFO or above is also a line of
  ``.logfs/errors`` (``logfs.refusals``);
* editors' and tools' temporary files next to ``config`` and ``append``
  (``logfs.tempfiles``): created, renamed over those files, removed; and
  ``mv``'s unlink then create of ``config``, one replacement (``_ConfigUnlinks``);
* ``rm -r`` of a topic: a process that listed a topic's directories may unlink
  and rmdir what is inside without effect, so its final rmdir of the topic
  directory deletes the topic as ``rmdir`` alone does (see ``_RecursiveRemovals``).

Views are served through the kernel's page cache (``--page-cache``, the
default; ``--no-page-cache`` serves them with ``direct_io``, every read from
this process), exactly:

* an opening keeps the pages cached for its inode (``keep_cache``): a view's
  inode is one rendering whose bytes only grow at its end (a deletion, a clean
  or a recreation gives the name a new inode, ``ViewIdentity``), except a
  followed ``records`` opened after its first bytes were deleted (its reads are
  shifted: direct I/O) and consumer views (what is read is committed: direct);
* attributes are cached ``nodes.VIEW_ATTR_TIMEOUT_S`` and dropped at every
  change of the partition's log end (``_views_changed``: ``invalidate_inode``
  with ``attr_only``, which locks no page, so it cannot wait on a request of
  this process); the kernel then asks the size again at a read at EOF or an
  ``fstat``, and drops the cached pages of a view whose size or mtime changed
  (FUSE's auto_inval_data; a truncation of the log moves the mtime too).
  The kernel ignores attributes answered while an invalidation of the inode
  came in (``fuse_change_attributes``: its ``attr_version`` moved), so an inode
  is invalidated once until the kernel asks again, and a change within
  ``_ATTR_SETTLE_S`` of an answer is invalidated that much later (but before
  the answer to the ``write()`` or ``flush()`` of this mount that made it, so a
  writer's next ``fstat`` sees its records: read-your-writes): on a log that
  grows all the time (a busy partition fetched by a cluster mount) the kernel
  otherwise kept the size of the lookup, 0, and ``cat`` read nothing, exit 0.
  An invalidation that finds no inode in the kernel (the answer to its first
  lookup not yet applied) is sent again, and a read-only open invalidates a
  size that changed since its last answer whatever was sent before;
* the kernel never shows the zeros it fills a short read with.  A READ
  answered short means end of file to it: it zero-fills the rest of the
  request's pages and keeps them, hidden only while the size it holds is no
  larger than where the answer ended.  So no size of a view inode is answered
  beyond the end of a short READ answer whose pages the kernel may still hold
  (``_zero_fills``): the request that would answer it first has the kernel
  drop the inode's pages (``invalidate_inode`` of the data, from a worker
  thread: it waits for READs in flight, which this thread answers), and a
  ``write()``/``flush()`` does that before its answer for what it appended.
  The kernel's own drop at a new size comes after it sets the size (page by
  page, the zero-filled last page last): a reader on another CPU would read
  the zeros in between.  A short answer is rendered on the trio thread, where
  every size is answered, in the step that sends it: one rendered in a worker
  thread is rendered again there, so it never ends below a size answered
  while the thread ran (the kernel, which got that size first, would keep the
  zeros inside it);
* large reads of one opening run in arrival order (readahead sends the next
  before the current one is answered), and the mount raises the kernel's
  readahead to 1 MiB (``cli._raise_readahead``, root only).

``scripts/bench/bench_reads.py`` measures both modes beside a plain file.  With
``--page-cache`` a mapping (``mmap``) of a view reads its pages like ``read``;
files served with ``direct_io`` refuse it with ENODEV.  A damaged batch fails
a page-cache read whole (``ViewHandle._whole``): the good bytes before it
reach the reader in whole pages only (direct I/O hands over every one).

Appends and view reads run on the trio thread (they are one ``os.write`` /
a few ``pread``s in the engine); anything that may fsync or walk directories
goes to a worker thread with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import itertools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import pyfuse3
import trio

from engine.errors import LogfsError, OffsetOutOfRangeError, ReadOnlyError
from logfs.access import MountAccess
from logfs.dirs import RootDir, TopicDir
from logfs.errors import (
    AccessDeniedError,
    MalformedNameError,
    NoSuchNameError,
    NotPermittedError,
    RetryAfterRelease,
)
from logfs.nodes import Directory, FileNode, Node, ViewFile
from logfs.tempfiles import TempFile, TempFiles

if TYPE_CHECKING:
    from engine.topic import TopicPartition
    from logfs.handles import Handle
    from logfs.namespace import Namespace
    from logfs.tree import NodeKey

log = logging.getLogger(__name__)

__all__ = ["LogfsOperations"]

#: st_blksize of files: coreutils (cat, cp, dd-less tools) size their buffers
#: from it, and 1 MiB is the largest request FUSE sends (256 pages), so a
#: ``cat`` into ``append`` writes one 1 MiB batch per syscall instead of 128 KiB.
BLOCK_SIZE = 1 << 20

#: set while the kernel itself removes a topic's entry (rmdir): no invalidation then, it would deadlock
_KERNEL_REMOVES: contextvars.ContextVar[bool] = contextvars.ContextVar("kernel_removes", default=False)

#: how long an open waits for a release on its way (``RetryAfterRelease``), and how often it looks
_RELEASE_WAIT_S = 2.0
#: how long after answering a view's attributes a change of its log waits to invalidate them (see the docstring)
_ATTR_SETTLE_S = 0.05
#: how many times a request drops an inode's zero-filled pages (READs answered short meanwhile add more) before
#: it answers the size below them and has the kernel ask again later
_ZERO_FILL_DROPS = 3
_RELEASE_POLL_S = 0.002

#: renameat2's flag: fail with EEXIST rather than replace (emacs takes its lock file with it)
_RENAME_NOREPLACE = 1

#: the topic's config file: unlinked and created again by ``mv`` (see _ConfigUnlinks)
_CONFIG = "config"

# errnos that are part of normal operation (shells probe names, tools test for files)
_QUIET_ERRNOS = frozenset({errno.ENOENT, errno.ESTALE})
#: errnos of a name that went away between a listing and its lookup (readdir leaves it out)
_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESTALE})


class _RefusalLog:
    """Each refusal logged once per minute: a name polled by ``tail -F`` must not flood the log."""

    _WINDOW_S = 60.0
    _MAX_REMEMBERED = 1024

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def log(self, level: int, message: str, *args: object) -> None:
        text = message % args
        now = time.monotonic()
        seen = self._last.get(text)
        if seen is not None and now - seen < self._WINDOW_S:
            return
        if len(self._last) >= self._MAX_REMEMBERED:
            self._last.clear()
        self._last[text] = now
        log.log(level, "%s", text)


_refusals = _RefusalLog()


def _level_of(exc: LogfsError) -> int:
    if getattr(exc, "quiet", False):
        return logging.DEBUG
    if isinstance(exc, (MalformedNameError, OffsetOutOfRangeError)):
        return logging.INFO        # a name a user typed (since/notatime, offset/007, from/99999)
    if exc.errno in _QUIET_ERRNOS:
        return logging.DEBUG
    return logging.WARNING


#: An operation of LogfsOperations: _translating keeps its signature.
_Op = TypeVar("_Op", bound=Callable[..., Coroutine[Any, Any, Any]])


def _translating(op: _Op) -> _Op:
    """Turn engine and OS exceptions into FUSEError, logging the cause once."""

    @functools.wraps(op)
    async def wrapper(self: LogfsOperations, *args: Any) -> Any:     # Any: the operation's own
        try:
            return await op(self, *args)
        except pyfuse3.FUSEError:
            raise
        except LogfsError as exc:
            code = errno.errorcode.get(exc.errno, exc.errno)
            level = _level_of(exc)
            _refusals.log(level, "%s failed (%s): %s", op.__name__, code, exc)
            if level > logging.DEBUG:
                self._record_refusal(op.__name__, args, exc.errno, exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            code = exc.errno or errno.EIO
            _refusals.log(logging.WARNING, "%s failed (%s): %s", op.__name__, errno.errorcode.get(code, code), exc)
            self._record_refusal(op.__name__, args, code, exc)
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            log.exception("%s failed with an unexpected error", op.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return cast("_Op", wrapper)   # cast: the wrapper keeps the wrapped operation's signature


class _RecursiveRemovals:
    """Which processes are removing a topic recursively (``rm -r``, ``shutil.rmtree``, ``find -delete``).

    A recursive removal lists a directory before it unlinks its entries and
    removes the directory last.  The files of a topic cannot be removed one by
    one (EPERM), and ``rm`` never removes a directory after failing on one of
    its entries, so for a process that listed the topic's directory,
    unlinking and rmdir inside the topic are accepted without
    effect; its final rmdir of the topic directory deletes the topic.  Any
    other process gets EPERM.  Entries expire after five minutes.
    """

    _TTL_S = 300.0
    _MAX = 1024

    def __init__(self) -> None:
        self._listed: dict[tuple[int, str], float] = {}

    def listed(self, pid: int, topic: str) -> None:
        if len(self._listed) >= self._MAX:
            self._expire()
        self._listed[(pid, topic)] = time.monotonic()

    def removing(self, pid: int, topic: str) -> bool:
        seen = self._listed.get((pid, topic))
        return seen is not None and time.monotonic() - seen < self._TTL_S

    def done(self, pid: int, topic: str) -> None:
        self._listed.pop((pid, topic), None)

    def _expire(self) -> None:
        now = time.monotonic()
        for key, seen in list(self._listed.items()):
            if now - seen >= self._TTL_S:
                del self._listed[key]
        if len(self._listed) >= self._MAX:
            self._listed.clear()


class _ConfigUnlinks:
    """``unlink`` of a topic's ``config``: the first half of a replacement (``mv ~/cfg t/config``).

    ``mv`` across filesystems removes the target, then creates it and copies
    the file into it.  The unlink is remembered for the process that made it
    and changes nothing yet: that process no longer sees ``config`` (so its
    ``O_CREAT|O_EXCL`` goes through) and its create of ``config`` opens a
    replacement, applied at close whole or not at all as ``>`` is
    (``logfs.control.ConfigEditHandle``).  If the process exits (or a minute
    passes) without creating it, the unlink applies: every override is
    removed, the file shows the defaults.
    """

    _TTL_S = 60.0

    def __init__(self) -> None:
        self._pending: dict[tuple[NodeKey, int], tuple[float, Node]] = {}

    def unlinked(self, parent: Node, pid: int, config: Node) -> None:
        self._pending[(parent.key, pid)] = (time.monotonic(), config)

    def hidden(self, parent: Node, pid: int) -> bool:
        return (parent.key, pid) in self._pending

    def take(self, parent: Node, pid: int) -> bool:
        """The process's create of ``config``: the unlink becomes that opening's replacement."""
        return self._pending.pop((parent.key, pid), None) is not None

    def settle(self) -> list[Node]:
        """The config files whose unlink applies now: its process is gone or the minute has passed."""
        if not self._pending:
            return []
        now = time.monotonic()
        due = [key for key, (since, _) in self._pending.items()
               if now - since >= self._TTL_S or not os.path.exists(f"/proc/{key[1]}")]
        return [self._pending.pop(key)[1] for key in due]


#: operations whose first argument is a file handle, and those naming an entry of a directory
_HANDLE_OPS = frozenset({"read", "write", "flush", "fsync"})
_NAME_OPS = frozenset({"lookup", "mkdir", "rmdir", "unlink", "rename", "symlink", "mknod", "create"})


def _joined(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


class _Inode:
    __slots__ = ("node", "nlookup", "nopen")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.nlookup = 0
        self.nopen = 0


class _DirHandle:
    __slots__ = ("inode", "names")

    def __init__(self, inode: int, names: list[str]) -> None:
        self.inode = inode
        self.names = names


class LogfsOperations(pyfuse3.Operations):
    """FUSE operations over a :class:`logfs.namespace.Namespace`."""

    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, namespace: Namespace, access: MountAccess | None = None) -> None:
        super().__init__()
        #: the owner, group and mode bits of every name (logfs.access)
        self._access = access or MountAccess.of_process()
        self.ns = namespace
        self.read_only = namespace.read_only
        self._inodes: dict[int, _Inode] = {pyfuse3.ROOT_INODE: _Inode(namespace.root)}
        self._inodes[pyfuse3.ROOT_INODE].nlookup = 1
        # node object -> its inode; the _Inode entry holds the node, so an id is
        # never reused while it is a key here
        self._inode_of: dict[int, int] = {id(namespace.root): pyfuse3.ROOT_INODE}
        namespace.root.ino = pyfuse3.ROOT_INODE
        self._next_inode = pyfuse3.ROOT_INODE + 1
        self._handles: dict[int, tuple[int, Handle]] = {}
        #: fh -> the lock that keeps large reads of a page-cached view in their order (see read)
        self._read_locks: dict[int, trio.Lock] = {}
        self._dir_handles: dict[int, _DirHandle] = {}
        self._next_fh = 1
        self._uid = self._access.uid
        self._gid = self._access.gid
        self._removals = _RecursiveRemovals()
        self._config_unlinks = _ConfigUnlinks()
        self._temps = TempFiles(namespace)     # editors' and tools' temporary files (logfs.tempfiles)
        namespace.topic_deleted_listeners.append(self._topic_deleted)
        # partition -> inodes of its views whose attributes the kernel caches (page-cache mode)
        self._view_inodes: dict[TopicPartition, set[int]] = {}
        self._view_inodes_lock = threading.Lock()
        #: view inodes invalidated since the kernel last asked their attributes (under _view_inodes_lock)
        self._attrs_stale: set[int] = set()
        #: view inode -> when its attributes were last answered (monotonic) and the size answered, and the
        #: changes deferred meanwhile
        self._attrs_answered: dict[int, tuple[float, int]] = {}
        self._attrs_deferred: set[int] = set()
        self._attrs_timer: threading.Timer | None = None
        #: view inode -> (sequence number, end) of each READ answered short whose zero-filled pages the kernel
        #: may still hold (under _view_inodes_lock): no size beyond the smallest end is answered (see the docstring)
        self._zero_fills: dict[int, list[tuple[int, int]]] = {}
        self._zero_fill_seq = itertools.count()
        #: inodes of _zero_fills whose log end moved since a write() or flush() last dropped them
        self._zero_fills_grown: set[int] = set()
        namespace.views_changed_listeners.append(self._views_changed)

    # ------------------------------------------------------------------ inode table

    def _views_changed(self, tp: TopicPartition) -> None:
        """The log end of ``tp`` moved: drop the attributes the kernel cached of its views.

        Called from the thread that changed the log (the trio thread in a
        write, a replica fetcher, the cleaner...), under the log's lock.  Only
        attributes are invalidated (no page is locked, so this cannot wait on
        a request of this process); the kernel asks for the new size at the
        next ``fstat`` or read at EOF, and a size or mtime that changed makes
        it drop the view's cached pages (auto_inval_data).
        """
        now = time.monotonic()
        inodes = []
        with self._view_inodes_lock:
            for ino in self._view_inodes.get(tp, ()):
                if ino in self._zero_fills:
                    self._zero_fills_grown.add(ino)     # for the write() or flush() that made the change
                if ino in self._attrs_stale:
                    continue            # the kernel has not asked since: it will get the newest size
                if now - self._attrs_answered.get(ino, (-_ATTR_SETTLE_S, 0))[0] < _ATTR_SETTLE_S:
                    self._defer_locked(ino)       # an answer may be on its way to the kernel
                    continue
                self._attrs_stale.add(ino)
                inodes.append(ino)
        self._invalidate_attrs(inodes)

    def _settle_attrs(self, ino: int, node: Node) -> None:
        """A read-only open of ``ino``: if its size changed since the kernel last got it, its attributes are
        invalidated now (the kernel applied that answer before it sent the open), so the reader's first
        read at EOF asks the size again.

        This does not trust ``_attrs_stale``: an invalidation sent while the answer to the inode's first
        lookup was on its way found no inode in the kernel (ENOENT, see ``_invalidate_attrs``), and the
        kernel then holds that answer's size for the whole attribute timeout.  At the open the kernel holds
        the inode, so this invalidation reaches it.
        """
        with self._view_inodes_lock:
            answered = self._attrs_answered.get(ino)
        if answered is None or node.size() == answered[1]:
            return
        with self._view_inodes_lock:
            self._attrs_deferred.discard(ino)
            self._attrs_stale.add(ino)
        self._invalidate_attrs([ino])

    def _invalidate_written(self) -> None:
        """After a ``write()`` or ``flush()`` of this mount: what it appended is invalidated before the writer
        gets its answer, deferred or not, so an ``fstat`` or a read at EOF after it sees the new size
        (read-your-writes); only changes no request of this mount made wait out ``_ATTR_SETTLE_S``."""
        if self._attrs_deferred:
            self._invalidate_deferred()

    def _invalidate_deferred(self) -> None:
        with self._view_inodes_lock:
            inodes = [ino for ino in self._attrs_deferred if ino not in self._attrs_stale]
            self._attrs_stale.update(inodes)
            self._attrs_deferred.clear()
            self._attrs_timer = None
        self._invalidate_attrs(inodes)

    def _defer_locked(self, ino: int) -> None:
        """Invalidate ``ino``'s attributes ``_ATTR_SETTLE_S`` from now; the caller holds ``_view_inodes_lock``."""
        self._attrs_deferred.add(ino)
        if self._attrs_timer is None:
            self._attrs_timer = threading.Timer(_ATTR_SETTLE_S, self._invalidate_deferred)
            self._attrs_timer.daemon = True
            self._attrs_timer.start()

    def _invalidate_attrs(self, inodes: Sequence[int]) -> None:
        """Drop the kernel's cached attributes of ``inodes`` (marked stale by the caller).

        ENOENT for an inode this mount still holds means the kernel has not yet made it: the answer to its
        first lookup is on its way (the looking-up process applies it after it wakes, which a loaded machine
        can delay past ``_ATTR_SETTLE_S``).  That answer's size would then stand for the attribute timeout
        while the inode counts as stale, so the invalidation is deferred again until the kernel holds it.
        """
        for ino in inodes:
            try:
                pyfuse3.invalidate_inode(ino, attr_only=True)
            except OSError as exc:
                if exc.errno == errno.ENOENT and ino in self._inodes:
                    with self._view_inodes_lock:
                        if ino in self._attrs_answered:     # not forgotten meanwhile
                            self._attrs_stale.discard(ino)
                            self._defer_locked(ino)
                elif exc.errno not in (errno.ENOENT, errno.ENOTCONN, errno.ENODEV):   # forgotten, or unmounted
                    log.warning("Cannot invalidate the cached attributes of inode %d: %s", ino, exc)

    def _zero_filled(self, ino: int, end: int) -> None:
        """A READ of view inode ``ino`` answered short, ending at ``end``: the kernel zero-filled its pages on."""
        with self._view_inodes_lock:
            fills = self._zero_fills.setdefault(ino, [])
            if fills and fills[-1][1] == end:
                fills.pop()             # the same end again: the later one decides when its pages are gone
            fills.append((next(self._zero_fill_seq), end))

    def _zero_fill_below(self, ino: int) -> int | None:
        """Where the first zeros the kernel may hold of ``ino`` start (None: none); under _view_inodes_lock."""
        fills = self._zero_fills.get(ino)
        return min(end for _, end in fills) if fills else None

    async def _drop_zero_fills(self, ino: int, node: Node) -> None:
        """Before a size of ``ino`` is answered: the kernel drops the zero-filled pages that size would show.

        The data invalidation runs in a worker thread: the kernel waits for the
        READs of the inode in flight, which this thread answers meanwhile.  It
        drops every short answer's pages sent before it began; a READ answered
        short while it ran is dropped by the next round, and after
        ``_ZERO_FILL_DROPS`` rounds ``_attr`` answers the size below it.
        """
        for _ in range(_ZERO_FILL_DROPS):
            with self._view_inodes_lock:
                below = self._zero_fill_below(ino)
                began = next(self._zero_fill_seq)
            if below is None or node.size() <= below:
                return
            await trio.to_thread.run_sync(self._invalidate_data, ino)
            with self._view_inodes_lock:
                left = [fill for fill in self._zero_fills.get(ino, ()) if fill[0] > began]
                if left:
                    self._zero_fills[ino] = left
                else:
                    self._zero_fills.pop(ino, None)

    async def _drop_grown_zero_fills(self) -> None:
        """After a ``write()`` or ``flush()``: the zero-filled pages of the views whose log end moved go before its
        answer, so a reader's next read at EOF gets the new size at once (read-your-writes)."""
        if not self._zero_fills_grown:
            return
        with self._view_inodes_lock:
            inodes = list(self._zero_fills_grown)
            self._zero_fills_grown.clear()
        for ino in inodes:
            entry = self._inodes.get(ino)
            if entry is None:
                continue
            try:
                await self._drop_zero_fills(ino, entry.node)
            except LogfsError:
                pass        # a view of a deleted topic: its next getattr fails, the write does not

    def _invalidate_data(self, ino: int) -> None:
        """Drop the kernel's cached pages and attributes of ``ino`` (a worker thread: it waits for READs in flight)."""
        try:
            pyfuse3.invalidate_inode(ino)
        except OSError as exc:
            # ENOENT: the kernel holds no such inode, so no page of it either; or forgotten, or unmounted
            if exc.errno not in (errno.ENOENT, errno.ENOTCONN, errno.ENODEV):
                log.warning("Cannot invalidate the cached pages of inode %d: %s", ino, exc)
            return
        with self._view_inodes_lock:
            if ino in self._attrs_answered:
                self._attrs_stale.add(ino)      # its attributes went too: the kernel asks again

    def _node(self, inode: int) -> Node:
        entry = self._inodes.get(inode)
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return entry.node

    def _directory(self, inode: int) -> Directory:
        """The directory of ``inode``; ENOTDIR for a file."""
        node = self._node(inode)
        if not isinstance(node, Directory):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return node

    def _remember(self, node: Node) -> int:
        """The inode of ``node``, its lookup count raised by one."""
        ino = self._inode_of.get(id(node))
        if ino is not None:
            self._inodes[ino].nlookup += 1
            return ino
        # A node forgotten by the kernel and looked up again keeps its number
        # (numbers are never given to another node), so an unchanged file keeps
        # its inode even across cache eviction.
        ino = getattr(node, "ino", None)
        if ino is None:
            ino = self._next_inode
            self._next_inode += 1
            node.ino = ino
        entry = self._inodes[ino] = _Inode(node)
        entry.nlookup = 1
        self._inode_of[id(node)] = ino
        if isinstance(node, ViewFile) and node.attr_timeout:
            with self._view_inodes_lock:
                self._view_inodes.setdefault(node.tp, set()).add(ino)
        return ino

    def _drop(self, ino: int, nlookup: int) -> None:
        entry = self._inodes.get(ino)
        if entry is None or ino == pyfuse3.ROOT_INODE:
            return
        entry.nlookup -= nlookup
        self._maybe_free(ino, entry)

    def _maybe_free(self, ino: int, entry: _Inode) -> None:
        if entry.nlookup > 0 or entry.nopen > 0:
            return
        del self._inodes[ino]
        node = entry.node
        del self._inode_of[id(node)]
        if isinstance(node, ViewFile) and node.attr_timeout:
            with self._view_inodes_lock:
                views = self._view_inodes.get(node.tp)
                if views is not None:
                    views.discard(ino)
                    if not views:
                        del self._view_inodes[node.tp]
                self._attrs_stale.discard(ino)
                self._attrs_answered.pop(ino, None)
                self._zero_fills.pop(ino, None)
                self._zero_fills_grown.discard(ino)
        if node.transient:
            try:
                node.close()
            except Exception:
                log.exception("Closing %s failed", node)
        self.ns.forgotten(node)

    def _topic_deleted(self, topic: str) -> None:
        """Drop the kernel's cached entry of a deleted topic (its name is cached for STABLE_TIMEOUT_S)."""
        if _KERNEL_REMOVES.get():
            return
        name = os.fsencode(topic)
        if trio.lowlevel.in_trio_run():
            # on the trio thread, inside a request: the notification must not wait for it
            pyfuse3.invalidate_entry_async(pyfuse3.ROOT_INODE, name, ignore_enoent=True)
            return
        try:       # a worker thread (a write to <topic>/delete): done before the write returns
            pyfuse3.invalidate_entry(pyfuse3.ROOT_INODE, name)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("Could not drop the kernel's entry of deleted topic %s: %s", topic, exc)

    def inodes_known(self) -> int:
        """Inodes the kernel may still name (for tests and stats)."""
        return len(self._inodes)

    def _attr(self, ino: int, node: Node) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = ino
        attr.generation = 0
        attr.entry_timeout = node.entry_timeout
        attr.attr_timeout = node.attr_timeout
        if node.is_dir:
            attr.st_mode = stat.S_IFDIR | self._mode(node)
            attr.st_nlink = 2
            attr.st_size = 0
            attr.st_blocks = 0
        else:
            view = isinstance(node, ViewFile) and node.attr_timeout
            if view:
                with self._view_inodes_lock:    # before the size: a change after it is invalidated later
                    self._attrs_stale.discard(ino)
                    self._attrs_answered[ino] = (time.monotonic(), -1)
            attr.st_mode = stat.S_IFREG | self._mode(node)
            attr.st_nlink = 1
            attr.st_size = node.size()
            if view:
                with self._view_inodes_lock:
                    below = self._zero_fill_below(ino)
                    if below is not None and attr.st_size > below:
                        # a READ answered short since _drop_zero_fills: this size waits for its pages to go,
                        # and the kernel asks again shortly
                        attr.st_size = below
                        self._defer_locked(ino)
                    if ino in self._attrs_answered:
                        self._attrs_answered[ino] = (self._attrs_answered[ino][0], attr.st_size)
            attr.st_blocks = node.blocks()
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_blksize = BLOCK_SIZE
        mtime = node.mtime_ns()
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime
        return attr

    def _unsized_attr(self, ino: int, node: Node) -> pyfuse3.EntryAttributes:
        """Attributes of a file a listing does not size (readdir): valid for no time, so a stat or an open
        asks for the real ones."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = ino
        attr.generation = 0
        attr.entry_timeout = attr.attr_timeout = 0
        attr.st_mode = stat.S_IFREG | self._mode(node)
        attr.st_nlink = 1
        # the size the kernel may hold already (an opening's pages), not 0: a smaller size would drop them
        attr.st_size = node.listed_size()
        attr.st_blocks = 0
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_blksize = BLOCK_SIZE
        try:
            mtime = node.mtime_ns()
        except LogfsError:
            mtime = self.ns.started_ns
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime
        return attr

    def _mode(self, node: Node) -> int:
        """The permission bits the kernel enforces: the node's own (a temporary file's as its creator set
        them), widened to the group and others by the mount's rule (logfs.access)."""
        if isinstance(node, TempFile):
            return node.mode & ~self._access.umask
        return self._access.mode(node.mode, node.commits_on_read)

    def _entry(self, node: Node) -> pyfuse3.EntryAttributes:
        ino = self._remember(node)
        try:
            return self._attr(ino, node)
        except BaseException:
            self._drop(ino, 1)
            raise

    # Any: a FUSE operation's own arguments (inodes, names, handles), whichever operation it was
    def _record_refusal(self, op: str, args: tuple[Any, ...], code: int, exc: BaseException) -> None:
        """Add a refusal to ``.logfs/errors`` (logfs.refusals), with the path the operation was about."""
        try:
            path = self._path_of(op, args)
        except Exception:    # the path is a courtesy: a refusal is recorded without it rather than not at all
            path = "?"
        self.ns.refusals.record(path, code, f"{op}: {exc}")

    def _path_of(self, op: str, args: tuple[Any, ...]) -> str:     # Any: as in _record_refusal
        """The path an operation's arguments name: a handle's file, an inode, or a name in a directory."""
        if op in _HANDLE_OPS:
            held = self._handles.get(args[0])
            return self._inodes[held[0]].node.path() if held is not None else "?"
        entry = self._inodes.get(args[0]) if args else None
        if entry is None:
            return "?"
        if op in _NAME_OPS:
            return _joined(entry.node.path(), os.fsdecode(args[1]))
        if op == "link":
            new_parent = self._inodes.get(args[1])
            return _joined(new_parent.node.path() if new_parent else "?", os.fsdecode(args[2]))
        return entry.node.path()

    def _check_writable(self, what: str = "change the mount") -> None:
        if self.read_only:
            raise ReadOnlyError(f"Cannot {what}: the mount is read-only (--read-only)")

    # ------------------------------------------------------------------ names

    # Any: pyfuse3's RequestContext, None from within
    @_translating
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        parent = self._directory(parent_inode)
        self.ns.stats.metadata_requests += 1
        decoded = os.fsdecode(name)
        temp = self._temps.get(parent, decoded)
        if decoded == _CONFIG and temp is None:
            await self._settle_config_unlinks()
            if self._config_unlinks.hidden(parent, getattr(ctx, "pid", 0)):
                raise NoSuchNameError(f"{getattr(parent, 'topic', '?')}/config was unlinked by this process (mv): "
                                      "its create of config replaces the overrides")
        if temp is not None:
            return self._entry(temp)
        prepare = parent.preparation(decoded)
        if prepare is not None:         # a cluster mount's first use of a partition: its replica is made
            await trio.to_thread.run_sync(prepare)
        node = parent.lookup(decoded)
        known = self._inode_of.get(id(node))
        if known is not None:
            await self._drop_zero_fills(known, node)
        return self._entry(node)

    async def _settle_config_unlinks(self) -> None:
        """Apply the unlinks of ``config`` whose process went away without creating it (see _ConfigUnlinks)."""
        for config in self._config_unlinks.settle():
            await trio.to_thread.run_sync(self._remove_overrides, config)

    @staticmethod
    def _remove_overrides(config: Node) -> None:
        try:
            # ignore: a topic's config node is a TopicConfigFile (Node has no open())
            handle = config.open(True)      # type: ignore[attr-defined]
            handle.opened(os.O_WRONLY | os.O_TRUNC)
            handle.release()                 # the empty text: every override removed
            log.info("Removed every override of %s: it was unlinked and not created again", config.describe())
        except LogfsError as exc:
            log.warning("Could not remove the overrides of unlinked %s: %s", config.describe(), exc)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, nlookup in inode_list:
            self._drop(ino, nlookup)

    @_translating
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:     # Any: as lookup()'s ctx
        self.ns.stats.metadata_requests += 1
        node = self._node(inode)
        await self._drop_zero_fills(inode, node)
        return self._attr(inode, node)

    @_translating
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext | None) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        if isinstance(node, TempFile):
            self._check_writable(f"change the attributes of {node.describe()}")
            if fields.update_size:
                node.truncate(attr.st_size)
            if fields.update_mode:
                node.mode = stat.S_IMODE(attr.st_mode)
            return self._attr(inode, node)      # owners and times are not kept (a temporary file)
        # an editor restores the mode and owner a file had after writing it: the same values are accepted
        changes = ((fields.update_mode and stat.S_IMODE(attr.st_mode) != self._mode(node))
                   or (fields.update_uid and attr.st_uid != self._uid)
                   or (fields.update_gid and attr.st_gid != self._gid))
        if changes:
            self._check_writable(f"change the attributes of {node.describe()}")
            raise NotPermittedError("Modes and owners of the mount are fixed")
        if fields.update_size:
            # O_TRUNC of a control or append file: accepted, appends only ever append;
            # ftruncate() of an opening of config makes what it writes a replacement (logfs.control)
            self._check_writable(f"change the attributes of {node.describe()}")
            if node.is_dir or not getattr(node, "writable", False):
                raise AccessDeniedError(f"Cannot truncate {node.describe()}: it is read-only")
            held = self._handles.get(fh) if fh is not None else None
            if held is not None:
                await trio.to_thread.run_sync(held[1].truncate, attr.st_size)
        # Times are not stored: touch is accepted and changes nothing.
        await self._drop_zero_fills(inode, node)
        return self._attr(inode, node)

    @_translating
    async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                    ctx: pyfuse3.RequestContext | None) -> pyfuse3.EntryAttributes:
        self._check_writable(f"create directory {os.fsdecode(name)!r}")
        parent = self._directory(parent_inode)
        node = await trio.to_thread.run_sync(parent.mkdir, os.fsdecode(name))
        return self._entry(node)

    @_translating
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None) -> None:
        self._check_writable(f"remove directory {os.fsdecode(name)!r}")
        parent = self._directory(parent_inode)
        decoded = os.fsdecode(name)
        pid = getattr(ctx, "pid", 0)
        if isinstance(parent, RootDir):
            token = _KERNEL_REMOVES.set(True)     # the kernel drops the entry it asked to remove
            try:
                await trio.to_thread.run_sync(parent.rmdir, decoded)
            finally:
                _KERNEL_REMOVES.reset(token)
            self._removals.done(pid, decoded)
            return
        topic = getattr(parent, "topic", None)
        if topic is not None and self._removals.removing(pid, topic):
            return    # part of `rm -r` of the topic: its rmdir of the topic deletes it
        await trio.to_thread.run_sync(parent.rmdir, decoded)

    async def _fixed(self, *args: object) -> NoReturn:
        self._check_writable("create, remove, link or rename files")
        raise NotPermittedError("The namespace is fixed: files cannot be created, removed, linked or renamed "
                                "(except temporary files next to config and append)")

    @_translating
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None) -> None:
        self._check_writable(f"remove {os.fsdecode(name)!r}")
        parent = self._directory(parent_inode)
        if self._temps.unlink(parent, os.fsdecode(name)):
            return
        if os.fsdecode(name) == _CONFIG and isinstance(parent, TopicDir):
            await self._settle_config_unlinks()
            config = parent.lookup(_CONFIG)
            self._config_unlinks.unlinked(parent, getattr(ctx, "pid", 0), config)
            log.info("%s unlinked: the overrides are replaced when the same process creates config "
                     "(mv), or removed when it exits without doing so", config.describe())
            return
        try:
            await trio.to_thread.run_sync(parent.unlink, os.fsdecode(name))
        except NotPermittedError:
            topic = getattr(parent, "topic", None)
            if topic is not None and self._removals.removing(getattr(ctx, "pid", 0), topic):
                return    # part of `rm -r` of the topic (see _RecursiveRemovals)
            raise

    @_translating
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext | None) -> None:
        # only a temporary file moves: to a free name, or over config/append (logfs.tempfiles)
        old_parent, new_parent = self._node(parent_inode_old), self._node(parent_inode_new)
        if flags in (0, _RENAME_NOREPLACE) and self._temps.get(old_parent, os.fsdecode(name_old)) is not None:
            await trio.to_thread.run_sync(functools.partial(
                self._temps.rename, old_parent, os.fsdecode(name_old), new_parent, os.fsdecode(name_new),
                noreplace=flags == _RENAME_NOREPLACE))
            return
        await self._fixed()

    @_translating
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext | None) -> NoReturn:
        await self._fixed()

    @_translating
    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext | None) -> NoReturn:
        await self._fixed()

    @_translating
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext | None) -> NoReturn:
        await self._fixed()

    @_translating
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext | None) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._check_writable()
        parent = self._directory(parent_inode)
        if os.fsdecode(name) == _CONFIG and self._config_unlinks.take(parent, getattr(ctx, "pid", 0)):
            # the second half of mv's replacement: what this opening writes replaces the overrides
            attr = self._entry(parent.lookup(_CONFIG))
            return await self.open(attr.st_ino, flags | os.O_TRUNC, ctx), attr
        create: Callable[[str], Node]
        # an editor's or a tool's temporary file next to config and append; else groups/<new group>
        # (Directory's default refuses with EPERM)
        create = functools.partial(self._temps.create, parent) if self._temps.takes(parent) else parent.create
        attr = self._entry(create(os.fsdecode(name)))
        return await self.open(attr.st_ino, flags, ctx), attr

    # ------------------------------------------------------------------ files

    @_translating
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext | None) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if not isinstance(node, FileNode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        write = (flags & os.O_ACCMODE) != os.O_RDONLY
        if write:
            self._check_writable(f"open {node.describe()} for writing")
        else:
            prepare = node.open_preparation()
            if prepare is not None:     # a cluster mount's replica catching up first (logfs.nodes.ViewFile)
                await trio.to_thread.run_sync(prepare)
        deadline = trio.current_time() + _RELEASE_WAIT_S
        while True:
            try:
                handle = node.open(write)
                break
            except RetryAfterRelease:
                # the holder's last close() returned; its release is queued behind this open
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(_RELEASE_POLL_S)
        handle.opened(flags)
        if not write:
            self._settle_attrs(inode, node)     # after the open: the size of the view it anchored
        handle.opener = getattr(ctx, "pid", 0)     # whose process tree writes through it (logfs.writers)
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = (inode, handle)
        self._inodes[inode].nopen += 1
        return pyfuse3.FileInfo(fh=fh, direct_io=handle.direct_io, keep_cache=handle.keep_cache)

    # ignore: pyfuse3's stub says bytes; a memoryview is served the same way
    @_translating
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:   # type: ignore[override]
        inode, handle = self._handles[fh]
        data, threaded = await self._render(fh, handle, off, size)
        if handle.keep_cache and len(data) < size:
            # The kernel zero-fills the rest and takes it for the end: rendered in a worker thread, it is
            # rendered once more here (a continuation of the cursor), so it ends no earlier than a size this
            # thread answered meanwhile; and no size beyond it is answered while its pages may hold the zeros.
            if threaded:
                data = handle.read(off, size)
            self._zero_filled(inode, off + len(data))
        return data

    async def _render(self, fh: int, handle: Handle, off: int, size: int) -> tuple[bytes | memoryview, bool]:
        """The answer to a read, and whether a worker thread rendered it."""
        threshold = handle.offload_reads_from
        # a read that may wait on tiered storage's store never runs here: a store that does not answer
        # would stop every request of the mount for its timeout
        store = handle.may_wait_on_store(off, size)
        if not store and (threshold is None or size < threshold):
            return handle.read(off, size), False
        if not handle.keep_cache:
            # direct I/O: a reader's next read comes once this one is answered
            if not store and handle.continues_at(off):
                return handle.read(off, size), False
            return await trio.to_thread.run_sync(handle.read, off, size), True
        # Through the page cache the kernel's readahead sends the next requests before this
        # one is answered: served by threads in any order they would each miss the view's
        # sequential cursor and render from its index (docs/performance.md, "Figures behind the code").
        # trio.Lock is FIFO, so they run in the order they came, one at a time; each decides
        # once it holds the lock (a request that came while one was in a thread continues it).
        lock = self._read_locks.get(fh)
        if lock is None:
            lock = self._read_locks[fh] = trio.Lock()
        async with lock:
            if not store and handle.continues_at(off):
                return handle.read(off, size), False
            return await trio.to_thread.run_sync(handle.read, off, size), True

    @_translating
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handles[fh][1]
        try:
            if handle.blocking:
                return await trio.to_thread.run_sync(handle.write, off, buf)
            return handle.write(off, buf)
        finally:
            self._invalidate_written()
            await self._drop_grown_zero_fills()

    @_translating
    async def flush(self, fh: int) -> None:
        # Implemented for every handle: an ENOSYS here would make the kernel
        # stop sending flush for the whole mount, and append files need it.
        handle = self._handles[fh][1]
        try:
            if handle.blocking:
                await trio.to_thread.run_sync(handle.flush)
            else:
                handle.flush()
        finally:
            self._invalidate_written()
            await self._drop_grown_zero_fills()

    @_translating
    async def fsync(self, fh: int, datasync: bool) -> None:
        await trio.to_thread.run_sync(self._handles[fh][1].fsync)

    async def release(self, fh: int) -> None:
        inode, handle = self._handles.pop(fh)
        self._read_locks.pop(fh, None)
        try:
            if handle.blocking:
                await trio.to_thread.run_sync(handle.release)
            else:
                handle.release()
        except Exception as exc:  # release has no caller to answer: log it
            log.error("Closing %s failed: %s", type(handle).__name__, exc)
            code = getattr(exc, "errno", None)
            handle.refused_at_release = (code if isinstance(code, int) else errno.EIO, str(exc))
        if handle.refused_at_release is not None:
            self.ns.refusals.record(self._inodes[inode].node.path() if inode in self._inodes else "?",
                                    handle.refused_at_release[0], f"release: {handle.refused_at_release[1]}")
        entry = self._inodes.get(inode)
        if entry is not None:
            entry.nopen -= 1
            if entry.nopen == 0:
                entry.node.detach()
            self._maybe_free(inode, entry)

    # ------------------------------------------------------------------ directories

    @_translating
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext | None) -> int:
        node = self._directory(inode)
        if isinstance(node, TopicDir) and not self.read_only:
            # a recursive removal of the topic starts by listing the topic directory
            # (rm -rf of a partition directory alone stays refused: partitions cannot go)
            self._removals.listed(getattr(ctx, "pid", 0), node.topic)
        fh = self._next_fh
        self._next_fh += 1
        # Names are snapshotted at opendir so start_id indexes a stable list.
        self._dir_handles[fh] = _DirHandle(inode, [".", "..", *node.names(), *self._temps.names(node)])
        return fh

    @_translating
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        dh = self._dir_handles[fh]
        parent = self._node(dh.inode)
        for i in range(start_id, len(dh.names)):
            name = dh.names[i]
            if i < 2:
                # "." and "..": the kernel takes no lookup reference for them
                ino = dh.inode if i == 0 else self._parent_inode(parent)
                attr = self._attr(ino, parent if i == 0 else self._node(ino))
                if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, i + 1):
                    return
                continue
            temp = self._temps.get(parent, name)
            # ignore: a parent is a Directory (Node has no store_preparation() or lookup())
            prepare = None if temp is not None else parent.store_preparation(name)  # type: ignore[attr-defined]
            sizable = True
            if prepare is not None:     # what the attributes read of tiered storage's store, off this thread
                try:
                    await trio.to_thread.run_sync(prepare)
                except LogfsError:
                    sizable = False     # the store fails: listed unsized (below), not asked again here
            try:
                node = temp or parent.lookup(name)   # type: ignore[attr-defined]
            except LogfsError:
                continue   # vanished since opendir (deleted topic, retained segment)
            ino = self._remember(node)
            try:
                if not node.sized_in_listing or not sizable:
                    attr = self._unsized_attr(ino, node)
                else:
                    await self._drop_zero_fills(ino, node)
                    attr = self._attr(ino, node)
            except LogfsError as exc:
                if exc.errno in _GONE_ERRNOS or node.is_dir:
                    self._drop(ino, 1)
                    continue
                # there, but not sizable now (a remote log segment's rendering while the object store fails):
                # listed all the same, never silently left out, with attributes the kernel keeps for no time,
                # so a stat or an open asks again and gets the error
                attr = self._unsized_attr(ino, node)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, i + 1):
                self._drop(ino, 1)
                return

    def _parent_inode(self, node: Node) -> int:
        parent_key = getattr(node, "parent_key", None)
        parent = self.ns.known_node(parent_key) if parent_key is not None else None
        ino = self._inode_of.get(id(parent)) if parent is not None else None
        return ino if ino is not None else pyfuse3.ROOT_INODE

    async def releasedir(self, fh: int) -> None:
        self._dir_handles.pop(fh, None)

    @_translating
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        dh = self._dir_handles[fh]
        node = self._node(dh.inode)
        # ignore: fsyncdir comes for directories only (Node has no fsync())
        await trio.to_thread.run_sync(node.fsync)   # type: ignore[attr-defined]

    @_translating
    async def statfs(self, ctx: pyfuse3.RequestContext | None) -> pyfuse3.StatvfsData:
        st = os.statvfs(self.ns.manager.log_dirs[0])
        data = pyfuse3.StatvfsData()
        data.f_bsize = st.f_bsize
        data.f_frsize = st.f_frsize
        data.f_blocks = st.f_blocks
        data.f_bfree = st.f_bfree
        data.f_bavail = st.f_bavail
        data.f_files = st.f_files
        data.f_ffree = st.f_ffree
        data.f_favail = st.f_favail
        data.f_namemax = 255
        return data

    # ------------------------------------------------------------------ shutdown

    def close_all(self) -> None:
        """Release every handle and view still held (the kernel will not send forget/release)."""
        with self._view_inodes_lock:      # no kernel to tell any more
            self._view_inodes.clear()
        for _, handle in list(self._handles.values()):
            try:
                handle.shutdown()
            except Exception as exc:
                log.error("Closing %s at shutdown failed: %s", type(handle).__name__, exc)
        self._handles.clear()
        for entry in self._inodes.values():
            if entry.node.transient:
                try:
                    entry.node.close()
                except Exception:
                    log.exception("Closing %s at shutdown failed", entry.node)
        self._inodes.clear()
