"""The mount's namespace: path names -> nodes, and what opening each node gives.

This module is the only place that knows the shape of the tree in SPEC.md
section 4.  It speaks in terms of the engine (``LogManager``, ``Log``,
``LogView``) and plain Python exceptions carrying an errno; it knows nothing of
FUSE inodes, which ``logfs.fs`` keeps.  Every failure is raised as an
``engine.errors.LogfsError`` subclass so ``logfs.fs`` can answer with its errno.

One path, one file (SPEC.md "Reading"): every name resolves to one node
object for as long as what it shows stays the same file, and ``logfs.fs``
gives one node one inode, so ``stat`` twice, ``cp``, ``tail -F`` and
``rsync`` see one file:

* structural nodes (directories, ``append``, ``config``, ``delete``,
  ``state``, ``.logfs/*``) live as long as their topic;
* *content* nodes (``records``, ``records.jsonl``, ``from/<N>``,
  ``since/<T>``, ``segments/*``, ``offset/<N>``) are kept in
  ``Namespace._nodes`` under their name and reused while their content is the
  same file: a view while its :class:`engine.views.ViewIdentity` is current
  (nothing it covers deleted or compacted), a raw segment file while the
  segment object is the log's, ``offset/<N>`` while the record's value is the
  same.  Otherwise the lookup makes a new node (a new inode: the file was
  replaced, as after a log rotation).  The kernel's ``forget`` of a content
  node's inode drops it from the table, so repeated lookups cost no memory.

A view node holds no ``LogView`` while nothing has it open (a name looked up
once must not pin deleted segments); its opens share one ``LogView`` anchored at
the node's start offset.  Sizes of one inode only grow: a current node measures
a fresh rendering from the same start (the same bytes plus appends), an open
one its shared view, a replaced one that is not open keeps its last size.
"""

from __future__ import annotations

import collections
import datetime as _dt
import hashlib
import errno as _errno
import logging
import os
import re
import threading
import time
import weakref
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable

import orjson

from engine.config import validate_topic_overrides
from engine.errors import (
    InvalidConfigError,
    InvalidRequestError,
    LogfsError,
    OffsetOutOfRangeError,
    ReadOnlyError,
    UnknownTopicOrPartitionError,
)
from engine.files import (
    DELETED_FILE_SUFFIX, INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX, SEGMENT_FILE_SUFFIXES, filename_prefix_from_offset,
)
from engine.numbers import parse_canonical_int
from engine.topic import TopicPartition, parse_partition, validate_topic_name
from engine.views import LogView, ViewFormat, ViewIdentity, record_at
from logfs import stats as _stats
from logfs.appender import LineAppender

if TYPE_CHECKING:  # pragma: no cover
    from engine.log import Log
    from engine.manager import LogManager
    from engine.segment import LogSegment

log = logging.getLogger(__name__)

__all__ = [
    "Namespace", "Node", "Directory", "FileNode", "Handle",
    "NoSuchNameError", "NotPermittedError", "AccessDeniedError",
]

# File modes: views are read-only, control files are writable, ``delete`` is write-only.
DIR_MODE = 0o755
VIEW_MODE = 0o444
RW_MODE = 0o644
WRITE_ONLY_MODE = 0o200

#: Forgotten content nodes kept so an unchanged file keeps its inode number (see Namespace.forgotten).
RETIRED_NODES = 4096


class NoSuchNameError(LogfsError):
    """A name that does not exist in the namespace (a view, a file, a directory)."""

    errno = _errno.ENOENT


class NotPermittedError(LogfsError):
    """The namespace is fixed: files cannot be created, removed or renamed."""

    errno = _errno.EPERM


class AccessDeniedError(LogfsError):
    """A write to a read-only view or file."""

    errno = _errno.EACCES


class MalformedNameError(NoSuchNameError):
    """A name under ``offset/``, ``from/``, ``since/`` or ``segments/`` that spells no offset or time.

    ENOENT like any missing name (SPEC.md section 7), but a user typed it, so
    the mount logs it (plain missing names are probed by shells and tools all
    the time and are not logged).
    """


class StaleNameError(LogfsError):
    """The file behind this inode was replaced (records deleted or compacted) between lookup and open.

    ESTALE makes the kernel look the path up again and open the new file
    (``do_filp_open`` retries with LOOKUP_REVAL), so an ``open`` racing a
    deletion opens what the path names now.
    """

    errno = _errno.ESTALE


# --------------------------------------------------------------------------- handles


