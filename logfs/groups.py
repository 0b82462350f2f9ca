"""Consumer groups in the mount: ``<topic>/groups/`` and ``<topic>/<p>/consume/``.

The committed offsets live in ``__consumer_offsets`` (engine.consumer_offsets,
loaded at mount start); this module gives them their files:

* ``<topic>/groups/`` holds a file per group with a committed offset on the
  topic (``echo ... > groups/new`` creates one: the group exists once a commit
  is applied).  ``groups/<group>`` reads ``<partition> <committed> <log end
  offset> <lag>`` for every partition (``-1`` and the lag from the log start
  where the group has no commit).  Written lines, applied together when the
  file is closed (as an edited file would be; Kafka's
  ``kafka-consumer-groups.sh --reset-offsets --execute``):

  - ``<partition> <offset>``: commit ``offset`` (0 .. log end offset);
  - ``reset earliest`` / ``reset latest``: every partition to its log start /
    log end offset;
  - ``reset <offset>``: every partition to ``offset``, clamped to each
    partition's [log start, log end] as kafka-consumer-groups' ``--to-offset``;
  - ``reset <ISO 8601>`` or ``reset @<epoch ms>``: every partition to its first
    offset with a timestamp at or after that time (the log end when none), as
    ``--to-datetime`` (a bare number is an offset, hence the ``@``).

  A bad line fails the ``write()`` carrying it with EINVAL and nothing written
  through that opening is applied.  ``rm groups/<group>`` deletes the group's
  commits on the topic (tombstones, Kafka's OffsetDelete).
* ``<topic>/<p>/consume/<group>`` (text) and ``consume/<group>.jsonl`` read the
  records from the group's committed offset (the log start when it has none,
  or when it is below the log start or beyond the log end) to the log end
  offset at open.  Closing the file commits the offset of the first record
  the reader was not wholly given.  A partition is read by one opening per
  group at a time, as Kafka assigns a partition to one consumer of a group: a
  second ``open()`` while the first is open fails with EBUSY.  The commit is
  fenced: it applies only if the committed offset is still the one this
  opening started from (a ``groups/`` write meanwhile wins).  On a read-only
  mount the files read the same and commit nothing.
* Durability, as Kafka's coordinator: a commit is acknowledged once it is
  appended to ``__consumer_offsets`` (the close returned: a crash of the mount
  keeps it) and survives a power loss once that partition is flushed
  (``flush.messages``/``flush.ms`` of ``__consumer_offsets``, or ``fsync()``).
  ``fsync()`` of a ``groups/<group>`` opening applies the complete lines
  written so far; of a ``consume/<group>`` opening commits what was read so
  far; of any opening of either (``sync groups/<group>``) flushes the group's
  partition.  ``fsync`` of the ``groups/`` or ``consume/`` directory flushes
  the partitions of every group of the topic.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, cast

from engine.errors import InvalidRequestError, LogfsError
from engine.numbers import INT_MAX, parse_canonical_int
from engine.topic import TopicPartition
from engine.views.consume import ConsumerView, open_consumer_view
from logfs.errors import NoSuchNameError, shown
from logfs.handles import BytesHandle, Handle, LineHandle, ViewHandle
from logfs.names import parse_timestamp, split_format
from logfs.nodes import RW_MODE, Directory, FileNode, Node

if TYPE_CHECKING:  # pragma: no cover
    from engine.consumer_offsets import GroupMetadataManager
    from engine.views import ViewFormat
    from logfs.leases import Lease
    from logfs.tree import NodeKey, Tree

log = logging.getLogger(__name__)

__all__ = ["coordinator", "GroupsDir", "GroupFile", "ConsumeDir", "ConsumeFile"]

#: longest line a groups/<group> file takes (a command is a few dozen bytes)
_MAX_LINE = 4096


def coordinator(ns: Tree) -> GroupMetadataManager:
    return ns.group_coordinator


def _check_group_name(group: str) -> None:
    if not group or group in (".", ".."):
        raise NoSuchNameError(f"Invalid consumer group id {group!r}")


# --------------------------------------------------------------------------- groups/


class GroupsDir(Directory):
    def __init__(self, ns: Tree, topic: str) -> None:
        super().__init__(ns)
        self.topic = topic

    @property
    def key(self) -> NodeKey:
        return ("groups", self.topic)

    def path(self) -> str:
        return f"{self.topic}/groups"

    def names(self) -> list[str]:
        return coordinator(self.ns).groups(self.topic)

    def lookup(self, name: str) -> Node:
        self.ns.require_topic(self.topic)
        if not coordinator(self.ns).committed_offsets(name, self.topic):
            # only groups with commits exist: `cat t/*/records` must not find a group named "records"
            raise NoSuchNameError(f"Group {name!r} has no committed offsets on topic {self.topic}")
        return self.ns.stable(GroupFile, self.topic, name)

    def create(self, name: str) -> Node:
        """``echo '0 5' > groups/<new group>``: the group exists once what is written is applied."""
        self.ns.check_writable()
        self.ns.require_topic(self.topic)
        _check_group_name(name)
        return self.ns.stable(GroupFile, self.topic, name)

    def fsync(self) -> None:
        """fsyncdir(): the commits of every group on the topic made durable."""
        store = coordinator(self.ns)
        store.flush(store.groups(self.topic))

    def unlink(self, name: str) -> None:
        """``rm groups/<group>``: tombstones for the group's commits on this topic."""
        self.ns.check_writable()
        self.ns.require_topic(self.topic)
        if coordinator(self.ns).delete_group_offsets(name, self.topic) == 0:
            raise NoSuchNameError(f"Group {name!r} has no committed offsets on topic {self.topic}")


