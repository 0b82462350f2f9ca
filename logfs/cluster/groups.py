"""Consumer groups of a cluster mount: the cluster's group coordinator holds the committed offsets.

The same interface as the embedded ``engine.consumer_offsets.GroupMetadataManager``
(what ``logfs.groups`` calls), answered by the cluster's group coordinator:
OffsetFetch to read, OffsetCommit (as Kafka's ``Admin.alterConsumerGroupOffsets``)
to commit, OffsetDelete to remove a group's commits on a topic, ListGroups to
list them.  So ``kafka-consumer-groups.sh --describe`` and any Kafka consumer
of the group see what ``groups/<group>`` and ``consume/<group>`` commit, and
the other way round.

Every partition's answer is checked: Kafka only lets an admin commit for a
group with no active members, so a commit for a group a running consumer
holds is refused per partition (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
REBALANCE_IN_PROGRESS): EBUSY, the coordinator's reason in the log, nothing
committed.  A coordinator that is loading its partition of
``__consumer_offsets`` or moving (COORDINATOR_LOAD_IN_PROGRESS,
COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: a fresh cluster, a broker
restart) is asked again, the coordinator looked up again, until the mount's
request timeout.

These requests go through kafka-python's admin client, not librdkafka's:
librdkafka 2.16's coordinator-targeted admin requests crash the process on
exactly these answers (a ListConsumerGroupOffsets answered
COORDINATOR_LOAD_IN_PROGRESS dereferences the consumer-group handle an admin
client does not have: SIGSEGV in ``rd_kafka_cgrp_op``; a request that fails
to be sent while the coordinator's connection drops frees its ``eonce`` twice:
``rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0'``,
librdkafka PR 5397).  Lag is counted against the local replica's log end
(which trails the cluster's high watermark by at most one fetch).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from engine.consumer_offsets import GroupLag, group_lag
from engine.errors import InvalidRequestError
from engine.topic import TopicPartition
from logfs.cluster.admin import UNREACHABLE_WAIT_S, ClusterAdmin
from logfs.cluster.errors import (
    RETRIABLE_COORDINATOR_ERRORS,
    ClusterTimeoutError,
    GroupBusyError,
    error_name,
    from_kafka,
    quiet_while_unreachable,
    refused,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from engine.manager import LogManager

log = logging.getLogger(__name__)

__all__ = ["ClusterGroupCoordinator"]

T = TypeVar("T")

#: how long a request to a loading or moving coordinator waits before it is asked again
_RETRY_BACKOFF_S = 0.2


class ClusterGroupCoordinator:
    """Committed offsets kept by the cluster's group coordinator (see the module docstring)."""

    def __init__(self, manager: LogManager, admin: ClusterAdmin,
                 client_config: Mapping[str, Any] | None = None) -> None:     # Any: kafka-python's settings
        self.manager = manager
        self.admin = admin
        #: kafka-python's names of the mount's client settings (security), as the replica fetcher gets them
        self._client_config = dict(client_config or {})
        self._client_lock = threading.Lock()
        self._kafka_admin: Any = None     # Any: kafka-python's KafkaAdminClient, untyped

    # ------------------------------------------------------------------ requests

    def _wait_s(self) -> float:
        """The bound of one request: the mount's timeout, a short while when the cluster is known unreachable
        (some requests are made on the mount's request thread, which must not stall the whole mount)."""
        return self.admin.timeout_s if self.admin.reachable else min(self.admin.timeout_s, UNREACHABLE_WAIT_S)

    def _client(self, wait_s: float) -> Any:     # Any: kafka-python's KafkaAdminClient
        """kafka-python's ``KafkaAdminClient``, made at the first group request (it bootstraps when made).

        Its requests run on its own network thread; callers from any thread block on their answer."""
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        with self._client_lock:
            if self._kafka_admin is None:
                timeout_ms = int(self.admin.timeout_s * 1000)
                try:
                    self._kafka_admin = KafkaAdminClient(**{
                        "bootstrap_servers": self.admin.brokers.split(","),
                        "client_id": "logfs-group-admin",
                        "request_timeout_ms": timeout_ms,
                        "bootstrap_timeout_ms": max(1, int(wait_s * 1000)),
                        "reconnect_backoff_ms": 100,
                        "reconnect_backoff_max_ms": 1_000,
                        **self._client_config,
                    })
                except KafkaError as exc:
                    raise ClusterTimeoutError(f"Reaching the group coordinator: {exc} "
                                              f"(bootstrap servers {self.admin.brokers})") from None
            return self._kafka_admin

    def _forget_coordinator(self, group: str) -> None:
        """The coordinator of ``group`` is looked up again at the next request (FindCoordinator)."""
        client = self._kafka_admin
        if client is None:
            return
        coordinators = client._manager.cluster._coordinators
        for key in [k for k in list(coordinators) if k[1] == group]:
            coordinators.pop(key, None)

    def _request(self, what: str, group: str | None, call: Callable[[Any], T]) -> T:     # Any: kafka-python's client
        """``call(client)``, asked again while the coordinator loads or moves, until the request's bound.

        A refusal is the engine error of its meaning (EBUSY for a group with members) with the
        coordinator's reason; no answer in time is ETIMEDOUT."""
        from kafka.errors import KafkaError

        wait_s = self._wait_s()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return call(self._client(wait_s))
            except KafkaError as exc:
                name = error_name(exc)
                if not (name in RETRIABLE_COORDINATOR_ERRORS or getattr(exc, "retriable", False)
                        or type(exc).__name__ in ("NoBrokersAvailable", "UnknownBrokerIdError")):
                    raise quiet_while_unreachable(from_kafka(exc, what, self.admin.brokers),
                                                  self.admin.reachable) from None
                if group is not None and name != "COORDINATOR_LOAD_IN_PROGRESS":
                    self._forget_coordinator(group)
                last = f"{name}: {exc}" if name != type(exc).__name__ else str(exc)
            if time.monotonic() + _RETRY_BACKOFF_S >= deadline:
                raise quiet_while_unreachable(ClusterTimeoutError(
                    f"{what}: no answer from the group coordinator within {wait_s:g} s "
                    f"({last}; bootstrap servers {self.admin.brokers})"), self.admin.reachable)
            time.sleep(_RETRY_BACKOFF_S)

    def close(self) -> None:
        with self._client_lock:
            if self._kafka_admin is not None:
                self._kafka_admin.close()
                self._kafka_admin = None

    # ------------------------------------------------------------------ reading

    def _group_offsets(self, group: str) -> dict[TopicPartition, int]:
        """OffsetFetch of every partition ``group`` committed."""
        # Any: kafka-python's TopicPartition and OffsetAndMetadata (an untyped library)
        def fetch(client: Any) -> dict[Any, Any]:
            offsets: dict[Any, Any] = client.list_group_offsets({group: None}).get(group, {})     # Any: as fetch()'s
            return offsets

        result = self._request(f"Reading the committed offsets of group {group}", group, fetch)
        return {TopicPartition(tp.topic, tp.partition): om.offset for tp, om in result.items() if om.offset >= 0}

    def _group_ids(self) -> list[str]:
        groups = self._request("Listing the consumer groups", None, lambda client: client.list_groups())
        return sorted({g["group_id"] for g in groups})

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
        from kafka.structs import OffsetAndMetadata
        from kafka.structs import TopicPartition as KafkaTopicPartition

        items = sorted(offsets.items())
        partitions = {KafkaTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(offset, metadata, -1)
                      for tp, offset in items}
        what = f"Committing offsets for group {group}"

        def alter(client: Any) -> None:     # Any: kafka-python's client
            answers = client.alter_group_offsets(group, partitions)
            self._check(answers, what)

        self._request(what, group, alter)
        log.info("[GroupCoordinator] Group %s committed offsets %s on the cluster", group,
                 ", ".join(f"{tp}={offset}" for tp, offset in items))

    def flush(self, groups: Iterable[str]) -> None:
        """Nothing to make durable here: the cluster acknowledged each commit (``fsync()`` of a group file)."""

    def check_commit_allowed(self, group: str) -> None:
        """DescribeGroups: a group with active members is refused at once (EBUSY), as its commit would be.

        Called at the first write to ``groups/<group>`` (logfs.groups): the commit itself is made at close,
        whose error a shell does not report.  A group the coordinator cannot describe (a consumer-protocol
        group of KIP-848) is left to the commit's own answer."""
        described = self._request(f"Describing group {group}", group, lambda client: client.describe_groups([group]))
        info = described.get(group) or {}
        members = info.get("members") or []
        if members and not info.get("error"):
            raise GroupBusyError(f"Committing offsets for group {group}: the cluster refused it: the group has "
                                 f"{len(members)} active member(s) (state {info.get('group_state')}); Kafka lets "
                                 "an admin commit only for a group without members")

    def delete_group_offsets(self, group: str, topic: str) -> int:
        """OffsetDelete of ``group``'s commits on ``topic``; returns how many there were."""
        partitions = sorted(self.committed_offsets(group, topic))
        if not partitions:
            return 0
        from kafka.structs import TopicPartition as KafkaTopicPartition

        what = f"Deleting the committed offsets of group {group} on topic {topic}"

        def delete(client: Any) -> None:     # Any: kafka-python's client
            answers = client.delete_group_offsets(group, [KafkaTopicPartition(topic, p) for p in partitions])
            self._check(answers, what)

        self._request(what, group, delete)
        log.info("[GroupCoordinator] Deleted the committed offsets of group %s on topic %s (partitions %s)",
                 group, topic, ",".join(map(str, partitions)))
        return len(partitions)

    def _check(self, answers: Mapping[Any, Any], what: str) -> None:     # Any: kafka-python's answers
        """Every partition's answer of an OffsetCommit or OffsetDelete: a coordinator that loads or moves is
        raised as such (asked again), any other error is the request's refusal."""
        from kafka.errors import NoError

        failed = {f"{tp.topic}-{tp.partition}": error_name(error) for tp, error in sorted(answers.items())
                  if error is not NoError}
        if not failed:
            return
        retriable = [name for name in failed.values() if name in RETRIABLE_COORDINATOR_ERRORS]
        if retriable:
            error_class = next(e for e in answers.values() if error_name(e) == retriable[0])
            raise error_class(f"{what}: {retriable[0]}")
        raise refused(failed, what, self.admin.brokers)

    def on_topic_deleted(self, topic: str) -> None:
        """Nothing: the cluster's coordinator drops the commits of a deleted topic itself."""