class Handle:
    """What an ``open()`` of a node returns; ``logfs.fs`` keeps one per file handle.

    ``direct_io`` bypasses the page cache: the kernel forwards every read to us
    and does not trust ``st_size`` for EOF, which is what generated files whose
    content changes between opens need.  ``blocking`` marks handles whose
    writes touch the disk beyond one ``os.write`` (config files, deletion
    markers, fsync) and so run off the trio thread.
    """

    direct_io = True
    blocking = False
    #: reads of at least this many bytes run in a worker thread (None: always inline)
    offload_reads_from: int | None = None

    def read(self, offset: int, size: int) -> bytes:
        return b""

    def write(self, offset: int, data: bytes) -> int:
        raise AccessDeniedError("File is read-only")

    def flush(self) -> None:
        """close() of one descriptor: commit what is buffered, report its error."""

    def fsync(self) -> None:
        """fsync(): nothing is buffered outside the engine for read-only files."""

    def release(self) -> None:
        """Last descriptor closed."""


class BytesHandle(Handle):
    """A snapshot of a generated file taken at open, so one reader sees one version."""

    __slots__ = ("_content",)

    def __init__(self, content: bytes) -> None:
        self._content = content

    def read(self, offset: int, size: int) -> bytes:
        return self._content[offset:offset + size]


class ViewHandle(Handle):
    """Reads of a ``LogView``: the hot path of ``cat records``.

    A large read renders for tens of milliseconds; done in a worker thread it
    lets appends and small requests on the trio thread interleave with it (the
    GIL switches every few ms) for the price of one thread hop per read.
    Small reads (``head``, ``wc``'s 16 KiB) stay inline where the hop would
    dominate.
    """

    __slots__ = ("_view",)
    offload_reads_from = 128 * 1024

    def __init__(self, view, direct_io: bool) -> None:
        self._view = view
        self.direct_io = direct_io

    def read(self, offset: int, size: int) -> bytes:
        return self._view.read(offset, size)


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


class LineCommandHandle(Handle):
    """Line-oriented control file (``delete``).

    The complete lines of each ``write()`` are applied together, so one
    ``echo`` is all-or-nothing and its error is that write's error; a last line
    without a newline is applied when the descriptor is closed (flush).
    """

    blocking = True

    def __init__(self, apply: Callable[[list[bytes]], None], content: bytes = b"") -> None:
        self._apply = apply
        self._partial = b""
        self._content = content
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        return self._content[offset:offset + size]

    def write(self, offset: int, data: bytes) -> int:
        with self._lock:
            buf = self._partial + data
            lines = buf.split(b"\n")
            rest = lines.pop()
            lines = [line for line in lines if line.strip()]
            if lines:
                self._apply(lines)
            self._partial = rest
        return len(data)

    def flush(self) -> None:
        with self._lock:
            rest, self._partial = self._partial, b""
            if rest.strip():
                self._apply([rest])

    release = flush


class EditAbandonedError(InvalidConfigError):
    """A write to a config opening after one of its lines was refused (logged once, at the first)."""

    quiet = True


class ConfigEditHandle(Handle):
    """``<topic>/config`` opened for writing: the whole text is applied when it is closed.

    An edited file is written in pieces (bash's builtin ``printf`` writes
    line by line, editors in blocks), so nothing is applied before the close:
    each write checks its complete lines (known name, valid value) and fails
    with EINVAL on a bad one, after which nothing written through this opening
    is applied and its further writes fail too.  At close (flush) the collected
    overrides are applied at once, all or nothing (``alter_topic_config``).
    """

    blocking = True

    def __init__(self, node: TopicConfigFile, content: bytes) -> None:
        self._node = node
        self._content = content
        self._partial = b""
        self._updates: dict[str, str | None] = {}
        self._refused: str | None = None
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        return self._content[offset:offset + size]

    def _take(self, lines: list[bytes]) -> None:
        if self._refused is not None:
            raise EditAbandonedError(
                f"{self._node.describe()}: an earlier line written through this opening was refused "
                f"({self._refused}); nothing written through it will be applied")
        try:
            updates = self._node.parse_lines(lines)
            validate_topic_overrides(updates)
        except LogfsError as exc:
            self._refused = str(exc)
            self._updates.clear()
            raise InvalidConfigError(f"{exc}; nothing written to {self._node.describe()} "
                                     "through this opening will be applied") from None
        self._updates.update(updates)

    def write(self, offset: int, data: bytes) -> int:
        with self._lock:
            buf = self._partial + data
            lines = buf.split(b"\n")
            rest = lines.pop()
            self._take(lines)
            self._partial = rest
        return len(data)

    def flush(self) -> None:
        with self._lock:
            if self._refused is not None:
                return          # the write that carried the bad line failed; close succeeds
            rest, self._partial = self._partial, b""
            if rest:
                self._take([rest])
            updates, self._updates = self._updates, {}
            if updates:
                self._node.apply(updates)

    release = flush


