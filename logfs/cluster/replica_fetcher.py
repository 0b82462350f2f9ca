"""The local replica: Kafka's ``ReplicaFetcherThread`` for a mount of a cluster.

One thread keeps the local data dir a copy of the cluster's partitions:

* **metadata**: the cluster's topics (internal ones excepted; only those
  whose whole name matches ``--topics``, as a consumer subscribes by pattern)
  and their partitions are listed from a cached full metadata poll (every
  ``metadata.listing.max.age`` of the mount, 10 s, and at once when an
  admin change asks for it); the topics the mount holds replicas of are
  polled on their own every ``metadata.max.age`` (2 s) and at once when a
  fetch fails, so the metadata traffic follows what is read, not the cluster's
  size.  A topic gone from the cluster is deleted locally; a topic whose ID
  changed (deleted and recreated behind the mount's back) is deleted locally
  and replicated again on its next use, so no data of the old topic is ever
  served as the new one's.
* **replicas on first use** (Kafka's ``LogManager.getOrCreateLog`` when a
  broker becomes a follower): a partition has no local log, no open file and
  no place in a fetch session until something under its directory is looked
  up (:meth:`ReplicaFetcher.ensure_replica`); its log then starts where
  ``--from`` says (ListOffsets earliest, latest or by timestamp) and its
  directory carries the topic ID in Kafka's ``partition.metadata``.
* **fetch**: one Fetch request (v13+, topic IDs, so a recreated topic answers
  UNKNOWN_TOPIC_ID instead of its own records) per leader in flight, each
  long-polling at the leader, in an incremental fetch session (KIP-227,
  ``FetchSession``: after the first, requests and responses carry only the
  partitions that moved).  It fetches as a consumer does (replica id -1):
  the leader returns records up to the high watermark only, so what is stored
  locally was committed when it was fetched; the batches are appended byte
  for byte at the leader's offsets by ``Log.append_as_follower``.
* **divergence** (KIP-320, Kafka's ``AbstractFetcherThread.truncateOnFetchResponse``):
  each fetch carries the leader epoch of the last local batch
  (``lastFetchedEpoch``).  A leader whose history differs from the replica's
  there (an unclean leader election, or a local replica written by another
  history) answers with its diverging epoch and where that epoch ends; the
  replica truncates to the end of the largest epoch both hold and fetches on
  from there.  A local epoch the leader never had (OFFSET_OUT_OF_RANGE with
  the fetch offset inside the leader's log) truncates to the end of the
  largest local epoch at or below the leader's current one.
* **start**: the mount answers once every held partition's leader answered
  one fetch (at most ``FIRST_ROUND_MAX_S``), so a remounted replica shows the
  cluster's log start and its new records from the first read; a replica
  made on first use answers once its leader did, within the same bound.
* **log start**: the leader's log start offset in each response (retention,
  DeleteRecords on the cluster) moves the local log start up; a fetch offset
  below it (OFFSET_OUT_OF_RANGE) truncates the local log fully and starts it
  at the leader's log start (Kafka's ``truncateFullyAndStartAt``); beyond the
  leader's end (an unclean leader election) truncates to it.
* **leader changes**: NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, a
  broken connection: the partition backs off briefly, metadata is refreshed
  and the fetch goes to the new leader.

Kafka's raw wire format is kafka-python's (``kafka.protocol`` request classes,
its connection manager); the records stay bytes from socket to segment.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import LogfsError, UnknownTopicOrPartitionError
from engine.partition_metadata import read_topic_id
from engine.records.framing import iter_batches
from engine.topic import TopicPartition
from logfs.cluster.errors import ClusterTimeoutError, quiet_kafka_python

if TYPE_CHECKING:  # pragma: no cover
    from engine.log import Log
    from engine.manager import LogManager
    from logfs.cluster.admin import ClusterAdmin

log = logging.getLogger(__name__)

__all__ = ["ReplicaFetcher", "LEADER_LOG_START_OFFSET", "StartPosition"]

#: where a new replica starts (``--from``): "earliest", "latest" or a timestamp in epoch milliseconds
StartPosition = str | int

#: the reason logged when the local log start follows the leader's
LEADER_LOG_START_OFFSET = "leader log start offset"
#: the reason logged when the local log start is where --from started the replica
FROM_START = "the start chosen by --from"

# Kafka error codes the fetcher acts on
_NONE = 0
_OFFSET_OUT_OF_RANGE = 1
_UNKNOWN_TOPIC_OR_PARTITION = 3
_RETRIABLE_METADATA = {3, 5, 6, 56, 74, 75, 100}   # unknown topic/partition, leader not available, not leader,
#                                                    storage error, fenced/unknown leader epoch, unknown topic id

_FETCH_SESSION_ERRORS = {70, 71}   # FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH
_INT32_MAX = 0x7FFFFFFF
_BACKOFF_S = 0.2
#: the most the mount's start waits for the first fetch of every partition (see ReplicaFetcher.start)
FIRST_ROUND_MAX_S = 10.0


@dataclass
class PartitionFetchState:
    """Kafka's ``PartitionFetchState``: where a partition is fetched from."""

    log: Log
    topic_id: uuid.UUID
    leader: int
    leader_epoch: int
    delayed_until: float = 0.0
    high_watermark: int = -1
    #: a fetch response (records, nothing new, or an error) came back at least once
    responded: bool = False
    #: the leader epoch of the last local batch (``lastFetchedEpoch``); None: read it from the log
    last_epoch: int | None = None
    #: the Kafka error code of the last fetch of this partition (a warning is logged when it changes)
    last_error: int = 0
    #: where ``--from`` started a replica made on first use: its log start, also when the first batch fetched
    #: begins below it (a time or the end falling inside a batch)
    start_floor: int = -1

    def last_fetched_epoch(self) -> int:
        if self.last_epoch is None:
            self.last_epoch = self.log.latest_epoch()
        return self.last_epoch


