"""KIP-534 against the real thing: horizons Kafka's cleaner wrote, and Kafka's tools on ours.

* A compacted topic on a real KRaft broker, rolled by ``segment.ms``, is cleaned
  by Kafka's own cleaner until a batch carries a delete horizon.  The
  partition directory (copied after a clean broker stop) is then loaded by the
  engine: every record reads back with the timestamps kafka-python consumed
  from the broker, and our cleaner, driven by a ManualClock, keeps the
  tombstone (and Kafka's horizon, unchanged) just before the horizon and drops
  it at the horizon.
* A segment our cleaner gave a horizon is read by Kafka's DumpLogSegments,
  which prints the same ``deleteHorizonMs`` as ``logfs dump-log``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import TYPE_CHECKING

import pytest

from engine.cleaner import Cleaner, Throttler
from engine.cleaner.cleaner_manager import LogToClean, cleanable_offsets
from engine.cleaner.offset_map import OffsetMap
from engine.clock import ManualClock
from engine.config import LogConfig
from engine.errors import CorruptRecordError
from engine.log import Log
from engine.records import decode_batch, iter_batches, validate_batch
from tests.conftest import LOGFS
from tests.jvm import run_tool

if TYPE_CHECKING:
    from pathlib import Path

    from engine.records import Record

pytestmark = pytest.mark.kafka      # a KRaft broker and Kafka's DumpLogSegments

KAFKA_BROKER_OPTIONS = {"log.cleaner.backoff.ms": "100", "log.retention.check.interval.ms": "1000"}

DELETE_RETENTION_MS = 3_600_000
TOPIC = "kip534"


def _horizon_batches(partition_dir: Path) -> list[tuple[int, list[Record]]]:
    """(horizon, records) of every batch with a delete horizon in the dir's segments (read live: retried)."""
    found: list[tuple[int, list[Record]]] = []
    for path in sorted(partition_dir.glob("*.log")):
        try:
            data = path.read_bytes()
            for pos, header in iter_batches(data):
                if header.delete_horizon_ms is not None:
                    validate_batch(data, pos)
                    found.append((header.delete_horizon_ms, decode_batch(data, pos, header)))
        except (FileNotFoundError, CorruptRecordError):
            return []           # the cleaner swapped the segment under us: look again
    return found


def _clean(log: Log) -> None:
    cleaner = Cleaner(0, OffsetMap(1 << 20, 0.9), 4096, 1 << 20, 0.9, Throttler(float("inf")), log.clock)
    offsets = cleanable_offsets(log, None, log.clock.milliseconds())
    cleaner.clean(LogToClean(log.topic_partition, log, offsets.first_dirty_offset,
                             offsets.first_uncleanable_dirty_offset))