# --------------------------------------------------------------------------- nodes


class Node:
    """One name of the namespace."""

    is_dir = False
    mode = VIEW_MODE
    #: kept in the namespace only while the kernel remembers its inode (see module docstring)
    transient = False
    #: kernel attribute cache time; 0 for files whose size changes under the reader
    attr_timeout = 0.0
    #: the inode number logfs.fs gave this node (kept across the kernel's forget)
    ino: int | None = None

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns

    @property
    def key(self) -> tuple:
        raise NotImplementedError

    def size(self) -> int:
        return 0

    def blocks(self) -> int:
        """512-byte blocks stored for this file (``du``): what it holds on disk."""
        return (self.size() + 511) // 512

    def mtime_ns(self) -> int:
        return self.ns.started_ns

    def close(self) -> None:
        """The kernel forgot the inode and no handle is open: release engine resources."""

    def detach(self) -> None:
        """The last open handle was released: drop what only open handles need."""

    def retire(self) -> None:
        """The kernel forgot the inode: keep only what identifies the file (see Namespace.forgotten)."""


class Directory(Node):
    is_dir = True
    mode = DIR_MODE

    def names(self) -> list[str]:
        raise NotImplementedError

    def lookup(self, name: str) -> Node:
        raise NotImplementedError

    def mkdir(self, name: str) -> Node:
        raise NotPermittedError(f"Cannot create directory {name!r} here")

    def rmdir(self, name: str) -> None:
        raise NotPermittedError(f"Cannot remove directory {name!r}")

    def fsync(self) -> None:
        """fsyncdir(): flush every log below this directory."""


class FileNode(Node):
    writable = False

    def open(self, write: bool) -> Handle:
        raise NotImplementedError

    def _refuse_write(self, write: bool) -> None:
        if write and not self.writable:
            raise AccessDeniedError(f"{self.describe()} is read-only")

    def describe(self) -> str:
        return type(self).__name__


# ---- generated files


class GeneratedFile(FileNode):
    """A small file rendered on demand (state, config, stats); a snapshot per open."""

    def render(self) -> bytes:
        raise NotImplementedError

    def size(self) -> int:
        return len(self.render())

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        return BytesHandle(self.render())


class BrokerConfigFile(GeneratedFile):
    key = ("broker", "config")

    def describe(self) -> str:
        return ".logfs/config"

    def render(self) -> bytes:
        return _props_text(self.ns.manager.config.to_props())


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


