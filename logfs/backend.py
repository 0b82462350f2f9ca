"""Where the namespace's writes go: the embedded engine, or a Kafka cluster (SPEC.md section 10).

The namespace (logfs.dirs, control, appender, groups) reads every view from a
local ``LogManager`` in both cases, and makes every change through the
backend: it is the one way a write reaches a log (an append handle holds
topic-partitions, never a ``Log``); what differs is who
decides a change, and what is listed: an embedded mount lists its logs, a
cluster mount the cluster's topics (cached metadata), making a partition's
local replica on its first use (``ensure_replica``).  An embedded mount changes its own logs; a cluster mount
asks the cluster (CreateTopics, Produce, DeleteRecords, ...) and its local
logs are replicas that follow the cluster (logfs.cluster).  This module is
the seam: :class:`Backend` is what the namespace calls, :class:`EmbeddedBackend`
does it with the local ``LogManager``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from engine.errors import UnknownTopicOrPartitionError
from engine.numbers import LONG_MAX
from engine.topic import TopicPartition
from engine.views import attach as attach_views

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Mapping, Sequence

    from engine.config import LogConfig
    from engine.consumer_offsets import GroupMetadataManager
    from engine.jsonl_in import JsonRecord
    from engine.log import Log
    from engine.manager import LogManager
    from engine.records import Record

__all__ = ["Backend", "EmbeddedBackend", "LocalLogs"]


class Backend(Protocol):
    """The changes a mount makes, by the Kafka request each one is."""

    #: whether appends wait on something outside this process (then they leave the trio thread)
    remote: bool

    def topics(self) -> list[str]:
        """The topics the namespace lists (sorted); answered without a request."""

    def partitions(self, topic: str) -> list[int]:
        """The partitions of ``topic`` (sorted; [] if there is no such topic); answered without a request."""

    def ensure_replica(self, tp: TopicPartition, *, catch_up: bool = True) -> Log:
        """The local log of ``tp``, made on first use where the backend replicates, and with ``catch_up``
        holding what the cluster committed (may block); UnknownTopicOrPartitionError if there is no such
        partition."""

    def replica_behind(self, tp: TopicPartition) -> bool:
        """Whether a read of ``tp`` must wait for ``ensure_replica`` first (no request)."""

    def record_below_log_start(self, tp: TopicPartition, offset: int) -> Record | None:
        """The record at ``offset``, below the local log start, from where the records live beyond the local
        log (may block); None where the local log is all there is."""

    def create_topic(self, topic: str) -> None:
        """CreateTopics with the defaults (``num.partitions``)."""

    def add_partition(self, topic: str, partition: int) -> None:
        """CreatePartitions: ``partition`` must be the next number."""

    def delete_topic(self, topic: str) -> None:
        """DeleteTopics."""

    def topic_config_props(self, topic: str) -> dict[str, str]:
        """DescribeConfigs: the effective topic configuration, ``name -> value``."""

    def topic_overrides(self, topic: str) -> dict[str, str]:
        """The topic's own settings (DescribeConfigs entries whose source is the topic)."""

    def validate_topic_overrides(self, topic: str, updates: Mapping[str, str | None]) -> None:
        """InvalidConfigError (EINVAL) for the first name or value that would be refused; nothing changes."""

    def alter_topic_config(self, topic: str, updates: Mapping[str, str | None]) -> None:
        """IncrementalAlterConfigs: set (value) or remove (None) overrides, all or nothing."""

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """DeleteRecords before ``offset``; returns the new log start offset."""

    def append_values(self, tp: TopicPartition, values: Sequence[bytes | None],
                      keys: Sequence[bytes | None] | None) -> tuple[int, int]:
        """Produce one batch; returns (first offset, last offset) once readable through the mount."""

    def append_text_lines(self, tp: TopicPartition, block: bytes) -> tuple[int, int, int]:
        """``append_values`` of the lines of ``block`` (each ending in ``\\n``) as values, without keys;
        returns (first offset, last offset, number of lines)."""

    def append_json_records(self, tp: TopicPartition, records: Sequence[JsonRecord]) -> tuple[int, int]:
        """Produce parsed ``append.jsonl`` records; returns (first offset, last offset)."""

    def append_blocks(self, topic: str) -> bool:
        """Whether an append to ``topic`` may block (fsync, network): then it runs off the trio thread."""

    def produce_config(self, topic: str, partition: int | None = None) -> LogConfig:
        """The configuration a produce to ``topic`` (to its ``partition``) is read with: ``max.message.bytes``
        and the line settings (``parse.key``, ...); answered without a request.  UnknownTopicOrPartitionError
        if the mount holds no such topic or partition."""

    def flush(self, tp: TopicPartition) -> None:
        """``fsync()`` of an append file: Kafka's ``Log.flush`` of ``tp``'s local log (none: nothing)."""

    def group_coordinator(self) -> GroupMetadataManager:
        """The committed offsets of consumer groups (``groups/``, ``consume/``)."""

    def watch_topics(self, removed: Callable[[str], None]) -> None:
        """Have ``removed(topic)`` called when a topic goes away other than through the namespace."""

    def close(self) -> None:
        """Stop whatever the backend runs (called before the LogManager shuts down)."""


