"""``ClusterBackend``: the namespace's changes made on a Kafka cluster, its views served from the replica.

Each change is the cluster's request (logfs.cluster.admin, producer, groups)
and returns once the local replica shows it, so the namespace behaves as on
an embedded mount: ``mkdir t`` returns with ``t/`` listed, ``write()`` to
``append`` returns with the records readable (read-your-writes), ``before N``
returns with the records gone from every new view.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, cast

from engine.config import validate_topic_overrides
from engine.errors import (
    InvalidPartitionError,
    InvalidRecordError,
    InvalidTopicError,
    LogfsError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from engine.log import LEADER_LOG_START_OFFSET
from engine.topic import TopicPartition, validate_topic_name
from logfs.backend import LocalLogs
from logfs.cluster.admin import ClusterAdmin
from logfs.cluster.config import FETCHER_DEFAULTS, LOCAL_TOPIC_NAMES, ClusterOptions
from logfs.cluster.errors import ClusterError, ClusterTimeoutError, quiet_while_unreachable
from logfs.cluster.groups import ClusterGroupCoordinator
from logfs.cluster.producer import ClusterProducer
from logfs.cluster.replica_fetcher import ReplicaFetcher, StartPosition

if TYPE_CHECKING:  # pragma: no cover
    import re
    from collections.abc import Callable, Mapping, Sequence

    from engine.consumer_offsets import GroupMetadataManager
    from engine.jsonl_in import JsonRecord
    from engine.log import Log
    from engine.manager import LogManager
    from engine.records import Record

log = logging.getLogger(__name__)

__all__ = ["ClusterBackend", "CREATED_TOPIC_CONFIG"]

#: what topics created through the mount get: CreateTime, so a ``timestamp`` given in ``append.jsonl`` is
#: kept, and a plain line carries the mount's clock at produce time (librdkafka stamps it)
CREATED_TOPIC_CONFIG = {"message.timestamp.type": "CreateTime"}
#: Kafka's bounds of a CreateTime timestamp around the broker's clock (KIP-937), and its default for both
TIMESTAMP_LIMITS = ("message.timestamp.before.max.ms", "message.timestamp.after.max.ms")
_NO_LIMIT = 2 ** 63 - 1

#: records below the replica's log start fetched for ``offset/<N>`` and kept (a side cache, by recency)
BELOW_LOG_START_CACHED = 256


class ClusterBackend(LocalLogs):
    """The backend of a mount of a Kafka cluster (logfs.backend.Backend); configs and flushes of the local
    replicas are ``LocalLogs``'."""

    remote = True

    def __init__(self, manager: LogManager, options: ClusterOptions, *, topics: re.Pattern[str] | None = None,
                 start: StartPosition = "earliest") -> None:
        self.manager = manager
        self.options = options
        self.brokers = options.bootstrap
        self.timeout_s = options.timeout_s
        self.admin = ClusterAdmin(options.client_config(), self.timeout_s, options.create)
        self.topic_pattern = topics
        fetcher = {**FETCHER_DEFAULTS, **options.fetcher}
        self.fetcher = ReplicaFetcher(
            manager, self.admin, options.fetcher_client_config(),
            metadata_max_age_s=int(fetcher["metadata.max.age.ms"]) / 1000,
            listing_max_age_s=int(fetcher["metadata.listing.max.age.ms"]) / 1000,
            fetch_max_wait_ms=int(fetcher["fetch.max.wait.ms"]),
            topics=topics, start=start)
        self.producer: ClusterProducer | None = None
        self._coordinator = ClusterGroupCoordinator(manager, self.admin, options.fetcher_client_config())
        self._below_start: collections.OrderedDict[tuple[TopicPartition, int], Record | None] = \
            collections.OrderedDict()
        self._below_start_lock = threading.Lock()

    def start(self) -> None:
        """Reach the cluster and bring the replica's topics in line (bounded by the request timeout).

        librdkafka reaches it first (ClusterAdmin.connect): a refused authentication or TLS handshake fails the
        mount within a second, naming the setting to check (logfs.cluster.errors.security_failure)."""
        started = time.monotonic()
        self.admin.connect(self.timeout_s)
        self.fetcher.start(max(1.0, self.timeout_s - (time.monotonic() - started)))
        self.producer = ClusterProducer(self.options.client_config())

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        self._coordinator.close()
        self.fetcher.stop()

    # ------------------------------------------------------------------ waiting for the replica

    def _wait_until(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterTimeoutError(f"{what}: the cluster did the change, but its metadata did not show "
                                          f"it within {self.timeout_s:g} s (bootstrap servers {self.brokers})")
            self.fetcher.request_sync(min(left, 5.0))

    # ------------------------------------------------------------------ the namespace's listing

    def topics(self) -> list[str]:
        """The cluster's selected topics, from cached metadata (logfs.cluster.replica_fetcher)."""
        return self.fetcher.topics()

    def partitions(self, topic: str) -> list[int]:
        return self.fetcher.partitions(topic)

    def ensure_replica(self, tp: TopicPartition, *, catch_up: bool = True) -> Log:
        """The local replica of ``tp``, made on its first use; with ``catch_up``, once it holds the leader's
        high watermark (ReplicaFetcher.catch_up: ETIMEDOUT when it stops gaining records)."""
        return self.fetcher.ensure_replica(tp, self.timeout_s, catch_up=catch_up)

    def replica_behind(self, tp: TopicPartition) -> bool:
        return self.fetcher.behind(tp)

    def record_below_log_start(self, tp: TopicPartition, offset: int) -> Record | None:
        """``offset/<N>`` below the replica's log start: a one-off read of the record at ``offset`` from the
        cluster (a consumer assigned there, as ``kafka-console-consumer --partition P --offset N
        --max-messages 1``), not stored in the replica; kept in a small side cache."""
        key = (tp, offset)
        with self._below_start_lock:
            known = key in self._below_start
            record = self._below_start.get(key)
            if known:
                self._below_start.move_to_end(key)
        if not known:
            from logfs.cluster.consumer import read_one_record

            record = read_one_record(self.options.client_config(), tp, offset, self.timeout_s)
            with self._below_start_lock:      # a record, or None for none (not asked again on the lookup)
                self._below_start[key] = record
                while len(self._below_start) > BELOW_LOG_START_CACHED:
                    self._below_start.popitem(last=False)
        if record is None:
            raise OffsetOutOfRangeError(f"No record at offset {offset} in partition {tp} on the cluster "
                                        "(below its log start, or removed by compaction)",
                                        offset=offset, log_start_offset=-1, log_end_offset=-1)
        return record

    # ------------------------------------------------------------------ topics

    def create_topic(self, topic: str) -> None:
        validate_topic_name(topic)
        if not self.fetcher.selected(topic):
            pattern = self.topic_pattern.pattern if self.topic_pattern is not None else ""
            raise InvalidTopicError(f"Cannot create topic {topic}: the mount shows only topics matching "
                                    f"--topics {pattern!r}")
        self.admin.create_topic(topic, CREATED_TOPIC_CONFIG)
        self._wait_until(lambda: topic in self.fetcher.topics(), f"Creating topic {topic}")
        self.fetcher.created(topic)

    def add_partition(self, topic: str, partition: int) -> None:
        current = len(self.fetcher.partitions(topic))
        if not current:
            raise UnknownTopicOrPartitionError(f"Topic {topic} does not exist")
        if partition != current:
            raise InvalidPartitionError(
                f"Cannot add partition {partition} to topic {topic}: the next partition is {current}")
        self.admin.create_partitions(topic, partition + 1)
        self._wait_until(lambda: partition in self.fetcher.partitions(topic),
                         f"Adding partition {partition} to topic {topic}")

    def delete_topic(self, topic: str) -> None:
        self.fetcher.deleted(topic)
        self.admin.delete_topic(topic)
        self._wait_until(lambda: topic not in self.fetcher.topics(), f"Deleting topic {topic}")

    # ------------------------------------------------------------------ configs

    def topic_config_props(self, topic: str) -> dict[str, str]:
        """The cluster's DescribeConfigs, plus the mount's own line settings (``parse.key``, ...)."""
        held = topic in self.manager.topics()
        local = (self.manager.topic_config(topic) if held else self.manager.default_config).to_props()
        props, _ = self.admin.describe_topic_config(topic)
        props.update({k: v for k, v in local.items() if k in LOCAL_TOPIC_NAMES})
        return props

    def topic_overrides(self, topic: str) -> dict[str, str]:
        _, overrides = self.admin.describe_topic_config(topic)
        local = self.manager.topic_overrides(topic) if topic in self.manager.topics() else {}
        overrides.update({k: v for k, v in local.items() if k in LOCAL_TOPIC_NAMES})
        return overrides

    def validate_topic_overrides(self, topic: str, updates: Mapping[str, str | None]) -> None:
        """The mount's own names checked here, the rest by the broker (IncrementalAlterConfigs, validateOnly)."""
        local = {k: v for k, v in updates.items() if k in LOCAL_TOPIC_NAMES}
        remote = {k: v for k, v in updates.items() if k not in LOCAL_TOPIC_NAMES}
        validate_topic_overrides(local)
        if remote:
            self.admin.alter_topic_config(topic, remote, validate_only=True)

    def alter_topic_config(self, topic: str, updates: Mapping[str, str | None]) -> None:
        local = {k: v for k, v in updates.items() if k in LOCAL_TOPIC_NAMES}
        remote = {k: v for k, v in updates.items() if k not in LOCAL_TOPIC_NAMES}
        if local:
            validate_topic_overrides(local)
        if remote:
            self.admin.alter_topic_config(topic, remote)
        if local:
            if topic not in self.manager.topics():      # the mount's own settings live with a replica
                self.ensure_replica(TopicPartition(topic, min(self.partitions(topic), default=0)), catch_up=False)
            self.manager.alter_topic_config(topic, local)

    # ------------------------------------------------------------------ records

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        low = self.admin.delete_records(tp, offset)
        target = self.manager.get_log(tp)
        if target is not None:      # gone from the namespace now, as on an embedded mount
            target.maybe_increment_log_start_offset(min(low, target.log_end_offset), LEADER_LOG_START_OFFSET)
        return low

    def _visible(self, tp: TopicPartition, first: int, last: int) -> tuple[int, int]:
        """Read-your-writes: wait until the local replica holds ``last``."""
        if not self.fetcher.wait_for_offset(tp, last, self.timeout_s):
            # Acknowledged by the cluster: failing the write would make the writer append it twice.
            log.warning("Offsets %d..%d of %s were acknowledged by the cluster but not yet fetched by the local "
                        "replica after %g s: a read right now may not show them", first, last, tp, self.timeout_s)
        return first, last

    def _producer(self) -> ClusterProducer:
        if self.producer is None:
            raise LogfsError("The cluster mount is not started")
        return self.producer

    def _produce(self, tp: TopicPartition, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                 headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None,
                 timestamps: Sequence[int | None] | None = None) -> tuple[int, int]:
        # where the records are read back (read-your-writes), made on first use
        held_end = self.ensure_replica(tp, catch_up=False).log_end_offset
        try:
            first, last = self._producer().produce(tp, values, keys, headers, timestamps)
        except ClusterError as exc:
            raise quiet_while_unreachable(exc, self.admin.reachable) from None
        if first < held_end:
            # new offsets the replica already held: it is a replica of an earlier topic of this name (deleted and
            # recreated since the last metadata poll); the metadata now replaces it, fetched anew for the read-back
            log.info("Partition %s: the cluster appended at offsets %d..%d, below the local replica's end %d: "
                     "the topic was recreated, refreshing its metadata", tp, first, last, held_end)
            self.fetcher.request_sync(min(self.timeout_s, 5.0))
            self.ensure_replica(tp, catch_up=False)
        return self._visible(tp, first, last)

    def append_values(self, tp: TopicPartition, values: Sequence[bytes | None],
                      keys: Sequence[bytes | None] | None) -> tuple[int, int]:
        try:
            return self._produce(tp, values, keys)
        except InvalidRecordError as exc:
            raise self._timestamp_refusal(tp, exc, "the mount's clock") from None

    def append_text_lines(self, tp: TopicPartition, block: bytes) -> tuple[int, int, int]:
        values = block.split(b"\n")
        values.pop()                # after the last newline: nothing
        first, last = self.append_values(tp, values, None)
        return first, last, len(values)

    def append_json_records(self, tp: TopicPartition, records: Sequence[JsonRecord]) -> tuple[int, int]:
        timestamps = [r.timestamp for r in records]
        if any(t is not None for t in timestamps):
            self._check_timestamps(tp, timestamps)
        try:
            return self._produce(tp, [r.value for r in records], [r.key for r in records],
                                 [r.headers for r in records], timestamps)
        except InvalidRecordError as exc:
            raise self._timestamp_refusal(tp, exc, "the timestamps given") from None

    def _check_timestamps(self, tp: TopicPartition, timestamps: Sequence[int | None]) -> None:
        """Refuse (EINVAL, nothing produced) given timestamps the topic would not keep: on a LogAppendTime
        topic the broker replaces them, and one outside the topic's ``message.timestamp.before/after.max.ms``
        of now (this host's clock) the broker refuses (INVALID_TIMESTAMP)."""
        props, _ = self.admin.describe_topic_config(tp.topic)
        if props.get("message.timestamp.type") == "LogAppendTime":
            raise InvalidRecordError(
                f"Appending to {tp}: topic {tp.topic} has message.timestamp.type=LogAppendTime, so the broker "
                "would replace the \"timestamp\" of the lines with its own clock; write them without one, or set "
                f"message.timestamp.type=CreateTime in {tp.topic}/config to keep them")
        now = int(time.time() * 1000)
        before, after = (int(props.get(name, _NO_LIMIT)) for name in TIMESTAMP_LIMITS)
        for i, ts in enumerate(timestamps):
            if ts is None:
                continue
            if ts < now - before or ts > now + after:
                limit, bound = (f"{TIMESTAMP_LIMITS[0]}={before}", "before") if ts < now - before \
                    else (f"{TIMESTAMP_LIMITS[1]}={after}", "after")
                raise InvalidRecordError(
                    f"Appending to {tp}: record {i + 1} of the write has timestamp {ts}, more than {limit} ms "
                    f"{bound} now ({now}): topic {tp.topic} refuses it (INVALID_TIMESTAMP)")

    def _timestamp_refusal(self, tp: TopicPartition, exc: InvalidRecordError, whose: str) -> InvalidRecordError:
        """The broker's INVALID_TIMESTAMP, with the topic's limits named; any other refusal as it is."""
        if "INVALID_TIMESTAMP" not in str(exc):
            return exc
        try:
            props, _ = self.admin.describe_topic_config(tp.topic)
            limits = ", ".join(f"{name}={props.get(name, _NO_LIMIT)}" for name in TIMESTAMP_LIMITS)
        except LogfsError as describe_error:
            limits = f"its limits could not be read: {describe_error}"
        return InvalidRecordError(f"{exc}: {whose} outside what topic {tp.topic} accepts around the broker's "
                                  f"clock ({limits})")

    def append_blocks(self, topic: str) -> bool:
        return True     # every append waits for the cluster

    def watch_topics(self, removed: Callable[[str], None]) -> None:
        def topic_removed(topic: str) -> None:
            if self.producer is not None:       # the producer's metadata of the old topic is no use
                self.producer.topic_replaced(topic)
            removed(topic)

        self.fetcher.topic_removed = topic_removed

    def group_coordinator(self) -> GroupMetadataManager:
        # the embedded coordinator's interface (what logfs.groups calls), answered by the cluster
        return cast("GroupMetadataManager", self._coordinator)
