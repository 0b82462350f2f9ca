"""The directories of the tree (SPEC.md section 4): the one home of its shape.

Every name a directory holds is in its table here (``BrokerDir._FILES``,
``TopicDir._ENTRIES``, ``PartitionDir._ENTRIES``), the consumer-group entries
(``groups``, ``consume``) and ``append.jsonl`` included; their nodes live in
logfs.groups and logfs.control, which know nothing of this module.  What
a name spells (times, the ``.jsonl`` suffix) is parsed by logfs.names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from engine.errors import OffsetOutOfRangeError
from engine.files import SEGMENT_FILE_SUFFIXES, filename_prefix_from_offset, parse_segment_file_name, segment_file_name
from engine.numbers import parse_canonical_int
from engine.remote.remote_segment import RemoteLogSegment
from engine.topic import TopicPartition, parse_partition, validate_topic_name
from engine.transactions import visible_end_offset
from engine.views import LogView, ViewFormat, load_remote_view_indexes, record_at
from logfs.control import (
    AppendFile,
    BrokerConfigFile,
    JsonlAppendFile,
    PartitionDeleteFile,
    TopicConfigFile,
    TopicDeleteFile,
)
from logfs.errors import MalformedNameError, NoSuchNameError, NotPermittedError, shown
from logfs.groups import ConsumeDir, GroupsDir
from logfs.names import JSONL_SUFFIX, parse_timestamp, split_format
from logfs.nodes import (
    FOLLOWED_VIEWS,
    STABLE_TIMEOUT_S,
    Directory,
    ErrorsFile,
    MetricsFile,
    Node,
    RecordFile,
    RemoteSegmentFile,
    SegmentFile,
    StateFile,
    StatsFile,
    ViewFile,
    record_digest,
)

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from engine.log import Log
    from logfs.tree import NodeKey, Tree


class RootDir(Directory):
    key = ("root",)
    topic: str | None = None
    # its attributes never change; the kernel checks them at every path walk (default_permissions)
    attr_timeout = STABLE_TIMEOUT_S

    def path(self) -> str:
        return ""

    def names(self) -> list[str]:
        return [".logfs", *self.ns.backend.topics()]

    def lookup(self, name: str) -> Node:
        if name == ".logfs":
            return self.ns.stable(BrokerDir)
        if name in self.ns.backend.topics():
            return self.ns.stable(TopicDir, name)
        raise NoSuchNameError(f"No topic {name!r}")

    def mkdir(self, name: str) -> Node:
        self.ns.check_writable()
        if name == ".logfs":
            raise NotPermittedError(".logfs is reserved")
        validate_topic_name(name)
        self.ns.backend.create_topic(name)
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
    entry_timeout = attr_timeout = STABLE_TIMEOUT_S
    _FILES: ClassVar[dict[str, type[Node]]] = {"config": BrokerConfigFile, "errors": ErrorsFile,
                                                "stats.json": StatsFile, "metrics": MetricsFile}

    def path(self) -> str:
        return ".logfs"

    def names(self) -> list[str]:
        return list(self._FILES)

    def lookup(self, name: str) -> Node:
        cls = self._FILES.get(name)
        if cls is None:
            raise NoSuchNameError(f"No file .logfs/{name}")
        return self.ns.stable(cls)


class TopicDir(Directory):
    """``<topic>/``: the names of ``_ENTRIES`` (each maps to the method making its node), then the partitions."""

    parent_key = ("root",)
    _ENTRIES: ClassVar[dict[str, str]] = {
        "append": "_append", "config": "_config", "delete": "_delete",
        "append.jsonl": "_append_jsonl", "groups": "_groups",
    }
    entry_timeout = attr_timeout = STABLE_TIMEOUT_S     # invalidated by logfs.fs when the topic goes

    def __init__(self, ns: Tree, topic: str) -> None:
        super().__init__(ns)
        self.topic = topic

    @property
    def key(self) -> NodeKey:
        return ("topic", self.topic)

    def path(self) -> str:
        return self.topic

    #: the names whose files read or write the topic's records (a cluster mount replicates every partition
    #: of the topic on their first use); ``config`` and ``delete`` need no replica
    _NEED_RECORDS = frozenset({"append", "append.jsonl", "groups"})

    def names(self) -> list[str]:
        parts = self.ns.backend.partitions(self.topic)
        return list(self._ENTRIES) + [str(p) for p in parts]

    def preparation(self, name: str) -> Callable[[], None] | None:
        if name not in self._NEED_RECORDS:
            return None
        return self.ns.replica_preparation([TopicPartition(self.topic, p)
                                            for p in self.ns.backend.partitions(self.topic)], catch_up=False)

    def lookup(self, name: str) -> Node:
        self.ns.require_topic(self.topic)
        method = self._ENTRIES.get(name)
        if method is not None:
            node: Node = getattr(self, method)()
            return node
        partition = parse_canonical_int(name)
        if partition is not None and partition in self.ns.backend.partitions(self.topic):
            return self.ns.stable(PartitionDir, TopicPartition(self.topic, partition))
        if partition is None and name.isdigit():     # 03, or digits of another script
            raise MalformedNameError(f"No partition {name!r} in topic {self.topic}: a partition is "
                                     "written in ASCII digits without leading zeros")
        raise NoSuchNameError(f"No partition {name!r} in topic {self.topic}")

    def mkdir(self, name: str) -> Node:
        self.ns.check_writable()
        partition = parse_partition(name)
        self.ns.backend.add_partition(self.topic, partition)
        return self.ns.stable(PartitionDir, TopicPartition(self.topic, partition))

    def rmdir(self, name: str) -> None:
        self.ns.check_writable()
        raise NotPermittedError(f"Partitions cannot be removed (topic {self.topic}); delete the topic instead")

    def fsync(self) -> None:
        for p in self.ns.manager.partitions(self.topic):
            target = self.ns.manager.get_log(TopicPartition(self.topic, p))
            if target is not None:
                target.flush()

    def _append(self) -> Node:
        return self.ns.stable(AppendFile, self.topic, None)

    def _append_jsonl(self) -> Node:
        return self.ns.stable(JsonlAppendFile, self.topic, None)

    def _config(self) -> Node:
        return self.ns.stable(TopicConfigFile, self.topic)

    def _delete(self) -> Node:
        return self.ns.stable(TopicDeleteFile, self.topic)

    def _groups(self) -> Node:
        return self.ns.stable(GroupsDir, self.topic)


class _PartitionDirectory(Directory):
    """A directory of one partition: ``<topic>/<p>/`` itself (:class:`PartitionDir`), and those below it."""

    kind = "partition"

    def __init__(self, ns: Tree, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp
        self.topic = tp.topic

    @property
    def key(self) -> NodeKey:
        return (self.kind, self.tp)

    @property
    def parent_key(self) -> NodeKey:
        return ("topic", self.topic)

    def path(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}"


class _PartitionSubDir(_PartitionDirectory):
    """``offset/``, ``from/``, ``since/`` and ``segments/``: a directory in ``<topic>/<p>/``."""

    kind = ""

    @property
    def parent_key(self) -> NodeKey:
        return (_PartitionDirectory.kind, self.tp)

    def path(self) -> str:
        return f"{super().path()}/{self.kind}"

    def names(self) -> list[str]:
        # offset/, from/ and since/ are addressed by name only: listing every
        # offset or timestamp would be unbounded.
        return []

    def preparation(self, name: str) -> Callable[[], None] | None:
        return self.ns.replica_preparation([self.tp])

    def fsync(self) -> None:
        self.ns.log(self.tp).flush()


class OffsetDir(_PartitionSubDir):
    kind = "offset"

    def preparation(self, name: str) -> Callable[[], None] | None:
        replica = self.ns.replica_preparation([self.tp])
        offset = parse_canonical_int(name)
        if replica is not None or offset is None:
            return replica
        if not self.ns.backend.remote:      # the record read once from the store, then from its caches
            return self.ns.store_preparation(self.tp, lambda target: record_at(target, offset))
        target = self.ns.manager.get_log(self.tp)
        if target is None or offset >= target.log_start_offset:
            return None
        return lambda: self._below_log_start(offset)

    def _below_log_start(self, offset: int) -> None:
        try:
            self.ns.backend.record_below_log_start(self.tp, offset)    # cached for lookup()
        except OffsetOutOfRangeError:
            pass            # lookup() says it

    def lookup(self, name: str) -> Node:
        offset = parse_canonical_int(name)
        if offset is None:
            raise MalformedNameError(f"No offset {shown(name)} in {self.tp}: an offset is written in "
                                     "ASCII digits without leading zeros")
        target = self.ns.log(self.tp)
        # below the local log start of a bounded replica: the record as the cluster holds it
        below = self.ns.backend.record_below_log_start(self.tp, offset) if offset < target.log_start_offset else None
        record = below if below is not None else record_at(target, offset)
        content = (record.value or b"") + b"\n"
        digest = record_digest(content)
        node = self.ns.content(("offset", self.tp, offset), lambda node: node.digest == digest,
                               lambda: RecordFile(self.ns, self.tp, offset, content, record.timestamp))
        node.content = content
        return node


class _ViewsDir(_PartitionSubDir):
    """``from/`` and ``since/``: each name spells where its view starts (``<name>.jsonl``: in JSON lines)."""

    #: what a name must spell, said when it does not
    spelling = ""

    def parse(self, stem: str) -> int | None:
        """What ``stem`` spells (an offset, a time), or None."""
        raise NotImplementedError

    def start_offset(self, target: Log, value: int, name: str) -> int:
        """Where the view of ``name`` (spelling ``value``) starts in ``target``."""
        raise NotImplementedError

    def preparation(self, name: str) -> Callable[[], None] | None:
        replica = self.ns.replica_preparation([self.tp])
        if replica is not None:
            return replica
        stem, fmt = split_format(name)
        value = self.parse(stem)
        if value is None:
            return None

        def warm(target: Log) -> None:     # the view's start and size: what lookup() reads of the store
            view = LogView(target, fmt, start_offset=self.start_offset(target, value, name))
            try:
                view.size()
            finally:
                view.close()

        return self.ns.store_preparation(self.tp, warm)

    def lookup(self, name: str) -> Node:
        stem, fmt = split_format(name)
        value = self.parse(stem)
        if value is None:
            raise MalformedNameError(f"No view {self.kind}/{shown(name)} in {self.tp}: {self.spelling}")
        target = self.ns.log(self.tp)
        return ViewFile.named(self.ns, self.tp, f"{self.kind}/{name}", target, fmt,
                              start_offset=self.start_offset(target, value, name))


class FromDir(_ViewsDir):
    kind = "from"
    spelling = "an offset is written in ASCII digits without leading zeros"

    def parse(self, stem: str) -> int | None:
        return parse_canonical_int(stem)

    def start_offset(self, target: Log, value: int, name: str) -> int:
        # the end a read_committed view of a live replica shows is its last stable offset
        start, end = target.log_start_offset, visible_end_offset(target)
        if not start <= value <= end:
            bound = "last stable offset" if end < target.log_end_offset else "log end offset"
            raise OffsetOutOfRangeError(
                f"No view from/{name} in {self.tp}: offset {value} is outside the log "
                f"(log start offset {start}, {bound} {end})",
                offset=value, log_start_offset=start, log_end_offset=end)
        return value


class SinceDir(_ViewsDir):
    kind = "since"
    spelling = "not epoch milliseconds or an ISO 8601 time"

    def parse(self, stem: str) -> int | None:
        return parse_timestamp(stem)

    def start_offset(self, target: Log, value: int, name: str) -> int:
        found = target.fetch_offset_by_timestamp(value)
        # No record at or after T yet (or only behind the last stable offset of a read_committed view of
        # a live replica, as Kafka's ListOffsets finds none): the view starts at the visible end and grows.
        end = visible_end_offset(target)
        return end if found is None or found[0] > end else found[0]


#: the files of ``segments/`` per segment: its own, and its JSON-lines rendering
_SEGMENT_LISTING = (*SEGMENT_FILE_SUFFIXES, JSONL_SUFFIX)


class SegmentsDir(_PartitionSubDir):
    """``segments/``: the files of every segment a reader sees, as in a Kafka data dir; with tiered storage
    the remote log segments below the local log start too (their bytes read from the store, read-only)."""

    kind = "segments"

    def names(self) -> list[str]:
        names: list[str] = []
        for base in self.ns.log(self.tp).reader_segments():
            stem = filename_prefix_from_offset(base)
            names.extend(stem + suffix for suffix in _SEGMENT_LISTING)
        return names

    def lookup(self, name: str) -> Node:
        parsed = parse_segment_file_name(name)
        if parsed is None or parsed[1] not in _SEGMENT_LISTING or segment_file_name(*parsed) != name:
            raise NoSuchNameError(f"No segment file {shown(name)} in {self.tp}")
        base, suffix = parsed
        target = self.ns.log(self.tp)
        segment = target.reader_segments().get(base)
        if segment is None:
            raise NoSuchNameError(f"No segment with base offset {base} in {self.tp}")
        if suffix == JSONL_SUFFIX:
            start = max(base, target.log_start_offset)
            return ViewFile.named(self.ns, self.tp, f"segments/{name}", target, ViewFormat.JSONL, start_offset=start,
                                segment=segment)
        if isinstance(segment, RemoteLogSegment):
            remote = segment
            return self.ns.content(("segfile", self.tp, name), lambda node: node.is_current(remote),
                                   lambda: RemoteSegmentFile(self.ns, self.tp, name, remote, suffix))
        return self.ns.content(("segfile", self.tp, name), lambda node: node.is_current(segment),
                               lambda: SegmentFile(self.ns, self.tp, name, segment, suffix))


class PartitionDir(_PartitionDirectory):
    """``<topic>/<p>/``: each name maps to the class of its node, made from the partition, or to the method
    making it (add names to ``_ENTRIES``)."""

    entry_timeout = attr_timeout = STABLE_TIMEOUT_S     # a partition goes only with its topic

    _ENTRIES: ClassVar[dict[str, str | Callable[[Tree, TopicPartition], Node]]] = {
        "append": "_append", "records": "_records", "records.jsonl": "_records_jsonl",
        "offset": OffsetDir, "from": FromDir, "since": SinceDir, "segments": SegmentsDir,
        "state": StateFile, "delete": PartitionDeleteFile, "append.jsonl": "_append_jsonl", "consume": ConsumeDir,
    }

    def names(self) -> list[str]:
        return list(self._ENTRIES)

    #: names whose lookup makes the replica without waiting for it to catch up: a view waits at its open
    #: (ViewFile.open_preparation), so that ``cat t/*/records`` (the shell's lookups first, one by one) has
    #: every partition fetched together; a write waits for its own records
    _CATCH_UP_AT_OPEN = frozenset({"records", "records.jsonl", "append", "append.jsonl", "delete"})

    def preparation(self, name: str) -> Callable[[], None] | None:
        replica = self.ns.replica_preparation([self.tp], catch_up=name not in self._CATCH_UP_AT_OPEN)
        return replica if replica is not None else self.store_preparation(name)

    def store_preparation(self, name: str) -> Callable[[], None] | None:
        if name not in FOLLOWED_VIEWS:
            return None
        # the view indexes of the remote log segments, which size the view
        return self.ns.store_preparation(self.tp, load_remote_view_indexes)

    def lookup(self, name: str) -> Node:
        target = self.ns.log(self.tp)
        entry = self._ENTRIES.get(name)
        if entry is None:
            raise NoSuchNameError(f"No file {name!r} in partition {self.tp}")
        if isinstance(entry, str):
            node: Node = getattr(self, entry)(target)
            return node
        return self.ns.stable(entry, self.tp)

    def _records(self, target: Log) -> Node:
        return ViewFile.named(self.ns, self.tp, "records", target, ViewFormat.TEXT,
                              start_offset=target.log_start_offset)

    def _records_jsonl(self, target: Log) -> Node:
        return ViewFile.named(self.ns, self.tp, "records.jsonl", target, ViewFormat.JSONL,
                              start_offset=target.log_start_offset)

    def _append(self, target: Log) -> Node:
        return self.ns.stable(AppendFile, self.tp.topic, self.tp.partition)

    def _append_jsonl(self, target: Log) -> Node:
        return self.ns.stable(JsonlAppendFile, self.tp.topic, self.tp.partition)

    def fsync(self) -> None:
        self.ns.log(self.tp).flush()