class GroupFile(FileNode):
    writable = True
    mode = RW_MODE

    def __init__(self, ns: Tree, topic: str, group: str) -> None:
        super().__init__(ns)
        self.topic = topic
        self.group = group

    @property
    def key(self) -> NodeKey:
        return ("group", self.topic, self.group)

    def describe(self) -> str:
        return f"{self.topic}/groups/{self.group}"

    def render(self) -> bytes:
        self.ns.require_topic(self.topic)
        rows = coordinator(self.ns).lag(self.group, self.topic)
        return "".join(f"{r.partition} {r.committed} {r.log_end_offset} {r.lag}\n" for r in rows).encode()

    def size(self) -> int:
        return len(self.render())

    def open(self, write: bool) -> Handle:
        content = self.render()
        if not write:
            return GroupSnapshotHandle(self, content)
        self.ns.check_writable()
        return GroupCommandHandle(self, content)

    def flush_commits(self) -> None:
        """fsync of the group's partition of ``__consumer_offsets`` (nothing on a read-only mount)."""
        if not self.ns.read_only:
            coordinator(self.ns).flush([self.group])


class GroupSnapshotHandle(BytesHandle):
    """``groups/<group>`` opened for reading; its ``fsync()`` (``sync groups/<group>``) makes the group's
    commits durable."""

    __slots__ = ("_node",)

    def __init__(self, node: GroupFile, content: bytes) -> None:
        super().__init__(content)
        self._node = node

    def fsync(self) -> None:
        self._node.flush_commits()


