"""The mount's namespace: path names -> nodes, and what opening each node gives.

The shape of the tree in SPEC.md section 4 is ``logfs.dirs``'s (every name in
its directories' tables); this module holds the nodes those directories hand
out, in one table, and the mount's state they share: the nodes see it as a
``logfs.tree.Tree`` (they import nothing of this module).  It speaks in
terms of the engine (``LogManager``, ``Log``, ``LogView``) and plain Python
exceptions carrying an errno; it knows nothing of FUSE inodes, which
``logfs.fs`` keeps.  Every failure is raised as an
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
import time
from typing import TYPE_CHECKING, TypeVar, cast

from engine.errors import (
    LogfsError,
    ReadOnlyError,
    UnknownTopicOrPartitionError,
)
from engine.remote.remote_segment import RemoteReadError
from engine.topic import TopicPartition
from logfs.appender import TopicRouter
from logfs.backend import Backend, EmbeddedBackend
from logfs.dirs import RootDir
from logfs.leases import GroupLeases
from logfs.nodes import RETIRED_NODES, Node
from logfs.refusals import RecentRefusals
from logfs.tree import Keyed, NodeKey

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from engine.log import Log
    from engine.manager import LogManager
    from logfs import stats as _stats

_K = TypeVar("_K", bound=Keyed)


class Namespace:
    """The tree of SPEC.md section 4 over one ``LogManager``; its nodes see it as a ``logfs.tree.Tree``."""

    def watch_views_of(self, log: Log) -> None:
        """Tell ``views_changed_listeners`` of each change of ``log``'s end (page-cache mode only)."""
        if not self.views_direct_io and self._log_end_moved not in log.end_listeners:
            log.end_listeners.append(self._log_end_moved)

    def _log_end_moved(self, log: Log) -> None:
        for listener in self.views_changed_listeners:
            listener(log.topic_partition)

    def __init__(self, manager: LogManager, stats: _stats.MountStats, *, read_only: bool = False,
                 views_direct_io: bool = True, backend: Backend | None = None) -> None:
        self.manager = manager
        #: where changes go: the LogManager itself, or a Kafka cluster (logfs.backend, logfs.cluster)
        self.backend: Backend = backend if backend is not None else EmbeddedBackend(manager)
        self.stats = stats
        self.read_only = read_only
        self.views_direct_io = views_direct_io
        self.started_ns = _now_ns()
        self._routers: dict[str, TopicRouter] = {}
        #: the recent refusals, ``.logfs/errors`` (logfs.fs records each one)
        self.refusals = RecentRefusals()
        #: called with a topic's name once it is deleted (logfs.fs drops the kernel's cached entry)
        self.topic_deleted_listeners: list[Callable[[str], None]] = []
        #: called with a partition whose views may have grown (its log end moved), when views are
        #: served through the page cache (logfs.fs drops the attributes the kernel cached of them)
        self.views_changed_listeners: list[Callable[[TopicPartition], None]] = []
        self._nodes: dict[NodeKey, Node] = {}
        self._retired: collections.OrderedDict[NodeKey, Node] = collections.OrderedDict()
        self.root = RootDir(self)
        self._nodes[self.root.key] = self.root
        # consumer groups (logfs.groups): the committed offsets (the backend's: loaded from
        # __consumer_offsets at mount start, or a cluster's coordinator), and which group is
        # consuming which partition through an open file
        self.group_coordinator = self.backend.group_coordinator()
        self.group_leases = GroupLeases()
        stats.groups = self.group_coordinator
        # a cluster deletes or recreates topics behind the mount's back (logfs.cluster)
        self.backend.watch_topics(self.forget_topic)

    # ---- helpers used by nodes

    def stable(self, cls: Callable[..., _K], *args: object) -> _K:
        """The one node object of a structural name (so its inode is reused)."""
        node = cls(self, *args)
        # a key's first element names the kind of node, so its class
        existing = cast("_K | None", self._nodes.get(node.key))
        if existing is None:
            self._nodes[node.key] = cast("Node", node)   # cast: _K is a Node subclass; the table holds Nodes
            return node
        return existing

    def content(self, key: NodeKey, same: Callable[[_K], bool], make: Callable[[], _K]) -> _K:
        """The node of a content name: the known one while ``same(node)``, else a new one (a new inode)."""
        # a key's first element names the kind of content, so the class of its node
        known = cast("_K | None", self._nodes.get(key))
        if known is not None and same(known):
            self._retired.pop(key, None)
            return known
        node = make()
        self._nodes[key] = cast("Node", node)   # cast: as in stable()
        self._retired.pop(key, None)
        return node

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

    def known_node(self, key: NodeKey) -> Node | None:
        return self._nodes.get(key)

    def nodes_known(self) -> int:
        """Nodes in the table (structural and content), for tests and stats."""
        return len(self._nodes)

    def log(self, tp: TopicPartition) -> Log:
        """The local log of ``tp``; a cluster mount makes its replica on first use (``replicas_missing``
        and ``ensure_replicas`` let logfs.fs do that off the request thread first)."""
        target = self.manager.get_log(tp)
        if target is None:
            return self.backend.ensure_replica(tp)
        return target

    def store_preparation(self, tp: TopicPartition, warm: Callable[[Log], object]) -> Callable[[], None] | None:
        """``warm(log)`` of ``tp``'s log, to run off the request thread before a lookup (logfs.fs), when some of
        its records are only in tiered storage's remote store: what the lookup then reads of them comes from
        memory and the chunk cache, so a store that does not answer stops that lookup, not the mount.  None
        when every record is local.  A failure of the store is the lookup's (its errno); any other error
        is left for the lookup to find and say."""
        log = self.manager.get_log(tp)
        if log is None or not log.has_remote_only_records:
            return None

        def prepare() -> None:
            try:
                warm(log)
            except RemoteReadError:
                raise
            except LogfsError:
                pass                    # the lookup meets it again and says it

        return prepare

    def replica_preparation(self, tps: list[TopicPartition], *, catch_up: bool = True
                            ) -> Callable[[], None] | None:
        """Making the local replicas of those of ``tps`` a remote backend has none of yet (a cluster mount's
        first use of them: logfs.fs runs it off the request thread), and with ``catch_up`` waiting until
        each holds the leader's high watermark (the replicas are made first, so they are fetched together);
        None when there is nothing to do."""
        if not self.backend.remote:
            return None
        if catch_up:
            waiting = [tp for tp in tps if self.backend.replica_behind(tp)]
        else:
            waiting = [tp for tp in tps if self.manager.get_log(tp) is None]
        if not waiting:
            return None

        def make_replicas() -> None:
            for tp in waiting:
                self.backend.ensure_replica(tp, catch_up=False)
            if catch_up:
                for tp in waiting:
                    self.backend.ensure_replica(tp)

        return make_replicas

    def require_topic(self, topic: str) -> None:
        if topic not in self.backend.topics():
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
        self.backend.delete_topic(topic)
        self._routers.pop(topic, None)
        if not self.read_only:
            self.group_coordinator.on_topic_deleted(topic)   # Kafka drops a deleted topic's commits
        self.forget_topic(topic)

    def forget_topic(self, topic: str) -> None:
        """Drop the nodes of a deleted topic (called from any thread; logfs.cluster calls it too).

        Stable nodes of the topic resolve it by name, and a view node checks its
        segments against the log it was made for; drop them so a topic of the
        same name created later starts from fresh objects.
        """
        self._routers.pop(topic, None)
        for key in list(self._nodes):   # list(): a snapshot, lookups may add keys meanwhile
            if _mentions_topic(key, topic):
                self._nodes.pop(key, None)
                self._retired.pop(key, None)
        for listener in self.topic_deleted_listeners:
            listener(topic)


# --------------------------------------------------------------------------- helpers


def _mentions_topic(key: NodeKey, topic: str) -> bool:
    return any(part == topic or (isinstance(part, TopicPartition) and part.topic == topic) for part in key[1:])


def _now_ns() -> int:
    return time.time_ns()
