"""A mount of a real 3-node Kafka cluster (issue 20, SPEC.md section 10).

One cluster for the module (tests/kafka_cluster.py: KRaft, replication factor
3, ``min.insync.replicas=2``); each test mounts it with ``logfs mount
--bootstrap-server`` and drives the mount with real tools and files, Spark
and scripts/pipeline.py included (those tests carry the ``spark`` marker too).
The tests that stop brokers run last and leave the cluster whole again.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import re
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT, Mount, MountFactory
from tests.helpers import direct_read, wait_for
from tests.spark_util import append_lines, records_jsonl, run_pipeline

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from tests.kafka_cluster import KafkaCluster

pytestmark = [pytest.mark.cluster, pytest.mark.kafka, pytest.mark.mount]

_TIMESTAMP = re.compile(rb'"timestamp":[0-9]+,"timestampType":[01]')


def normalised(jsonl: bytes) -> bytes:
    """records.jsonl with the timestamps blanked: a topic the mount creates is CreateTime, so a plain line
    carries the mount's clock at produce time, where an embedded mount stamps it LogAppendTime at the append
    (docs/cluster.md); everything else is compared byte for byte."""
    return _TIMESTAMP.sub(b'"timestamp":0,"timestampType":0', jsonl)


@pytest.fixture
def cluster_mount(kafka_cluster: KafkaCluster, logfs_mount: MountFactory) -> Callable[..., Mount]:
    """Factory: a started mount of the module's cluster (``options``: more ``-o`` settings)."""
    def make(options: dict[str, str] | None = None, name: str = "c") -> Mount:
        return logfs_mount(options, name=name, extra_args=["--bootstrap-server", kafka_cluster.bootstrap])
    return make


