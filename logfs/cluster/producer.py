"""Appends to the cluster: an idempotent ``acks=all`` producer (librdkafka) and its delivery reports.

``write()`` of an ``append`` file produces its records to the partition the
namespace chose (the mount's own partitioner, Kafka's murmur2, so a keyed line
lands where an embedded mount puts it) and returns once every record of the
write has its delivery report: acknowledged by all in-sync replicas, or
failed.  Idempotence (``enable.idempotence=true``) keeps the order and
removes duplicates across librdkafka's retries and leader changes, as docs/SPEC.md
section 10 promises.  A write that cannot be delivered within
``delivery.timeout.ms`` (the mount's default: 30 s) fails with ETIMEDOUT, a
refusal with the errno of its Kafka error (logfs.cluster.errors).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, TypedDict

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from logfs.cluster.errors import ClientLog, ClusterError, ClusterTimeoutError, error_name, from_kafka

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from engine.errors import LogfsError
    from engine.topic import TopicPartition

log = logging.getLogger(__name__)

__all__ = ["ClusterProducer", "PRODUCER_DEFAULTS"]

#: what the mount sets unless ``-o`` says otherwise; ``acks`` and idempotence are not negotiable
PRODUCER_DEFAULTS = {
    "linger.ms": "5",   # the records of one write() leave as one batch
    # librdkafka's default (10,000) cut a write of more lines into several batches (`seq 25000 >> append`:
    # three, with three LogAppendTimes); its maximum leaves batch.size (the broker's 1 MB) the only limit
    "batch.num.messages": "1000000",
    "delivery.timeout.ms": "30000",
    "request.timeout.ms": "10000",
    "message.max.bytes": str(64 * 1024 * 1024),
}
_FORCED = {"acks": "all", "enable.idempotence": "true"}
#: how long after ``delivery.timeout.ms`` a write waits for its last delivery report (librdkafka scans for
#: timed-out messages once a second)
_REPORT_GRACE_S = 2.0


class _RecordArgs(TypedDict, total=False):
    """What a record adds to librdkafka's ``produce`` beyond its value."""

    key: bytes
    headers: list[tuple[str, str | bytes | None]]
    timestamp: int


class _Delivery:
    """The delivery reports of one write of ``total`` records to ``tp``.

    ``offsets`` holds every acknowledged record's offset; ``acked_after_error`` counts the acknowledgements
    reported after the first failure (0: what was acknowledged came before anything failed).  A write the
    mount stopped waiting for (``abandoned``) logs the acknowledgements that still arrive, once.
    """

    __slots__ = ("expected", "offsets", "error", "done", "lock", "total", "tp", "acked_after_error", "abandoned",
                 "late")

    def __init__(self, expected: int, tp: TopicPartition | None = None) -> None:
        self.lock = threading.Lock()     # reports are served by whichever thread polls librdkafka
        self.expected = expected
        self.total = expected
        self.tp = tp
        self.offsets: list[int] = []
        self.error: object | None = None
        self.done = threading.Event()
        self.acked_after_error = 0
        self.abandoned = False
        self.late: list[int] = []

    def report(self, err: KafkaError | None, msg: Message) -> None:
        with self.lock:
            if err is not None:
                if self.error is None:
                    self.error = err
            else:
                offset = msg.offset()
                if offset is None or offset < 0:    # acks=all and idempotence always report one
                    if self.error is None:
                        self.error = f"delivered without an offset ({offset})"
                else:
                    self.offsets.append(offset)
                    if self.error is not None:
                        self.acked_after_error += 1
                    if self.abandoned:
                        self.late.append(offset)
            self.expected -= 1
            if self.expected == 0:
                self.done.set()
                if self.late:
                    log.warning("Appending %d records to %s: %d more of them were acknowledged after the write "
                                "had failed, at offsets %d-%d (resume after offset %d)", self.total, self.tp,
                                len(self.late), min(self.late), max(self.late), max(self.offsets))

    def accounting(self) -> str:
        """What the cluster stored of a failed write, for its error and the log: the offsets acknowledged (or
        none), and the records still unanswered, which may yet be stored."""
        with self.lock:
            offsets = sorted(self.offsets)
            pending = self.expected
            acked_after_error = self.acked_after_error
        if not offsets:
            text = (f"before it failed, the cluster acknowledged none of its {self.total} records of {self.tp} "
                    "(resume with record 1 of the write)")
            if pending:
                text += f"; {pending} records had no answer yet and may still be stored"
            return text
        first, last, count = offsets[0], offsets[-1], len(offsets)
        text = (f"before it failed, the cluster acknowledged {count} of its {self.total} records at offsets "
                f"{first}-{last} of {self.tp}")
        if last - first + 1 == count and acked_after_error == 0:
            # idempotence keeps a partition's records in the order produced: the acknowledged ones, contiguous
            # and all reported before the first failure, are the write's first `count`
            text += f" (its first {count} records: resume with record {count + 1} of the write)"
        else:
            text += f" (not one run of its first records: {count} offsets, see the log)"
        if pending:
            text += f"; {pending} records had no answer yet and may still be stored after offset {last}"
        return text


