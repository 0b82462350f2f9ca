"""The mount's namespace: path names -> nodes, and what opening each node gives.

This module is the only place that knows the shape of the tree in SPEC.md
section 4.  It speaks in terms of the engine (``LogManager``, ``Log``,
``LogView``) and plain Python exceptions carrying an errno; it knows nothing of
FUSE inodes, which ``logfs.fs`` keeps.  Every failure is raised as an
``engine.errors.LogfsError`` subclass so ``logfs.fs`` can answer with its errno.

Two kinds of node exist:

* *stable* nodes (directories, ``append``, ``config``, ``delete``, ``state``,
  ``.logfs/*``) have an identity key; the filesystem gives every lookup of the
  same key the same inode.
* *fresh* nodes (``records``, ``from/<N>``, ``since/<T>``, ``segments/*``,
  ``offset/<N>``) are created anew at each lookup.  A view node anchors its
  ``LogView`` at lookup time, so the kernel's per-inode size is the size of
  *that* opening's view, which only grows: ``tail -f`` never sees truncation
  even when retention or compaction rewrites the log underneath.
"""

from __future__ import annotations

import datetime as _dt
import errno as _errno
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable

import orjson

from engine.errors import (
    InvalidConfigError,
    InvalidRequestError,
    LogfsError,
    ReadOnlyError,
    UnknownTopicOrPartitionError,
)
from engine.topic import TopicPartition, parse_partition, validate_topic_name
from engine.views import LogView, ViewFormat, record_at
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

SEGMENT_SUFFIXES = (".log", ".index", ".timeindex")


class NoSuchNameError(LogfsError):
    """A name that does not exist in the namespace (a view, a file, a directory)."""

    errno = _errno.ENOENT


class NotPermittedError(LogfsError):
    """The namespace is fixed: files cannot be created, removed or renamed."""

    errno = _errno.EPERM


class AccessDeniedError(LogfsError):
    """A write to a read-only view or file."""

    errno = _errno.EACCES


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
    """A segment file exactly as on disk (``.log``, ``.index``, ``.timeindex``)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def release(self) -> None:
        os.close(self._fd)


class LineCommandHandle(Handle):
    """Line-oriented control file (``config``, ``delete``).

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


# --------------------------------------------------------------------------- nodes


class Node:
    """One name of the namespace."""

    is_dir = False
    mode = VIEW_MODE
    #: whether every lookup of this name is the same inode (see module docstring)
    stable = True
    #: kernel attribute cache time; 0 for files whose size changes under the reader
    attr_timeout = 0.0

    def __init__(self, ns: "Namespace") -> None:
        self.ns = ns

    @property
    def key(self) -> tuple:
        raise NotImplementedError

    def size(self) -> int:
        return 0

    def mtime_ns(self) -> int:
        return self.ns.started_ns

    def close(self) -> None:
        """The kernel forgot the inode and no handle is open: release engine resources."""

    def detach(self) -> None:
        """The node was made for a directory listing only: drop what only an open needs."""


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
    def __init__(self, ns: "Namespace", tp: TopicPartition) -> None:
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

    def __init__(self, ns: "Namespace", topic: str) -> None:
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
        return LineCommandHandle(self._alter, self.render())

    def _alter(self, lines: list[bytes]) -> None:
        updates: dict[str, str | None] = {}
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("#"):
                continue
            name, sep, value = line.partition("=")
            name = name.strip()
            if not sep or not name:
                raise InvalidConfigError(
                    f"Invalid config line {line!r} for topic {self.topic}: expected name=value")
            value = value.strip()
            updates[name] = value if value else None
        if updates:
            self.ns.manager.alter_topic_config(self.topic, updates)
            log.info("Updated topic %s config overrides: %s", self.topic,
                     ", ".join(f"{k}={'' if v is None else v}" for k, v in updates.items()))


# ---- control files


