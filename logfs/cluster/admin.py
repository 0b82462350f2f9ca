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
import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Producer
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
from logfs.cluster.errors import (
    ClientLog,
    ClusterAuthenticationError,
    ClusterTimeoutError,
    error_name,
    from_kafka,
    quiet_while_unreachable,
    security_failure,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from engine.topic import TopicPartition

log = logging.getLogger(__name__)

__all__ = ["ClusterAdmin", "UNREACHABLE_WAIT_S"]

#: how long a request waits while the cluster is known to be unreachable
UNREACHABLE_WAIT_S = 2.0
#: how much longer than its ``request_timeout`` the mount waits for librdkafka to complete a request
_COMPLETION_MARGIN_S = 5.0
_MIN_REQUEST_TIMEOUT_S = 0.5
_RETRY_BACKOFF_S = 0.2
#: retriable in Kafka's sense, but the request's bound is spent: not asked again
_NOT_RETRIED = frozenset({"_TIMED_OUT", "REQUEST_TIMED_OUT", "_MSG_TIMED_OUT"})


class _Retriable(Exception):
    """A retriable refusal of a request that may be made again (carries the error to raise in the end)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ClusterAdmin:
    """Kafka's ``Admin`` requests the mount makes, each bounded by ``timeout_s``."""

    def __init__(self, client_config: Mapping[str, str], timeout_s: float,
                 create_defaults: Mapping[str, str] | None = None) -> None:
        self.brokers = client_config["bootstrap.servers"]
        self.timeout_s = timeout_s
        self._create_defaults = dict(create_defaults or {})
        self._client_config = dict(client_config)
        # Any: librdkafka's settings and the logger object, which its stub's setting types leave out
        config: dict[str, Any] = {**client_config, "logger": ClientLog("logfs.cluster.librdkafka")}
        try:
            self._admin = AdminClient(config)
        except KafkaException as exc:     # a client setting librdkafka does not know or refuses
            raise InvalidConfigError(f"Invalid Kafka client setting: {exc.args[0].str()}") from None
        #: whether the cluster answered the replica fetcher's last metadata request (set by the fetcher)
        self.reachable = True

    def connect(self, timeout_s: float) -> None:
        """Reach the cluster (a Metadata request), or fail at once when it refuses the mount's credentials or
        TLS handshake, naming the setting to check: a broker says so within a second, and waiting the whole
        ``timeout_s`` would only hide it.

        Asked by a short-lived librdkafka producer with an ``error_cb`` (librdkafka reports a refused
        authentication there only; a Metadata request just times out), polled on this thread and dropped
        after: the long-lived admin client is never polled, so an ``error_cb`` on it would only pile its
        errors up on its queue.
        """
        failures: list[ClusterAuthenticationError] = []
        client_log = logging.getLogger("logfs.cluster.librdkafka")

        def on_error(error: Any) -> None:     # Any: librdkafka's KafkaError
            client_log.debug("%s: %s", error.name(), error.str())
            failure = security_failure(error.name(), error.str(), self.brokers)
            if failure is not None:
                failures.append(failure)

        probe = Producer({**self._client_config, "logger": ClientLog("logfs.cluster.librdkafka"),
                          "error_cb": on_error})
        deadline = time.monotonic() + timeout_s
        last: object = None
        try:
            while True:
                probe.poll(0.1)                    # serves on_error
                if failures:
                    raise failures[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterTimeoutError(f"Cannot reach the Kafka cluster at {self.brokers} within "
                                              f"{timeout_s:g} s" + (f" ({last})" if last else "")
                                              + "; if its brokers are up, check security.protocol (the one of "
                                              "the listener at that port)")
                try:
                    probe.list_topics(timeout=min(0.5, left))
                except KafkaException as exc:
                    last = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc
                    continue
                probe.poll(0)
                if failures:                       # answered through one broker, refused by another
                    raise failures[0]
                return
        finally:
            probe.flush(0)

    def request_timeout(self) -> float:
        """The bound of a request made now: the mount's timeout, or while the cluster is known to be
        unreachable a short while only (some requests are made on the mount's request thread, a lookup of
        ``groups/``, a read of ``config``, which must not stall every other file of the mount)."""
        return self.timeout_s if self.reachable else min(self.timeout_s, UNREACHABLE_WAIT_S)

    def result(self, future: concurrent.futures.Future[object], what: str, timeout: float | None = None, *,
               retriable: bool = False) -> Any:     # Any: each admin request answers its own type
        """The answer of one admin request, or the engine error for the cluster's refusal or silence.

        Each item of a request (topic, partition, config resource) has its own future; a refusal of that item,
        raised by the future or carried in its result's ``error``, is this request's error.
        ``timeout`` is the ``request_timeout`` the request was made with (default: :meth:`request_timeout`).
        librdkafka completes the future itself by then (``_TIMED_OUT``), so the wait here, a little longer,
        never leaves a request pending behind it: an abandoned admin request piles up in librdkafka for the
        rest of its own timeout and is answered into a future nobody reads.
        """
        timeout = self.request_timeout() if timeout is None else timeout
        try:
            answer = future.result(timeout=timeout + _COMPLETION_MARGIN_S)
            error = getattr(answer, "error", None)      # a per-item result carrying its own error
            if error is not None and not callable(error):
                raise KafkaException(error)
            return answer
        except concurrent.futures.TimeoutError:
            raise quiet_while_unreachable(ClusterTimeoutError(
                f"{what}: no answer from the cluster within {timeout:g} s (bootstrap servers {self.brokers})"),
                self.reachable) from None
        except KafkaException as exc:
            error = quiet_while_unreachable(from_kafka(exc, what, self.brokers), self.reachable)
            inner: Any = exc.args[0] if exc.args else None     # Any: the KafkaError librdkafka raises inside
            if retriable and callable(getattr(inner, "retriable", None)) and inner.retriable() \
                    and error_name(inner) not in _NOT_RETRIED:
                raise _Retriable(error) from None
            raise error from None

    # Any: as result()
    def _asked_again(self, send: Callable[[float], concurrent.futures.Future[object]], what: str) -> Any:
        """``send(request_timeout)``'s answer, the request made again while the refusal is retriable
        (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE: a leader moving), until the request's bound.

        Only for requests that may be repeated (DeleteRecords, ListOffsets, DescribeConfigs)."""
        bound = self.request_timeout()
        deadline = time.monotonic() + bound
        while True:
            timeout = max(deadline - time.monotonic(), _MIN_REQUEST_TIMEOUT_S)
            try:
                return self.result(send(timeout), what, timeout, retriable=True)
            except _Retriable as exc:
                if time.monotonic() + _RETRY_BACKOFF_S >= deadline:
                    raise exc.error from None
                time.sleep(_RETRY_BACKOFF_S)

    def create_topic(self, topic: str, config: Mapping[str, str]) -> None:
        """CreateTopics with the cluster's ``num.partitions`` and ``default.replication.factor``
        unless the mount was given others (``-o num.partitions=``, ``-o default.replication.factor=``)."""
        partitions = int(self._create_defaults.get("num.partitions", "-1"))
        replication = int(self._create_defaults.get("default.replication.factor", "-1"))
        new = NewTopic(topic, num_partitions=partitions, replication_factor=replication, config=dict(config))
        timeout = self.request_timeout()
        futures = self._admin.create_topics([new], request_timeout=timeout)
        self.result(futures[topic], f"Creating topic {topic}", timeout)
        log.info("Created topic %s on the cluster", topic)

    def create_partitions(self, topic: str, total: int) -> None:
        timeout = self.request_timeout()
        futures = self._admin.create_partitions([NewPartitions(topic, total)], request_timeout=timeout)
        self.result(futures[topic], f"Adding partition {total - 1} to topic {topic}", timeout)
        log.info("Topic %s has %d partitions on the cluster", topic, total)

    def delete_topic(self, topic: str) -> None:
        timeout = self.request_timeout()
        futures = self._admin.delete_topics([topic], request_timeout=timeout)
        self.result(futures[topic], f"Deleting topic {topic}", timeout)
        log.info("Deleted topic %s on the cluster", topic)

    def describe_topic_config(self, topic: str) -> tuple[dict[str, str], dict[str, str]]:
        """DescribeConfigs: (every setting, the topic's own overrides), ``name -> value``."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        timeout = self.request_timeout()
        futures = self._admin.describe_configs([resource], request_timeout=timeout)
        entries = self.result(futures[resource], f"Describing the config of topic {topic}", timeout)
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
        timeout = self.request_timeout()
        futures = self._admin.incremental_alter_configs([resource], request_timeout=timeout,
                                                        validate_only=validate_only)
        self.result(futures[resource], f"Altering the config of topic {topic}", timeout)
        if validate_only:
            return
        log.info("Altered the config of topic %s on the cluster: %s", topic,
                 ", ".join(f"{k}={'' if v is None else v}" for k, v in updates.items()))

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """DeleteRecords before ``offset``; the partition's new low watermark."""
        target = KafkaTopicPartition(tp.topic, tp.partition, offset)
        result = self._asked_again(
            lambda timeout: self._admin.delete_records([target], request_timeout=timeout)[target],
            f"Deleting the records of {tp} before offset {offset}")
        return int(getattr(result, "low_watermark", offset))

    def list_offsets(self, tp: TopicPartition) -> tuple[int, int]:
        """(log start offset, high watermark) of a partition (ListOffsets earliest and latest)."""
        target = KafkaTopicPartition(tp.topic, tp.partition)

        def ask(spec: OffsetSpec) -> int:
            answer = self._asked_again(
                lambda timeout: self._admin.list_offsets({target: spec}, request_timeout=timeout)[target],
                f"Listing the offsets of {tp}")
            return int(answer.offset)

        out = [ask(OffsetSpec.earliest()), ask(OffsetSpec.latest())]
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
    source: Any = entry.source      # Any: the ConfigSource enum or its number, as librdkafka hands it back
    return int(getattr(source, "value", source))