def _admin(cluster: KafkaCluster):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def _consume(cluster: KafkaCluster, topic: str, partition: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record a Kafka consumer reads from the partition, log start to end."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "logfs-test-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        consumer.assign([TopicPartition(topic, partition, low)])
        out: list[tuple[int, bytes | None, bytes | None]] = []
        while (out[-1][0] + 1 if out else low) < high:
            msg = consumer.poll(10)
            assert msg is not None, f"consumer got nothing more after {out[-1:]} (high watermark {high})"
            assert msg.error() is None, msg.error()
            offset = msg.offset()
            assert offset is not None               # a consumed record has its offset
            out.append((offset, msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


# --------------------------------------------------------------------------- same bytes as an embedded mount


def test_every_view_matches_an_embedded_mount(cluster_mount, logfs_mount, kafka_cluster: KafkaCluster) -> None:
    """The same writes to an embedded mount and a cluster mount give the same bytes in every view."""
    options = {"num.partitions": "3"}
    embedded = logfs_mount(options, name="e")
    cluster = cluster_mount(options)
    writes = [b"alpha\n", b"beta\ngamma\n", "ünïcödé line\n".encode(), b"\n", b'quote " and \\ backslash\n',
              b"\x01\x02 control\n"] + [b"line %d\n" % i for i in range(50)]
    keyed = [b"k1\tv1\n", b"k2\tv2\nk3\tv3\n", b"k1\tv4\n", b"k9\tnull-me\n"]
    for m in (embedded, cluster):
        (m / "t").mkdir()
        assert sorted(os.listdir(m / "t")) == sorted(os.listdir(embedded / "t"))
        for data in writes:
            with open(m / "t/0/append", "ab", buffering=0) as f:
                f.write(data)
            # read-your-writes: the records are there as soon as write() returned
            assert (m / "t/0/records").read_bytes().endswith(data if data != b"\n" else b"\n")
        with open(m / "t/config", "a") as f:        # >>: added to the overrides (CreateTime stays)
            f.write("parse.key=true\nnull.marker=null-me\n")
        for data in keyed:
            with open(m / "t/append", "ab", buffering=0) as f:
                f.write(data)
        with open(m / "t/1/append.jsonl", "ab", buffering=0) as f:
            f.write(b'{"key":"a","value":"from json","headers":[{"key":"h","value":"x"}]}\n'
                    b'{"key":null,"value":null}\n{"valueEncoding":"base64","value":"AAEC"}\n')
    for p in range(3):
        for view in ("records", "offset/0", "from/1"):
            path = f"t/{p}/{view}"
            if not (embedded / path).exists():
                assert not (cluster / path).exists(), path
                continue
            assert (cluster / path).read_bytes() == (embedded / path).read_bytes(), path
        for view in ("records.jsonl", "from/1.jsonl"):
            path = f"t/{p}/{view}"
            if (embedded / path).exists():
                assert normalised((cluster / path).read_bytes()) == normalised((embedded / path).read_bytes()), path
    records = (cluster / "t/0/records").read_bytes()
    assert records.startswith(b"".join(writes))
    for n in (0, 3, 55):
        assert (cluster / f"t/0/offset/{n}").read_bytes() == (embedded / f"t/0/offset/{n}").read_bytes()
    # the cluster holds what the mount shows: a Kafka consumer reads the same values
    assert [v for _, _, v in _consume(kafka_cluster, "t", 0)] == records.split(b"\n")[:-1]


@pytest.mark.parametrize("mode", [["--page-cache"], []], ids=["page-cache", "direct-io"])
def test_read_committed_views_of_the_cluster_end_at_the_last_stable_offset(
        kafka_cluster: KafkaCluster, logfs_mount, mode: list[str]) -> None:
    """-o isolation.level=read_committed on a cluster mount reads as a read_committed consumer does: up to
    the last stable offset.  Records at and after an open transaction's first record (a later
    non-transactional one too) are held back while it is open, even in a view read meanwhile (and kept
    open by a follower); after its COMMIT marker is replicated they appear, after its ABORT marker its
    records never do and the later ones appear.  The page cache serves what an O_DIRECT read serves."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    topic = "rc-" + ("cached" if mode else "direct")
    m = logfs_mount({"isolation.level": "read_committed"}, name="c",
                    extra_args=["--bootstrap-server", kafka_cluster.bootstrap, *mode])
    admin = _admin(kafka_cluster)       # held: the future fails if the client is collected first
    admin.create_topics([NewTopic(topic, 1)])[topic].result()
    records: Path = m / topic / "0" / "records"
    wait_for(lambda: records.exists(), "a topic created on the cluster to show up")
    plain = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all"})
    txn = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": f"logfs-{topic}"})
    txn.init_transactions(60)

    def produce(producer, *values: bytes) -> None:
        for v in values:
            producer.produce(topic, v, partition=0)
        assert producer.flush(30) == 0

    def replicated(log_end: int) -> None:
        wait_for(lambda: json.loads((m / topic / "0" / "state").read_bytes())["log_end_offset"] >= log_end,
                 f"the replica to reach offset {log_end}")

    def shows(expected: bytes) -> bool:
        return records.read_bytes() == direct_read(records) == expected

    def missing(offset: int) -> bool:
        with pytest.raises(OSError) as err:
            (m / topic / "0" / "offset" / str(offset)).read_bytes()
        return err.value.errno == errno.ENOENT

    follower = open(records, "rb")      # a reader following the file (tail -f), open all along
    try:
        produce(plain, b"plain-0")                    # 0
        replicated(1)
        assert shows(b"plain-0\n")
        assert follower.read() == b"plain-0\n"
        txn.begin_transaction()
        produce(txn, b"txn-0", b"txn-1")              # 1, 2
        produce(plain, b"plain-1")                    # 3: behind the open transaction
        replicated(4)
        assert shows(b"plain-0\n")
        assert follower.read() == b""
        assert missing(1)
        assert missing(3)
        txn.commit_transaction(60)                    # the COMMIT marker: 4
        replicated(5)
        assert shows(b"plain-0\ntxn-0\ntxn-1\nplain-1\n")
        assert follower.read() == b"txn-0\ntxn-1\nplain-1\n"
        assert (m / topic / "0" / "offset" / "3").read_bytes() == b"plain-1\n"
        txn.begin_transaction()
        produce(txn, b"aborted-0")                    # 5
        produce(plain, b"plain-2")                    # 6: behind the open transaction
        replicated(7)
        assert shows(b"plain-0\ntxn-0\ntxn-1\nplain-1\n")
        assert follower.read() == b""
        txn.abort_transaction(60)                     # the ABORT marker: 7
        replicated(8)
        assert shows(b"plain-0\ntxn-0\ntxn-1\nplain-1\nplain-2\n")
        assert follower.read() == b"plain-2\n"
        assert b"aborted" not in (m / topic / "0" / "records.jsonl").read_bytes()
        assert missing(5)
    finally:
        follower.close()


# --------------------------------------------------------------------------- admin operations


def test_admin_operations_act_on_the_cluster(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka.admin import ConfigResource

    m = cluster_mount()
    admin = _admin(kafka_cluster)
    (m / "adm").mkdir()
    md = admin.list_topics("adm", timeout=10).topics["adm"]
    assert len(md.partitions) == 1
    assert len(md.partitions[0].replicas) == 3                               # the cluster's defaults
    with pytest.raises(FileExistsError):
        (m / "adm").mkdir()
    (m / "adm/1").mkdir()
    assert len(admin.list_topics("adm", timeout=10).topics["adm"].partitions) == 2
    assert sorted(os.listdir(m / "adm")).count("1") == 1
    # config: IncrementalAlterConfigs; the broker's refusal is EINVAL with its message in the log
    resource = ConfigResource(ConfigResource.Type.TOPIC, "adm")
    assert "message.timestamp.type=CreateTime" in (m / "adm/config").read_text().splitlines()
    (m / "adm/config").write_text("retention.ms=86400000\n")

    def retention_ms() -> str:
        return str(admin.describe_configs([resource])[resource].result()["retention.ms"].value)

    # the controller committed it when the write returned; the broker that answers DescribeConfigs applies
    # the metadata record soon after (KRaft propagates it asynchronously)
    wait_for(lambda: retention_ms() == "86400000", "the new retention.ms described by the cluster")
    with pytest.raises(OSError) as refused:
        (m / "adm/config").write_text("retention.ms=soon\n")
    assert refused.value.errno == errno.EINVAL
    assert "Invalid value soon for configuration retention.ms" in m.log()
    assert retention_ms() == "86400000"
    # DeleteRecords and a tombstone
    with open(m / "adm/0/append", "ab", buffering=0) as f:
        for i in range(6):
            f.write(b"r%d\n" % i)
    (m / "adm/0/delete").write_text("before 4\n")
    assert (m / "adm/0/records").read_bytes() == b"r4\nr5\n"
    consumer_low = _consume(kafka_cluster, "adm")[0][0]
    assert consumer_low == 4
    (m / "adm/0/delete").write_text("key gone\n")
    assert _consume(kafka_cluster, "adm")[-1] == (6, b"gone", None)
    tombstone = '"key":"gone","keyEncoding":"utf8","value":null,"valueEncoding":null'
    assert tombstone in (m / "adm/0/records.jsonl").read_text()
    # DeleteTopics
    os.rmdir(m / "adm")
    assert "adm" not in os.listdir(m.path)
    wait_for(lambda: "adm" not in admin.list_topics(timeout=10).topics, "adm deleted on the cluster")


# --------------------------------------------------------------------------- topics changed behind the mount


def test_topic_deleted_and_recreated_behind_the_mount(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    m = cluster_mount()
    admin = _admin(kafka_cluster)

    def produce(values: list[bytes]) -> None:
        producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all"})
        for v in values:
            producer.produce("behind", v, partition=0)
        assert producer.flush(30) == 0

    admin.create_topics([NewTopic("behind", 1)])["behind"].result()
    wait_for(lambda: (m / "behind").exists(), "a topic created on the cluster to show up")
    produce([b"old-%d" % i for i in range(20)])
    wait_for(lambda: (m / "behind/0/records").read_bytes().count(b"\n") == 20, "the old records replicated")
    admin.delete_topics(["behind"])["behind"].result()
    wait_for(lambda: not (m / "behind").exists(), "a topic deleted on the cluster to disappear")
    wait_for(lambda: _create(admin, "behind"), "the topic recreated (the cluster finishes the deletion first)")
    produce([b"new-%d" % i for i in range(5)])
    wait_for(lambda: (m / "behind/0/records").exists() and
             (m / "behind/0/records").read_bytes() == b"".join(b"new-%d\n" % i for i in range(5)),
             "the recreated topic's records, and none of the old ones", timeout=60)
    assert b"old-" not in (m / "behind/0/records.jsonl").read_bytes()
    assert "Deleting the local replica of topic behind" in m.log()


def _create(admin, topic: str) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic
    try:
        admin.create_topics([NewTopic(topic, 1)])[topic].result()
        return True
    except KafkaException:
        return False


def test_the_replica_survives_kill_9_of_the_mount(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """kill -9 of the mount: the next mount recovers the replica and fetches on from its end, nothing twice."""
    m = cluster_mount()
    (m / "crash").mkdir()
    with open(m / "crash/0/append", "ab", buffering=0) as f:
        for i in range(50):
            f.write(b"c%d\n" % i)
    m.kill()
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": "all"})
    for i in range(50, 60):
        producer.produce("crash", b"c%d" % i, partition=0)
    assert producer.flush(30) == 0
    m.start()
    expected = b"".join(b"c%d\n" % i for i in range(60))
    wait_for(lambda: (m / "crash/0/records").read_bytes() == expected, "the replica caught up after the crash")
    assert [v for _, _, v in _consume(kafka_cluster, "crash")] == expected.split(b"\n")[:-1]


def test_a_replica_whose_partition_metadata_was_lost_is_fetched_again(cluster_mount) -> None:
    """A replica's partition dir is made without fsyncs (the leader holds its records): when a power loss
    takes its ``partition.metadata`` (here: removed while the mount is down), the next mount drops the
    topic's replica, says why, and fetches it again whole, nothing twice."""
    m = cluster_mount()
    (m / "lost").mkdir()
    with open(m / "lost/0/append", "ab", buffering=0) as f:
        for i in range(40):
            f.write(b"l%d\n" % i)
    expected = b"".join(b"l%d\n" % i for i in range(40))
    wait_for(lambda: (m / "lost/0/records").read_bytes() == expected, "the replica holding the writes")
    m.stop()
    (m.data / "lost-0" / "partition.metadata").unlink()
    m.start()
    wait_for(lambda: "its partition.metadata is gone" in m.log(), "the replica dropped, saying why")
    assert (m / "lost/0/records").read_bytes() == expected
    assert (m.data / "lost-0" / "partition.metadata").exists()


def test_one_write_is_one_batch_on_the_cluster(cluster_mount) -> None:
    """The lines of one write() leave as one produce batch, which the broker appends whole or not at all (as an
    embedded mount's write is one batch): the replica holds the leader's batches byte for byte, so it shows it."""
    from engine.records import iter_batches

    m = cluster_mount()
    (m / "atom").mkdir()
    with open(m / "atom/0/append", "ab", buffering=0) as f:
        f.write(b"".join(b"line %05d of one write\n" % i for i in range(5000)))
        f.write(b"x\ny\n")
    data = b"".join(p.read_bytes() for p in sorted((m.data / "atom-0").glob("*.log")))
    assert [(h.base_offset, h.records_count) for _, h in iter_batches(data)] == [(0, 5000), (5000, 2)]
    assert (m / "atom/0/records").read_bytes().endswith(b"line 04999 of one write\nx\ny\n")


def _rewrite_replica_tail(m: Mount, topic: str, start: int, values: list[bytes], epoch: int) -> None:
    """Behind the stopped mount's back: the local replica's records from ``start`` on replaced by ``values``
    stamped with leader epoch ``epoch``, as an old leader's lost history would be."""
    from engine.log import Log
    from engine.records import encode_values
    from tests.helpers import make_config

    target = Log.load(str(m.data / f"{topic}-0"), make_config())
    try:
        target.truncate_to(start)
        data = encode_values(start, values, 1_700_000_000_000)
        target.append_as_follower(data[:12] + epoch.to_bytes(4, "big", signed=True) + data[16:])
        target.flush()
    finally:
        target.close()


def test_a_replica_that_diverged_from_the_leader_is_truncated_by_leader_epoch(
        cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """KIP-320: the fetch's lastFetchedEpoch finds a local tail the leader never had; the replica truncates to
    where their epochs agree and fetches the leader's records, instead of serving the stale ones forever."""
    m = cluster_mount()
    (m / "div").mkdir()
    with open(m / "div/0/append", "ab", buffering=0) as f:
        f.write(b"".join(b"first-%d\n" % i for i in range(5)))        # leader epoch e0
    leader, _ = kafka_cluster.partition_state("div", 0)
    kafka_cluster.node(leader).stop()                                  # controlled shutdown: a new epoch
    try:
        wait_for(lambda: kafka_cluster.partition_state("div", 0)[0] not in (leader, -1), "a new leader", timeout=60)
        with open(m / "div/0/append", "ab", buffering=0) as f:
            f.write(b"".join(b"second-%d\n" % i for i in range(5, 10)))   # epoch e1 > e0
    finally:
        kafka_cluster.node(leader).start()
        kafka_cluster.wait_ready()
    expected = b"".join(b"first-%d\n" % i for i in range(5)) + b"".join(b"second-%d\n" % i for i in range(5, 10))
    assert (m / "div/0/records").read_bytes() == expected
    offsets = [json.loads(line)["offset"] for line in (m / "div/0/records.jsonl").read_text().splitlines()]
    assert offsets == list(range(10))
    m.stop()
    first_epoch = int.from_bytes((m.data / "div-0" / "00000000000000000000.log").read_bytes()[12:16], "big")
    stale = [b"stale-%d" % i for i in range(5, 10)]
    # 1. the old leader's epoch e0 went on past offset 5 here: the leader answers with its diverging epoch
    _rewrite_replica_tail(m, "div", 5, stale, first_epoch)
    m.start()
    assert (m / "div/0/records").read_bytes() == expected
    assert "diverges from the leader after leader epoch" in m.log()
    # 2. an epoch the leader never had: it answers OFFSET_OUT_OF_RANGE inside its own log
    m.stop()
    _rewrite_replica_tail(m, "div", 5, stale, first_epoch + 1000)
    m.start()
    assert (m / "div/0/records").read_bytes() == expected
    assert "holds leader epochs the leader" in m.log()
    assert [v for _, _, v in _consume(kafka_cluster, "div")] == expected.split(b"\n")[:-1]


@pytest.mark.timeout(400)
def test_torture_of_the_local_replica_loses_nothing_the_cluster_acknowledged(
        kafka_cluster: KafkaCluster, tmp_path) -> None:
    """tests/harness/torture.py against a cluster mount: writers, followers, readers and DeleteRecords, the mount
    killed, or over tests/harness/powerloss_fs.py its replica's disk losing power, again and again; after every
    remount each record the cluster acknowledged is served once, in order, with the cluster's log start.
    (The same run with the first-fetch wait of the mount's start taken out reports acknowledged records
    lost and the log start below an acknowledged `before N`: the check bites.)"""
    args = ["--bootstrap-server", kafka_cluster.bootstrap, "--cycles", "8", "--cycle-seconds", "1.5",
            "--writers", "3", "--clean-every", "4", "--seed", "20", "--power-loss", "--power-loss-rate", "0.5",
            "--new-topic-rate", "0.5", "--json", "--work-dir", str(tmp_path)]
    # the topics p, r, c are the harness's: each round gets them fresh
    admin = _admin(kafka_cluster)
    existing = [t for t in ("p", "r", "c") if t in admin.list_topics(timeout=30).topics]
    if existing:
        for future in admin.delete_topics(existing).values():
            future.result()
        wait_for(lambda: not set(existing) & set(admin.list_topics(timeout=30).topics), "the harness's topics gone")
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "harness" / "torture.py"), *args],
                            capture_output=True, text=True, timeout=380)
    out = result.stdout
    summary = json.loads(out[out.index("{"):]) if "{" in out else {}
    output = out + result.stderr[-6000:]
    assert summary, output
    assert summary["lost"] == 0, output
    assert summary["duplicated"] == 0, output
    assert summary["misplaced"] == 0, output
    assert summary["start_went_back"] == 0, output
    assert summary["retention_undone_by_power_loss"] == 0, output
    assert result.returncode == 0, output
    assert summary["cycles"] >= 8, output
    assert summary["acknowledged"] > 500, output
    faults = summary["faults"]
    for crash in ("kill-9", "power-loss"):
        assert sum(n for kind, n in faults.items() if kind.startswith(crash)) >= 1, output
    assert faults.get("delete-records", 0) >= 1, output


# --------------------------------------------------------------------------- consumer groups


def test_groups_are_the_cluster_coordinators(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    m = cluster_mount()
    (m / "grp").mkdir()
    with open(m / "grp/0/append", "ab", buffering=0) as f:
        f.write(b"".join(b"g%d\n" % i for i in range(10)))
    (m / "grp/groups/mountgroup").write_text("0 3\n")

    def describe(group: str) -> dict[int, tuple[str, str]]:
        out = kafka_cluster.tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                                 "--bootstrap-server", kafka_cluster.bootstrap, "--describe", "--group", group)
        rows = {}
        for line in out.splitlines():
            words = line.split()
            if len(words) >= 6 and words[1] == "grp":
                rows[int(words[2])] = (words[3], words[4])     # CURRENT-OFFSET, LOG-END-OFFSET
        return rows

    assert describe("mountgroup")[0] == ("3", "10")
    assert (m / "grp/groups/mountgroup").read_text() == "0 3 10 7\n"
    # consume/<group> reads from the committed offset and commits at close
    assert (m / "grp/0/consume/mountgroup").read_bytes() == b"".join(b"g%d\n" % i for i in range(3, 10))
    assert describe("mountgroup")[0] == ("10", "10")
    # a Kafka consumer's commit shows up in the mount
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "kafkagroup",
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition("grp", 0, 6)], asynchronous=False)
    consumer.close()
    assert (m / "grp/groups/kafkagroup").read_text() == "0 6 10 4\n"
    assert "kafkagroup" in os.listdir(m / "grp/groups")


