"""The nodes of the namespace: the base classes, generated files and content files (views, records, segments).

Also the file modes: views are read-only, control files writable, ``delete`` write-only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import weakref
from typing import TYPE_CHECKING, Generic, TypeVar

import orjson

from engine.errors import LogfsError, UnknownTopicOrPartitionError
from engine.files import DELETED_FILE_SUFFIX, INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX
from engine.views import LogView, ViewFormat, ViewIdentity
from logfs import stats as _stats
from logfs.errors import AccessDeniedError, NotPermittedError, StaleNameError
from logfs.handles import BytesHandle, Handle, RawFileHandle, RemoteFileHandle, ViewHandle
from logfs.refusals import ErrorsHandle

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable

    from engine.log import Log
    from engine.remote.remote_segment import RemoteLogSegment
    from engine.segment import LogSegment
    from engine.topic import TopicPartition
    from logfs.tree import NodeKey, Tree

log = logging.getLogger(__name__)

# File modes: views are read-only, control files are writable, ``delete`` is write-only.
DIR_MODE = 0o755
VIEW_MODE = 0o444
RW_MODE = 0o644
WRITE_ONLY_MODE = 0o200

#: Forgotten content nodes kept so an unchanged file keeps its inode number (see Namespace.forgotten).
RETIRED_NODES = 4096

#: How long the kernel may cache a stable name and its attributes (topic and partition directories,
#: ``append``, ``delete``; ``config``'s name): they change only when the topic is deleted, and then
#: logfs.fs invalidates the topic's entry.  Every path walk and ``stat`` would otherwise reach the mount.
STABLE_TIMEOUT_S = 1.0


class Node:
    """One name of the namespace."""

    is_dir = False
    mode = VIEW_MODE
    #: reading it changes something (a consumer group's committed offsets): the owner's alone (logfs.access)
    commits_on_read = False
    #: kept in the namespace only while the kernel remembers its inode (see module docstring)
    transient = False
    #: kernel attribute cache time; 0 for files whose size changes under the reader
    attr_timeout = 0.0
    #: kernel cache time of the name -> inode entry; 0 for names whose file may be replaced
    entry_timeout = 0.0
    #: the inode number logfs.fs gave this node (kept across the kernel's forget)
    ino: int | None = None
    #: whether a directory listing (readdir) sizes it; False for a file whose size may wait for an object
    #: store (a remote log segment's rendering): listed with attributes valid for no time, sized at its stat
    sized_in_listing = True

    def __init__(self, ns: Tree) -> None:
        self.ns = ns

    @property
    def key(self) -> NodeKey:
        raise NotImplementedError

    def size(self) -> int:
        return 0

    def blocks(self) -> int:
        """512-byte blocks stored for this file (``du``): what it holds on disk."""
        return (self.size() + 511) // 512

    def listed_size(self) -> int:
        """The size a listing gives when it does not size the file (``sized_in_listing``, or sizing failed):
        never below a size answered before, so a kernel that holds the file's pages drops none of them."""
        return 0

    def mtime_ns(self) -> int:
        return self.ns.started_ns

    def close(self) -> None:
        """The kernel forgot the inode and no handle is open: release engine resources."""

    def detach(self) -> None:
        """The last open handle was released: drop what only open handles need."""

    def retire(self) -> None:
        """The kernel forgot the inode: keep only what identifies the file (see Namespace.forgotten)."""

    def describe(self) -> str:
        """The node as a log line names it."""
        return type(self).__name__

    def path(self) -> str:
        """The node's path in the mount, as ``.logfs/errors`` shows it (``t/0/append``, ``t/0/offset``)."""
        return self.describe()


