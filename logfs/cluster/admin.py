"""The cluster's admin API for the namespace's control files (Kafka's ``Admin`` client, via librdkafka).

``mkdir t`` is CreateTopics, ``mkdir t/N`` CreatePartitions, ``rmdir t`` and
``delete`` DeleteTopics, ``config`` DescribeConfigs / IncrementalAlterConfigs,
``delete`` ``before N`` DeleteRecords.  Every call is bounded by the mount's
request timeout; a refusal comes back as the engine error of the same meaning
with the broker's message (logfs.cluster.errors).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from engine.errors import InvalidConfigError
from engine.topic import TopicPartition
from logfs.cluster.errors import ClientLog, ClusterTimeoutError, from_kafka

log = logging.getLogger(__name__)

__all__ = ["ClusterAdmin", "UNREACHABLE_WAIT_S"]

#: how long a request waits while the cluster is known to be unreachable
UNREACHABLE_WAIT_S = 2.0


class ClusterAdmin:
    """Kafka's ``Admin`` requests the mount makes, each bounded by ``timeout_s``."""

    def __init__(self, client_config: Mapping[str, str], timeout_s: float,
                 create_defaults: Mapping[str, str] | None = None) -> None:
        self.brokers = client_config["bootstrap.servers"]
        self.timeout_s = timeout_s
        self._create_defaults = dict(create_defaults or {})
        config: dict = {**client_config, "logger": ClientLog("logfs.cluster.librdkafka")}
        try:
            self._admin = AdminClient(config)
        except KafkaException as exc:     # a client setting librdkafka does not know or refuses
            raise InvalidConfigError(f"Invalid Kafka client setting: {exc.args[0].str()}") from None
        #: whether the cluster answered the replica fetcher's last metadata request (set by the fetcher)
        self.reachable = True

    def result(self, future: concurrent.futures.Future, what: str) -> Any:
        """The answer of one admin request, or the engine error for the cluster's refusal or silence.

        Also used by logfs.cluster.groups for its group requests.
        """
        # While the cluster is known to be unreachable, a request waits a short while only: some are
        # made on the mount's request thread (a lookup of groups/, a read of config), which must not
        # stall every other file of the mount for the whole timeout.
        timeout = self.timeout_s if self.reachable else min(self.timeout_s, UNREACHABLE_WAIT_S)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise ClusterTimeoutError(f"{what}: no answer from the cluster within {timeout:g} s "
                                      f"(bootstrap servers {self.brokers})") from None
        except KafkaException as exc:
            raise from_kafka(exc, what, self.brokers) from None

    def create_topic(self, topic: str, config: Mapping[str, str]) -> None:
        """CreateTopics with the cluster's ``num.partitions`` and ``default.replication.factor``
        unless the mount was given others (``-o num.partitions=``, ``-o default.replication.factor=``)."""
        partitions = int(self._create_defaults.get("num.partitions", "-1"))
        replication = int(self._create_defaults.get("default.replication.factor", "-1"))
        new = NewTopic(topic, num_partitions=partitions, replication_factor=replication, config=dict(config))
        futures = self._admin.create_topics([new], request_timeout=self.timeout_s)
        self.result(futures[topic], f"Creating topic {topic}")
        log.info("Created topic %s on the cluster", topic)

    def create_partitions(self, topic: str, total: int) -> None:
        futures = self._admin.create_partitions([NewPartitions(topic, total)], request_timeout=self.timeout_s)
        self.result(futures[topic], f"Adding partition {total - 1} to topic {topic}")
        log.info("Topic %s has %d partitions on the cluster", topic, total)

    def delete_topic(self, topic: str) -> None:
        futures = self._admin.delete_topics([topic], request_timeout=self.timeout_s)
        self.result(futures[topic], f"Deleting topic {topic}")
        log.info("Deleted topic %s on the cluster", topic)

    def describe_topic_config(self, topic: str) -> tuple[dict[str, str], dict[str, str]]:
        """DescribeConfigs: (every setting, the topic's own overrides), ``name -> value``."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        futures = self._admin.describe_configs([resource], request_timeout=self.timeout_s)
        entries = self.result(futures[resource], f"Describing the config of topic {topic}")
        props = {name: entry.value for name, entry in entries.items()
                 if entry.value is not None and not entry.is_sensitive}
        overrides = {name: value for name, value in props.items()
                     if _source(entries[name]) == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}
        return props, overrides

    def alter_topic_config(self, topic: str, updates: Mapping[str, str | None], *,
                           validate_only: bool = False) -> None:
        """IncrementalAlterConfigs (SET a value, DELETE an override for None); ``validate_only`` asks the
        broker whether it would accept them and changes nothing."""
        entries = [ConfigEntry(name, value or "", incremental_operation=AlterConfigOpType.SET if value is not None
                               else AlterConfigOpType.DELETE) for name, value in updates.items()]
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
        futures = self._admin.incremental_alter_configs([resource], request_timeout=self.timeout_s,
                                                        validate_only=validate_only)
        self.result(futures[resource], f"Altering the config of topic {topic}")
        if validate_only:
            return
        log.info("Altered the config of topic %s on the cluster: %s", topic,
                 ", ".join(f"{k}={'' if v is None else v}" for k, v in updates.items()))

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """DeleteRecords before ``offset``; the partition's new low watermark."""
        target = KafkaTopicPartition(tp.topic, tp.partition, offset)
        futures = self._admin.delete_records([target], request_timeout=self.timeout_s)
        result = self.result(futures[target], f"Deleting the records of {tp} before offset {offset}")
        return int(getattr(result, "low_watermark", offset))

    def list_offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """(log start offset, high watermark) of a partition (ListOffsets earliest and latest)."""
        out = []
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
            target = KafkaTopicPartition(tp.topic, tp.partition)
            futures = self._admin.list_offsets({target: spec}, request_timeout=self.timeout_s)
            out.append(int(self.result(futures[target], f"Listing the offsets of {tp}").offset))
        return out[0], out[1]

    def list_offset(self, tp: TopicPartition, position: str | int) -> int:
        """ListOffsets of one partition: ``"earliest"`` (the log start offset), ``"latest"`` (the high
        watermark), or a timestamp in epoch ms (the first offset at or after it; the high watermark if none)."""
        target = KafkaTopicPartition(tp.topic, tp.partition)
        spec = (OffsetSpec.earliest() if position == "earliest" else OffsetSpec.latest() if position == "latest"
                else OffsetSpec.for_timestamp(int(position)))
        futures = self._admin.list_offsets({target: spec}, request_timeout=self.timeout_s)
        offset = int(self.result(futures[target], f"Listing the offsets of {tp}").offset)
        if offset < 0:          # no record at or after the time
            return self.list_offset(tp, "latest")
        return offset

    def raw(self) -> AdminClient:
        return self._admin


def _source(entry: ConfigEntry) -> int:
    """The entry's ``ConfigSource`` as its number (librdkafka hands back the number or the enum)."""
    source: object = entry.source
    return int(getattr(source, "value", source))  # type: ignore[call-overload]