class FetchSession:
    """Kafka's ``FetchSessionHandler`` (KIP-227): one incremental fetch session per leader.

    The first request of a session is full (session id 0, epoch 0) and lists
    every partition the replica fetches from that leader; the broker answers
    with a session id.  Each later request (epoch 1, 2, ...) lists only the
    partitions whose fetch position changed (records appended, truncation, a
    new leader epoch) or are new, and forgets those no longer fetched there;
    the broker answers only for partitions with something new.  So an idle
    mount of 10,000 partitions sends and decodes a few bytes per poll, not every
    partition.  Any error (an evicted session, a broken connection) starts a
    new session with a full request.  A broker that gives no session id (its
    session cache is full) gets full requests without a session (epoch -1).
    """

    __slots__ = ("session_id", "epoch", "sent", "sessionless")

    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = 0
        #: what the broker's session holds: partition -> (fetch offset, last fetched epoch, leader epoch)
        self.sent: dict[tuple[uuid.UUID, int], tuple[int, int, int]] = {}
        self.sessionless = False

    def next_request(self, wanted: Mapping[tuple[uuid.UUID, int], tuple[TopicPartition, tuple[int, int, int]]]
                     ) -> tuple[int, int, list[tuple[uuid.UUID, int]], list[tuple[uuid.UUID, int]]]:
        """(session id, epoch, partitions to send, partitions to forget) of the next request."""
        if self.sessionless:
            return 0, -1, list(wanted), []
        if self.session_id == 0:
            return 0, 0, list(wanted), []
        send = [key for key, (_, position) in wanted.items() if self.sent.get(key) != position]
        forget = [key for key in self.sent if key not in wanted]
        return self.session_id, self.epoch, send, forget

    def acknowledged(self, session_id: int, sent: Mapping[tuple[uuid.UUID, int], tuple[int, int, int]],
                     forgotten: list[tuple[uuid.UUID, int]]) -> None:
        """The broker answered the request built by next_request without a top-level error."""
        if self.sessionless:
            return
        if self.session_id == 0:                # a full request
            if session_id == 0:
                self.sessionless = True         # no session was created: full requests from now on
                return
            self.session_id, self.epoch, self.sent = session_id, 1, dict(sent)
            return
        self.sent.update(sent)
        for key in forgotten:
            self.sent.pop(key, None)
        self.epoch = self.epoch + 1 if self.epoch < _INT32_MAX else 1

    def reset(self) -> None:
        self.session_id, self.epoch, self.sent, self.sessionless = 0, 0, {}, False


@dataclass
class _TopicMetadata:
    topic_id: uuid.UUID
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)   # partition -> (leader, epoch)