class Directory(Node):
    is_dir = True
    mode = DIR_MODE

    def names(self) -> list[str]:
        raise NotImplementedError

    def lookup(self, name: str) -> Node:
        raise NotImplementedError

    def preparation(self, name: str) -> Callable[[], None] | None:
        """What must happen before ``lookup(name)`` that may block (a cluster mount making a partition's
        replica on first use, fetching a record from the cluster): logfs.fs runs it off the request thread.
        None when nothing must."""
        return None

    def store_preparation(self, name: str) -> Callable[[], None] | None:
        """The part of ``preparation(name)`` that reads tiered storage's remote store (what a listing's
        attributes of ``name`` need too: logfs.fs runs it off the request thread before readdir answers
        them).  None when nothing must."""
        return None

    def mkdir(self, name: str) -> Node:
        raise NotPermittedError(f"Cannot create directory {name!r} here")

    def rmdir(self, name: str) -> None:
        raise NotPermittedError(f"Cannot remove directory {name!r}")

    def create(self, name: str) -> Node:
        """``open(O_CREAT)`` of a new name; only ``groups/`` takes one (a new consumer group)."""
        raise NotPermittedError("The namespace is fixed: files cannot be created, removed, linked or renamed")

    def unlink(self, name: str) -> None:
        """``rm``; only ``groups/<group>`` can go (logfs.fs accepts the rest within ``rm -r`` of a topic)."""
        raise NotPermittedError(f"Cannot remove {name!r}: the files of a topic cannot be removed one by one "
                                "(rmdir or rm -r the topic directory deletes the topic)")

    def fsync(self) -> None:
        """fsyncdir(): flush every log below this directory."""


class FileNode(Node):
    writable = False

    def open(self, write: bool) -> Handle:
        raise NotImplementedError

    def open_preparation(self) -> Callable[[], None] | None:
        """What a read-only open must wait for first, off the request thread (logfs.fs); None: nothing."""
        return None

    def _refuse_write(self, write: bool) -> None:
        if write and not self.writable:
            raise AccessDeniedError(f"{self.describe()} is read-only")


# ---- generated files


class GeneratedFile(FileNode):
    """A small file rendered on demand (state, config, stats); a snapshot per open.

    While it is open, its size is never less than an open snapshot's:
    ``sendfile`` (``shutil.copyfile``, a web server) reads even a
    ``direct_io`` file through the page cache and stops at the size the
    kernel last got, so a ``stat`` after the open that gave the size of a
    shorter, newer rendering cut that opening's copy short (a metrics file
    shrunk by a deleted topic).  A size above what an opening holds reads as
    its end at its last byte (the kernel lowers the size at a short read).
    """

    #: the longest snapshot handed out since the file was last not open
    _open_size = 0

    def render(self) -> bytes:
        raise NotImplementedError

    def size(self) -> int:
        return max(len(self.render()), self._open_size)

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        snapshot = self.render()
        self._open_size = max(self._open_size, len(snapshot))
        return BytesHandle(snapshot)

    def detach(self) -> None:
        self._open_size = 0


class StatsFile(GeneratedFile):
    key = ("broker", "stats.json")

    def describe(self) -> str:
        return ".logfs/stats.json"

    def render(self) -> bytes:
        return _stats.stats_json(self.ns.manager, self.ns.stats)


class MetricsFile(GeneratedFile):
    key = ("broker", "metrics")

    def describe(self) -> str:
        return ".logfs/metrics"

    def render(self) -> bytes:
        return _stats.prometheus_metrics(self.ns.manager, self.ns.stats)


class ErrorsFile(FileNode):
    """``.logfs/errors``: :class:`~logfs.refusals.RecentRefusals` of the mount as a growing file."""

    key = ("broker", "errors")
    attr_timeout = entry_timeout = 0.0     # grows with every refusal: the kernel asks again each time

    def describe(self) -> str:
        return ".logfs/errors"

    def size(self) -> int:
        return self.ns.refusals.end

    def mtime_ns(self) -> int:
        return self.ns.refusals.last_ns or self.ns.started_ns

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        return ErrorsHandle(self.ns.refusals)


