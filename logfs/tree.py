"""What a node of the tree asks of the namespace: the :class:`Tree` protocol.

The nodes (logfs.nodes, dirs, control, groups, tempfiles) are handed the
namespace they live in; this protocol is all they see of it, so they depend
on these few members and not on ``logfs.namespace.Namespace`` (which imports
them: a node naming it, even for type checking only, would close a circle).
This module imports nothing of the nodes or the namespace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from engine.consumer_offsets import GroupMetadataManager
    from engine.log import Log
    from engine.manager import LogManager
    from engine.topic import TopicPartition
    from logfs.appender import TopicRouter
    from logfs.backend import Backend
    from logfs.leases import GroupLeases
    from logfs.refusals import RecentRefusals
    from logfs.stats import MountStats

__all__ = ["Keyed", "NodeKey", "Tree"]

#: a node's key in the namespace's table: its kind (a str), then what it names (a topic, a TopicPartition,
#: a name, an offset, an id)
NodeKey = tuple[object, ...]


class Keyed(Protocol):
    """A node as the namespace's table knows it: by its key (see ``logfs.nodes.Node.key``)."""

    @property
    def key(self) -> NodeKey: ...


_K = TypeVar("_K", bound=Keyed)


class Tree(Protocol):
    """The namespace as its nodes use it (implemented by ``logfs.namespace.Namespace``)."""

    #: the local logs: the embedded broker's, or a cluster's replicas (read by views, state, stats)
    manager: LogManager
    #: where changes go (logfs.backend): the LogManager itself, or a Kafka cluster
    backend: Backend
    stats: MountStats
    #: when the mount started (the mtime of files that have none of their own)
    started_ns: int
    read_only: bool
    #: views bypass the page cache (``--views-direct-io``)
    views_direct_io: bool
    #: the recent refusals, ``.logfs/errors``
    refusals: RecentRefusals
    #: the committed offsets of consumer groups, and which group consumes which partition through a file
    group_coordinator: GroupMetadataManager
    group_leases: GroupLeases

    def check_writable(self) -> None:
        """ReadOnlyError (EROFS) on a read-only mount."""

    def require_topic(self, topic: str) -> None:
        """UnknownTopicOrPartitionError (ENOENT) if the mount lists no topic ``topic``."""

    def log(self, tp: TopicPartition) -> Log:
        """The local log of ``tp`` (a cluster mount makes its replica on first use)."""

    def store_preparation(self, tp: TopicPartition, warm: Callable[[Log], object]) -> Callable[[], None] | None:
        """``warm(log)`` off the request thread before a lookup, when some records of ``tp`` are only in tiered
        storage's remote store (may block); None when every record is local."""

    def replica_preparation(self, tps: list[TopicPartition], *, catch_up: bool = True
                            ) -> Callable[[], None] | None:
        """Making the local replicas of ``tps`` the backend has none of yet, and with ``catch_up`` waiting until
        they hold what the cluster committed (may block); None if there is nothing to do."""

    def delete_topic(self, topic: str) -> None:
        """DeleteTopics, and everything the mount kept of the topic."""

    def router(self, topic: str) -> TopicRouter:
        """The partition chooser shared by every topic-level append file of ``topic``."""

    def watch_views_of(self, log: Log) -> None:
        """Have the kernel's cached attributes of ``log``'s views dropped at each change of its end."""

    def stable(self, cls: Callable[..., _K], *args: object) -> _K:
        """The one node of a structural name, ``cls(tree, *args)`` the first time (so its inode is reused)."""

    def content(self, key: NodeKey, same: Callable[[_K], bool], make: Callable[[], _K]) -> _K:
        """The node of a content name: the known one while ``same(node)``, else ``make()`` (a new inode)."""
