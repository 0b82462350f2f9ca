"""Consumer groups of a cluster mount: the cluster's group coordinator holds the committed offsets.

The same interface as the embedded ``engine.consumer_offsets.GroupMetadataManager``
(what ``logfs.groups`` calls), answered by the cluster: OffsetFetch
(``ListConsumerGroupOffsets``) to read, OffsetCommit through
``AlterConsumerGroupOffsets`` to commit, OffsetDelete to remove a group's
commits on a topic.  So ``kafka-consumer-groups.sh --describe`` and any Kafka
consumer of the group see what ``groups/<group>`` and ``consume/<group>``
commit, and the other way round.  Kafka only lets an admin commit for a group
with no active members: committing for a group a running consumer holds is
refused by the coordinator (its message in the log, EIO).  Lag is counted
against the local replica's log end (which trails the cluster's high
watermark by at most one fetch).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KafkaTopicPartition

from engine.consumer_offsets import GroupLag, group_lag
from engine.errors import InvalidRequestError
from engine.manager import LogManager
from engine.topic import TopicPartition
from logfs.cluster.admin import ClusterAdmin

log = logging.getLogger(__name__)

__all__ = ["ClusterGroupCoordinator"]


class ClusterGroupCoordinator:
    """Committed offsets kept by the cluster's group coordinator (see the module docstring)."""

    def __init__(self, manager: LogManager, admin: ClusterAdmin,
                 kafka_python_config: Mapping[str, Any] | None = None) -> None:
        self.manager = manager
        self.admin = admin
        #: the mount's client settings for kafka-python (logfs.cluster.client_settings), for OffsetDelete
        self._kafka_python_config = dict(kafka_python_config or {})

    # ------------------------------------------------------------------ reading

    def _group_offsets(self, group: str) -> dict[TopicPartition, int]:
        futures = self.admin.raw().list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                               request_timeout=self.admin.timeout_s)
        result = self.admin.result(futures[group], f"Reading the committed offsets of group {group}")
        return {TopicPartition(tp.topic, tp.partition): tp.offset
                for tp in (result.topic_partitions or []) if tp.offset >= 0}

    def _group_ids(self) -> list[str]:
        future = self.admin.raw().list_consumer_groups(request_timeout=self.admin.timeout_s)
        result = self.admin.result(future, "Listing the consumer groups")
        return sorted(g.group_id for g in result.valid)

    def groups(self, topic: str) -> list[str]:
        """The groups with a committed offset on ``topic``, sorted."""
        return [g for g in self._group_ids() if any(tp.topic == topic for tp in self._group_offsets(g))]

    def all_groups(self) -> dict[str, dict[str, dict[int, int]]]:
        """topic -> group -> partition -> committed offset."""
        out: dict[str, dict[str, dict[int, int]]] = {}
        for group in self._group_ids():
            for tp, offset in self._group_offsets(group).items():
                out.setdefault(tp.topic, {}).setdefault(group, {})[tp.partition] = offset
        return out

    def committed(self, group: str, tp: TopicPartition) -> int | None:
        return self._group_offsets(group).get(tp)

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        return {tp.partition: o for tp, o in self._group_offsets(group).items() if tp.topic == topic}

    def lag(self, group: str, topic: str) -> list[GroupLag]:
        """Every partition of ``topic``: committed (-1 if none), log end, lag (from the log start if none)."""
        return group_lag(self.manager, topic, self.committed_offsets(group, topic))

    # ------------------------------------------------------------------ writing

    def commit(self, group: str, offsets: Mapping[TopicPartition, int], *, metadata: str = "") -> None:
        """AlterConsumerGroupOffsets: all of ``offsets`` for ``group`` in one request."""
        if not offsets:
            return
        if not group:
            raise InvalidRequestError("A consumer group id must not be empty")
        items = sorted(offsets.items())
        if metadata:
            partitions = [KafkaTopicPartition(tp.topic, tp.partition, offset, metadata=metadata)
                          for tp, offset in items]
        else:   # librdkafka refuses metadata=None
            partitions = [KafkaTopicPartition(tp.topic, tp.partition, offset) for tp, offset in items]
        request = ConsumerGroupTopicPartitions(group, partitions)
        futures = self.admin.raw().alter_consumer_group_offsets([request], request_timeout=self.admin.timeout_s)
        self.admin.result(futures[group], f"Committing offsets for group {group}")
        log.info("[GroupCoordinator] Group %s committed offsets %s on the cluster", group,
                 ", ".join(f"{tp}={offset}" for tp, offset in items))

    def flush(self, groups: Iterable[str]) -> None:
        """Nothing to make durable here: the cluster acknowledged each commit (``fsync()`` of a group file)."""

    def delete_group_offsets(self, group: str, topic: str) -> int:
        """OffsetDelete of ``group``'s commits on ``topic``; returns how many there were."""
        partitions = sorted(self.committed_offsets(group, topic))
        if not partitions:
            return 0
        from kafka import KafkaAdminClient
        from kafka import TopicPartition as KpTopicPartition

        # confluent-kafka 2.16 has no OffsetDelete (DeleteConsumerGroupOffsets): kafka-python's admin client
        # makes it, with the same client settings as every other client of the mount
        admin = KafkaAdminClient(**{"bootstrap_servers": self.admin.brokers.split(","),
                                    "request_timeout_ms": int(self.admin.timeout_s * 1000),
                                    **self._kafka_python_config})
        try:
            admin.delete_group_offsets(group, [KpTopicPartition(topic, p) for p in partitions])
        finally:
            admin.close()
        log.info("[GroupCoordinator] Deleted the committed offsets of group %s on topic %s (partitions %s)",
                 group, topic, ",".join(map(str, partitions)))
        return len(partitions)

    def on_topic_deleted(self, topic: str) -> None:
        """Nothing: the cluster's coordinator drops the commits of a deleted topic itself."""
