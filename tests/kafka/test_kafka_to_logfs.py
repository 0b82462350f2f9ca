"""Kafka -> logfs: a real Apache Kafka broker's data directory, mounted read-only, shows what its consumers see.

One KRaft broker (tests/kafka_broker.py) is written by kafka-python producers:
every codec, records with headers and null keys/values, explicit CreateTime
timestamps and a LogAppendTime topic, idempotent and transactional producers
(some transactions committed, some aborted, interleaved with non-transactional
writes), a compacted topic with small segments that Kafka's own cleaner
compacts (gaps, tombstones carrying KIP-534 delete horizons), and a consumer
group that commits offsets.  A kafka-python consumer reads every partition back
from the broker; then the broker stops (cleanly, and later with kill -9) and
``logfs mount --read-only`` serves its ``log.dirs``: every view must equal what
the consumer read, and no file of the directory may change.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import time
from typing import TYPE_CHECKING

import pytest
from kafka import KafkaConsumer, KafkaProducer

from engine import transactions
from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.topic import TopicPartition
from tests.conftest import LOGFS, Mount, kafka_records
from tests.helpers import log_of
from tests.jvm import run_tool
from tests.kafka_broker import KafkaBroker, Seen, consume_all, hash_tree, seen_from_json

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.mount, pytest.mark.kafka]

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
#: Kafka's cleaner writes the delete horizon into the batch (KIP-534): attribute bit 6.
DELETE_HORIZON_FLAG = 0x40
CONTROL_FLAG = 0x20
TRANSACTIONAL_FLAG = 0x10
#: Internal topics a consumer cannot read: the KRaft metadata log.
NOT_CONSUMABLE = {"__cluster_metadata"}


def _record(rng: random.Random, i: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    key = None if i % 7 == 0 else f"key-{i % 40}".encode()
    if i % 11 == 0:
        value = None
    elif i % 13 == 0:   # not UTF-8 (and no newline, so the text view stays one line per record)
        value = bytes(rng.choice([b for b in range(256) if b != 10]) for _ in range(rng.randint(1, 40)))
        value = b"\xff" + value
    else:
        value = f"value {i} é {'x' * rng.randint(0, 60)}".encode()
    if key is None and value is None:   # kafka-python refuses a record with neither
        value = b""
    headers = []
    if i % 3 == 0:
        headers = [("trace", f"t-{i}".encode()), ("bin", b"\x00\xfe\xff"), ("empty", b"")]
    return key, value, headers


def _produce_codecs(broker: KafkaBroker) -> None:
    broker.create_topic("codecs", len(CODECS))
    rng = random.Random(12)
    base_ts = int(time.time() * 1000) - 3_600_000
    for partition, codec in enumerate(CODECS):
        # acks=1 without idempotence on two of them: the plain producer path.  A batch closes when it
        # holds 4096 bytes or at the flush every 50 records, never on a timer (linger is a minute): the
        # same batches on a busy machine as on an idle one.  (kafka-python sends a batch that does not
        # shrink uncompressed, so a timer closing a batch of one record early left an uncompressed batch
        # in the zstd partition under load.)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec,
                                 batch_size=4096, linger_ms=60_000, enable_idempotence=partition % 2 == 0,
                                 acks="all" if partition % 2 == 0 else 1)
        for i in range(300):
            key, value, headers = _record(rng, i)
            # explicit CreateTime timestamps, not monotonic, so max timestamps and the time index matter
            timestamp = base_ts + i * 10 + (500 if i % 17 == 0 else 0) if i % 2 else None
            producer.send("codecs", key=key, value=value, headers=headers, partition=partition,
                          timestamp_ms=timestamp)
            if i % 50 == 49:
                producer.flush()
        producer.flush()
        producer.close()


def _produce_log_append_time(broker: KafkaBroker) -> None:
    broker.create_topic("appendtime", 1, {"message.timestamp.type": "LogAppendTime"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="lz4")
    for i in range(50):
        producer.send("appendtime", key=b"k%d" % (i % 5), value=b"at-%d" % i, timestamp_ms=1000 + i)
    producer.flush()
    producer.close()


def _produce_transactions(broker: KafkaBroker) -> None:
    """Two transactional producers commit and abort, a plain idempotent producer writes in between."""
    broker.create_topic("txn", 2)
    plain = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True, linger_ms=0)
    txa = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tx-a", compression_type="gzip")
    txb = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tx-b")
    txa.init_transactions()
    txb.init_transactions()
    for t in range(6):
        txa.begin_transaction()
        txb.begin_transaction()
        for i in range(15):
            txa.send("txn", key=b"a%d" % i, value=b"tx-a %d/%d %s" % (t, i, b"commit" if t % 2 == 0 else b"abort"),
                     partition=i % 2, headers=[("txn", b"a%d" % t)])
            if i % 5 == 0:
                txa.flush()     # several batches per transaction
                # a non-transactional record inside the transaction's range stays visible to every reader
                plain.send("txn", value=b"plain %d/%d" % (t, i), partition=0).get(timeout=30)
            txb.send("txn", key=None, value=b"tx-b %d/%d %s" % (t, i, b"commit" if t % 3 else b"abort"),
                     partition=1)
        txa.flush()
        txb.flush()
        if t % 2 == 0:
            txa.commit_transaction()
        else:
            txa.abort_transaction()
        if t % 3:
            txb.commit_transaction()
        else:
            txb.abort_transaction()
        plain.send("txn", value=b"plain after %d" % t, partition=t % 2).get(timeout=30)
    for p in (plain, txa, txb):
        p.close()


def _leave_transaction_open(broker: KafkaBroker) -> None:
    """A transaction that never ends: the producer goes away before committing (no marker in the log)."""
    broker.create_topic("txn-open", 1)
    plain = KafkaProducer(bootstrap_servers=broker.bootstrap)
    tx = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tx-open",
                       transaction_timeout_ms=900_000)   # the coordinator must not abort it during the test
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("txn-open", value=b"committed before").get(timeout=30)
    tx.commit_transaction()
    tx.begin_transaction()
    for i in range(5):
        tx.send("txn-open", value=b"open %d" % i).get(timeout=30)
        plain.send("txn-open", value=b"plain %d" % i).get(timeout=30)
    plain.close()
    tx.close()


def _active_base(partition_dir: Path) -> int:
    return max(int(name[:-4]) for name in os.listdir(partition_dir) if name.endswith(".log"))


def _cleaner_checkpoint(log_dir: Path, topic: str, partition: int) -> int | None:
    try:
        lines = (log_dir / "cleaner-offset-checkpoint").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        name, part, offset = line.split()
        if name == topic and int(part) == partition:
            return int(offset)
    return None


def _produce_compacted(broker: KafkaBroker) -> None:
    """Rounds of overwrites and tombstones in segments rolled by segment.ms; Kafka's cleaner compacts them."""
    broker.create_topic("compacted", 1, {
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "86400000", "compression.type": "producer"})
    pdir = broker.log_dir / "compacted-0"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0, compression_type="snappy")
    for rnd in range(5):
        segments_before = len([n for n in os.listdir(pdir) if n.endswith(".log")])
        for k in range(30):
            if rnd == 3 and k % 4 == 1:
                producer.send("compacted", key=b"ck%d" % k, value=None)      # tombstone
            elif rnd == 0 or k % (rnd + 1) == 0 or (rnd == 3 and k % 7 == 0):
                # later rounds overwrite some keys only: the survivors leave gaps
                producer.send("compacted", key=b"ck%d" % k, value=b"round %d key %d" % (rnd, k),
                              headers=[("round", b"%d" % rnd)] if k % 5 == 0 else [])
        producer.flush()
        # segment.ms rolls on the first append after 100 ms: keep appending one record until it has rolled
        deadline = time.monotonic() + 30
        while len([n for n in os.listdir(pdir) if n.endswith(".log")]) <= segments_before:
            assert time.monotonic() < deadline, "compacted topic never rolled a segment"
            time.sleep(0.11)
            producer.send("compacted", key=b"roll", value=b"roll %d" % rnd).get(timeout=30)
    producer.close()
    # The cleaner is done when its checkpoint reaches the active segment (the first uncleanable offset).
    broker.wait_for(lambda: _cleaner_checkpoint(broker.log_dir, "compacted", 0) == _active_base(pdir),
                    "Kafka's log cleaner to clean compacted-0 up to its active segment", timeout=90)