# --------------------------------------------------------------------------- Spark on a cluster mount
#
# The Spark ``logfs`` source reads the mount's raw ``segments/`` files, which on a cluster mount are the local
# replica's: the leader's batches byte for byte.  It returns what it returns on an embedded mount holding the
# same records, timestamps aside (docs/cluster.md: a plain line is CreateTime on the cluster, LogAppendTime on
# an embedded mount).  Both run on the worker's one SparkSession (tests/spark_util.py).

_COLUMNS = ["key", "value", "topic", "partition", "offset"]




@pytest.mark.spark
def test_pipeline_script_runs_unchanged_on_a_cluster_mount(spark, kafka_cluster: KafkaCluster, logfs_mount,
                                                           tmp_path, monkeypatch) -> None:
    """scripts/pipeline.py, as docs/spark.md runs it, with --mount pointing at a mount of the cluster (batch mode; its
    stream mode reads through the same logfs source, run on an embedded mount by tests/spark/test_spark.py)."""
    m = logfs_mount(name="pipe", extra_args=["--bootstrap-server", kafka_cluster.bootstrap])
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> str:
        return run_pipeline(spark, str(m.path), *args)

    out = run("--source", "cevents", "--sink", "ctotals", "--generate", "400")
    assert "Appended 400 events to topic cevents" in out
    assert "Read 400 events from topic cevents" in out
    events = [json.loads(r["value"]) for r in records_jsonl(str(m.path), "cevents")]
    assert len(events) == 400
    counts = collections.Counter(e["type"] for e in events)
    totals = [json.loads(r["value"]) for r in records_jsonl(str(m.path), "ctotals")]
    assert {t["type"]: t["count"] for t in totals} == counts
    # the sink is on the cluster: a Kafka consumer reads the same aggregates
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "pipeline-check",
                         "enable.auto.commit": False})
    try:
        got = 0
        partitions = sorted(int(n) for n in os.listdir(m / "ctotals") if n.isdigit())
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition("ctotals", p), timeout=30)
            got += high - low
        assert got == len(totals)
    finally:
        consumer.close()


