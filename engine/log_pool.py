"""The live logs of a LogManager, by partition and by topic (Kafka's ``LogManager.currentLogs``).

A write looks its topic up on every request, so the topic index is kept as
logs come and go rather than derived from the partitions each time: every
lookup here costs the same with 10 partitions or 100,000.

Locking: the owner (``LogManager``) mutates the pool under its own lock.
Single lookups (``get``, ``has_topic``) and ``snapshot`` are one step each
under the GIL, so they may be called without that lock; a caller that needs
two lookups to agree takes the owner's lock around both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import ItemsView, Iterator, Mapping, ValuesView

    from engine.log import Log
    from engine.topic import TopicPartition


class LogPool:
    """Partition → log, with the partitions of each topic kept beside it.

    Invariant: ``tp in self._by_partition`` iff ``tp.partition in self._by_topic[tp.topic]``,
    and no topic maps to an empty dict.
    """

    __slots__ = ("_by_partition", "_by_topic")

    def __init__(self) -> None:
        self._by_partition: dict[TopicPartition, Log] = {}
        self._by_topic: dict[str, dict[int, Log]] = {}

    def get(self, tp: TopicPartition) -> Log | None:
        return self._by_partition.get(tp)

    def __contains__(self, tp: TopicPartition) -> bool:
        return tp in self._by_partition

    def __len__(self) -> int:
        return len(self._by_partition)

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self._by_partition)

    def put(self, tp: TopicPartition, log: Log) -> None:
        self._by_partition[tp] = log
        self._by_topic.setdefault(tp.topic, {})[tp.partition] = log

    def update(self, logs: Mapping[TopicPartition, Log]) -> None:
        for tp, log in logs.items():
            self.put(tp, log)

    def pop(self, tp: TopicPartition) -> Log | None:
        log = self._by_partition.pop(tp, None)
        if log is not None:
            partitions = self._by_topic[tp.topic]
            del partitions[tp.partition]
            if not partitions:
                del self._by_topic[tp.topic]
        return log

    def values(self) -> ValuesView[Log]:
        return self._by_partition.values()

    def items(self) -> ItemsView[TopicPartition, Log]:
        return self._by_partition.items()

    def snapshot(self) -> list[Log]:
        """Every live log, copied in one step (callable without the owner's lock)."""
        return list(self._by_partition.copy().values())

    def has_topic(self, topic: str) -> bool:
        return topic in self._by_topic

    def topics(self) -> list[str]:
        return list(self._by_topic)

    def logs_of(self, topic: str) -> dict[int, Log]:
        """Partition number → log of ``topic`` (a copy; empty when the topic has none)."""
        return dict(self._by_topic.get(topic, {}))