class StateFile(GeneratedFile):
    def __init__(self, ns: Tree, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp

    @property
    def key(self) -> NodeKey:
        return ("state", self.tp)

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/state"

    def render(self) -> bytes:
        state = _stats.partition_state(self.ns.manager, self.ns.log(self.tp))
        return orjson.dumps(state, option=orjson.OPT_INDENT_2) + b"\n"


# ---- content files (transient: kept while the kernel remembers their inode)


class ViewFile(FileNode):
    """``records``, ``records.jsonl``, ``from/<N>``, ``since/<T>``, ``segments/<base>.jsonl``.

    One node is one rendering from ``start_offset``: the same file for as long
    as its :class:`ViewIdentity` is current.  Opens share one ``LogView``
    anchored at that start, closed with the last handle; in between the node
    pins nothing (see the module docstring for sizes).  ``records`` and
    ``records.jsonl`` stay the same file while open, whatever is deleted below
    (``followed``): a follower by name (``tail -F``) never sees a replacement.
    """

    transient = True

    def __init__(self, ns: Tree, tp: TopicPartition, name: str, target: Log, fmt: ViewFormat,
                 start_offset: int, segment: LogSegment | None = None) -> None:
        super().__init__(ns)
        self.tp = tp
        self.name = name
        self.log = target
        self.format = fmt
        self.start_offset = start_offset
        self.identity = ViewIdentity(target, start_offset, segment)
        self._single = segment is not None
        # segments/<base>.jsonl of a remote log segment: sizing it may fetch from the store (after a restart),
        # which `ls segments/` must not wait for copy after copy
        self.sized_in_listing = not getattr(segment, "remote", False)
        self._view: LogView | None = None
        self._last_size = 0
        self._last_mtime_ns = 0
        self._truncations = target.truncations
        if not ns.views_direct_io:
            # through the page cache: the kernel keeps the attributes, and logfs.fs drops them at
            # each change of the log's end (Namespace.views_changed_listeners), so a reader at EOF
            # (tail -f) sees appends at once and a small read costs no getattr
            self.attr_timeout = VIEW_ATTR_TIMEOUT_S
            ns.watch_views_of(target)

    @classmethod
    def named(cls, ns: Tree, tp: TopicPartition, name: str, target: Log, fmt: ViewFormat, *, start_offset: int,
              segment: LogSegment | None = None) -> ViewFile:
        """The view node of ``name``: one rendering from ``start_offset`` while nothing of it changed."""
        return ns.content(("view", tp, name), lambda node: node.same_file(start_offset),
                          lambda: cls(ns, tp, name, target, fmt, start_offset, segment))

    @property
    def key(self) -> NodeKey:
        return ("view", self.tp, self.name)

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/{self.name}"

    def is_current(self) -> bool:
        return self.identity.is_current()

    def _anchor(self) -> LogView:
        segment = self.identity.segment() if self._single else None
        if self._single and segment is None:
            raise StaleNameError(f"{self.describe()} was replaced: its segment is gone")
        return LogView(self.log, self.format, start_offset=self.start_offset, segment=segment)

    def size(self) -> int:
        if self._view is not None:
            if self.ns.manager.get_log(self.tp) is not self.log:
                # the topic was deleted (by rmdir, or on the cluster by another client): a follower of an open
                # view (tail -f, which polls fstat) gets ENOENT instead of waiting for records that never come
                raise UnknownTopicOrPartitionError(f"{self.describe()}: topic {self.tp.topic} was deleted")
            size = self._view.size()
        elif self.identity.is_current():
            view = self._anchor()      # the same bytes from the same start, plus appends
            try:
                size = view.size()
            finally:
                view.close()
        else:
            size = self._last_size     # replaced and not open: what it last was
        if size > self._last_size:
            self._last_size = size
        return self._last_size

    def listed_size(self) -> int:
        return self._last_size

    def blocks(self) -> int:
        # A rendering of the log stores nothing of its own: du counts the
        # segment files (segments/*.log, .index, .timeindex), not every view of them.
        return 0

    def mtime_ns(self) -> int:
        """When the last record it shows was appended (the .log's mtime; never goes back).

        A truncation of the log (a replica's truncation to its leader, an append
        rolled back) adds a nanosecond even when the .log's mtime does not
        move: the kernel drops the pages it cached of a view whose mtime
        changed (FUSE's auto_inval_data), so none of the removed bytes is read
        from its page cache.
        """
        segment = self.identity.segment() if self._single else self.log.segments.peekitem(-1)[1]
        if segment is not None and (self.identity.is_current() or self.followed):
            try:
                mtime = segment.last_modified * 1_000_000
            except LogfsError:
                mtime = 0
            if mtime > self._last_mtime_ns:
                self._last_mtime_ns = mtime
        if self.log.truncations != self._truncations:
            self._truncations = self.log.truncations
            self._last_mtime_ns = max(self._last_mtime_ns, self.ns.started_ns) + 1
        return self._last_mtime_ns or self.ns.started_ns

    @property
    def followed(self) -> bool:
        """``records``/``records.jsonl`` while open: the same file across deletions below (``tail -F``)."""
        return self._view is not None and self.name in FOLLOWED_VIEWS and not self._single

    def same_file(self, start_offset: int) -> bool:
        """Whether a lookup now, anchored at ``start_offset``, names this file (one inode)."""
        return self.followed or (self.start_offset == start_offset and self.is_current())

    def open_preparation(self) -> Callable[[], None] | None:
        """A cluster mount's replica catching up to the leader's high watermark before the view opens, so the
        view holds every record committed when it was opened (ETIMEDOUT rather than a short file)."""
        return self.ns.replica_preparation([self.tp])

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        if self._view is None:
            if not self.identity.is_current():
                if (self._single or self.name not in FOLLOWED_VIEWS or not self.ns.views_direct_io
                        or self.ns.manager.get_log(self.tp) is not self.log):     # (the topic was deleted)
                    raise StaleNameError(f"{self.describe()} was replaced (records deleted or compacted)")
                self._anchor_at_log_start()
            self._view = self._anchor()
            self.ns.stats.views_open += 1
        if self.name in FOLLOWED_VIEWS and not self._single:
            return FollowedViewHandle(self._view, self.ns.views_direct_io)
        return ViewHandle(self._view, self.ns.views_direct_io)

    def _anchor_at_log_start(self) -> None:
        """``records``/``records.jsonl`` replaced between lookup and open: this open names the log as it is now.

        The whole log's rendering is what the path names, and ESTALE makes the
        kernel look it up once more only: a compaction or a retention run that
        replaces segments twice in that window (the cleaner swapping group
        after group) would fail a plain ``cat`` with ESTALE.  Served with
        direct I/O, nothing of the old rendering is in the kernel's page cache
        and every read and ``fstat`` comes here, so the node itself can take the
        log's current start; its size restarts with it.  Through the page cache
        the kernel may hold the old rendering's pages: ESTALE stays.
        """
        self.start_offset = self.log.log_start_offset
        self.identity = ViewIdentity(self.log, self.start_offset)
        self._last_size = 0

    def detach(self) -> None:
        """The last handle closed: release the view (and the segments it pins)."""
        view, self._view = self._view, None
        if view is not None:
            self._last_size = max(self._last_size, view.size())
            self.ns.stats.views_open -= 1
            view.close()

    close = detach


#: attribute cache time of views served through the page cache (invalidated at every append anyway)
VIEW_ATTR_TIMEOUT_S = 1.0

#: the views a follower by name (``tail -F``) reads: they keep their inode across deletions while open
FOLLOWED_VIEWS = frozenset(("records", "records.jsonl"))


class FollowedViewHandle(ViewHandle):
    """An opening of ``records``/``records.jsonl``, whose first bytes may be gone (see ``ViewFile.followed``).

    While a follower keeps ``records`` open, the name stays that file even
    after retention, ``before N`` or the cleaner deleted records below the
    follower, so ``tail -F`` never prints a record twice.  The deleted records'
    bytes stay counted at the start of that file (its size only grows), and a
    reader opening it meanwhile (``cat``) starts there: its first read at a
    position the view can no longer render is moved to the first byte it can,
    and its reads go on from there, so it reads every record the log still
    holds, once, and ends where the file ends.
    """

    __slots__ = ("_first", "_shift")

    def __init__(self, view: LogView, direct_io: bool) -> None:
        super().__init__(view, direct_io)
        # where this opening may start reading; 0 for one opened before anything was deleted,
        # which reads on what it opened
        self._first = view.readable_from()
        self._shift: int | None = None if self._first else 0
        if self._first:
            # this opening's bytes are not the inode's (they are moved by _shift): never through its pages
            self.direct_io, self.keep_cache = True, False

    def read(self, offset: int, size: int) -> bytes | memoryview:
        if self._shift is None:
            self._shift = self._first - offset if offset < self._first else 0
        return self._whole(self._view.read_buffer(offset + self._shift, size), offset + self._shift, size)

    def continues_at(self, offset: int) -> bool:
        return self._shift is not None and self._view.continues_at(offset + self._shift)

    def may_wait_on_store(self, offset: int, size: int) -> bool:
        position = offset + self._shift if self._shift is not None else max(offset, self._first)
        return self._view.may_wait_on_store(position, size)


class RecordFile(FileNode):
    """``offset/<N>``: the value of one record, newline-terminated."""

    transient = True

    def __init__(self, ns: Tree, tp: TopicPartition, offset: int, content: bytes,
                 timestamp: int) -> None:
        super().__init__(ns)
        self.tp = tp
        self.offset = offset
        self.content: bytes | None = content
        self.size_ = len(content)
        self.digest = record_digest(content)
        self.timestamp = timestamp

    def retire(self) -> None:
        self.content = None      # a lookup brings it back (OffsetDir.lookup reads the record anyway)

    @property
    def key(self) -> NodeKey:
        return ("offset", self.tp, self.offset)

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/offset/{self.offset}"

    def size(self) -> int:
        return self.size_

    def blocks(self) -> int:
        return 0

    def mtime_ns(self) -> int:
        return self.timestamp * 1_000_000 if self.timestamp >= 0 else self.ns.started_ns

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        if self.content is None:
            raise StaleNameError(f"{self.describe()}: looked up again to read it")
        return BytesHandle(self.content)


#: the segment a file of ``segments/`` is named for: a local one or a remote log segment (tiered storage)
_SegmentT = TypeVar("_SegmentT", "LogSegment", "RemoteLogSegment")


class _SegmentFileNode(FileNode, Generic[_SegmentT]):
    """``segments/<base>.log|.index|.timeindex``: one file of one segment, held weakly (it goes with its log)."""

    transient = True

    def __init__(self, ns: Tree, tp: TopicPartition, name: str, segment: _SegmentT, suffix: str) -> None:
        super().__init__(ns)
        self.tp = tp
        self.name = name
        self._segment: weakref.ref[_SegmentT] = weakref.ref(segment)
        self.suffix = suffix
        self._last_size = 0

    @property
    def key(self) -> NodeKey:
        return ("segfile", self.tp, self.name)

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/segments/{self.name}"

    def is_current(self, segment: LogSegment | RemoteLogSegment) -> bool:
        return self._segment() is segment


class SegmentFile(_SegmentFileNode["LogSegment"]):
    """A local segment's file: the bytes on disk, read-only, up to their used size."""

    def __init__(self, ns: Tree, tp: TopicPartition, name: str, segment: LogSegment, suffix: str) -> None:
        super().__init__(ns, tp, name, segment, suffix)
        self._last_mtime_ns = 0

    def segment(self) -> LogSegment | None:
        return self._segment()

    def _used_size(self) -> int:
        seg = self._segment()
        if seg is None:
            return self._last_size
        try:
            if self.suffix == LOG_FILE_SUFFIX:
                size = seg.size
            elif self.suffix == INDEX_FILE_SUFFIX:
                size = seg.offset_index.entries * seg.offset_index.entry_size
            else:
                size = seg.time_index.entries * seg.time_index.entry_size
        except (LogfsError, ValueError, OSError):    # an index closed by a deletion in progress
            size = self._last_size
        if size > self._last_size:
            self._last_size = size
        return self._last_size

    def size(self) -> int:
        return self._used_size()

    def mtime_ns(self) -> int:
        seg = self._segment()
        if seg is not None:
            try:
                mtime = seg.last_modified * 1_000_000
            except LogfsError:
                mtime = 0
            if mtime > self._last_mtime_ns:
                self._last_mtime_ns = mtime
        return self._last_mtime_ns or self.ns.started_ns

    def _paths(self) -> Iterable[str]:
        seg = self._segment()
        if seg is None:
            return ()
        if self.suffix == LOG_FILE_SUFFIX:
            path = seg.log_path
        elif self.suffix == INDEX_FILE_SUFFIX:
            path = seg.offset_index.path
        else:
            path = seg.time_index.path
        # The segment may have been scheduled for deletion (renamed .deleted)
        # since the lookup; its bytes are still the same.
        return (path,) if path.endswith(DELETED_FILE_SUFFIX) else (path, path + DELETED_FILE_SUFFIX)

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        for path in self._paths():
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            return RawFileHandle(fd, self._used_size)
        raise StaleNameError(f"{self.describe()} was deleted")


class RemoteSegmentFile(_SegmentFileNode["RemoteLogSegment"]):
    """A remote log segment's file (tiered storage): the copy's bytes as they were on local disk, read-only,
    read from the store through the engine (its chunk cache)."""

    def size(self) -> int:
        seg = self._segment()
        if seg is not None:
            self._last_size = seg.file_size(self.suffix)      # final: a copy never changes
        return self._last_size

    def blocks(self) -> int:
        return 0            # stored in the object store, not on local disk (du)

    def mtime_ns(self) -> int:
        seg = self._segment()
        return seg.last_modified * 1_000_000 if seg is not None else self.ns.started_ns

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        seg = self._segment()
        if seg is None:
            raise StaleNameError(f"{self.describe()} was deleted")
        suffix = self.suffix
        return RemoteFileHandle(lambda offset, size: seg.read_file(suffix, offset, size))


def record_digest(content: bytes) -> bytes:
    """What identifies the content of ``offset/<N>`` once its bytes are dropped."""
    return hashlib.blake2b(content, digest_size=16).digest()