@pytest.mark.spark
def test_spark_source_reads_a_cluster_mount_as_an_embedded_one(spark, kafka_cluster: KafkaCluster,
                                                                logfs_mount) -> None:
    options = {"num.partitions": "2"}
    embedded = logfs_mount(options, name="e")
    cluster = logfs_mount(options, name="c", extra_args=["--bootstrap-server", kafka_cluster.bootstrap])
    rows = {}
    for name, m in (("embedded", embedded), ("cluster", cluster)):
        (m / "sp").mkdir()
        for p in range(2):
            append_lines(str(m.path), "sp", [b"v-%d-%04d" % (p, i) for i in range(300)], partition=p, chunk=50)
        df = spark.read.format("logfs").option("path", str(m.path)).option("subscribe", "sp").load()
        rows[name] = sorted(tuple(r) for r in df.select(*_COLUMNS).collect())
    assert len(rows["cluster"]) == 600
    assert rows["cluster"] == rows["embedded"]


# --------------------------------------------------------------------------- faults


def test_leader_killed_during_appends(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """kill -9 of the partition leader while a writer appends: every acknowledged line there once, in order."""
    m = cluster_mount()
    (m / "ha").mkdir()
    acked: list[int] = []
    failed: list[tuple[int, int | None]] = []
    stop = threading.Event()

    def writer() -> None:
        n = 0
        with open(m / "ha/0/append", "ab", buffering=0) as f:
            while not stop.is_set():
                try:
                    f.write(b"seq-%06d\n" % n)
                    acked.append(n)
                except OSError as exc:
                    failed.append((n, exc.errno))
                n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for(lambda: len(acked) >= 200, "200 acknowledged appends", timeout=60)
        leader, _ = kafka_cluster.partition_state("ha", 0)
        kafka_cluster.node(leader).kill()
        wait_for(lambda: kafka_cluster.partition_state("ha", 0)[0] not in (leader, -1),
                 "a new leader", timeout=60)
        mark = len(acked)
        wait_for(lambda: len(acked) >= mark + 200, "200 more acknowledged appends under the new leader",
                 timeout=120)
    finally:
        stop.set()
        thread.join(timeout=120)
    lines = (m / "ha/0/records").read_bytes().split(b"\n")[:-1]
    seqs = [int(line[4:]) for line in lines]
    assert len(seqs) == len(set(seqs)), "a record appears twice"
    assert seqs == sorted(seqs), "records out of order"
    missing = set(acked) - set(seqs)
    assert not missing, f"acknowledged records lost: {sorted(missing)[:10]}"
    assert all(code in (errno.EIO, errno.ETIMEDOUT) for _, code in failed), failed
    # the cluster agrees with the mount
    assert [v for _, _, v in _consume(kafka_cluster, "ha")] == lines
    # the killed broker comes back and catches up (the next tests want the whole cluster)
    kafka_cluster.node(leader).start()
    kafka_cluster.wait_ready()
    wait_for(lambda: len(kafka_cluster.partition_state("ha", 0)[1]) == 3, "the ISR whole again", timeout=120)


def test_cluster_unreachable(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """All brokers down: reads of the replica go on, writes fail in bounded time, service resumes by itself."""
    m = cluster_mount({"delivery.timeout.ms": "5000"})
    (m / "down").mkdir()
    with open(m / "down/0/append", "ab", buffering=0) as f:
        f.write(b"before\n")
    kafka_cluster.stop()        # every node at once: one by one, the last would wait for a quorum that is gone
    try:
        result = subprocess.run(["bash", "-c", "echo during >> down/0/append"], cwd=m.path, capture_output=True,
                                timeout=60)
        assert result.returncode != 0
        assert re.search(rb"(Connection timed out|Input/output error)", result.stderr), result.stderr
        assert kafka_cluster.bootstrap.split(",")[0] in m.log()
        wait_for(lambda: "cannot be reached" in m.log(), "the mount to log that the cluster is unreachable",
                 timeout=60)
        # a request made on the mount's request thread fails fast instead of stalling the mount
        config = subprocess.run(["cat", "down/config"], cwd=m.path, capture_output=True, timeout=60)
        assert config.returncode != 0, config.stderr
        assert b"Connection timed out" in config.stderr, config.stderr
        assert (m / "down/0/records").read_bytes() == b"before\n"
        assert "before" in (m / "down/0/records.jsonl").read_text()
    finally:
        for node in kafka_cluster.nodes:
            node.start()
        kafka_cluster.wait_ready()

    def write_again() -> bool:
        return subprocess.run(["bash", "-c", "echo after >> down/0/append"], cwd=m.path,
                              capture_output=True, timeout=60).returncode == 0
    wait_for(write_again, "a write to succeed once the cluster is back", timeout=120, interval=1.0)
    assert (m / "down/0/records").read_bytes().endswith(b"after\n")


# ----------------------------------------------------------------------- docs/cluster.md, as written


def test_readme_cluster_section_runs_as_written(kafka_cluster: KafkaCluster, tmp_path) -> None:
    """The first ```sh block of "Mounting a Kafka cluster" (docs/cluster.md), against this cluster."""
    from tests.conftest import ROOT
    from tests.docs import doc_section
    section = doc_section("Mounting a Kafka cluster")
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "no ```sh block in the section"
    body = block.group(1)
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        else:
            commands[-1][1].append(line)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    background: list[subprocess.Popen[bytes]] = []
    try:
        for command, expected in commands:
            command = command.replace("broker1:9092,broker2:9092,broker3:9092", kafka_cluster.bootstrap)
            if command.endswith("&"):
                background.append(subprocess.Popen(["bash", "-c", command], cwd=tmp_path))
                continue
            result = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, timeout=120)
            assert result.returncode == 0, (command, result.stderr, (tmp_path / "logfs.log").read_text()[-3000:])
            assert result.stdout.decode().splitlines() == expected, command
    finally:
        if subprocess.run(["mountpoint", "-q", str(tmp_path / "mnt")]).returncode == 0:
            subprocess.run(["fusermount3", "-u", str(tmp_path / "mnt")])
        for proc in background:
            assert proc.wait(timeout=60) == 0, (tmp_path / "logfs.log").read_text()[-3000:]


# --------------------------------------------------------------------------- refused at start


def test_a_mount_of_an_unreachable_cluster_or_a_bad_setting_exits_naming_it(logfs_mount) -> None:
    closed = "127.0.0.1:1"
    m = logfs_mount({"delivery.timeout.ms": "3000"}, name="u", extra_args=["--bootstrap-server", closed],
                    start=False)
    with pytest.raises(RuntimeError, match="exited with 1"):
        m.start()
    m.proc = None           # refused at start, as expected: nothing to unmount
    assert f"Cannot mount the Kafka cluster at {closed}" in m.log()
    bad = logfs_mount({"no.such.client.setting": "1"}, name="b", extra_args=["--bootstrap-server", closed],
                      start=False)
    with pytest.raises(RuntimeError, match="exited with 2"):    # refused before connecting (client_settings)
        bad.start()
    bad.proc = None
    assert "Invalid configuration: Unsupported Kafka client setting no.such.client.setting" in bad.log()