class ClusterProducer:
    """One librdkafka producer per mount, served by a poll thread; :meth:`produce` blocks its caller."""

    def __init__(self, client_config: Mapping[str, str]) -> None:
        config = {**PRODUCER_DEFAULTS, **client_config, **_FORCED}
        self.brokers = config["bootstrap.servers"]
        self.delivery_timeout_s = int(config["delivery.timeout.ms"]) / 1000
        self.queue_max_messages = int(config.get("queue.buffering.max.messages", "100000"))
        self._config = {**config, "logger": ClientLog("logfs.cluster.librdkafka")}
        self._producer = Producer(self._config)
        #: topics whose partitions and leaders this producer has metadata for (see _know)
        self._known: set[str] = set()
        #: topics this producer has produced to (see topic_replaced)
        self._produced: set[str] = set()
        self._replace_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="logfs-producer", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def produce(self, tp: TopicPartition, values: Sequence[bytes | None],
                keys: Sequence[bytes | None] | None = None,
                headers: Sequence[Sequence[tuple[str, bytes | None]]] | None = None,
                timestamps: Sequence[int | None] | None = None) -> tuple[int, int]:
        """Produce the records in order and wait for their delivery; (first offset, last offset)."""
        if tp.topic not in self._known:
            self._know(tp)
        self._produced.add(tp.topic)
        n = len(values)
        delivery = _Delivery(n, tp)
        what = f"Appending {n} records to {tp}"
        if (not headers or not any(headers)) and (timestamps is None or all(t is None for t in timestamps)):
            if not self._produce_batch(tp, values, keys, delivery, what):
                self._refresh(tp)
                if not self._produce_batch(tp, values, keys, delivery, what):
                    self._refused_unknown(delivery, len(values), what)
            return self._wait(delivery, what)
        # librdkafka's produce_batch takes neither headers nor timestamps: such records are produced one by
        # one, which librdkafka may send in more than one batch (docs/cluster.md, "one write()")
        i = 0
        try:
            for i, value in enumerate(values):
                kwargs: _RecordArgs = {}
                key = keys[i] if keys is not None else None
                if key is not None:
                    kwargs["key"] = key
                if headers is not None and headers[i]:
                    kwargs["headers"] = list(headers[i])
                timestamp = timestamps[i] if timestamps is not None else None
                if timestamp is not None:
                    kwargs["timestamp"] = timestamp
                try:
                    self._produce_one(tp, value, delivery, kwargs)
                except KafkaException as exc:
                    if i > 0 or exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                        raise
                    self._refresh(tp)       # nothing queued yet: the partition is new to librdkafka
                    self._produce_one(tp, value, delivery, kwargs)
        except KafkaException as exc:
            # the records queued before the failure are delivered or fail on their own; say which
            log.warning("%s: %d of them were queued before librdkafka refused one: %s", what, i, exc)
            raise from_kafka(exc, what, self.brokers) from None
        return self._wait(delivery, what)

    def topic_replaced(self, topic: str) -> None:
        """``topic`` was deleted on the cluster (and maybe created again): a producer that produced to it
        is replaced by a new one (its writes in flight finish on the old one, flushed in the background).

        librdkafka keeps the old topic's partitions and leader epochs and ignores metadata with lower
        epochs, so it cannot produce to a topic recreated after leader changes until its
        ``metadata.max.age.ms`` (15 minutes): every write timed out meanwhile."""
        with self._replace_lock:
            if topic not in self._produced:
                return
            old, self._producer = self._producer, Producer(self._config)
            self._known.clear()
            self._produced.clear()
        log.info("Topic %s was deleted on the cluster: a new producer replaces the one that produced to it", topic)
        threading.Thread(target=self._retire, args=(old,), name="logfs-producer-retired", daemon=True).start()

    def _retire(self, old: Producer) -> None:
        remaining = old.flush(self.delivery_timeout_s + 5)
        if remaining:
            log.error("%d records were not delivered to the cluster by the replaced producer", remaining)

    def _refresh(self, tp: TopicPartition) -> None:
        """librdkafka refused ``tp`` as an unknown partition and queued nothing: its metadata of the topic
        predates partitions added by another client (it asks again only every
        ``topic.metadata.refresh.interval.ms``, 5 minutes), so ask now (a Metadata request for the topic)."""
        log.info("Partition %s is not in the producer's metadata of topic %s (partitions added on the cluster): "
                 "refreshing it", tp, tp.topic)
        self._known.discard(tp.topic)
        self._know(tp)

    def _refused_unknown(self, delivery: _Delivery, n: int, what: str) -> None:
        """The write fails: librdkafka still knows no partition ``tp`` after a metadata refresh."""
        with delivery.lock:
            delivery.expected -= n
            if delivery.error is None:
                delivery.error = KafkaError(KafkaError._UNKNOWN_PARTITION)
            if delivery.expected == 0:
                delivery.done.set()
        log.warning("%s: librdkafka refused them: no such partition in the topic's metadata", what)

    def _know(self, tp: TopicPartition) -> None:
        """Metadata of ``tp``'s topic before its first produce (a Metadata request for it).

        Records produced to a topic the producer has no metadata for wait in librdkafka's unassigned queue
        and are moved to the partition's queue when the metadata arrives, one by one, while the sender,
        ``linger.ms`` long expired, already sends what was moved: the first write of a mount to a topic
        left in two or three batches.  A failure here is left to the produce that follows."""
        try:
            md = self._producer.list_topics(tp.topic, timeout=min(self.delivery_timeout_s, 10.0))
        except KafkaException as exc:
            log.debug("Metadata of topic %s before its first produce: %s", tp.topic, exc)
            return
        partition = md.topics.get(tp.topic)
        if partition is not None and partition.error is None and tp.partition in partition.partitions \
                and partition.partitions[tp.partition].leader >= 0:
            self._known.add(tp.topic)

    def _produce_batch(self, tp: TopicPartition, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                       delivery: _Delivery, what: str) -> bool:
        """The records of one write onto the partition's queue at once (librdkafka's ``rd_kafka_produce_batch``).

        Enqueued in one call, they leave in one ProduceRequest batch as long as
        they fit in ``batch.size`` (1 MB; ``batch.num.messages`` is set to its maximum): the
        broker appends that batch whole or not at all, so such a write is all or
        nothing on the cluster as on an embedded mount.  librdkafka 2.16 still
        enqueues them one by one inside that call, so a write of tens of
        thousands of records that takes longer than ``linger.ms`` to enqueue can
        be cut (far less often than with one ``produce()`` per record, which
        Python makes slower).  Waits for room in the local queue first, so the
        batch is never refused half enqueued for a full queue.  False, with nothing
        queued and ``delivery`` untouched, when librdkafka knows no such partition.
        """
        messages: list[dict[str, object]] = []
        for i, value in enumerate(values):
            message: dict[str, object] = {} if value is None else {"value": value}
            if keys is not None and keys[i] is not None:
                message["key"] = keys[i]
            messages.append(message)
        while len(self._producer) + len(messages) > self.queue_max_messages and len(self._producer):
            self._producer.poll(0.05)       # deliveries drain the queue
        try:
            queued = self._producer.produce_batch(tp.topic, messages, partition=tp.partition,
                                                  on_delivery=delivery.report)
        except (KafkaException, BufferError) as exc:
            raise from_kafka(exc, what, self.brokers) from None
        if queued == 0 and messages and all(getattr(m.get("_error"), "code", lambda: None)()
                                            == KafkaError._UNKNOWN_PARTITION for m in messages):
            return False            # nothing queued: the caller refreshes the topic's metadata and asks again
        if queued != len(messages):
            refused = [m["_error"] for m in messages if "_error" in m]
            with delivery.lock:             # refused messages get no delivery report
                delivery.expected -= len(messages) - queued
                if delivery.error is None:
                    delivery.error = refused[0] if refused else "refused by librdkafka"
                if delivery.expected == 0:
                    delivery.done.set()
            log.warning("%s: librdkafka queued %d of them and refused the rest: %s", what, queued,
                        refused[0] if refused else "no reason given")
        return True

    def _wait(self, delivery: _Delivery, what: str) -> tuple[int, int]:
        """(first, last) offset of the write, or its error naming what the cluster stored of it, none included
        (never quieted while the cluster is unreachable: the writer needs it to resume without a duplicate, in
        ``.logfs/errors`` and the log; what was acknowledged is logged here too)."""
        if not delivery.done.wait(self.delivery_timeout_s + _REPORT_GRACE_S):
            with delivery.lock:
                delivery.abandoned = True
            error: LogfsError = ClusterTimeoutError(
                f"{what}: no delivery report within {self.delivery_timeout_s + _REPORT_GRACE_S:g} s "
                f"(bootstrap servers {self.brokers})")
        elif delivery.error is not None:
            error = from_kafka(delivery.error, what, self.brokers)
        else:
            return min(delivery.offsets), max(delivery.offsets)
        stored = delivery.accounting()
        if delivery.offsets:
            log.warning("%s failed: %s; %s", what, error_name(delivery.error or "timeout"), stored)
        accounted = type(error)(f"{error}; {stored}")
        if isinstance(accounted, ClusterError):
            accounted.partial = True
        raise accounted

    def _produce_one(self, tp: TopicPartition, value: bytes | None, delivery: _Delivery, kwargs: _RecordArgs) -> None:
        while True:
            try:
                self._producer.produce(tp.topic, value, partition=tp.partition, on_delivery=delivery.report,
                                       **kwargs)
                return
            except BufferError:         # the local queue is full: wait for deliveries to drain it
                self._producer.poll(0.1)

    def close(self, timeout_s: float = 10.0) -> None:
        remaining = self._producer.flush(timeout_s)
        if remaining:
            log.error("%d records were not delivered to the cluster before the mount stopped", remaining)
        self._stop.set()
        self._thread.join()