class TopicDeleteFile(FileNode):
    """Write the marker ``topic`` to delete the topic asynchronously (like rmdir)."""

    writable = True
    mode = WRITE_ONLY_MODE

    def __init__(self, ns: "Namespace", topic: str) -> None:
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
                raise InvalidRequestError(
                    f"Invalid marker {marker.decode('utf-8', 'replace')!r} for {self.topic}/delete:"
                    " expected 'topic'")
        self.ns.delete_topic(self.topic)


class PartitionDeleteFile(FileNode):
    """``before <offset>`` (Kafka's DeleteRecords) or ``key <key>`` (a tombstone)."""

    writable = True
    mode = WRITE_ONLY_MODE

    def __init__(self, ns: "Namespace", tp: TopicPartition) -> None:
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
            if verb == b"before" and arg.strip().isdigit():
                actions.append(("before", int(arg.strip())))
            elif verb == b"key" and arg:
                actions.append(("key", arg))
            else:
                raise InvalidRequestError(
                    f"Invalid marker {line.decode('utf-8', 'replace')!r} for {self.tp}/delete:"
                    " expected 'before <offset>' or 'key <key>'")
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

    def __init__(self, ns: "Namespace", topic: str, partition: int | None) -> None:
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


# ---- fresh files


class ViewFile(FileNode):
    """``records``, ``records.jsonl``, ``from/<N>``, ``since/<T>``, ``segments/<base>.jsonl``.

    The lookup anchors a ``LogView`` to validate the name and measure its size;
    ``logfs.fs`` detaches it again unless the file is open.  The open anchors
    the view its reads use, shared by every open of this inode and closed when
    the last one is released, so a view pins its segments (deleted ones
    included) only while someone reads it.
    """

    stable = False

    def __init__(self, ns: "Namespace", name: str, anchor: Callable[[], object]) -> None:
        super().__init__(ns)
        self.name = name
        self._anchor = anchor
        self._view = None
        self._created_ns = _now_ns()

    @property
    def key(self) -> tuple:
        return ("view", id(self))

    @property
    def view(self):
        if self._view is None:
            self._view = self._anchor()
            self.ns.stats.views_open += 1
        return self._view

    def describe(self) -> str:
        return self.name

    def size(self) -> int:
        return self.view.size()

    def mtime_ns(self) -> int:
        return self._created_ns

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        return ViewHandle(self.view, self.ns.views_direct_io)

    def detach(self) -> None:
        """Release the view while no file is open (it re-anchors when used again)."""
        self.close()

    def close(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            self.ns.stats.views_open -= 1
            view.close()


class RecordFile(FileNode):
    """``offset/<N>``: the value of one record, newline-terminated."""

    stable = False

    def __init__(self, ns: "Namespace", name: str, content: bytes) -> None:
        super().__init__(ns)
        self.name = name
        self.content = content

    @property
    def key(self) -> tuple:
        return ("record", id(self))

    def describe(self) -> str:
        return self.name

    def size(self) -> int:
        return len(self.content)

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        return BytesHandle(self.content)


class SegmentFile(FileNode):
    """``segments/<base>.log|.index|.timeindex``: the bytes on disk, read-only."""

    stable = False

    def __init__(self, ns: "Namespace", name: str, segment: "LogSegment", suffix: str) -> None:
        super().__init__(ns)
        self.name = name
        self.segment = segment
        self.suffix = suffix

    @property
    def key(self) -> tuple:
        return ("segment", id(self))

    def describe(self) -> str:
        return f"segments/{self.name}"

    def _path(self) -> str:
        seg = self.segment
        if self.suffix == ".log":
            return seg.log_path
        if self.suffix == ".index":
            return seg.offset_index.path
        return seg.time_index.path

    def _candidates(self) -> Iterable[str]:
        # The segment may have been scheduled for deletion (renamed .deleted)
        # between the lookup and this call; its bytes are still the same.
        path = self._path()
        yield path
        if not path.endswith(".deleted"):
            yield path + ".deleted"

    def size(self) -> int:
        for path in self._candidates():
            try:
                return os.stat(path).st_size
            except FileNotFoundError:
                continue
        return 0

    def mtime_ns(self) -> int:
        for path in self._candidates():
            try:
                return os.stat(path).st_mtime_ns
            except FileNotFoundError:
                continue
        return self.ns.started_ns

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        for path in self._candidates():
            try:
                return RawFileHandle(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            except FileNotFoundError:
                continue
        raise NoSuchNameError(f"Segment file {self.name} has been deleted")


# ---- directories


class RootDir(Directory):
    key = ("root",)

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
    _FILES = {"config": BrokerConfigFile, "stats.json": StatsFile, "metrics": MetricsFile}

    def names(self) -> list[str]:
        return list(self._FILES)

    def lookup(self, name: str) -> Node:
        cls = self._FILES.get(name)
        if cls is None:
            raise NoSuchNameError(f"No file .logfs/{name}")
        return self.ns.stable(cls)


class TopicDir(Directory):
    def __init__(self, ns: "Namespace", topic: str) -> None:
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
        if name.isdigit() and int(name) in self.ns.manager.partitions(self.topic) and str(int(name)) == name:
            return self.ns.stable(PartitionDir, TopicPartition(self.topic, int(name)))
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
    _NAMES = ["append", "records", "records.jsonl", "offset", "from", "since", "segments", "state", "delete"]

    def __init__(self, ns: "Namespace", tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp

    @property
    def key(self) -> tuple:
        return ("partition", self.tp)

    def names(self) -> list[str]:
        from logfs.groups import PARTITION_NAMES
        return list(self._NAMES) + PARTITION_NAMES

    def lookup(self, name: str) -> Node:
        target = self.ns.log(self.tp)
        ns = self.ns
        from logfs.groups import partition_entry   # consume/, append.jsonl (issue 13)
        extra = partition_entry(ns, self.tp, name)
        if extra is not None:
            return extra
        if name == "records":
            return ns.view(name, target, "text")
        if name == "records.jsonl":
            return ns.view(name, target, "jsonl")
        if name == "append":
            return ns.stable(AppendFile, self.tp.topic, self.tp.partition)
        if name == "state":
            return ns.stable(StateFile, self.tp)
        if name == "delete":
            return ns.stable(PartitionDeleteFile, self.tp)
        if name == "offset":
            return ns.stable(OffsetDir, self.tp)
        if name == "from":
            return ns.stable(FromDir, self.tp)
        if name == "since":
            return ns.stable(SinceDir, self.tp)
        if name == "segments":
            return ns.stable(SegmentsDir, self.tp)
        raise NoSuchNameError(f"No file {name!r} in partition {self.tp}")

    def fsync(self) -> None:
        self.ns.log(self.tp).flush()


class _PartitionSubDir(Directory):
    kind = ""

    def __init__(self, ns: "Namespace", tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp

    @property
    def key(self) -> tuple:
        return (self.kind, self.tp)

    def names(self) -> list[str]:
        # offset/, from/ and since/ are addressed by name only: listing every
        # offset or timestamp would be unbounded.
        return []

    def fsync(self) -> None:
        self.ns.log(self.tp).flush()


class OffsetDir(_PartitionSubDir):
    kind = "offset"

    def lookup(self, name: str) -> Node:
        offset = _parse_offset(name)
        if offset is None:
            raise NoSuchNameError(f"No offset {name!r} in {self.tp}: not a number")
        record = record_at(self.ns.log(self.tp), offset)
        return RecordFile(self.ns, name, (record.value or b"") + b"\n")


class FromDir(_PartitionSubDir):
    kind = "from"

    def lookup(self, name: str) -> Node:
        stem, fmt = _split_format(name)
        offset = _parse_offset(stem)
        if offset is None:
            raise NoSuchNameError(f"No view from/{name} in {self.tp}: not an offset")
        # LogView refuses offsets outside [log start, log end] (OffsetOutOfRangeError -> ENOENT).
        return self.ns.view(f"from/{name}", self.ns.log(self.tp), fmt, start_offset=offset)


class SinceDir(_PartitionSubDir):
    kind = "since"

    def lookup(self, name: str) -> Node:
        stem, fmt = _split_format(name)
        timestamp = parse_timestamp(stem)
        if timestamp is None:
            raise NoSuchNameError(f"No view since/{name} in {self.tp}: not epoch ms or ISO 8601")
        target = self.ns.log(self.tp)
        found = target.fetch_offset_by_timestamp(timestamp)
        # No record at or after T yet: the view starts at the log end and grows.
        start = target.log_end_offset if found is None else found[0]
        return self.ns.view(f"since/{name}", target, fmt, start_offset=start)


class SegmentsDir(_PartitionSubDir):
    kind = "segments"

    def names(self) -> list[str]:
        names = []
        for base in self.ns.log(self.tp).segments.keys():
            stem = f"{base:020d}"
            names.extend(stem + suffix for suffix in (".log", ".index", ".timeindex", ".jsonl"))
        return names

    def lookup(self, name: str) -> Node:
        stem, dot, suffix = name.partition(".")
        if len(stem) != 20 or not stem.isdigit() or suffix not in ("log", "index", "timeindex", "jsonl"):
            raise NoSuchNameError(f"No segment file {name!r} in {self.tp}")
        target = self.ns.log(self.tp)
        segment = target.segments.get(int(stem))
        if segment is None:
            raise NoSuchNameError(f"No segment with base offset {int(stem)} in {self.tp}")
        if suffix == "jsonl":
            return self.ns.view(f"segments/{name}", target, "jsonl", segment=segment)
        return SegmentFile(self.ns, name, segment, "." + suffix)


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

    def __init__(self, manager: "LogManager", stats: "_stats.MountStats", *, read_only: bool = False,
                 views_direct_io: bool = True) -> None:
        self.manager = manager
        self.stats = stats
        self.read_only = read_only
        self.views_direct_io = views_direct_io
        self.started_ns = _now_ns()
        self._routers: dict[str, TopicRouter] = {}
        self._stable: dict[tuple, Node] = {}
        self.root = RootDir(self)
        self._stable[self.root.key] = self.root
        from logfs import groups   # loads __consumer_offsets: committed offsets (issue 13)
        groups.install(self)

    # ---- helpers used by nodes

    def stable(self, cls, *args) -> Node:
        """The one node object of a stable name (so its inode is reused)."""
        node = cls(self, *args)
        existing = self._stable.get(node.key)
        if existing is None:
            self._stable[node.key] = node
            return node
        return existing

    def view(self, name: str, target: "Log", fmt: str, *, start_offset: int | None = None,
             segment: "LogSegment | None" = None) -> ViewFile:
        view_format = ViewFormat.TEXT if fmt == "text" else ViewFormat.JSONL
        node = ViewFile(self, name, lambda: LogView(target, view_format, start_offset=start_offset,
                                                    segment=segment))
        node.view   # anchor now: an out-of-range start fails the lookup, and the size is this moment's
        return node

    def log(self, tp: TopicPartition) -> "Log":
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
        for key in list(self._stable):   # list(): a snapshot, lookups may add keys meanwhile
            if _mentions_topic(key, topic):
                self._stable.pop(key, None)


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


def _parse_offset(text: str) -> int | None:
    if not text.isdigit() or not text.isascii():
        return None
    return int(text)


def parse_timestamp(text: str) -> int | None:
    """Epoch milliseconds or ISO 8601 (a naive time is UTC) -> epoch ms; None if neither."""
    if text.isdigit() and text.isascii():
        return int(text)
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return int(when.timestamp() * 1000)


def _now_ns() -> int:
    return time.time_ns()