class ReplicaFetcher:
    """Keeps a ``LogManager``'s logs a replica of the cluster's partitions (see the module docstring)."""

    def __init__(self, manager: LogManager, admin: ClusterAdmin, client_config: Mapping[str, Any], *,
                 metadata_max_age_s: float = 2.0, listing_max_age_s: float = 10.0, fetch_max_wait_ms: int = 500,
                 partition_max_bytes: int = 8 << 20, topics: re.Pattern[str] | None = None,
                 start: StartPosition = "earliest") -> None:
        from kafka.net.compat import KafkaNetClient

        quiet_kafka_python()
        self.manager = manager
        self.admin = admin
        self.brokers = admin.brokers
        self.metadata_max_age_s = metadata_max_age_s
        self.listing_max_age_s = max(listing_max_age_s, metadata_max_age_s)
        #: ``--topics``: only topics whose whole name matches are listed and replicated
        self.topic_pattern = topics
        #: ``--from``: where a replica made on first use starts
        self.start_position: StartPosition = start
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.partition_max_bytes = partition_max_bytes
        self._client_config = dict(client_config)
        self._client = KafkaNetClient(**{**self._client_settings(), "client_id": "logfs-replica-fetcher",
                                         **client_config})
        self._states: dict[TopicPartition, PartitionFetchState] = {}
        #: the selected topics of the cluster as the last full metadata poll saw them (replaced whole, read
        #: from any thread): what the namespace lists
        self._cluster: dict[str, _TopicMetadata] = {}
        #: replicas made on first use, for the fetcher thread to start fetching (under _appended)
        self._added: list[TopicPartition] = []
        self._floors: dict[TopicPartition, int] = {}
        self._create_lock = threading.Lock()
        #: the replica ensure_replica is making (its first fetch appends): the fetcher thread leaves it alone
        self._creating: TopicPartition | None = None
        self._refresh_wanted = False
        self._next_listing = 0.0
        #: held topics a metadata response did not show, since when: dropped at the second miss only (a
        #: broker that has not yet seen a topic just created answers UNKNOWN_TOPIC_OR_PARTITION for it)
        self._missing: dict[str, float] = {}
        self._inflight: dict[int, tuple[Any, dict[tuple[uuid.UUID, int], TopicPartition],
                                        dict[tuple[uuid.UUID, int], tuple[int, int, int]],
                                        list[tuple[uuid.UUID, int]]]] = {}
        self._sessions: dict[int, FetchSession] = {}
        #: the client of first fetches (ensure_replica), made on the first: its own connections, as a broker
        #: answers the requests of one connection in order, behind the session's long poll
        self._first_client: Any = None
        self._node_delayed: dict[int, float] = {}
        self._appended = threading.Condition()
        self._sync_wanted = threading.Event()
        self._sync_generation = 0
        self._next_sync = 0.0
        self._unreachable_since: float | None = None
        #: (old leader, new leader) -> partitions, while one metadata response is applied
        self._moved: dict[tuple[int, int], list[TopicPartition]] = {}
        self._stop = threading.Event()
        #: called with a topic's name after its local replica was deleted (the namespace forgets its nodes)
        self.topic_removed: Callable[[str], None] | None = None
        self._thread = threading.Thread(target=self._run, name="logfs-replica-fetcher", daemon=True)

    def _client_settings(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.brokers.split(","),
            "request_timeout_ms": 10_000,
            "reconnect_backoff_ms": 100,
            "reconnect_backoff_max_ms": 1_000,
            "receive_message_max_bytes": 256 << 20,
            **self._client_config,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float) -> None:
        """Bootstrap, bring the local topics in line with the cluster's, then fetch in the background."""
        from kafka.errors import KafkaError

        try:
            self._client._manager.bootstrap(int(timeout_s * 1000))
        except KafkaError as exc:
            # librdkafka's admin client reached the cluster just before (ClusterBackend.start)
            raise LogfsError(f"The replica fetcher (kafka-python) cannot connect to the Kafka cluster at "
                             f"{self.brokers} within {timeout_s:g} s, though the admin client (librdkafka) did "
                             f"with the same settings: {exc}") from None
        self._sync_metadata(full=True)
        self._thread.start()
        self._wait_first_round(min(timeout_s, FIRST_ROUND_MAX_S))

    def _wait_first_round(self, timeout_s: float) -> None:
        """Until every partition's leader answered one fetch: a remounted replica serves the cluster's log
        start and, up to a fetch's ``partition_max_bytes``, its records from the first read, not what the
        replica held when the last mount stopped (bounded: past it, the replica catches up while serving)."""
        deadline = time.monotonic() + timeout_s
        with self._appended:
            while True:
                waiting = [tp for tp, s in list(self._states.items()) if not s.responded]
                if not waiting:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("The local replica serves %d partitions (e.g. %s) before their leaders answered "
                                "a first fetch within %g s: they catch up while the mount serves them",
                                len(waiting), waiting[0], timeout_s)
                    return
                self._appended.wait(min(left, 0.5))

    def stop(self) -> None:
        self._stop.set()
        self._client.wakeup()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._client.close()
        with self._create_lock:
            if self._first_client is not None:
                self._first_client.close()

    # ------------------------------------------------------------------ for the backend

    def selected(self, topic: str) -> bool:
        """Whether ``topic`` is one the mount lists (not internal, its whole name matching ``--topics``)."""
        if topic.startswith("__"):
            return False
        return self.topic_pattern is None or self.topic_pattern.fullmatch(topic) is not None

    def topics(self) -> list[str]:
        """The selected topics of the cluster (cached metadata: no request)."""
        return sorted(self._cluster)

    def partitions(self, topic: str) -> list[int]:
        """The partitions of a selected topic (cached metadata: no request); [] for an unknown topic."""
        meta = self._cluster.get(topic)
        return [] if meta is None else sorted(meta.partitions)

    def ensure_replica(self, tp: TopicPartition, timeout_s: float) -> Log:
        """The local log of ``tp``, made on first use: started where ``--from`` says, fetched at once, and
        returned once its leader answered a first fetch (at most ``FIRST_ROUND_MAX_S``)."""
        target = self.manager.get_log(tp)
        if target is not None:
            return target
        meta = self._cluster.get(tp.topic)
        if meta is None or tp.partition not in meta.partitions:
            raise UnknownTopicOrPartitionError(f"No partition {tp} on the cluster")
        with self._create_lock:
            target = self.manager.get_log(tp)
            if target is None:
                start = self._start_offset(tp)
                self._creating = tp
                try:
                    target = self.manager.get_or_create_log(tp, kafka_topic_id(meta.topic_id))
                    if start > 0:
                        target.truncate_fully_and_start_at(start)
                    log.info("Replicating partition %s from offset %d (--from %s)", tp, start,
                             self.start_position)
                    fetched = self._first_fetch(tp, meta, target, timeout_s)
                    _raise_log_start(target, start, FROM_START)
                finally:
                    with self._appended:
                        self._creating = None
                        self._added.append(tp)
                        self._floors[tp] = start
                self._client.wakeup()
                if fetched:
                    return target
        deadline = time.monotonic() + min(timeout_s, FIRST_ROUND_MAX_S)
        with self._appended:
            while True:
                state = self._states.get(tp)
                if state is not None and state.responded:
                    return target
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("Partition %s: its leader did not answer a first fetch within %g s: serving what "
                                "the local replica holds while it catches up", tp, min(timeout_s, FIRST_ROUND_MAX_S))
                    return target
                self._appended.wait(min(left, 0.5))

    def _first_fetch(self, tp: TopicPartition, meta: _TopicMetadata, target: Log, timeout_s: float) -> bool:
        """One Fetch of a new replica from its leader, at once (sessionless, ``max_wait_ms`` 0), appended
        before the fetcher thread takes the partition into its leader's session; False if the leader did not
        answer with records or nothing-new (the fetcher thread then handles what it says)."""
        from kafka.protocol.consumer import FetchRequest

        leader, epoch = meta.partitions[tp.partition]
        if leader < 0:
            return False
        timeout_ms = int(min(timeout_s, FIRST_ROUND_MAX_S) * 1000)
        fetch_topic = FetchRequest.FetchTopic
        request = FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=64 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[fetch_topic(topic=tp.topic, topic_id=meta.topic_id, partitions=[
                fetch_topic.FetchPartition(partition=tp.partition, current_leader_epoch=epoch,
                                           fetch_offset=target.log_end_offset, last_fetched_epoch=-1,
                                           log_start_offset=-1, partition_max_bytes=self.partition_max_bytes)])],
            forgotten_topics_data=[], rack_id="", min_version=13, max_version=16)
        try:
            if self._first_client is None:
                from kafka.net.compat import KafkaNetClient

                client = KafkaNetClient(**{"client_id": "logfs-replica-first-fetch", **self._client_settings()})
                client._manager.bootstrap(timeout_ms)
                self._first_client = client
            response = self._first_client.send_and_receive(leader, request, timeout_ms=timeout_ms)
            pd = response.responses[0].partitions[0]
            diverging = getattr(pd, "diverging_epoch", None)
            if response.error_code != _NONE or pd.error_code != _NONE or (diverging is not None
                                                                          and diverging.epoch >= 0):
                return False
            if pd.records:
                target.append_as_follower(pd.records)
            if pd.log_start_offset > target.log_start_offset:
                target.maybe_increment_log_start_offset(min(pd.log_start_offset, target.log_end_offset),
                                                        LEADER_LOG_START_OFFSET)
            return True
        except Exception as exc:  # the fetcher thread fetches it anyway: say it, and leave it to it
            log.debug("First fetch of %s from broker %d failed: %s", tp, leader, exc)
            return False

    def _start_offset(self, tp: TopicPartition) -> int:
        """ListOffsets for ``--from``: the leader's log start, its high watermark, or the first offset whose
        timestamp is at or after the time (the high watermark when none is)."""
        deadline = time.monotonic() + FIRST_ROUND_MAX_S
        while True:
            try:
                return self.admin.list_offset(tp, self.start_position)
            except ClusterTimeoutError:
                raise
            except LogfsError:      # a leader being elected (a topic just created): ask again, briefly
                if time.monotonic() >= deadline:
                    raise
                time.sleep(_BACKOFF_S)

    def request_sync(self, timeout_s: float) -> bool:
        """Refresh metadata now (an admin change was made); True once a sync started after this call ended."""
        with self._appended:
            target = self._sync_generation + 2      # a sync running now may have read the old metadata
        self._sync_wanted.set()
        self._client.wakeup()
        deadline = time.monotonic() + timeout_s
        with self._appended:
            while self._sync_generation < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._appended.wait(left)
                if self._sync_generation < target:
                    self._sync_wanted.set()
                    self._client.wakeup()
        return True

    def wait_for_offset(self, tp: TopicPartition, offset: int, timeout_s: float) -> bool:
        """Wait until the local replica of ``tp`` holds ``offset`` (read-your-writes); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._appended:
            while True:
                target = self.manager.get_log(tp)
                if target is not None and target.log_end_offset > offset:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._appended.wait(left)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        from kafka.errors import KafkaError

        last_bug = ""
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if self._sync_wanted.is_set() or now >= self._next_listing:
                    self._sync_wanted.clear()
                    self._sync_metadata(full=True)
                elif self._refresh_wanted or now >= self._next_sync:
                    self._sync_metadata(full=False)
                self._start_added()
                self._send_fetches()
                self._client.poll(timeout_ms=100)
                self._complete_fetches()
            except KafkaError as exc:   # the client's own errors (a broker gone, a connection lost) are state
                if not self._stop.is_set():
                    log.debug("Replica fetcher: %r, retrying after a metadata refresh", exc)
                    self._sync_wanted.set()
                    self._stop.wait(_BACKOFF_S)
            except Exception as exc:  # a bug: the thread must survive it, say it once (not at every retry)
                if not self._stop.is_set():
                    if repr(exc) != last_bug:
                        log.exception("Replica fetcher: unexpected error, retrying: %s", exc)
                        last_bug = repr(exc)
                    else:
                        log.debug("Replica fetcher: the same unexpected error again: %r", exc)
                    self._stop.wait(_BACKOFF_S)

    # ------------------------------------------------------------------ metadata

    def _metadata(self, topics: list[str] | None) -> Any:
        """A MetadataResponse for ``topics`` (None: every topic) from the least loaded broker, or from any other
        one that answers (a broker that died is not the cluster being unreachable), within 10 s in all."""
        from kafka.protocol.metadata import MetadataRequest

        cluster = self._client.cluster
        nodes: list[Any] = []
        for node in ([self._client.least_loaded_node(bootstrap_fallback=True)]
                     + [b.node_id for b in cluster.brokers()] + [b.node_id for b in cluster.bootstrap_brokers()]):
            if node is not None and node not in nodes:
                nodes.append(node)
        if not nodes:
            raise LogfsError("no broker to ask for metadata")
        wanted = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t, topic_id=None)
                                              for t in topics]
        deadline = time.monotonic() + 10.0
        failure: Exception | None = None
        for node in nodes:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            try:
                return self._client.send_and_receive(
                    node, MetadataRequest(topics=wanted, allow_auto_topic_creation=False, max_version=12),
                    timeout_ms=left_ms)
            except Exception as exc:    # this broker is down: ask the next one
                failure = exc
        raise failure if failure is not None else LogfsError("no broker answered a metadata request in time")

    def _sync_metadata(self, *, full: bool) -> None:
        """The cached listing (full) or the held topics' metadata (not full), and the fetch states to match."""
        now = time.monotonic()
        self._next_sync = now + self.metadata_max_age_s
        self._refresh_wanted = False
        local = self.manager.topics()
        held = [topic for topic in local if self.selected(topic)]
        if full:
            self._next_listing = now + self.listing_max_age_s
        elif not held:
            self._bump_generation()
            return
        try:
            md = self._metadata(None if full else held)
        except Exception as exc:
            self._unreachable(exc)
            self._bump_generation()
            return
        self.admin.reachable = True
        self._client.cluster.update_metadata(md)    # the brokers the fetches go to, as this metadata names them
        if self._unreachable_since is not None:
            log.info("The Kafka cluster at %s answers again after %.1f s", self.brokers,
                     time.monotonic() - self._unreachable_since)
            self._unreachable_since = None
        fresh: dict[str, _TopicMetadata] = {}
        present: set[str] = set()
        uncertain: set[str] = set()
        for t in md.topics:
            if t.is_internal or t.name.startswith("__"):
                continue
            if t.error_code == _UNKNOWN_TOPIC_OR_PARTITION:
                continue                                    # not there: gone
            present.add(t.name)
            if t.error_code != _NONE or not t.partitions:
                uncertain.add(t.name)
                continue
            meta = _TopicMetadata(t.topic_id)
            for p in t.partitions:
                meta.partitions[p.partition_index] = (p.leader_id, p.leader_epoch)
            if self.selected(t.name):
                fresh[t.name] = meta
        gone: list[str] = []
        for topic in local if full else held:
            if topic in present:
                self._missing.pop(topic, None)
            elif topic in self._missing:
                gone.append(topic)
            else:
                self._missing[topic] = now
                uncertain.add(topic)        # kept as it was until the next poll says it again
        known = self._cluster
        if full:
            cluster = {name: known[name] for name in uncertain if name in known}
        else:
            cluster = {name: meta for name, meta in known.items() if name not in held or name in uncertain}
        cluster.update(fresh)
        self._cluster = cluster
        if self.topic_removed is not None:
            for name in known.keys() - cluster.keys():
                if name not in local:       # (a replica dropped below says it itself)
                    self.topic_removed(name)        # gone from the listing: the kernel forgets its entry
        for topic in gone:
            self._missing.pop(topic, None)
            self._drop_topic(topic, "it no longer exists on the cluster")
        self._moved = {}
        for topic in held:
            if topic in fresh:
                try:
                    self._ensure_topic(topic, fresh[topic])
                except LogfsError as exc:
                    log.error("Cannot replicate topic %s locally: %s", topic, exc)
        self._log_leader_changes()
        self._bump_generation()

    def _log_leader_changes(self) -> None:
        """One line for the leader changes one metadata response showed, however many partitions moved."""
        if not self._moved:
            return
        moves = []
        for (was, now), tps in sorted(self._moved.items(), key=lambda item: -len(item[1])):
            example = ", ".join(map(str, tps[:3])) + (", ..." if len(tps) > 3 else "")
            moves.append(f"{len(tps)} from {_broker(was)} to {_broker(now)} ({example})")
        log.info("Partition leaders moved: %s", "; ".join(moves))
        self._moved = {}

    def _bump_generation(self) -> None:
        with self._appended:
            self._sync_generation += 1
            self._appended.notify_all()

    def _unreachable(self, exc: Exception) -> None:
        self.admin.reachable = False
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            log.warning("The Kafka cluster at %s cannot be reached (%s): serving the local replica, "
                        "writes fail until it answers", self.brokers, exc)

    def _local_topic_id(self, topic: str) -> str | None:
        for partition in self.manager.partitions(topic):
            target = self.manager.get_log(TopicPartition(topic, partition))
            if target is not None:
                return read_topic_id(target.dir)
        return None

    def _ensure_topic(self, name: str, meta: _TopicMetadata) -> None:
        """The fetch states of the partitions of ``name`` held locally, at their current leaders."""
        topic_id = kafka_topic_id(meta.topic_id)
        if not self.selected(name):
            return          # a replica a mount with other --topics left: kept, neither listed nor fetched
        local = self.manager.partitions(name)
        if local and self._local_topic_id(name) != topic_id:
            self._drop_topic(name, f"the cluster's topic of this name has a new topic ID {topic_id} "
                                   "(deleted and recreated)")
            return
        for partition in local:
            tp = TopicPartition(name, partition)
            if partition not in meta.partitions or tp == self._creating:
                continue            # (being made: _start_added takes it once its first fetch is in)
            leader, epoch = meta.partitions[partition]
            target = self.manager.get_log(tp)
            if target is None:
                continue
            state = self._states.get(tp)
            if state is None or state.log is not target:
                self._states[tp] = PartitionFetchState(target, meta.topic_id, leader, epoch)
            elif (state.leader, state.leader_epoch) != (leader, epoch):
                if leader != state.leader:
                    self._moved.setdefault((state.leader, leader), []).append(tp)
                state.leader, state.leader_epoch, state.delayed_until = leader, epoch, 0.0

    def _start_added(self) -> None:
        """Fetch states for the replicas made on first use since the last round."""
        with self._appended:
            added, self._added = self._added, []
            floors, self._floors = self._floors, {}
        for tp in added:
            meta = self._cluster.get(tp.topic)
            target = self.manager.get_log(tp)
            if meta is None or target is None or tp.partition not in meta.partitions:
                continue
            state = self._states.get(tp)
            if state is None or state.log is not target:
                leader, epoch = meta.partitions[tp.partition]
                state = self._states[tp] = PartitionFetchState(target, meta.topic_id, leader, epoch)
            state.start_floor = floors.get(tp, -1)

    def _drop_topic(self, topic: str, why: str) -> None:
        log.info("Deleting the local replica of topic %s: %s", topic, why)
        for tp in [tp for tp in self._states if tp.topic == topic]:
            del self._states[tp]
        try:
            self.manager.delete_topic(topic)
        except LogfsError as exc:
            log.error("Could not delete the local replica of topic %s: %s", topic, exc)
        if self.topic_removed is not None:
            self.topic_removed(topic)
        with self._appended:
            self._appended.notify_all()

    # ------------------------------------------------------------------ fetching

    def _send_fetches(self) -> None:
        from kafka.errors import KafkaError
        from kafka.protocol.consumer import FetchRequest

        now = time.monotonic()
        by_leader: dict[int, list[tuple[TopicPartition, PartitionFetchState]]] = {}
        for tp, state in self._states.items():
            if state.leader < 0 or state.delayed_until > now:
                continue
            if self._node_delayed.get(state.leader, 0.0) > now:
                continue
            if state.leader in self._inflight:
                continue
            by_leader.setdefault(state.leader, []).append((tp, state))
        fetch_topic = FetchRequest.FetchTopic
        fetch_partition = fetch_topic.FetchPartition
        forgotten_topic = FetchRequest.ForgottenTopic
        for leader, parts in by_leader.items():
            session = self._sessions.setdefault(leader, FetchSession())
            wanted: dict[tuple[uuid.UUID, int], tuple[TopicPartition, tuple[int, int, int]]] = {}
            for tp, state in parts:
                wanted[(state.topic_id, tp.partition)] = (
                    tp, (state.log.log_end_offset, state.last_fetched_epoch(), state.leader_epoch))
            session_id, epoch, send, forget = session.next_request(wanted)
            topics: dict[uuid.UUID, tuple[str, list]] = {}
            for key in send:
                tp, (offset, last_epoch, leader_epoch) = wanted[key]
                topics.setdefault(key[0], (tp.topic, []))[1].append(fetch_partition(
                    partition=tp.partition, current_leader_epoch=leader_epoch, fetch_offset=offset,
                    last_fetched_epoch=last_epoch, log_start_offset=-1, partition_max_bytes=self.partition_max_bytes))
            forgotten: dict[uuid.UUID, list[int]] = {}
            for topic_id, partition in forget:
                forgotten.setdefault(topic_id, []).append(partition)
            request = FetchRequest(
                replica_id=-1, max_wait_ms=self.fetch_max_wait_ms, min_bytes=1, max_bytes=64 << 20,
                isolation_level=0, session_id=session_id, session_epoch=epoch,
                topics=[fetch_topic(topic=name, topic_id=tid, partitions=ps) for tid, (name, ps) in topics.items()],
                forgotten_topics_data=[forgotten_topic(topic_id=tid, partitions=ps) for tid, ps in forgotten.items()],
                rack_id="", min_version=13, max_version=16)
            try:
                future = self._client.send(leader, request)
            except KafkaError as exc:   # UnknownBrokerIdError, NodeNotReadyError...: the leader is state, not a bug
                session.reset()
                self._node_failed(leader, exc)
                continue
            keys = {key: tp for key, (tp, _) in wanted.items()}
            self._inflight[leader] = (future, keys, {key: wanted[key][1] for key in send}, forget)

    def _complete_fetches(self) -> None:
        for leader, (future, keys, sent, forgotten) in list(self._inflight.items()):
            if not future.is_done:
                continue
            del self._inflight[leader]
            session = self._sessions.setdefault(leader, FetchSession())
            if future.failed():
                session.reset()
                self._node_failed(leader, future.exception)
                continue
            self._node_delayed.pop(leader, None)
            response = future.value
            error = getattr(response, "error_code", _NONE)
            if error != _NONE:
                session.reset()
                if error in _FETCH_SESSION_ERRORS:      # evicted from the broker's cache: a full fetch next
                    log.debug("Fetch session %d with broker %d: error code %d, starting a new one",
                              session.session_id, leader, error)
                else:
                    self._node_failed(leader, f"fetch error code {error}")
                continue
            was = session.session_id
            session.acknowledged(getattr(response, "session_id", 0), sent, forgotten)
            if session.session_id != was:
                log.debug("Fetch session %d with broker %d for %d partitions", session.session_id, leader, len(sent))
            for topic in response.responses:
                for pd in topic.partitions:
                    tp = keys.get((topic.topic_id, pd.partition_index))
                    if tp is not None:
                        self._partition_data(tp, topic.topic_id, pd)

    def _node_failed(self, node: int, why: object) -> None:
        log.debug("Fetch from broker %d failed: %s", node, why)
        self._node_delayed[node] = time.monotonic() + _BACKOFF_S
        self._refresh_wanted = True

    def _partition_data(self, tp: TopicPartition, topic_id: uuid.UUID, pd: Any) -> None:
        state = self._states.get(tp)
        if state is None or state.topic_id != topic_id or self.manager.get_log(tp) is not state.log:
            return      # dropped or recreated while the fetch was in flight
        error = pd.error_code
        diverging = getattr(pd, "diverging_epoch", None)
        if error == _NONE and diverging is not None and diverging.epoch >= 0:
            self._diverged(tp, state, diverging.epoch, diverging.end_offset)
        elif error == _NONE:
            state.last_error = _NONE
            self._append(tp, state, pd)
        elif error == _OFFSET_OUT_OF_RANGE:
            self._out_of_range(tp, state)
        else:
            if error not in _RETRIABLE_METADATA and state.last_error != error:
                log.warning("Fetch of %s failed with Kafka error code %d; retrying", tp, error)
            state.last_error = error
            state.delayed_until = time.monotonic() + _BACKOFF_S
            self._refresh_wanted = True

    def _append(self, tp: TopicPartition, state: PartitionFetchState, pd: Any) -> None:
        target = state.log
        records = pd.records
        try:
            if records:
                target.append_as_follower(records)
                last = deque(iter_batches(records, lenient=True), maxlen=1)
                if last:
                    state.last_epoch = last[0][1].partition_leader_epoch
            leader_start = pd.log_start_offset
            if leader_start > target.log_start_offset:
                target.maybe_increment_log_start_offset(min(leader_start, target.log_end_offset),
                                                        LEADER_LOG_START_OFFSET)
            _raise_log_start(target, state.start_floor, FROM_START)
        except LogfsError as exc:
            log.error("Partition %s: could not append what the leader returned at offset %d: %s", tp,
                      target.log_end_offset, exc)
            state.delayed_until = time.monotonic() + 1.0
            records = None          # the mount's start need not wait for it: it serves what it has
        else:
            state.high_watermark = pd.high_watermark
        if records or not state.responded:
            with self._appended:
                state.responded = True
                self._appended.notify_all()

    def _truncate(self, tp: TopicPartition, state: PartitionFetchState, offset: int) -> None:
        state.log.truncate_to(offset)
        state.last_epoch = None
        with self._appended:
            self._appended.notify_all()

    def _diverged(self, tp: TopicPartition, state: PartitionFetchState, epoch: int, end_offset: int) -> None:
        """Kafka's ``getOffsetTruncationState``: truncate to where the leader's and the replica's epochs agree."""
        target = state.log
        local = target.end_offset_for_epoch(epoch)
        if local is None:
            offset = end_offset
        else:
            local_epoch, local_end = local
            # an epoch the replica does not hold: to the end of its largest lower one, and ask again
            offset = min(end_offset, local_end) if local_epoch == epoch else local_end
        offset = min(offset, target.log_end_offset)
        log.warning("Partition %s: the local replica diverges from the leader after leader epoch %d, which ends at "
                    "offset %d on the leader: truncating the local replica from %d to %d", tp, epoch, end_offset,
                    target.log_end_offset, offset)
        try:
            self._truncate(tp, state, offset)
        except LogfsError as exc:
            log.error("Partition %s: could not truncate the local replica to %d: %s", tp, offset, exc)
            state.delayed_until = time.monotonic() + 1.0

    def _out_of_range(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        """Kafka's ``handleOutOfRangeError``: follow the leader's log start, or its end."""
        target = state.log
        try:
            start, end = self.admin.list_offsets(tp)
        except LogfsError as exc:
            log.warning("Partition %s: fetch offset %d out of range and the leader's offsets unknown: %s",
                        tp, target.log_end_offset, exc)
            state.delayed_until = time.monotonic() + 1.0
            return
        local_end = target.log_end_offset
        if local_end > end:
            log.warning("Partition %s: the local replica ends at %d, beyond the leader's high watermark %d "
                        "(an unclean leader election): truncating to it", tp, local_end, end)
            self._truncate(tp, state, end)
        elif local_end < start:
            log.info("Partition %s: the leader's log starts at %d, after the local log end %d (retention or "
                     "DeleteRecords on the cluster): starting the local log there", tp, start, local_end)
            target.truncate_fully_and_start_at(start)
            state.last_epoch = None
        else:
            # inside the leader's log: the leader does not know the last local batch's epoch
            local = target.end_offset_for_epoch(state.leader_epoch)
            agreed = local[1] if local is not None else (start if target.latest_epoch() > state.leader_epoch
                                                         else local_end)
            if agreed < local_end:
                log.warning("Partition %s: the local replica holds leader epochs the leader (epoch %d) never had, "
                            "from offset %d: truncating the local replica from %d to %d", tp, state.leader_epoch,
                            agreed, local_end, agreed)
                self._truncate(tp, state, agreed)
            else:
                state.delayed_until = time.monotonic() + _BACKOFF_S
        with self._appended:
            self._appended.notify_all()


def _broker(node: int) -> str:
    return "no leader" if node < 0 else f"broker {node}"


def _raise_log_start(target: Log, offset: int, reason: str) -> None:
    """The log start moved up to ``offset`` (at most the log end) if it is below."""
    if offset > target.log_start_offset and target.log_end_offset > target.log_start_offset:
        target.maybe_increment_log_start_offset(min(offset, target.log_end_offset), reason)


def kafka_topic_id(topic_id: uuid.UUID) -> str:
    """A topic ID as Kafka writes it (``Uuid.toString``: base64 url-safe without padding)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode("ascii")
