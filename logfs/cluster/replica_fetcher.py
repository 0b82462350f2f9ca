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
  ``--from`` says (ListOffsets earliest, latest or by timestamp, asked of the
  leader the fetcher's own metadata names, with its leader epoch) and its
  directory carries the topic ID in Kafka's ``partition.metadata``.
* **complete reads**: a read waits (:meth:`ReplicaFetcher.catch_up`) until
  the replica holds the leader's high watermark as of its open (ListOffsets
  latest for a new replica, else the leader's last fetch response), while the
  replica gains records; ETIMEDOUT when it stops gaining them.  Replicas are
  made without waiting, so many made one after another (a shell glob's
  lookups) are fetched together.
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
  cluster's log start and its new records from the first read.
* **log start**: the leader's log start offset in each response (retention,
  DeleteRecords on the cluster) moves the local log start up; a fetch offset
  below it (OFFSET_OUT_OF_RANGE) truncates the local log fully and starts it
  at the leader's log start (Kafka's ``truncateFullyAndStartAt``); beyond the
  leader's end (an unclean leader election) truncates to it.
* **leader changes**: NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH,
  UNKNOWN_TOPIC_ID, a broken connection: the partition backs off briefly
  (``_BACKOFF_S``), the held topics' metadata is refreshed at once and the
  fetch goes to the leader it names.

Kafka's raw wire format is kafka-python's (``kafka.protocol`` request classes,
its connection manager); the records stay bytes from socket to segment.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import LogfsError, UnknownTopicOrPartitionError
from engine.log import LEADER_LOG_START_OFFSET
from engine.partition_metadata import read_topic_id
from engine.records.framing import iter_batches
from engine.topic import TopicPartition
from logfs.cluster import kafka_python_tuning
from logfs.cluster.admin import UNREACHABLE_WAIT_S
from logfs.cluster.errors import ClusterTimeoutError, quiet_kafka_python

if TYPE_CHECKING:  # pragma: no cover
    import re
    from collections.abc import Callable, Mapping

    from engine.log import Log
    from engine.manager import LogManager
    from logfs.cluster.admin import ClusterAdmin

log = logging.getLogger(__name__)

__all__ = ["ReplicaFetcher", "StartPosition"]

#: where a new replica starts (``--from``): "earliest", "latest" or a timestamp in epoch milliseconds
StartPosition = str | int

#: the reason logged when the local log start is where --from started the replica
FROM_START = "the start chosen by --from"

# Kafka error codes the fetcher acts on
_NONE = 0
_OFFSET_OUT_OF_RANGE = 1
_UNKNOWN_TOPIC_OR_PARTITION = 3
_RETRIABLE_METADATA = {3, 5, 6, 56, 74, 75, 100}   # unknown topic/partition, leader not available, not leader,
#                                                    storage error, fenced/unknown leader epoch, unknown topic id

#: ListOffsets' timestamps of the log start and of the high watermark
_EARLIEST, _LATEST = -2, -1

_FETCH_SESSION_ERRORS = {70, 71}   # FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH
_INT32_MAX = 0x7FFFFFFF
_BACKOFF_S = 0.2
#: the most the mount's start waits for the first fetch of every partition (see ReplicaFetcher.start)
FIRST_ROUND_MAX_S = 10.0


class _LeaderError(Exception):
    """A leader's ListOffsets answer was an error, or did not come: refresh the metadata and ask again."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code


def _spec(position: StartPosition) -> int:
    """ListOffsets' timestamp for ``--from``."""
    return _EARLIEST if position == "earliest" else _LATEST if position == "latest" else int(position)


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


#: a partition as a fetch session names it: (topic ID, partition)
_PartitionKey = tuple[uuid.UUID, int]
#: what a fetch request says of a partition: (fetch offset, last fetched epoch, current leader epoch)
_FetchPosition = tuple[int, int, int]


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
        self.sent: dict[_PartitionKey, _FetchPosition] = {}
        self.sessionless = False

    def next_request(self, wanted: Mapping[_PartitionKey, tuple[TopicPartition, _FetchPosition]]
                     ) -> tuple[int, int, list[_PartitionKey], list[_PartitionKey]]:
        """(session id, epoch, partitions to send, partitions to forget) of the next request."""
        if self.sessionless:
            return 0, -1, list(wanted), []
        if self.session_id == 0:
            return 0, 0, list(wanted), []
        send = [key for key, (_, position) in wanted.items() if self.sent.get(key) != position]
        forget = [key for key in self.sent if key not in wanted]
        return self.session_id, self.epoch, send, forget

    def acknowledged(self, session_id: int, sent: Mapping[_PartitionKey, _FetchPosition],
                     forgotten: list[_PartitionKey]) -> None:
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