class GroupCommandHandle(LineHandle):
    """Lines written to ``groups/<group>``: validated per write, applied together at close."""

    def __init__(self, node: GroupFile, content: bytes) -> None:
        super().__init__(content)
        self._node = node
        self._actions: list[tuple[str, object]] = []
        self._failed = False

    def take_lines(self, lines: list[bytes]) -> None:
        try:
            parsed = [self._parse(line) for line in lines]
        except LogfsError:
            self._failed = True
            raise
        if any(a is not None for a in parsed) and not self._actions:
            self._check_group(parsed)
        self._actions.extend(a for a in parsed if a is not None)

    def check_rest(self, rest: bytes) -> None:
        if len(rest) > _MAX_LINE:
            self._failed = True
            raise InvalidRequestError(f"A line of more than {_MAX_LINE} bytes written to "
                                      f"{self._node.describe()}: not a group command")

    def _check_group(self, parsed: list[tuple[str, object] | None]) -> None:
        """A backend that can tell at once that the commit will be refused says it here, at the first
        write(), where a shell sees it (bash reports no error of the close() that applies the lines)."""
        check = getattr(coordinator(self._node.ns), "check_commit_allowed", None)
        if check is None:
            return
        try:
            check(self._node.group)
        except LogfsError:
            self._failed = True
            raise

    def flush(self) -> None:
        with self._lock:
            rest = self._pop_rest()
            if rest:
                try:
                    action = self._parse(rest)
                except LogfsError:
                    self._failed = True
                    raise
                if action is not None:
                    self._actions.append(action)
            actions, self._actions = self._actions, []
            if self._failed:
                if actions:
                    log.warning("Not applying %d lines written to %s: an earlier line was refused",
                                len(actions), self._node.describe())
                return
            if actions:
                self._apply(actions)

    release = flush

    def fsync(self) -> None:
        """fsync(): the complete lines written so far are applied now (an unfinished last line waits for
        the close), then the group's commits are flushed to disk, so what fsync() returned for survives
        a power loss."""
        with self._lock:
            actions, self._actions = self._actions, []
            if actions and not self._failed:
                self._apply(actions)
        self._node.flush_commits()

    def _parse(self, raw: bytes) -> tuple[str, object] | None:
        line = raw.decode("utf-8", "replace").strip()
        if not line or line.startswith("#"):
            return None
        words = line.split()
        node = self._node
        ns = node.ns
        if words[0] == "reset" and len(words) == 2:
            spec = words[1]
            if spec in ("earliest", "latest"):
                return ("reset", spec)
            if spec.isdigit() and spec.isascii():
                # one spelling per number (engine.numbers): no leading zero, at most 19 digits
                reset_to = parse_canonical_int(spec)
                if reset_to is None:
                    raise InvalidRequestError(
                        f"Invalid line {shown(line)} for {node.describe()}: {shown(spec)} is not an offset "
                        "(digits without leading zeros, at most 2^63-1)")
                return ("reset-offset", reset_to)
            when = parse_timestamp(spec[1:]) if spec.startswith("@") and spec[1:].isdigit() else \
                (None if spec.isdigit() else parse_timestamp(spec))
            if when is not None:
                return ("reset-time", when)
        elif len(words) == 2 and all(w.isdigit() and w.isascii() for w in words):
            parsed_partition = parse_canonical_int(words[0], maximum=INT_MAX)
            parsed_offset = parse_canonical_int(words[1])
            if parsed_partition is None or parsed_offset is None:
                bad = words[0] if parsed_partition is None else words[1]
                raise InvalidRequestError(
                    f"Invalid line {shown(line)} for {node.describe()}: {shown(bad)} is not "
                    f"{'a partition' if parsed_partition is None else 'an offset'} (digits without leading zeros, "
                    f"at most 2^{31 if parsed_partition is None else 63}-1)")
            partition, offset = parsed_partition, parsed_offset
            target = ns.manager.get_log(TopicPartition(node.topic, partition))
            if target is None:
                raise InvalidRequestError(
                    f"Invalid line {line!r} for {node.describe()}: topic {node.topic} has no partition {partition}")
            end = target.log_end_offset
            if offset > end:
                raise InvalidRequestError(
                    f"Invalid line {line!r} for {node.describe()}: offset {offset} is beyond the log end "
                    f"offset {end} of {node.topic}-{partition}")
            return ("commit", (partition, offset))
        raise InvalidRequestError(
            f"Invalid line {shown(line)} for {node.describe()}: expected '<partition> <offset>' or "
            "'reset earliest|latest|<offset>|<ISO 8601>|@<epoch ms>'")

    def _apply(self, actions: list[tuple[str, object]]) -> None:
        node = self._node
        manager = node.ns.manager
        partitions = sorted(manager.partitions(node.topic))
        offsets: dict[int, int] = {}
        for verb, arg in actions:
            if verb == "commit":
                # cast: a commit action's argument is its (partition, offset)
                partition, offset = cast("tuple[int, int]", arg)
                offsets[int(partition)] = int(offset)
                continue
            for p in partitions:
                target = manager.get_log(TopicPartition(node.topic, p))
                if target is None:
                    continue
                start, end = target.log_start_offset, target.log_end_offset
                if verb == "reset":
                    offsets[p] = start if arg == "earliest" else end
                elif verb == "reset-offset":
                    # ignore: a reset-offset action's argument is its offset (str or int)
                    offsets[p] = min(max(int(arg), start), end)  # type: ignore[call-overload]
                else:
                    # ignore: a reset-to-timestamp action's argument is its timestamp (str or int)
                    found = target.fetch_offset_by_timestamp(int(arg))  # type: ignore[call-overload]
                    offsets[p] = end if found is None else found[0]
        coordinator(node.ns).commit(node.group, {TopicPartition(node.topic, p): o for p, o in offsets.items()})


# --------------------------------------------------------------------------- consume/