def test_horizons_written_by_kafkas_cleaner_are_read_and_honoured(kafka_broker, tmp_path):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    kafka_broker.create_topic(TOPIC, 1, {"cleanup.policy": "compact", "segment.ms": "100",
                                         "min.cleanable.dirty.ratio": "0.01",
                                         "delete.retention.ms": str(DELETE_RETENTION_MS)})
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=0)
    partition_dir = kafka_broker.log_dir / f"{TOPIC}-0"
    try:
        producer.send(TOPIC, key=b"doomed", value=b"alive").get(timeout=30)
        producer.send(TOPIC, key=b"doomed", value=None).get(timeout=30)      # the tombstone
        deadline = time.monotonic() + 120
        n = 0
        # Keep writing (each append after segment.ms rolls a segment) until Kafka's cleaner has
        # cleaned past the tombstone and stored its horizon.
        while not (horizons := _horizon_batches(partition_dir)):
            assert time.monotonic() < deadline, f"Kafka's cleaner wrote no horizon:\n{kafka_broker.log()[-3000:]}"
            n += 1
            producer.send(TOPIC, key=b"hot", value=b"update %d" % n).get(timeout=30)
            time.sleep(0.2)
    finally:
        producer.close()
    assert any(r.key == b"doomed" and r.value is None for _, records in horizons for r in records)
    horizon = horizons[0][0]

    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    consumed = []
    while consumer.position(tp) < end:
        for batch in consumer.poll(timeout_ms=500).values():
            consumed += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    consumer.close()

    kafka_broker.stop()             # a consistent copy of the partition, then the broker goes on
    copy = tmp_path / f"{TOPIC}-0"
    shutil.copytree(partition_dir, copy)
    kafka_broker.start()

    clock = ManualClock(horizon - 1)
    config = LogConfig.from_props({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                                   "delete.retention.ms": str(DELETE_RETENTION_MS)})
    log = Log.load(str(copy), config, clock=clock)
    try:
        # Our decoders read Kafka's horizon batches with the timestamps the broker served.
        assert [(r.offset, r.timestamp, r.key, r.value) for r in log.read_records(log.log_start_offset)] == consumed
        log.append_values([b"from logfs"], [b"hot"])
        log.roll()
        _clean(log)                 # 1 ms before Kafka's horizon: the tombstone stays, the horizon too
        kept = _horizon_batches(copy)
        assert [h for h, records in kept if any(r.key == b"doomed" for r in records)] == [horizon]
        log.append_values([b"from logfs again"], [b"hot"])
        log.roll()
        clock.now = horizon
        _clean(log)                 # at the horizon: gone
        assert not any(r.key == b"doomed" for r in log.read_records(log.log_start_offset))
    finally:
        log.close()


def test_kafkas_dump_log_reads_the_horizons_our_cleaner_writes(tmp_path):
    """Kafka's DumpLogSegments on segments our cleaner re-wrote: same batch lines, sane indexes.

    The first batch loses its last record (its last offset stays the
    original's, as Kafka keeps it), the second gets a delete horizon; every
    batch is indexed (index.interval.bytes=1), so ``--index-sanity-check`` and
    the index dump check each entry against the batch at its position.
    """
    clock = ManualClock()
    d = tmp_path / "ours-0"
    d.mkdir()
    log = Log.load(str(d), LogConfig.from_props({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                                                 "delete.retention.ms": "60000", "index.interval.bytes": "1"}),
                   clock=clock)
    try:
        log.append_values([b"v2", b"v1"], [b"b", b"a"])
        log.append_values([None, b"v3"], [b"a", b"c"])
        log.append_values([b"v4"], [b"d"])
        log.roll()
        _clean(log)
        segment = next(iter(log.segments.values()))
        files = [segment.log_path, segment.offset_index.path, segment.time_index.path]
    finally:
        log.close()
    expected_horizon = clock.milliseconds() + 60000
    theirs = run_tool("org.apache.kafka.tools.DumpLogSegments", "--deep-iteration", "--print-data-log", "--files",
                      files[0], base=tmp_path).stdout.decode()
    ours = subprocess.run([str(LOGFS), "dump-log", "--print-data-log", files[0]], capture_output=True,
                          check=True).stdout.decode()
    batch_lines = [line for line in theirs.splitlines() if line.startswith("baseOffset:")]
    assert [line for line in ours.splitlines() if line.startswith("baseOffset:")] == batch_lines
    assert batch_lines[0].startswith("baseOffset: 0 lastOffset: 1 count: 1 ")
    assert sum(f"deleteHorizonMs: OptionalLong[{expected_horizon}]" in line for line in batch_lines) == 1
    assert all("isvalid: true" in line for line in batch_lines)
    for index in files[1:]:
        checked = run_tool("org.apache.kafka.tools.DumpLogSegments", "--index-sanity-check", "--files", index,
                           base=tmp_path)
        assert b"passed sanity check" in checked.stdout, checked.stdout.decode()
        dumped = run_tool("org.apache.kafka.tools.DumpLogSegments", "--files", index, base=tmp_path)
        text = (dumped.stdout + dumped.stderr).decode()
        assert "mismatch" not in text.lower(), text
        assert "offset:" in text, text