def _commit_group_offsets(broker: KafkaBroker) -> None:
    consumer = KafkaConsumer("codecs", bootstrap_servers=broker.bootstrap, group_id="kafka-group",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 200:
        assert time.monotonic() < deadline, "the group consumer got no records"
        seen += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
    consumer.commit()
    consumer.close()


def _batches(partition_dir: Path) -> list[tuple[int, int]]:
    """(base offset, attributes) of every batch in a partition directory's .log files."""
    out = []
    for name in sorted(os.listdir(partition_dir)):
        if not name.endswith(".log"):
            continue
        data = (partition_dir / name).read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            attributes, = struct.unpack_from(">h", data, pos + 21)
            out.append((base, attributes))
            pos += 12 + length
    return out


def _topics(log_dir: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name in os.listdir(log_dir):
        path = log_dir / name
        if path.is_dir() and "-" in name:
            topic, _, part = name.rpartition("-")
            if part.isdigit():
                out.setdefault(topic, []).append(int(part))
    return {t: sorted(p) for t, p in out.items()}


class Scenario:
    """What the broker's consumers read, captured before the broker stopped."""

    def __init__(self, broker: KafkaBroker) -> None:
        self.broker = broker
        self.topics = {t: p for t, p in _topics(broker.log_dir).items() if t not in NOT_CONSUMABLE}
        self.uncommitted = {t: consume_all(broker.bootstrap, t) for t in self.topics}
        self.committed = {t: consume_all(broker.bootstrap, t, isolation_level="read_committed")
                          for t in ("txn", "txn-open")}


@pytest.fixture(scope="module")
def scenario(kafka_broker: KafkaBroker) -> Scenario:
    _produce_codecs(kafka_broker)
    _produce_log_append_time(kafka_broker)
    _produce_transactions(kafka_broker)
    _produce_compacted(kafka_broker)
    _commit_group_offsets(kafka_broker)
    _leave_transaction_open(kafka_broker)
    captured = Scenario(kafka_broker)
    assert kafka_broker.stop() in (0, 143)   # the JVM exits 128+SIGTERM after its shutdown hooks
    assert (kafka_broker.log_dir / ".kafka_cleanshutdown").exists()
    return captured


def _mount(broker: KafkaBroker, name: str, options: dict[str, str] | None = None) -> Mount:
    """A read-only logfs mount of the broker's log dir itself (Mount's data dir is base/data)."""
    m = Mount(broker.base, options, read_only=True)
    m.path = broker.base / name
    m.path.mkdir(exist_ok=True)
    m.log_file = broker.base / f"{name}.log"
    return m.start()


def _read_jsonl(path: Path) -> list[Seen]:
    return [seen_from_json(json.loads(line)) for line in path.read_bytes().splitlines()]


def _check_views(m: Mount, topic: str, partition: int, expected: list[Seen]) -> None:
    """Every view of one partition equals the consumer's records."""
    where = f"{topic}/{partition}"
    pdir = m.path / topic / str(partition)
    rows = _read_jsonl(pdir / "records.jsonl")
    assert rows == expected, where
    text = (pdir / "records").read_bytes()
    assert text == b"".join((r.value or b"") + b"\n" for r in expected), where
    # segments/<base>.jsonl, in base offset order, are records.jsonl split by segment
    seg_rows: list[Seen] = []
    for name in sorted(n for n in os.listdir(pdir / "segments") if n.endswith(".jsonl")):
        seg_rows += _read_jsonl(pdir / "segments" / name)
    assert seg_rows == expected, where
    if not expected:
        return
    sample = [*expected[::max(1, len(expected) // 25)], expected[-1]]
    for rec in sample:
        assert (pdir / "offset" / str(rec.offset)).read_bytes() == (rec.value or b"") + b"\n", \
            f"{where} offset/{rec.offset}"
    for rec in sample[::5]:
        tail = [r for r in expected if r.offset >= rec.offset]
        assert _read_jsonl(pdir / "from" / f"{rec.offset}.jsonl") == tail, f"{where} from/{rec.offset}.jsonl"
        assert (pdir / "from" / str(rec.offset)).read_bytes() == b"".join((r.value or b"") + b"\n" for r in tail)


def _check_all_views(m: Mount, expected: dict[str, dict[int, list[Seen]]]) -> None:
    for topic, partitions in expected.items():
        assert sorted(int(p) for p in os.listdir(m.path / topic) if p.isdigit()) == sorted(partitions), topic
        for partition, records in partitions.items():
            _check_views(m, topic, partition, records)


def test_the_data_is_what_the_scenario_promises(scenario: Scenario):
    """The broker wrote what the other tests rely on: every codec, markers, KIP-534 horizons, gaps."""
    log_dir = scenario.broker.log_dir
    codecs = {p: {attrs & 0x7 for _, attrs in _batches(log_dir / f"codecs-{p}")} for p in range(len(CODECS))}
    assert codecs == {0: {0}, 1: {1}, 2: {2}, 3: {3}, 4: {4}}, codecs
    txn = _batches(log_dir / "txn-0") + _batches(log_dir / "txn-1")
    assert any(a & CONTROL_FLAG for _, a in txn), txn
    assert any(a & TRANSACTIONAL_FLAG and not a & CONTROL_FLAG for _, a in txn), txn
    assert len(scenario.committed["txn"][0]) < len(scenario.uncommitted["txn"][0]), "nothing aborted in txn-0"
    compacted = scenario.uncommitted["compacted"][0]
    offsets = [r.offset for r in compacted]
    assert offsets[-1] - offsets[0] + 1 > len(offsets), "Kafka's cleaner left no gaps"
    assert any(r.value is None for r in compacted), "no tombstone survived (delete.retention.ms is a day)"
    assert any(a & DELETE_HORIZON_FLAG for _, a in _batches(log_dir / "compacted-0")), \
        "Kafka's cleaner wrote no delete horizon"
    assert any(scenario.uncommitted["__consumer_offsets"].values()), "no group commit in __consumer_offsets"
    for name in ("meta.properties", "__cluster_metadata-0", "bootstrap.checkpoint"):
        assert (log_dir / name).exists(), name
    # Kafka's own files the mount must tolerate and leave alone
    files = {p: sorted(os.listdir(log_dir / f"txn-{p}")) for p in (0, 1)}
    assert any(n.endswith(".snapshot") for n in files[0]), files
    assert any(n.endswith(".txnindex") for p in (0, 1) for n in files[p]), files
    assert "partition.metadata" in files[0], files
    assert "leader-epoch-checkpoint" in files[0], files
    assert (log_dir / "__cluster_metadata-0" / "quorum-state").exists()
    assert (log_dir / "replication-offset-checkpoint").exists()
    # the open transaction holds a read_committed consumer at its first offset (the last stable offset)
    assert [r.value for r in scenario.committed["txn-open"][0]] == [b"committed before"], scenario.committed
    assert any(r.value == b"plain 4" for r in scenario.uncommitted["txn-open"][0]), scenario.uncommitted["txn-open"]


def test_clean_broker_dir_mounts_read_only_with_every_view_as_consumed(scenario: Scenario):
    log_dir = scenario.broker.log_dir
    before = hash_tree(log_dir)
    m = _mount(scenario.broker, "mnt-clean")
    try:
        _check_all_views(m, scenario.uncommitted)
        # control batches never appear: the views hold exactly the data records on disk
        for p in (0, 1):
            on_disk = kafka_records(log_dir / f"txn-{p}")
            assert [r.offset for r in on_disk] == [r.offset for r in scenario.uncommitted["txn"][p]]
    finally:
        assert m.stop() == 0, m.log()
    assert hash_tree(log_dir) == before, "a read-only mount changed the broker's data directory"


def test_read_committed_mount_hides_aborted_transactions_as_a_read_committed_consumer(scenario: Scenario):
    """-o isolation.level=read_committed: every view equals a read_committed consumer's records."""
    before = hash_tree(scenario.broker.log_dir)
    m = _mount(scenario.broker, "mnt-committed", {"isolation.level": "read_committed"})
    try:
        assert "isolation.level=read_committed" in (m.path / ".logfs" / "config").read_text().splitlines()
        # A transaction with no marker is hidden; unlike a consumer's, the views do not stop at the
        # last stable offset (docs/kafka.md: Coming from Kafka), so the plain records after it show.
        open_txn = [r for r in scenario.uncommitted["txn-open"][0] if not r.value.startswith(b"open ")]
        _check_all_views(m, {"txn": scenario.committed["txn"],
                             "txn-open": {0: open_txn},
                             # no transactions there: read_committed sees what read_uncommitted sees
                             "codecs": scenario.uncommitted["codecs"]})
        hidden = {r.offset for r in scenario.uncommitted["txn"][0]} - {r.offset for r in scenario.committed["txn"][0]}
        for offset in sorted(hidden)[:5]:
            with pytest.raises(FileNotFoundError):
                (m.path / "txn" / "0" / "offset" / str(offset)).read_bytes()
    finally:
        assert m.stop() == 0, m.log()
    assert hash_tree(scenario.broker.log_dir) == before


def test_read_committed_views_follow_appends_to_a_copy_mounted_read_write(scenario: Scenario, tmp_path: Path):
    """The aborted-transaction walk is incremental: records appended through the mount show up after it."""
    copy = tmp_path / "data"
    shutil.copytree(scenario.broker.log_dir, copy)
    m = Mount(tmp_path, {"isolation.level": "read_committed"})
    m.start()
    try:
        before = scenario.committed["txn"][0]
        opened = open(m.path / "txn" / "0" / "records.jsonl", "rb")   # a view opened before the appends
        assert _read_jsonl(m.path / "txn" / "0" / "records.jsonl") == before
        log_end = json.loads((m.path / "txn" / "0" / "state").read_bytes())["log_end_offset"]
        m.sh("printf 'appended 1\\nappended 2\\n' >> txn/0/append")
        rows = _read_jsonl(m.path / "txn" / "0" / "records.jsonl")
        assert rows[:len(before)] == before
        assert [r.value for r in rows[len(before):]] == [b"appended 1", b"appended 2"]
        assert [r.offset for r in rows[len(before):]] == [log_end, log_end + 1]
        assert [seen_from_json(json.loads(line)) for line in opened.read().splitlines()] == rows
        opened.close()
        last = rows[-1].offset
        assert (m.path / "txn" / "0" / "offset" / str(last)).read_bytes() == b"appended 2\n"
    finally:
        assert m.stop() == 0, m.log()


def test_aborted_transactions_are_those_the_broker_indexed(scenario: Scenario):
    """engine/transactions derives from the markers what Kafka wrote to its .txnindex files."""
    log_dir = scenario.broker.log_dir
    before = hash_tree(log_dir)
    manager = LogManager(BrokerConfig(log_dirs=[str(log_dir)], isolation_level="read_committed"), read_only=True)
    manager.startup()
    try:
        for p in scenario.topics["txn"]:
            pdir = log_dir / f"txn-{p}"
            indexed = []
            for name in sorted(n for n in os.listdir(pdir) if n.endswith(".txnindex")):
                raw = (pdir / name).read_bytes()
                for i in range(0, len(raw), 34):   # version, producer id, first, last, last stable offset
                    _, producer_id, first, last, _ = struct.unpack_from(">hqqqq", raw, i)
                    indexed.append((producer_id, first, last))
            state = transactions.read_committed_state(log_of(manager, TopicPartition("txn", p)))
            assert state is not None                # the log holds transactions
            assert indexed
            assert [tuple(a) for a in state.aborted_transactions()] == indexed
    finally:
        manager.shutdown()
    assert hash_tree(log_dir) == before


def test_logfs_dump_log_prints_what_kafka_dump_log_prints_for_broker_files(scenario: Scenario, tmp_path: Path):
    """Broker-written files: transaction markers, KIP-534 horizons, producer ids, headers, binary payloads,
    and the broker's aborted-transaction indexes and producer-state snapshots."""
    log_dir = scenario.broker.log_dir
    files = [str(log_dir / f"{topic}-{p}" / name)
             for topic in ("codecs", "txn", "compacted", "appendtime") for p in scenario.topics[topic]
             for name in sorted(os.listdir(log_dir / f"{topic}-{p}"))
             if name.endswith((".log", ".index", ".timeindex", ".txnindex", ".snapshot"))]
    kafka = run_tool("org.apache.kafka.tools.DumpLogSegments", "--deep-iteration", "--print-data-log",
                     "--files", ",".join(files), base=tmp_path)
    ours = subprocess.run([str(LOGFS), "dump-log", *files, "--print-data-log"], capture_output=True, timeout=300)
    kafka_lines = kafka.stdout.decode().splitlines()
    assert any("endTxnMarker: ABORT" in line for line in kafka_lines)
    assert any("deleteHorizonMs: OptionalLong[" in line for line in kafka_lines)
    assert any(line.startswith("version: 0 producerId: ") for line in kafka_lines)       # .txnindex
    assert any(line.startswith("producerId: ") for line in kafka_lines)                  # .snapshot
    for k, o in zip(kafka_lines, ours.stdout.decode().splitlines()):
        assert o == k
    assert len(ours.stdout.decode().splitlines()) == len(kafka_lines)


def test_consumer_offsets_topic_mounts_as_a_topic(scenario: Scenario):
    """The broker-written __consumer_offsets topic (50 partitions) reads as any topic."""
    expected = scenario.uncommitted["__consumer_offsets"]
    assert len(expected) == 50
    m = _mount(scenario.broker, "mnt-groups")
    try:
        _check_all_views(m, {"__consumer_offsets": expected})
    finally:
        assert m.stop() == 0, m.log()


def test_killed_broker_dir_mounts_read_only_recovering_in_memory(scenario: Scenario):
    """kill -9: no clean-shutdown marker; the read-only mount recovers in memory and writes nothing."""
    broker = scenario.broker
    broker.start()
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="zstd", acks="all")
    for i in range(100):
        producer.send("codecs", key=b"after-%d" % i, value=b"written before the crash %d" % i, partition=i % 5,
                      headers=[("crash", b"1")])
    producer.flush()
    producer.close()
    expected = {"codecs": consume_all(broker.bootstrap, "codecs")}
    for p in range(len(CODECS)):
        assert len(expected["codecs"][p]) == len(scenario.uncommitted["codecs"][p]) + 20
    broker.kill()
    assert not (broker.log_dir / ".kafka_cleanshutdown").exists()
    before = hash_tree(broker.log_dir)
    m = _mount(broker, "mnt-killed")
    try:
        _check_all_views(m, expected)
    finally:
        assert m.stop() == 0, m.log()
    assert hash_tree(broker.log_dir) == before, "a read-only mount changed the killed broker's data directory"