class StateFile(GeneratedFile):
    def __init__(self, ns: Namespace, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp

    @property
    def key(self) -> tuple:
        return ("state", self.tp)

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/state"

    def render(self) -> bytes:
        state = _stats.partition_state(self.ns.manager, self.ns.log(self.tp))
        return orjson.dumps(state, option=orjson.OPT_INDENT_2) + b"\n"


class TopicConfigFile(GeneratedFile):
    """Effective topic configuration; writing ``name=value`` lines alters overrides."""

    writable = True
    mode = RW_MODE

    def __init__(self, ns: Namespace, topic: str) -> None:
        super().__init__(ns)
        self.topic = topic

    @property
    def key(self) -> tuple:
        return ("config", self.topic)

    def describe(self) -> str:
        return f"{self.topic}/config"

    def render(self) -> bytes:
        self.ns.require_topic(self.topic)
        return _props_text(self.ns.manager.topic_config(self.topic).to_props())

    def open(self, write: bool) -> Handle:
        if not write:
            return BytesHandle(self.render())
        self.ns.check_writable()
        return ConfigEditHandle(self, self.render())

    def parse_lines(self, lines: list[bytes]) -> dict[str, str | None]:
        """``name=value`` lines -> overrides (``name=`` removes one); blank and ``#`` lines skipped."""
        updates: dict[str, str | None] = {}
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            if not line or line.startswith("#"):
                continue
            name, sep, value = line.partition("=")
            name = name.strip()
            if not sep or not name:
                shown = line if len(line) <= 80 else line[:80] + "..."
                raise InvalidConfigError(
                    f"Invalid config line {shown!r} for topic {self.topic}: expected name=value")
            value = value.strip()
            updates[name] = value if value else None
        return updates

    def apply(self, updates: dict[str, str | None]) -> None:
        # LogManager.alter_topic_config logs the change (once).
        self.ns.manager.alter_topic_config(self.topic, updates)


# ---- control files


class TopicDeleteFile(FileNode):
    """Write the marker ``topic`` to delete the topic asynchronously (like rmdir)."""

    writable = True
    mode = WRITE_ONLY_MODE

    def __init__(self, ns: Namespace, topic: str) -> None:
        super().__init__(ns)
        self.topic = topic

    @property
    def key(self) -> tuple:
        return ("delete", self.topic)

    def open(self, write: bool) -> Handle:
        if write:
            self.ns.check_writable()
        return LineCommandHandle(self._apply)

    def _apply(self, lines: list[bytes]) -> None:
        markers = [line.strip() for line in lines]
        for marker in markers:
            if marker != b"topic":
                shown = marker.decode("utf-8", "replace")
                shown = shown if len(shown) <= 80 else f"{shown[:80]}... ({len(shown)} characters)"
                raise InvalidRequestError(f"Invalid marker {shown!r} for {self.topic}/delete: expected 'topic'")
        self.ns.delete_topic(self.topic)


class PartitionDeleteFile(FileNode):
    """``before <offset>`` (Kafka's DeleteRecords) or ``key <key>`` (a tombstone)."""

    writable = True
    mode = WRITE_ONLY_MODE

    def __init__(self, ns: Namespace, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp

    @property
    def key(self) -> tuple:
        return ("delete", self.tp)

    def open(self, write: bool) -> Handle:
        if write:
            self.ns.check_writable()
        return LineCommandHandle(self._apply)

    def _apply(self, lines: list[bytes]) -> None:
        # Parse every marker first so a bad one applies none of them.
        actions: list[tuple[str, object]] = []
        for raw in lines:
            line = raw.rstrip(b"\r")
            verb, _, arg = line.lstrip().partition(b" ")
            offset = (parse_canonical_int(arg.strip().decode("ascii", "replace"))
                      if verb == b"before" else None)
            if offset is not None:
                actions.append(("before", offset))
            elif verb == b"key" and arg:
                actions.append(("key", arg))
            else:
                shown = line.decode("utf-8", "replace")
                shown = shown if len(shown) <= 80 else f"{shown[:80]}... ({len(shown)} characters)"
                raise InvalidRequestError(
                    f"Invalid marker {shown!r} for {self.tp}/delete:"
                    " expected 'before <offset>' (the offset in digits, no leading zero) or 'key <key>'")
        target = self.ns.log(self.tp)
        end = target.log_end_offset        # only grows: checking first keeps a bad marker from applying any
        for verb, arg in actions:
            if verb == "before" and int(arg) > end:  # type: ignore[call-overload]
                raise InvalidRequestError(
                    f"Cannot delete records of {self.tp} before offset {arg}: it is beyond the log end offset {end}")
        for verb, arg in actions:
            if verb == "before":
                # The manager checkpoints the new log start offset before this
                # returns: once `echo before N > delete` succeeds, no crash brings
                # the records back.  Beyond the log end: InvalidRequestError (EINVAL).
                # (LineCommandHandle is blocking: this runs off the trio thread.)
                start = self.ns.manager.delete_records(self.tp, int(arg))  # type: ignore[arg-type]
                log.info("[Log partition=%s, dir=%s] DeleteRecords before offset %s: log start offset is now %d",
                         self.tp, target.dir, arg, start)
            else:
                first, _ = target.append_values([None], [arg])  # type: ignore[list-item]
                self.ns.stats.record_append(1, 0)
                log.info("[Log partition=%s, dir=%s] Appended tombstone at offset %d", self.tp, target.dir, first)


class AppendFile(FileNode):
    """``append`` of a partition (``tp``) or of a topic (``partition`` None)."""

    writable = True
    mode = RW_MODE

    def __init__(self, ns: Namespace, topic: str, partition: int | None) -> None:
        super().__init__(ns)
        self.topic = topic
        self.partition = partition

    @property
    def key(self) -> tuple:
        return ("append", self.topic, self.partition)

    def open(self, write: bool) -> Handle:
        if write:
            self.ns.check_writable()
        if self.partition is None:
            self.ns.require_topic(self.topic)
        else:
            self.ns.log(TopicPartition(self.topic, self.partition))
        return LineAppender(self.ns.manager, self.topic, self.partition, self.ns.router(self.topic),
                            self.ns.stats)


# ---- content files (transient: kept while the kernel remembers their inode)


class ViewFile(FileNode):
    """``records``, ``records.jsonl``, ``from/<N>``, ``since/<T>``, ``segments/<base>.jsonl``.

    One node is one rendering from ``start_offset``: the same file for as long
    as its :class:`ViewIdentity` is current.  Opens share one ``LogView``
    anchored at that start, closed with the last handle; in between the node
    pins nothing (see the module docstring for sizes).
    """

    transient = True

    def __init__(self, ns: Namespace, tp: TopicPartition, name: str, target: Log, fmt: str,
                 start_offset: int, segment: LogSegment | None = None) -> None:
        super().__init__(ns)
        self.tp = tp
        self.name = name
        self.log = target
        self.format = ViewFormat.TEXT if fmt == "text" else ViewFormat.JSONL
        self.start_offset = start_offset
        self.identity = ViewIdentity(target, start_offset, segment)
        self._single = segment is not None
        self._view: LogView | None = None
        self._last_size = 0
        self._last_mtime_ns = 0

    @property
    def key(self) -> tuple:
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

    def blocks(self) -> int:
        # A rendering of the log stores nothing of its own: du counts the
        # segment files (segments/*.log, .index, .timeindex), not every view of them.
        return 0

    def mtime_ns(self) -> int:
        """When the last record it shows was appended (the .log's mtime; never goes back)."""
        segment = self.identity.segment() if self._single else self.log.segments.peekitem(-1)[1]
        if segment is not None and self.identity.is_current():
            try:
                mtime = segment.last_modified * 1_000_000
            except LogfsError:
                mtime = 0
            if mtime > self._last_mtime_ns:
                self._last_mtime_ns = mtime
        return self._last_mtime_ns or self.ns.started_ns

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        if self._view is None:
            if not self.identity.is_current():
                raise StaleNameError(f"{self.describe()} was replaced (records deleted or compacted)")
            self._view = self._anchor()
            self.ns.stats.views_open += 1
        return ViewHandle(self._view, self.ns.views_direct_io)

    def detach(self) -> None:
        """The last handle closed: release the view (and the segments it pins)."""
        view, self._view = self._view, None
        if view is not None:
            self._last_size = max(self._last_size, view.size())
            self.ns.stats.views_open -= 1
            view.close()

    close = detach


class RecordFile(FileNode):
    """``offset/<N>``: the value of one record, newline-terminated."""

    transient = True

    def __init__(self, ns: Namespace, tp: TopicPartition, offset: int, content: bytes,
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
    def key(self) -> tuple:
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


class SegmentFile(FileNode):
    """``segments/<base>.log|.index|.timeindex``: the bytes on disk, read-only, up to their used size."""

    transient = True

    def __init__(self, ns: Namespace, tp: TopicPartition, name: str, segment: LogSegment,
                 suffix: str) -> None:
        super().__init__(ns)
        self.tp = tp
        self.name = name
        self._segment = weakref.ref(segment)
        self.suffix = suffix
        self._last_size = 0
        self._last_mtime_ns = 0

    @property
    def key(self) -> tuple:
        return ("segfile", self.tp, self.name)

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/segments/{self.name}"

    def segment(self) -> LogSegment | None:
        return self._segment()

    def is_current(self, segment: LogSegment) -> bool:
        return self._segment() is segment

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


# ---- directories


class RootDir(Directory):
    key = ("root",)
    topic: str | None = None

    def names(self) -> list[str]:
        return [".logfs"] + sorted(self.ns.manager.topics())

    def lookup(self, name: str) -> Node:
        if name == ".logfs":
            return self.ns.stable(BrokerDir)
        if name in self.ns.manager.topics():
            return self.ns.stable(TopicDir, name)
        raise NoSuchNameError(f"No topic {name!r}")

    def mkdir(self, name: str) -> Node:
        self.ns.check_writable()
        if name == ".logfs":
            raise NotPermittedError(".logfs is reserved")
        validate_topic_name(name)
        self.ns.manager.create_topic(name)
        return self.ns.stable(TopicDir, name)

    def rmdir(self, name: str) -> None:
        self.ns.check_writable()
        if name == ".logfs":
            raise NotPermittedError(".logfs cannot be removed")
        self.ns.delete_topic(name)

    def fsync(self) -> None:
        for target in self.ns.manager.all_logs():
            target.flush()


class BrokerDir(Directory):
    key = ("broker",)
    parent_key = ("root",)
    topic: str | None = None
    _FILES = {"config": BrokerConfigFile, "stats.json": StatsFile, "metrics": MetricsFile}

    def names(self) -> list[str]:
        return list(self._FILES)

    def lookup(self, name: str) -> Node:
        cls = self._FILES.get(name)
        if cls is None:
            raise NoSuchNameError(f"No file .logfs/{name}")
        return self.ns.stable(cls)


class TopicDir(Directory):
    parent_key = ("root",)

    def __init__(self, ns: Namespace, topic: str) -> None:
        super().__init__(ns)
        self.topic = topic

    @property
    def key(self) -> tuple:
        return ("topic", self.topic)

    def names(self) -> list[str]:
        parts = self.ns.manager.partitions(self.topic)
        from logfs.groups import TOPIC_NAMES
        return ["append", "config", "delete"] + TOPIC_NAMES + [str(p) for p in sorted(parts)]

    def lookup(self, name: str) -> Node:
        self.ns.require_topic(self.topic)
        from logfs.groups import topic_entry   # groups/, append.jsonl (issue 13)
        extra = topic_entry(self.ns, self.topic, name)
        if extra is not None:
            return extra
        if name == "append":
            return self.ns.stable(AppendFile, self.topic, None)
        if name == "config":
            return self.ns.stable(TopicConfigFile, self.topic)
        if name == "delete":
            return self.ns.stable(TopicDeleteFile, self.topic)
        partition = parse_canonical_int(name)
        if partition is not None and partition in self.ns.manager.partitions(self.topic):
            return self.ns.stable(PartitionDir, TopicPartition(self.topic, partition))
        if partition is None and name.isdigit():     # 03, or digits of another script
            raise MalformedNameError(f"No partition {name!r} in topic {self.topic}: a partition is "
                                     "written in ASCII digits without leading zeros")
        raise NoSuchNameError(f"No partition {name!r} in topic {self.topic}")

    def mkdir(self, name: str) -> Node:
        self.ns.check_writable()
        partition = parse_partition(name)
        self.ns.manager.add_partition(self.topic, partition)
        return self.ns.stable(PartitionDir, TopicPartition(self.topic, partition))

    def rmdir(self, name: str) -> None:
        self.ns.check_writable()
        raise NotPermittedError(f"Partitions cannot be removed (topic {self.topic}); delete the topic instead")

    def fsync(self) -> None:
        for p in self.ns.manager.partitions(self.topic):
            target = self.ns.manager.get_log(TopicPartition(self.topic, p))
            if target is not None:
                target.flush()


class PartitionDir(Directory):
    """``<topic>/<p>/``: each name maps to a method making its node (add names to ``_ENTRIES``)."""

    _ENTRIES = {
        "append": "_append", "records": "_records", "records.jsonl": "_records_jsonl",
        "offset": "_offset", "from": "_from", "since": "_since", "segments": "_segments",
        "state": "_state", "delete": "_delete",
    }

    def __init__(self, ns: Namespace, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp
        self.topic = tp.topic

    @property
    def key(self) -> tuple:
        return ("partition", self.tp)

    @property
    def parent_key(self) -> tuple:
        return ("topic", self.tp.topic)

    def names(self) -> list[str]:
        from logfs.groups import PARTITION_NAMES   # consume/, append.jsonl (issue 13)
        return list(self._ENTRIES) + PARTITION_NAMES

    def lookup(self, name: str) -> Node:
        target = self.ns.log(self.tp)
        from logfs.groups import partition_entry
        extra = partition_entry(self.ns, self.tp, name)
        if extra is not None:
            return extra
        method = self._ENTRIES.get(name)
        if method is None:
            raise NoSuchNameError(f"No file {name!r} in partition {self.tp}")
        return getattr(self, method)(target)

    def _records(self, target: Log) -> Node:
        return self.ns.view(self.tp, "records", target, "text", start_offset=target.log_start_offset)

    def _records_jsonl(self, target: Log) -> Node:
        return self.ns.view(self.tp, "records.jsonl", target, "jsonl", start_offset=target.log_start_offset)

    def _append(self, target: Log) -> Node:
        return self.ns.stable(AppendFile, self.tp.topic, self.tp.partition)

    def _state(self, target: Log) -> Node:
        return self.ns.stable(StateFile, self.tp)

    def _delete(self, target: Log) -> Node:
        return self.ns.stable(PartitionDeleteFile, self.tp)

    def _offset(self, target: Log) -> Node:
        return self.ns.stable(OffsetDir, self.tp)

    def _from(self, target: Log) -> Node:
        return self.ns.stable(FromDir, self.tp)

    def _since(self, target: Log) -> Node:
        return self.ns.stable(SinceDir, self.tp)

    def _segments(self, target: Log) -> Node:
        return self.ns.stable(SegmentsDir, self.tp)

    def fsync(self) -> None:
        self.ns.log(self.tp).flush()


class _PartitionSubDir(Directory):
    kind = ""

    def __init__(self, ns: Namespace, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp
        self.topic = tp.topic

    @property
    def key(self) -> tuple:
        return (self.kind, self.tp)

    @property
    def parent_key(self) -> tuple:
        return ("partition", self.tp)

    def names(self) -> list[str]:
        # offset/, from/ and since/ are addressed by name only: listing every
        # offset or timestamp would be unbounded.
        return []

    def fsync(self) -> None:
        self.ns.log(self.tp).flush()


class OffsetDir(_PartitionSubDir):
    kind = "offset"

    def lookup(self, name: str) -> Node:
        offset = parse_canonical_int(name)
        if offset is None:
            raise MalformedNameError(f"No offset {_shown(name)} in {self.tp}: an offset is written in "
                                     "ASCII digits without leading zeros")
        record = record_at(self.ns.log(self.tp), offset)
        content = (record.value or b"") + b"\n"
        digest = record_digest(content)
        node = self.ns.content(("offset", self.tp, offset), lambda node: node.digest == digest,
                               lambda: RecordFile(self.ns, self.tp, offset, content, record.timestamp))
        node.content = content      # type: ignore[attr-defined]
        return node


class FromDir(_PartitionSubDir):
    kind = "from"

    def lookup(self, name: str) -> Node:
        stem, fmt = _split_format(name)
        offset = parse_canonical_int(stem)
        if offset is None:
            raise MalformedNameError(f"No view from/{_shown(name)} in {self.tp}: an offset is written in "
                                     "ASCII digits without leading zeros")
        target = self.ns.log(self.tp)
        start, end = target.log_start_offset, target.log_end_offset
        if not start <= offset <= end:
            raise OffsetOutOfRangeError(
                f"No view from/{name} in {self.tp}: offset {offset} is outside the log "
                f"(log start offset {start}, log end offset {end})",
                offset=offset, log_start_offset=start, log_end_offset=end)
        return self.ns.view(self.tp, f"from/{name}", target, fmt, start_offset=offset)


class SinceDir(_PartitionSubDir):
    kind = "since"

    def lookup(self, name: str) -> Node:
        stem, fmt = _split_format(name)
        timestamp = parse_timestamp(stem)
        if timestamp is None:
            raise MalformedNameError(f"No view since/{_shown(name)} in {self.tp}: not epoch milliseconds "
                                     "or an ISO 8601 time")
        target = self.ns.log(self.tp)
        found = target.fetch_offset_by_timestamp(timestamp)
        # No record at or after T yet: the view starts at the log end and grows.
        start = target.log_end_offset if found is None else found[0]
        return self.ns.view(self.tp, f"since/{name}", target, fmt, start_offset=start)


_SEGMENT_NAME = re.compile(r"([0-9]{20})\.(log|index|timeindex|jsonl)", re.ASCII)


class SegmentsDir(_PartitionSubDir):
    kind = "segments"

    def names(self) -> list[str]:
        names = []
        for base in self.ns.log(self.tp).segments.keys():
            stem = filename_prefix_from_offset(base)
            names.extend(stem + suffix for suffix in (*SEGMENT_FILE_SUFFIXES, ".jsonl"))
        return names

    def lookup(self, name: str) -> Node:
        match = _SEGMENT_NAME.fullmatch(name)
        if match is None:
            raise NoSuchNameError(f"No segment file {_shown(name)} in {self.tp}")
        base, suffix = int(match.group(1)), match.group(2)
        target = self.ns.log(self.tp)
        segment = target.segments.get(base)
        if segment is None:
            raise NoSuchNameError(f"No segment with base offset {base} in {self.tp}")
        if suffix == "jsonl":
            start = max(base, target.log_start_offset)
            return self.ns.view(self.tp, f"segments/{name}", target, "jsonl", start_offset=start,
                                segment=segment)
        return self.ns.content(("segfile", self.tp, name), lambda node: node.is_current(segment),
                               lambda: SegmentFile(self.ns, self.tp, name, segment, "." + suffix))


# --------------------------------------------------------------------------- namespace


class TopicRouter:
    """Round-robin partition choice for unkeyed writes to a topic-level ``append``.

    Shared by every handle of a topic so concurrent writers spread too; the
    choice is per write (Kafka's sticky partitioner picks per batch as well).
    """

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def next_partition(self, num_partitions: int) -> int:
        p = self._next % num_partitions
        self._next = p + 1
        return p


class Namespace:
    """The tree of SPEC.md section 4 over one ``LogManager``."""

    def __init__(self, manager: LogManager, stats: _stats.MountStats, *, read_only: bool = False,
                 views_direct_io: bool = True) -> None:
        self.manager = manager
        self.stats = stats
        self.read_only = read_only
        self.views_direct_io = views_direct_io
        self.started_ns = _now_ns()
        self._routers: dict[str, TopicRouter] = {}
        self._nodes: dict[tuple, Node] = {}
        self._retired: collections.OrderedDict[tuple, Node] = collections.OrderedDict()
        self.root = RootDir(self)
        self._nodes[self.root.key] = self.root
        from logfs import groups   # loads __consumer_offsets: committed offsets (issue 13)
        groups.install(self)

    # ---- helpers used by nodes

    def stable(self, cls, *args) -> Node:
        """The one node object of a structural name (so its inode is reused)."""
        node = cls(self, *args)
        existing = self._nodes.get(node.key)
        if existing is None:
            self._nodes[node.key] = node
            return node
        return existing

    def content(self, key: tuple, same: Callable[[Node], bool], make: Callable[[], Node]) -> Node:
        """The node of a content name: the known one while ``same(node)``, else a new one (a new inode)."""
        node = self._nodes.get(key)
        if node is not None and same(node):
            self._retired.pop(key, None)
            return node
        node = make()
        self._nodes[key] = node
        self._retired.pop(key, None)
        return node

    def view(self, tp: TopicPartition, name: str, target: Log, fmt: str, *, start_offset: int,
             segment: LogSegment | None = None) -> Node:
        """The view node of ``name``: one rendering from ``start_offset`` while nothing of it changed."""
        return self.content(
            ("view", tp, name),
            lambda node: node.start_offset == start_offset and node.is_current(),   # type: ignore[attr-defined]
            lambda: ViewFile(self, tp, name, target, fmt, start_offset, segment))

    def forgotten(self, node: Node) -> None:
        """The kernel forgot ``node``'s inode (cache eviction, ``drop_caches``).

        A content node still current stays known, among the last
        ``RETIRED_NODES`` forgotten ones, so a later lookup of the same
        unchanged file gets its inode number back (``logfs.fs`` keeps it on the
        node); older ones leave the table, so memory is bounded whatever is
        looked up.
        """
        if not node.transient:
            return
        key = node.key
        if self._nodes.get(key) is not node:
            return
        node.retire()
        self._retired[key] = node
        self._retired.move_to_end(key)
        while len(self._retired) > RETIRED_NODES:
            old_key, old = self._retired.popitem(last=False)
            if self._nodes.get(old_key) is old:
                del self._nodes[old_key]

    def known_node(self, key: tuple) -> Node | None:
        return self._nodes.get(key)

    def nodes_known(self) -> int:
        """Nodes in the table (structural and content), for tests and stats."""
        return len(self._nodes)

    def log(self, tp: TopicPartition) -> Log:
        target = self.manager.get_log(tp)
        if target is None:
            raise UnknownTopicOrPartitionError(f"No partition {tp}")
        return target

    def require_topic(self, topic: str) -> None:
        if topic not in self.manager.topics():
            raise UnknownTopicOrPartitionError(f"No topic {topic!r}")

    def router(self, topic: str) -> TopicRouter:
        router = self._routers.get(topic)
        if router is None:
            router = self._routers[topic] = TopicRouter()
        return router

    def check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError("The mount is read-only")

    def delete_topic(self, topic: str) -> None:
        self.require_topic(topic)
        self.manager.delete_topic(topic)
        self._routers.pop(topic, None)
        if not self.read_only:
            self.group_coordinator.on_topic_deleted(topic)   # Kafka drops a deleted topic's commits
        # Stable nodes of the topic resolve it by name; drop them so a topic of
        # the same name created later starts from fresh objects.
        for key in list(self._nodes):   # list(): a snapshot, lookups may add keys meanwhile
            if _mentions_topic(key, topic):
                self._nodes.pop(key, None)
                self._retired.pop(key, None)


# --------------------------------------------------------------------------- parsing


def _mentions_topic(key: tuple, topic: str) -> bool:
    for part in key[1:]:
        if part == topic or (isinstance(part, TopicPartition) and part.topic == topic):
            return True
    return False


def _props_text(props: dict[str, str]) -> bytes:
    return "".join(f"{k}={v}\n" for k, v in sorted(props.items())).encode()


def _split_format(name: str) -> tuple[str, str]:
    if name.endswith(".jsonl"):
        return name[:-6], "jsonl"
    return name, "text"


def record_digest(content: bytes) -> bytes:
    """What identifies the content of ``offset/<N>`` once its bytes are dropped."""
    return hashlib.blake2b(content, digest_size=16).digest()


def _shown(name: str) -> str:
    """A name as a log line shows it: quoted, at most 80 characters."""
    return repr(name) if len(name) <= 80 else f"{name[:80]!r}... ({len(name)} characters)"


def parse_timestamp(text: str) -> int | None:
    """Epoch milliseconds or ISO 8601 (a naive time is UTC) -> epoch ms; None if neither.

    Epoch milliseconds have one spelling (engine.numbers); ISO 8601 is read by
    ``datetime.fromisoformat`` on ASCII text only (it would accept other
    scripts' digits).  Every refusal is None, so every bad name is ENOENT.
    """
    if not text.isascii() or not text:
        return None
    if text[0].isdigit() and text.isdigit():
        return parse_canonical_int(text)
    try:
        when = _dt.datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    try:
        return int(when.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):
        return None


def _now_ns() -> int:
    return time.time_ns()