def _markers(partition_dir: Path) -> list[tuple[int, int | None, bool]]:
    """(offset, delete horizon, is_commit) of every transaction marker in the dir's segments."""
    out = []
    for path in sorted(partition_dir.glob("*.log")):
        data = path.read_bytes()
        for pos, header in iter_batches(data):
            if header.is_control:
                validate_batch(data, pos)
                record = decode_batch(data, pos, header, include_control=True)[0]
                assert record.key is not None       # a control record's key is its type
                out.append((header.base_offset, header.delete_horizon_ms, record.key[-1] == 1))
    return out


def test_transactions_are_cleaned_as_kafka_cleans_them(kafka_broker, tmp_path):
    """A real transactional producer's data, cleaned by ours (the broker's topic is not compacted).

    The aborted transaction updates a key the committed one wrote: its record
    must not supersede the committed value (it never enters the offset map),
    and the first clean removes it.  The abort marker stays through that clean
    (its transaction still had a batch), gets a horizon at the next one and
    goes at the horizon.  The commit marker stays while its transaction has a
    record left.  kafka-python, as a read_committed and a read_uncommitted
    consumer of the broker, saw what the cleaned log keeps.
    """
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = "txn"
    kafka_broker.create_topic(topic, 1, {"cleanup.policy": "delete"})
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, transactional_id="kip534-txn")
    plain = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, key=b"k1", value=b"committed 1")
        producer.send(topic, key=b"k2", value=b"committed 2")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(topic, key=b"k1", value=b"aborted 1")
        producer.send(topic, key=b"k9", value=b"aborted 9").get(timeout=30)   # in the log before the abort
        producer.abort_transaction()
        plain.send(topic, key=b"k2", value=b"later 2").get(timeout=30)
    finally:
        producer.close()
        plain.close()
    tp = TopicPartition(topic, 0)
    committed_view = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False,
                                 isolation_level=isolation)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        rows = []
        deadline = time.monotonic() + 60
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline
            for batch in consumer.poll(timeout_ms=500).values():
                rows += [(r.key, r.value) for r in batch]
        consumer.close()
        committed_view[isolation] = rows
    assert (b"k1", b"aborted 1") in committed_view["read_uncommitted"]
    assert (b"k1", b"aborted 1") not in committed_view["read_committed"]
    kafka_broker.stop()
    copy = tmp_path / f"{topic}-0"
    shutil.copytree(kafka_broker.log_dir / f"{topic}-0", copy)
    kafka_broker.start()

    clock = ManualClock()
    log = Log.load(str(copy), LogConfig.from_props({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                                                    "delete.retention.ms": "60000"}), clock=clock)
    try:
        commit, abort = _markers(copy)
        assert commit[2]
        assert not abort[2]
        assert commit[1] is None
        assert abort[1] is None
        log.roll()
        _clean(log)             # aborted records gone; k1's committed value kept; both markers, no horizon
        assert [(r.key, r.value) for r in log.read_records(log.log_start_offset)] == \
            [(b"k1", b"committed 1"), (b"k2", b"later 2")]
        assert [(k, v) for k, v in committed_view["read_committed"] if (k, v) != (b"k2", b"committed 2")] == \
            [(b"k1", b"committed 1"), (b"k2", b"later 2")]
        assert [(o, h) for o, h, _ in _markers(copy)] == [(commit[0], None), (abort[0], None)]
        log.append_values([b"x"], [b"k3"])
        log.roll()
        clock.sleep(1000)
        _clean(log)             # the aborted transaction has no record left: its marker gets a horizon
        horizon = clock.milliseconds() + 60000
        assert [(o, h) for o, h, _ in _markers(copy)] == [(commit[0], None), (abort[0], horizon)]
        log.append_values([b"y"], [b"k3"])
        log.roll()
        clock.now = horizon
        _clean(log)             # at the horizon the abort marker goes; k1's transaction keeps its marker
        assert [(o, h) for o, h, _ in _markers(copy)] == [(commit[0], None)]
        assert [(r.key, r.value) for r in log.read_records(log.log_start_offset)] == \
            [(b"k1", b"committed 1"), (b"k2", b"later 2"), (b"k3", b"y")]
    finally:
        log.close()