class LocalLogs:
    """What both backends answer from the mount's own ``LogManager``: its logs, or a cluster's replicas."""

    manager: LogManager

    def produce_config(self, topic: str, partition: int | None = None) -> LogConfig:
        if partition is None:
            return self.manager.topic_config(topic)
        target = self.manager.get_log(TopicPartition(topic, partition))
        if target is None:
            raise UnknownTopicOrPartitionError(f"No partition {topic}-{partition}")
        return target.config

    def flush(self, tp: TopicPartition) -> None:
        target = self.manager.get_log(tp)
        if target is not None:
            target.flush()


class EmbeddedBackend(LocalLogs):
    """The mount is the broker: every change goes to its own ``LogManager``."""

    remote = False

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager

    def _log(self, tp: TopicPartition) -> Log:
        """The log a produce goes to; an internal topic refuses it (the engine's rule, EPERM).

        The one place the mount's writes reach a ``Log``, so the one hook of the views: from its first
        produce, the log's appends keep its view indexes exact (``engine.views.attach``), no rescan.
        """
        target = self.manager.produce_target(tp)
        attach_views(target)
        return target

    def topics(self) -> list[str]:
        return self.manager.topics()

    def partitions(self, topic: str) -> list[int]:
        return self.manager.partitions(topic)

    def ensure_replica(self, tp: TopicPartition, *, catch_up: bool = True) -> Log:
        return self._log(tp)

    def replica_behind(self, tp: TopicPartition) -> bool:
        return False        # the mount's log is the log

    def record_below_log_start(self, tp: TopicPartition, offset: int) -> Record | None:
        return None         # the mount's log is the whole log

    def create_topic(self, topic: str) -> None:
        self.manager.create_topic(topic)

    def add_partition(self, topic: str, partition: int) -> None:
        self.manager.add_partition(topic, partition)

    def delete_topic(self, topic: str) -> None:
        self.manager.delete_topic(topic)

    def topic_config_props(self, topic: str) -> dict[str, str]:
        return self.manager.topic_config(topic).to_props()

    def topic_overrides(self, topic: str) -> dict[str, str]:
        return self.manager.topic_overrides(topic)

    def validate_topic_overrides(self, topic: str, updates: Mapping[str, str | None]) -> None:
        self.manager.validate_topic_overrides(topic, updates)

    def alter_topic_config(self, topic: str, updates: Mapping[str, str | None]) -> None:
        self.manager.alter_topic_config(topic, updates)

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        return self.manager.delete_records(tp, offset)

    def append_values(self, tp: TopicPartition, values: Sequence[bytes | None],
                      keys: Sequence[bytes | None] | None) -> tuple[int, int]:
        return self._log(tp).append_values(values, keys)

    def append_text_lines(self, tp: TopicPartition, block: bytes) -> tuple[int, int, int]:
        first, last = self._log(tp).append_text_lines(block)
        return first, last, last - first + 1       # one batch of consecutive offsets

    def append_json_records(self, tp: TopicPartition, records: Sequence[JsonRecord]) -> tuple[int, int]:
        from engine.jsonl_in import append_json_records
        return append_json_records(self._log(tp), records)

    def append_blocks(self, topic: str) -> bool:
        return self.manager.topic_config(topic).flush_messages < LONG_MAX

    def group_coordinator(self) -> GroupMetadataManager:
        from engine.consumer_offsets import GroupMetadataManager
        return GroupMetadataManager(self.manager).load()

    def watch_topics(self, removed: Callable[[str], None]) -> None:
        pass        # only the namespace deletes topics of an embedded mount

    def close(self) -> None:
        pass