class ConsumeDir(Directory):
    def __init__(self, ns: Tree, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp

    @property
    def key(self) -> NodeKey:
        return ("consume", self.tp)

    def path(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/consume"

    def names(self) -> list[str]:
        return coordinator(self.ns).groups(self.tp.topic)

    def lookup(self, name: str) -> Node:
        self.ns.log(self.tp)
        group, fmt = split_format(name)
        _check_group_name(group)
        node = ConsumeFile(self.ns, self.tp, group, fmt, name)
        _ = node.view      # anchor now: the size the kernel sees is this moment's
        return node

    def fsync(self) -> None:
        """fsyncdir(): the partition's records and its groups' commits made durable."""
        self.ns.log(self.tp).flush()
        if not self.ns.read_only:
            store = coordinator(self.ns)
            store.flush(store.groups(self.tp.topic))


class ConsumeFile(FileNode):
    """``consume/<group>[.jsonl]``: a fresh node per lookup (each opening reads from a new position)."""

    stable = False
    transient = True     # the same, in the node model where views are reused while unchanged (tools branch)
    commits_on_read = True     # closing an opening commits what it read: other users cannot open it

    def __init__(self, ns: Tree, tp: TopicPartition, group: str, fmt: ViewFormat, name: str) -> None:
        super().__init__(ns)
        self.tp = tp
        self.group = group
        self.format = fmt
        self.name = name
        self._view: ConsumerView | None = None
        self._from: int | None = None         # the committed offset the view was anchored at

    @property
    def key(self) -> NodeKey:
        return ("consume", id(self))

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/consume/{self.name}"

    @property
    def view(self) -> ConsumerView:
        if self._view is None:
            self._from = coordinator(self.ns).committed(self.group, self.tp)
            self._view = open_consumer_view(self.ns.log(self.tp), self.format, self._from)
        return self._view

    def size(self) -> int:
        return self.view.size()

    def open(self, write: bool) -> Handle:
        self._refuse_write(write)
        leases = self.ns.group_leases
        lease = leases.acquire(self.group, self.tp)
        try:
            if self._view is not None and coordinator(self.ns).committed(self.group, self.tp) != self._from:
                # committed since the view was anchored (by a previous opening whose release is still on
                # its way): start from the new position; that opening's handle closes the old view
                self._view = None
            view = self.view
        except BaseException:
            leases.release(self.group, self.tp, lease)
            raise
        return ConsumeHandle(self, view, self._from, lease)

    def detach(self) -> None:
        self.close()

    def close(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            view.close()


class ConsumeHandle(ViewHandle):
    """Reads of a consumer view; closing it commits what the reader was given."""

    __slots__ = ("_node", "_expected", "_given", "_flushed_at", "_lease", "_lock")
    _view: ConsumerView                 # the slot of ViewHandle, holding the view this handle was opened on
    blocking = True    # the commit appends to __consumer_offsets, which may create the topic

    def __init__(self, node: ConsumeFile, view: ConsumerView, committed: int | None, lease: Lease) -> None:
        # direct I/O always: what the reader is given is committed, and readahead would give more
        super().__init__(view, True)
        self._node = node
        self._expected = committed
        self._given = 0
        self._flushed_at = 0         # _given at the last commit: a flush with nothing new read commits nothing
        self._lease: Lease | None = lease
        self._lock = threading.Lock()

    def read(self, offset: int, size: int) -> bytes:
        data = self._view.read(offset, size)
        end = offset + len(data)
        with self._lock:             # large reads run in worker threads
            if end > self._given:
                self._given = end
            if self._lease is not None:
                self._lease.closing = False    # still read: a copy of the descriptor is open
        return data

    def flush(self) -> None:
        """close() of one descriptor: commit the position (the hold ends at the last one, ``release``)."""
        with self._lock:
            if self._lease is not None:
                self._lease.closing = True
            self._commit_given()

    def _commit_given(self) -> None:
        if self._given > self._flushed_at and not self._node.ns.read_only:
            self._commit(self._view.next_offset_at(self._given))
            self._flushed_at = self._given

    def fsync(self) -> None:
        """fsync(): commit what was read so far, as a close would, and make the group's commits durable."""
        with self._lock:
            self._commit_given()
        if not self._node.ns.read_only:
            coordinator(self._node.ns).flush([self._node.group])

    def _commit(self, offset: int) -> None:
        node = self._node
        store = coordinator(node.ns)
        current = store.committed(node.group, node.tp)
        if current != self._expected:
            log.warning("Not committing offset %d for group %s on %s: the group's committed offset moved to %s "
                        "while %s was open", offset, node.group, node.tp, current, node.describe())
            return
        if offset == current:
            return
        store.commit(node.group, {node.tp: offset})
        self._expected = offset

    def release(self) -> None:
        """The last descriptor closed: commit, and let another opening of the group's partition in."""
        try:
            self.flush()
        finally:
            with self._lock:
                lease, self._lease = self._lease, None
            if lease is not None:
                self._node.ns.group_leases.release(self._node.group, self._node.tp, lease)
            # the node owns its current view (logfs.fs closes it once no handle of the inode is open);
            # one the node re-anchored away from is this handle's to close
            if self._node._view is not self._view:
                self._view.close()