@dataclass(frozen=True)
class FetcherSettings:
    """The fetcher's settings: fixed at construction, so read by every thread without a lock."""

    #: the bootstrap servers (what error messages name)
    brokers: str
    #: how often the held topics' metadata is polled
    metadata_max_age_s: float
    #: how often the full listing is polled (at least ``metadata_max_age_s``)
    listing_max_age_s: float
    #: ``--topics``: only topics whose whole name matches are listed and replicated
    topic_pattern: re.Pattern[str] | None
    #: ``--from``: where a replica made on first use starts
    start_position: StartPosition
    fetch_max_wait_ms: int
    partition_max_bytes: int
    #: the mount's kafka-python settings, over the fetcher's defaults
    client_config: Mapping[str, Any]


@dataclass
class _InflightFetch:
    """One Fetch request sent to a leader and not yet completed (at most one per leader)."""

    #: kafka-python's future of the FetchResponse
    future: Any
    #: every partition the session fetches from this leader, by the key the response names it with
    keys: dict[_PartitionKey, TopicPartition]
    #: the positions this request sent (``FetchSession.acknowledged`` records them once it is answered)
    sent: dict[_PartitionKey, _FetchPosition]
    #: the partitions this request told the session to forget
    forgotten: list[_PartitionKey]


@dataclass
class _FetchLoop:
    """The fetcher thread's own state: fetch sessions, requests in flight, back-offs and metadata timers.

    Owner: the fetcher thread (and ``ReplicaFetcher.start``, before it starts the thread).  No other thread
    reads or writes it, so it has no lock.
    """

    #: leader -> its incremental fetch session
    sessions: dict[int, FetchSession] = field(default_factory=dict)
    #: leader -> the fetch request sent to it and not yet completed
    inflight: dict[int, _InflightFetch] = field(default_factory=dict)
    #: broker -> until when (monotonic) fetches from it back off after a failure
    node_delayed: dict[int, float] = field(default_factory=dict)
    #: when (monotonic) the next full listing is due
    next_listing: float = 0.0
    #: when (monotonic) the next poll of the held topics' metadata is due
    next_sync: float = 0.0
    #: a fetch failed: poll the held topics' metadata at the next round
    refresh_wanted: bool = False
    #: held topics a metadata response did not show, since when: dropped at the second miss only (a broker that
    #: has not yet seen a topic just created answers UNKNOWN_TOPIC_OR_PARTITION for it)
    missing: dict[str, float] = field(default_factory=dict)
    #: (old leader, new leader) -> partitions, while one metadata response is applied
    moved: dict[tuple[int, int], list[TopicPartition]] = field(default_factory=dict)
    #: since when (monotonic) the cluster has not answered a metadata request; None while it answers
    unreachable_since: float | None = None


@dataclass
class _Replicas:
    """What the fetcher thread publishes: the cluster's listing and the fetch state of each local replica.

    Owner: the fetcher thread, the only writer (and ``ReplicaFetcher.start`` before it starts the thread).
    Other threads read without a lock, one reference at a time: ``cluster`` is replaced whole, never changed
    in place; ``states`` is read by key (or copied whole), and a state's ``high_watermark`` and ``responded``
    are single values.  A thread that waits for a change waits on ``_Handoff.changed``, which the fetcher
    thread notifies after it.
    """

    #: the selected topics of the cluster as the last full metadata poll saw them: what the namespace lists
    cluster: dict[str, _TopicMetadata] = field(default_factory=dict)
    #: the fetch state of each local replica the fetcher fetches
    states: dict[TopicPartition, PartitionFetchState] = field(default_factory=dict)
    #: the last metadata response, which the side client applies (its brokers: see ``_SideClient.client``)
    last_metadata: Any = None


@dataclass
class _Handoff:
    """What request threads hand the fetcher thread, and the progress they wait for.

    Lock: ``changed``; every field is read and written under it, by request threads and the fetcher thread.
    The fetcher thread notifies it after every append, truncation and dropped topic, when a partition's leader
    first answered, and at the end of each metadata sync (``sync_generation``): a waiter re-checks what it
    waits for at each wake-up.
    """

    changed: threading.Condition = field(default_factory=threading.Condition)
    #: replicas made on first use, for the fetcher thread to start fetching
    added: list[TopicPartition] = field(default_factory=list)
    #: (where --from started it, the leader's high watermark then) of each replica made on first use, until
    #: the fetcher thread takes it
    pending: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)
    #: the replica ``ensure_replica`` is making (its first fetch appends): the fetcher thread leaves it alone
    creating: TopicPartition | None = None
    #: topics this mount created (mkdir), since when: for ``listing_max_age_s`` after they were first listed,
    #: a listing without them (a broker that has not yet applied the CreateTopics) keeps them
    created: dict[str, float] = field(default_factory=dict)
    #: a full metadata sync is wanted at the fetcher thread's next round (``request_sync``, a client error)
    sync_wanted: bool = False
    #: the metadata syncs ended (answered or not) since the start
    sync_generation: int = 0

    def want_sync(self) -> None:
        with self.changed:
            self.sync_wanted = True

    def take_sync_wanted(self) -> bool:
        """Whether a full sync was wanted, the wish cleared."""
        with self.changed:
            wanted, self.sync_wanted = self.sync_wanted, False
            return wanted

    def notify(self) -> None:
        with self.changed:
            self.changed.notify_all()


@dataclass
class _SideClient:
    """The client of requests made outside the fetch sessions (ListOffsets): its own connections, as a broker
    answers the requests of one connection in order, behind a long poll.

    Lock: ``lock``; the thread holding it owns ``client`` (made on first use) and ``metadata``.  A thread
    waits for it at most as long as its ListOffsets may take (``ReplicaFetcher._list_offsets_at``), and the
    fetcher thread hands its metadata over through ``_Replicas.last_metadata`` without taking it.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    client: Any = None
    #: the metadata response last applied to ``client``
    metadata: Any = None

    def get(self, settings: dict[str, Any], latest_metadata: Any) -> Any:
        """The client, made on first use, knowing the brokers of ``latest_metadata`` (under ``lock``)."""
        if self.client is None:
            from kafka.net.compat import KafkaNetClient

            client = KafkaNetClient(**{"client_id": "logfs-replica-offsets", **settings})
            client._manager.bootstrap(10_000)
            self.client = client
        md = latest_metadata
        if md is not None and md is not self.metadata:    # brokers that came back since its bootstrap
            self.client.cluster.update_metadata(md)
            self.metadata = md
        return self.client

    def close(self) -> None:
        with self.lock:
            if self.client is not None:
                self.client.close()


class ReplicaFetcher:
    """Keeps a ``LogManager``'s logs a replica of the cluster's partitions (see the module docstring).

    Its state is cut by who may touch it, each part with its own rule (see each class):

    * ``settings`` (:class:`FetcherSettings`): fixed at construction, read by every thread;
    * ``_loop`` (:class:`_FetchLoop`): the fetcher thread's own, no lock;
    * ``_replicas`` (:class:`_Replicas`): written by the fetcher thread only, read by any thread without a lock;
    * ``_handoff`` (:class:`_Handoff`): between request threads and the fetcher thread, under its condition;
    * ``_side`` (:class:`_SideClient`): the ListOffsets client, under its lock.

    ``_create_lock`` serialises the making of replicas (:meth:`_make_replica`) and guards no field;
    ``_stop`` ends the thread.  The fetch client ``_client`` is the fetcher thread's (``start`` bootstraps it
    before the thread runs), but for ``wakeup``, which any thread calls.
    """

    # Any: kafka-python's settings
    def __init__(self, manager: LogManager, admin: ClusterAdmin, client_config: Mapping[str, Any], *,
                 metadata_max_age_s: float = 2.0, listing_max_age_s: float = 10.0, fetch_max_wait_ms: int = 500,
                 partition_max_bytes: int = 8 << 20, topics: re.Pattern[str] | None = None,
                 start: StartPosition = "earliest") -> None:
        from kafka.net.compat import KafkaNetClient

        quiet_kafka_python()
        kafka_python_tuning.install()
        self.manager = manager
        self.admin = admin
        self.settings = FetcherSettings(
            brokers=admin.brokers, metadata_max_age_s=metadata_max_age_s,
            listing_max_age_s=max(listing_max_age_s, metadata_max_age_s), topic_pattern=topics,
            start_position=start, fetch_max_wait_ms=fetch_max_wait_ms, partition_max_bytes=partition_max_bytes,
            client_config=dict(client_config))
        self._client = KafkaNetClient(**{**self._client_settings(), "client_id": "logfs-replica-fetcher",
                                         **client_config})
        self._loop = _FetchLoop()
        self._replicas = _Replicas()
        self._handoff = _Handoff()
        self._side = _SideClient()
        self._create_lock = threading.Lock()
        self._stop = threading.Event()
        #: called with a topic's name after its local replica was deleted (the namespace forgets its nodes)
        self.topic_removed: Callable[[str], None] | None = None
        self._thread = threading.Thread(target=self._run, name="logfs-replica-fetcher", daemon=True)

    def _client_settings(self) -> dict[str, Any]:     # Any: kafka-python's settings
        return {
            "bootstrap_servers": self.settings.brokers.split(","),
            "request_timeout_ms": 10_000,
            "reconnect_backoff_ms": 100,
            "reconnect_backoff_max_ms": 1_000,
            "receive_message_max_bytes": 256 << 20,
            **self.settings.client_config,
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
                             f"{self.settings.brokers} within {timeout_s:g} s, though the admin client (librdkafka) "
                             f"did with the same settings: {exc}") from None
        self._sync_metadata(full=True)
        self._thread.start()
        self._wait_first_round(min(timeout_s, FIRST_ROUND_MAX_S))

    def _wait_first_round(self, timeout_s: float) -> None:
        """Until every partition's leader answered one fetch: a remounted replica serves the cluster's log
        start and, up to a fetch's ``partition_max_bytes``, its records from the first read, not what the
        replica held when the last mount stopped (bounded: past it, the replica catches up while serving)."""
        deadline = time.monotonic() + timeout_s
        with self._handoff.changed:
            while True:
                waiting = [tp for tp, s in list(self._replicas.states.items()) if not s.responded]
                if not waiting:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("The local replica serves %d partitions (e.g. %s) before their leaders answered "
                                "a first fetch within %g s: they catch up while the mount serves them",
                                len(waiting), waiting[0], timeout_s)
                    return
                self._handoff.changed.wait(min(left, 0.5))

    def stop(self) -> None:
        self._stop.set()
        self._client.wakeup()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._client.close()
        self._side.close()

    # ------------------------------------------------------------------ for the backend

    def selected(self, topic: str) -> bool:
        """Whether ``topic`` is one the mount lists (not internal, its whole name matching ``--topics``)."""
        if topic.startswith("__"):
            return False
        return self.settings.topic_pattern is None or self.settings.topic_pattern.fullmatch(topic) is not None

    def topics(self) -> list[str]:
        """The selected topics of the cluster (cached metadata: no request)."""
        return sorted(self._replicas.cluster)

    def created(self, topic: str) -> None:
        """The mount created ``topic``: the listings of the next ``listing_max_age_s`` keep it even when a broker
        that has not applied the CreateTopics yet answers without it (its first write must not be ENOENT)."""
        with self._handoff.changed:
            self._handoff.created[topic] = time.monotonic()

    def deleted(self, topic: str) -> None:
        """The mount is deleting ``topic``: the next listing without it drops it at once."""
        with self._handoff.changed:
            self._handoff.created.pop(topic, None)

    def partitions(self, topic: str) -> list[int]:
        """The partitions of a selected topic (cached metadata: no request); [] for an unknown topic."""
        meta = self._replicas.cluster.get(topic)
        return [] if meta is None else sorted(meta.partitions)

    def ensure_replica(self, tp: TopicPartition, timeout_s: float, *, catch_up: bool = True) -> Log:
        """The local log of ``tp``, made on first use: started where ``--from`` says and handed to the fetcher
        thread; with ``catch_up``, returned once it holds the leader's high watermark (see :meth:`catch_up`)."""
        target = self.manager.get_log(tp)
        if target is None:
            target = self._make_replica(tp, timeout_s)
        if catch_up:
            self.catch_up(tp, timeout_s)
        return target

    def _make_replica(self, tp: TopicPartition, timeout_s: float) -> Log:
        """A new local log of ``tp`` at the offset ``--from`` names, with the leader's high watermark then as
        what its first read waits for (one ListOffsets round trip; fetched by the fetcher thread)."""
        meta = self._replicas.cluster.get(tp.topic)
        if meta is None or tp.partition not in meta.partitions:
            raise UnknownTopicOrPartitionError(f"No partition {tp} on the cluster")
        with self._create_lock:
            target = self.manager.get_log(tp)
            if target is not None:
                return target
            start, high_watermark = self.list_offsets(tp, [_spec(self.settings.start_position), _LATEST], timeout_s)
            if start < 0:       # no record at or after --from's time: the end
                start = high_watermark
            meta = self._replicas.cluster.get(tp.topic) or meta
            with self._handoff.changed:
                self._handoff.creating = tp
            try:
                target = self.manager.get_or_create_log(tp, kafka_topic_id(meta.topic_id), durable=False)
                if start > 0:
                    target.truncate_fully_and_start_at(start)
                log.info("Replicating partition %s from offset %d (--from %s)", tp, start, self.settings.start_position)
            finally:
                with self._handoff.changed:
                    self._handoff.creating = None
                    if target is not None:
                        self._handoff.added.append(tp)
                        self._handoff.pending[tp] = (start, high_watermark)
            self._client.wakeup()
            return target

    def behind(self, tp: TopicPartition) -> bool:
        """Whether a read of ``tp`` must wait first (:meth:`ensure_replica`): it has no local replica yet, or
        its replica does not hold the leader's last known high watermark (unknown until its leader answered,
        but for a cluster known to be unreachable: then the replica serves what it holds).  No request."""
        target = self.manager.get_log(tp)
        if target is None:
            return True
        if tp.topic not in self._replicas.cluster:
            return False        # not listed (--topics, or gone): nothing to wait for
        state = self._replicas.states.get(tp)
        if state is None or state.log is not target:
            with self._handoff.changed:
                pending = self._handoff.pending.get(tp)
            return pending is None or target.log_end_offset < pending[1]
        if state.high_watermark < 0:
            return self.admin.reachable
        return target.log_end_offset < state.high_watermark

    def catch_up(self, tp: TopicPartition, timeout_s: float) -> None:
        """Wait until the local replica of ``tp`` holds the leader's high watermark as of now: the one
        ListOffsets gave when the replica was made, else the one of the leader's last fetch response (or of
        its first, for a replica kept from an earlier mount).  A read opened after this returns at least every
        record committed before it.

        Waits as long as the replica gains records; ETIMEDOUT when it gains none for ``timeout_s``, or
        for ``UNREACHABLE_WAIT_S`` while the cluster is known to be unreachable (a replica whose leader never
        answered then serves what it holds, as every replica does in an outage); ENOENT when the topic is
        deleted meanwhile."""
        bound = timeout_s
        since = time.monotonic()
        gained = -1
        with self._handoff.changed:
            while True:
                target = self.manager.get_log(tp)
                if target is None:
                    raise UnknownTopicOrPartitionError(f"Partition {tp} was deleted on the cluster")
                state = self._replicas.states.get(tp)
                if state is not None and state.log is target and state.high_watermark >= 0:
                    high_watermark = state.high_watermark
                else:
                    pending = self._handoff.pending.get(tp)
                    high_watermark = pending[1] if pending is not None and state is None else -1
                end = target.log_end_offset
                if high_watermark >= 0 and end >= high_watermark:
                    return
                if tp.topic not in self._replicas.cluster:
                    return
                reachable = self.admin.reachable
                if high_watermark < 0 and not reachable:
                    return
                now = time.monotonic()
                if end != gained:
                    gained, since = end, now
                waited = now - since
                limit = bound if reachable else min(bound, UNREACHABLE_WAIT_S)
                if waited >= limit:
                    held = f"offsets {target.log_start_offset}..{end - 1}" if end > target.log_start_offset \
                        else "no records"
                    want = f"its high watermark {high_watermark}" if high_watermark >= 0 else \
                        "an answer from its leader"
                    raise ClusterTimeoutError(
                        f"Partition {tp}: the local replica holds {held} and fetched nothing more for {waited:.1f} s "
                        f"toward {want}{'' if reachable else ' (the cluster cannot be reached)'}: a read now would "
                        f"miss committed records (bootstrap servers {self.settings.brokers})")
                self._handoff.changed.wait(min(limit - waited, 0.5))

    def list_offsets(self, tp: TopicPartition, timestamps: list[int], timeout_s: float) -> list[int]:
        """ListOffsets of ``tp`` at its leader, one offset per timestamp (``_EARLIEST``, ``_LATEST`` or epoch
        ms; -1 where no record is at or after the time), with the leader and leader epoch of the fetcher's own
        metadata (librdkafka's cache kept a recreated topic's old leader epoch, UNKNOWN_LEADER_EPOCH, for
        its ``metadata.max.age.ms``).  A leader error refreshes the metadata at once and asks again; ETIMEDOUT
        after ``timeout_s`` (``UNREACHABLE_WAIT_S`` while the cluster is known to be unreachable)."""
        from kafka.errors import KafkaError

        limit = timeout_s if self.admin.reachable else min(timeout_s, UNREACHABLE_WAIT_S)
        deadline = time.monotonic() + limit
        why: object = "no answer"
        while True:
            meta = self._replicas.cluster.get(tp.topic)
            if meta is None or tp.partition not in meta.partitions:
                raise UnknownTopicOrPartitionError(f"No partition {tp} on the cluster")
            leader, epoch = meta.partitions[tp.partition]
            left = deadline - time.monotonic()
            if leader >= 0 and left > 0:
                try:
                    return self._list_offsets_at(leader, epoch, tp, timestamps, left)
                except _LeaderError as exc:
                    why = exc
                except (KafkaError, OSError) as exc:
                    why = exc
            else:
                why = "no leader" if leader < 0 else why
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterTimeoutError(f"Listing the offsets of {tp} at its leader: {why} within {limit:g} s "
                                          f"(bootstrap servers {self.settings.brokers})")
            log.debug("ListOffsets of %s at broker %d: %s; refreshing metadata", tp, leader, why)
            self.request_sync(min(left, 2.0))
            time.sleep(min(_BACKOFF_S, max(0.0, deadline - time.monotonic())))

    def _list_offsets_at(self, leader: int, epoch: int, tp: TopicPartition, timestamps: list[int],
                         timeout_s: float) -> list[int]:
        """One ListOffsets (v4+: the current leader epoch) per timestamp, sent together to ``leader``; the side
        client is waited for at most ``timeout_s`` too (the fetcher thread must not stall behind a caller)."""
        from kafka import errors as kafka_errors
        from kafka.protocol.consumer import ListOffsetsRequest

        topic = ListOffsetsRequest.ListOffsetsTopic
        out = []
        if not self._side.lock.acquire(timeout=timeout_s):
            raise _LeaderError("the ListOffsets connection is busy")
        try:
            client = self._side.get(self._client_settings(), self._replicas.last_metadata)
            futures = [client.send(leader, ListOffsetsRequest(
                replica_id=-1, isolation_level=0, timeout_ms=0, min_version=4, topics=[topic(
                    name=tp.topic, partitions=[topic.ListOffsetsPartition(
                        partition_index=tp.partition, current_leader_epoch=epoch, timestamp=ts)])]))
                for ts in timestamps]
            deadline = time.monotonic() + timeout_s
            for future in futures:
                while not future.is_done:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _LeaderError(f"no answer from broker {leader}")
                    client.poll(timeout_ms=int(min(left, 0.5) * 1000) + 1, future=future)
                if future.failed():
                    raise _LeaderError(f"broker {leader}: {future.exception!r}")
                pd = future.value.topics[0].partitions[0]
                if pd.error_code != _NONE:
                    raise _LeaderError(f"broker {leader} answered Kafka error code {pd.error_code} "
                                       f"({kafka_errors.for_code(pd.error_code).message})", pd.error_code)
                out.append(pd.offset)
        finally:
            self._side.lock.release()
        return out

    def request_sync(self, timeout_s: float) -> bool:
        """Refresh metadata now (an admin change was made); True once a sync started after this call ended."""
        with self._handoff.changed:
            target = self._handoff.sync_generation + 2      # a sync running now may have read the old metadata
            self._handoff.sync_wanted = True
        self._client.wakeup()
        deadline = time.monotonic() + timeout_s
        with self._handoff.changed:
            while self._handoff.sync_generation < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._handoff.changed.wait(left)
                if self._handoff.sync_generation < target:
                    self._handoff.sync_wanted = True
                    self._client.wakeup()
        return True

    def wait_for_offset(self, tp: TopicPartition, offset: int, timeout_s: float) -> bool:
        """Wait until the local replica of ``tp`` holds ``offset`` (read-your-writes); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._handoff.changed:
            while True:
                target = self.manager.get_log(tp)
                if target is not None and target.log_end_offset > offset:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._handoff.changed.wait(left)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        from kafka.errors import KafkaError

        last_bug = ""
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if self._handoff.take_sync_wanted() or now >= self._loop.next_listing:
                    self._sync_metadata(full=True)
                elif self._loop.refresh_wanted or now >= self._loop.next_sync:
                    self._sync_metadata(full=False)
                self._start_added()
                self._send_fetches()
                self._client.poll(timeout_ms=100)
                self._complete_fetches()
            except KafkaError as exc:   # the client's own errors (a broker gone, a connection lost) are state
                if not self._stop.is_set():
                    log.debug("Replica fetcher: %r, retrying after a metadata refresh", exc)
                    self._handoff.want_sync()
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

    def _metadata(self, topics: list[str] | None) -> Any:     # Any: kafka-python's MetadataResponse
        """A MetadataResponse for ``topics`` (None: every topic) from the least loaded broker, or from any other
        one that answers (a broker that died is not the cluster being unreachable), within 10 s in all."""
        from kafka.protocol.metadata import MetadataRequest

        cluster = self._client.cluster
        nodes: list[Any] = []     # Any: kafka-python's broker metadata
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
        self._loop.next_sync = now + self.settings.metadata_max_age_s
        self._loop.refresh_wanted = False
        local = self.manager.topics()
        held = [topic for topic in local if self.selected(topic)]
        if full:
            self._loop.next_listing = now + self.settings.listing_max_age_s
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
        self._replicas.last_metadata = md
        if self._loop.unreachable_since is not None:
            log.info("The Kafka cluster at %s answers again after %.1f s", self.settings.brokers,
                     time.monotonic() - self._loop.unreachable_since)
            self._loop.unreachable_since = None
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
        with self._handoff.changed:
            for topic, since in list(self._handoff.created.items()):
                if now - since > self.settings.listing_max_age_s:
                    self._handoff.created.pop(topic, None)
                elif topic not in present and topic in self._replicas.cluster:
                    uncertain.add(topic)        # just created by this mount: kept as it was
        gone: list[str] = []
        for topic in local if full else held:
            if topic in present:
                self._loop.missing.pop(topic, None)
            elif topic in self._loop.missing:
                gone.append(topic)
            else:
                self._loop.missing[topic] = now
                uncertain.add(topic)        # kept as it was until the next poll says it again
        known = self._replicas.cluster
        if full:
            cluster = {name: known[name] for name in uncertain if name in known}
        else:
            cluster = {name: meta for name, meta in known.items() if name not in held or name in uncertain}
        cluster.update(fresh)
        self._replicas.cluster = cluster
        if self.topic_removed is not None:
            for name in known.keys() - cluster.keys():
                if name not in local:       # (a replica dropped below says it itself)
                    self.topic_removed(name)        # gone from the listing: the kernel forgets its entry
        for topic in gone:
            self._loop.missing.pop(topic, None)
            self._drop_topic(topic, "it no longer exists on the cluster")
        self._loop.moved = {}
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
        if not self._loop.moved:
            return
        moves = []
        for (was, now), tps in sorted(self._loop.moved.items(), key=lambda item: -len(item[1])):
            example = ", ".join(map(str, tps[:3])) + (", ..." if len(tps) > 3 else "")
            moves.append(f"{len(tps)} from {_broker(was)} to {_broker(now)} ({example})")
        log.info("Partition leaders moved: %s", "; ".join(moves))
        self._loop.moved = {}

    def _bump_generation(self) -> None:
        with self._handoff.changed:
            self._handoff.sync_generation += 1
            self._handoff.changed.notify_all()

    def _unreachable(self, exc: Exception) -> None:
        self.admin.reachable = False
        if self._loop.unreachable_since is None:
            self._loop.unreachable_since = time.monotonic()
            log.warning("The Kafka cluster at %s cannot be reached (%s): serving the local replica, "
                        "writes fail until it answers", self.settings.brokers, exc)

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
        local_id = self._local_topic_id(name) if local else topic_id
        if local_id != topic_id:
            self._drop_topic(name, f"the cluster's topic of this name has a new topic ID {topic_id} "
                                   "(deleted and recreated)" if local_id is not None else
                                   "its partition.metadata is gone (a replica's is not fsynced: a power loss)")
            return
        with self._handoff.changed:
            creating = self._handoff.creating     # read after ``local``: a making that ends later is _start_added's
        for partition in local:
            tp = TopicPartition(name, partition)
            if partition not in meta.partitions or tp == creating:
                continue            # (being made: _start_added takes it once its first fetch is in)
            leader, epoch = meta.partitions[partition]
            target = self.manager.get_log(tp)
            if target is None:
                continue
            state = self._replicas.states.get(tp)
            if state is None or state.log is not target:
                self._replicas.states[tp] = PartitionFetchState(target, meta.topic_id, leader, epoch)
            elif (state.leader, state.leader_epoch) != (leader, epoch):
                if leader != state.leader:
                    self._loop.moved.setdefault((state.leader, leader), []).append(tp)
                state.leader, state.leader_epoch, state.delayed_until = leader, epoch, 0.0

    def _start_added(self) -> None:
        """Fetch states for the replicas made on first use since the last round."""
        with self._handoff.changed:
            added, self._handoff.added = self._handoff.added, []
            pending, self._handoff.pending = self._handoff.pending, {}
            for tp in added:
                meta = self._replicas.cluster.get(tp.topic)
                target = self.manager.get_log(tp)
                if meta is None or target is None or tp.partition not in meta.partitions:
                    continue
                state = self._replicas.states.get(tp)
                if state is None or state.log is not target:
                    leader, epoch = meta.partitions[tp.partition]
                    state = self._replicas.states[tp] = PartitionFetchState(target, meta.topic_id, leader, epoch)
                start, high_watermark = pending.get(tp, (-1, -1))
                state.start_floor = start
                if state.high_watermark < 0:
                    state.high_watermark = high_watermark

    def _drop_topic(self, topic: str, why: str) -> None:
        log.info("Deleting the local replica of topic %s: %s", topic, why)
        for tp in [tp for tp in self._replicas.states if tp.topic == topic]:
            del self._replicas.states[tp]
        try:
            self.manager.delete_topic(topic)
        except LogfsError as exc:
            log.error("Could not delete the local replica of topic %s: %s", topic, exc)
        if self.topic_removed is not None:
            self.topic_removed(topic)
        self._handoff.notify()

    # ------------------------------------------------------------------ fetching

    def _send_fetches(self) -> None:
        from kafka.errors import KafkaError
        from kafka.protocol.consumer import FetchRequest

        now = time.monotonic()
        by_leader: dict[int, list[tuple[TopicPartition, PartitionFetchState]]] = {}
        for tp, state in self._replicas.states.items():
            if state.leader < 0 or state.delayed_until > now:
                continue
            if self._loop.node_delayed.get(state.leader, 0.0) > now:
                continue
            if state.leader in self._loop.inflight:
                continue
            by_leader.setdefault(state.leader, []).append((tp, state))
        fetch_topic = FetchRequest.FetchTopic
        fetch_partition = fetch_topic.FetchPartition
        forgotten_topic = FetchRequest.ForgottenTopic
        for leader, parts in by_leader.items():
            session = self._loop.sessions.setdefault(leader, FetchSession())
            wanted: dict[_PartitionKey, tuple[TopicPartition, _FetchPosition]] = {}
            for tp, state in parts:
                wanted[(state.topic_id, tp.partition)] = (
                    tp, (state.log.log_end_offset, state.last_fetched_epoch(), state.leader_epoch))
            session_id, epoch, send, forget = session.next_request(wanted)
            topics: dict[uuid.UUID, tuple[str, list[object]]] = {}
            for key in send:
                tp, (offset, last_epoch, leader_epoch) = wanted[key]
                topics.setdefault(key[0], (tp.topic, []))[1].append(fetch_partition(
                    partition=tp.partition, current_leader_epoch=leader_epoch, fetch_offset=offset,
                    last_fetched_epoch=last_epoch, log_start_offset=-1,
                    partition_max_bytes=self.settings.partition_max_bytes))
            forgotten: dict[uuid.UUID, list[int]] = {}
            for topic_id, partition in forget:
                forgotten.setdefault(topic_id, []).append(partition)
            request = FetchRequest(
                replica_id=-1, max_wait_ms=self.settings.fetch_max_wait_ms, min_bytes=1, max_bytes=64 << 20,
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
            self._loop.inflight[leader] = _InflightFetch(future, keys, {key: wanted[key][1] for key in send}, forget)

    def _complete_fetches(self) -> None:
        for leader, fetch in list(self._loop.inflight.items()):
            future = fetch.future
            if not future.is_done:
                continue
            del self._loop.inflight[leader]
            session = self._loop.sessions.setdefault(leader, FetchSession())
            if future.failed():
                session.reset()
                self._node_failed(leader, future.exception)
                continue
            self._loop.node_delayed.pop(leader, None)
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
            session.acknowledged(getattr(response, "session_id", 0), fetch.sent, fetch.forgotten)
            if session.session_id != was:
                log.debug("Fetch session %d with broker %d for %d partitions", session.session_id, leader,
                          len(fetch.sent))
            for topic in response.responses:
                for pd in topic.partitions:
                    tp = fetch.keys.get((topic.topic_id, pd.partition_index))
                    if tp is not None:
                        self._partition_data(tp, topic.topic_id, pd)

    def _node_failed(self, node: int, why: object) -> None:
        log.debug("Fetch from broker %d failed: %s", node, why)
        self._loop.node_delayed[node] = time.monotonic() + _BACKOFF_S
        self._loop.refresh_wanted = True

    # Any: a Fetch response's partition
    def _partition_data(self, tp: TopicPartition, topic_id: uuid.UUID, pd: Any) -> None:
        state = self._replicas.states.get(tp)
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
            self._loop.refresh_wanted = True

    def _append(self, tp: TopicPartition, state: PartitionFetchState, pd: Any) -> None:     # Any: as _partition_data's
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
            with self._handoff.changed:
                state.responded = True
                self._handoff.changed.notify_all()

    def _truncate(self, tp: TopicPartition, state: PartitionFetchState, offset: int) -> None:
        state.log.truncate_to(offset)
        state.last_epoch = None
        self._handoff.notify()

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
            start, end = self._list_offsets_at(state.leader, state.leader_epoch, tp, [_EARLIEST, _LATEST], 2.0)
        except (_LeaderError, LogfsError) as exc:
            self._loop.refresh_wanted = True
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
        self._handoff.notify()


def _broker(node: int) -> str:
    return "no leader" if node < 0 else f"broker {node}"


def _raise_log_start(target: Log, offset: int, reason: str) -> None:
    """The log start moved up to ``offset`` (at most the log end) if it is below."""
    if offset > target.log_start_offset and target.log_end_offset > target.log_start_offset:
        target.maybe_increment_log_start_offset(min(offset, target.log_end_offset), reason)


def kafka_topic_id(topic_id: uuid.UUID) -> str:
    """A topic ID as Kafka writes it (``Uuid.toString``: base64 url-safe without padding)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode("ascii")
