"""A cluster mount on a cluster that changes (issue 33): complete first reads, and the cluster's own changes.

One 3-node cluster for the module (tests/kafka_cluster.py).  Topics are filled
and changed with Kafka's own tools (ProducerPerformance, TopicCommand), as an
operator would, and read through fresh mounts with ``cat`` and ``wc``:

* a first read returns every record committed when it opened, whatever the
  replica had fetched (partitions larger than one fetch, plain, lz4 and zstd);
* partitions added with ``kafka-topics --alter`` are read and written at once;
* a topic deleted and recreated with ``kafka-topics`` (after leader changes, so
  the old topic's leader epochs are above the new one's) is read and written
  within seconds, with nothing of the old topic, and ``tail -F`` follows it;
* a partition never read fails with ETIMEDOUT while the cluster is away.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
from typing import TYPE_CHECKING

import pytest

from tests.helpers import wait_for

if TYPE_CHECKING:
    from pathlib import Path

    from tests.kafka_cluster import KafkaCluster

pytestmark = [pytest.mark.cluster, pytest.mark.kafka, pytest.mark.mount]

#: records of 100 bytes per one-partition topic: 20 MB, more than the replica fetches in one Fetch (8 MB
#: per partition), so a first read that does not wait for the high watermark is visibly short
BIG_RECORDS = 200_000
#: the records of the many-partition topic, spread by ProducerPerformance's partitioner over its partitions
WIDE_RECORDS, WIDE_PARTITIONS = 300_000, 3
#: the most a change made with Kafka's tools may take to be usable through the mount (metadata.max.age.ms
#: is 2 s, the full listing 10 s)
USABLE_WITHIN_S = 15.0


def _topics(cluster: KafkaCluster, *args: str) -> str:
    return cluster.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", cluster.bootstrap, *args)


def _perf(cluster: KafkaCluster, topic: str, records: int, compression: str) -> None:
    """Kafka's ProducerPerformance: ``records`` random 100-byte values (capital letters, one line each)."""
    out = cluster.tool("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records",
                       str(records), "--record-size", "100", "--throughput", "-1", "--producer-props",
                       f"bootstrap.servers={cluster.bootstrap}", "acks=all", f"compression.type={compression}",
                       "batch.size=65536", "linger.ms=5")
    assert f"{records} records sent" in out, out


def _high_watermarks(cluster: KafkaCluster, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "logfs-test-hw"})
    try:
        md = consumer.list_topics(topic, timeout=30)
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in sorted(md.topics[topic].partitions)]
    finally:
        consumer.close()


def _lines(cmd: str, cwd: Path) -> int:
    """``wc -l`` of a shell pipeline through the mount; the pipeline must succeed (pipefail)."""
    result = subprocess.run(["bash", "-o", "pipefail", "-c", cmd + " | wc -l"], cwd=cwd, capture_output=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


@pytest.fixture(scope="module")
def filled(kafka_cluster: KafkaCluster) -> KafkaCluster:
    """Topics filled by ProducerPerformance: one partition each, plain, lz4 and zstd, and a wider one."""
    for compression in ("none", "lz4", "zstd"):
        _topics(kafka_cluster, "--create", "--topic", f"perf-{compression}", "--partitions", "1",
                "--replication-factor", "1")
        _perf(kafka_cluster, f"perf-{compression}", BIG_RECORDS, compression)
    _topics(kafka_cluster, "--create", "--topic", "perf-wide", "--partitions", str(WIDE_PARTITIONS),
            "--replication-factor", "1")
    _perf(kafka_cluster, "perf-wide", WIDE_RECORDS, "lz4")
    return kafka_cluster


@pytest.fixture
def cluster_mount(kafka_cluster: KafkaCluster, logfs_mount):
    """Factory: a started mount of the module's cluster (``options``: more ``-o`` settings)."""
    def make(options: dict[str, str] | None = None, name: str = "c"):
        return logfs_mount(options, name=name, extra_args=["--bootstrap-server", kafka_cluster.bootstrap])
    return make


# --------------------------------------------------------------------------- first reads


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_a_first_read_returns_every_record_committed_when_it_opened(filled: KafkaCluster, cluster_mount,
                                                                    compression: str) -> None:
    """The issue's ``cat MNT/perf/0/records | wc -l``: 76,220 of 1,000,000 with exit 0 on a fresh mount."""
    m = cluster_mount(name=f"first-{compression}")
    assert _high_watermarks(filled, f"perf-{compression}") == [BIG_RECORDS]
    assert _lines(f"cat perf-{compression}/0/records", m.path) == BIG_RECORDS
    assert (m.data / f"perf-{compression}-0").is_dir()


def test_a_first_read_of_every_partition_by_glob(filled: KafkaCluster, cluster_mount) -> None:
    """``cat MNT/t/*/records | wc -l``: the shell looks every ``records`` up first, one by one (replicas
    made, fetched together), then cat opens each, which waits for its partition's high watermark."""
    m = cluster_mount(name="glob")
    high_watermarks = _high_watermarks(filled, "perf-wide")
    assert sum(high_watermarks) == WIDE_RECORDS
    assert all(hw > BIG_RECORDS / 4 for hw in high_watermarks)
    assert _lines("cat perf-wide/*/records", m.path) == WIDE_RECORDS
    # and the JSON view of a partition, first opened by tail, which reads from its end
    last = subprocess.run(["tail", "-n", "1", "perf-wide/1/records.jsonl"], cwd=m.path, capture_output=True,
                          timeout=60, check=True).stdout
    assert json.loads(last)["offset"] == high_watermarks[1] - 1


def test_a_first_read_while_records_are_produced(filled: KafkaCluster, cluster_mount) -> None:
    """Records produced while a fresh mount reads: the read holds at least the high watermark of its open."""
    from confluent_kafka import Producer

    m = cluster_mount(name="moving")
    _topics(filled, "--create", "--topic", "moving", "--partitions", "1", "--replication-factor", "1")
    _perf(filled, "moving", BIG_RECORDS // 2, "none")
    wait_for(lambda: (m.path / "moving").exists(), "the topic listed", timeout=USABLE_WITHIN_S)
    stop = threading.Event()

    def produce() -> None:
        producer = Producer({"bootstrap.servers": filled.bootstrap, "acks": "all", "linger.ms": 5})
        while not stop.is_set():
            for _ in range(200):
                producer.produce("moving", b"m" * 100, partition=0)
            producer.flush(30)
    thread = threading.Thread(target=produce)
    thread.start()
    try:
        wait_for(lambda: _high_watermarks(filled, "moving")[0] > BIG_RECORDS // 2 + 1000, "records coming in",
                 timeout=60)
        before = _high_watermarks(filled, "moving")[0]
        assert _lines("cat moving/0/records", m.path) >= before
    finally:
        stop.set()
        thread.join(timeout=60)


# --------------------------------------------------------------------------- the cluster's own changes


def test_partitions_added_with_kafka_topics_are_usable_within_seconds(kafka_cluster: KafkaCluster,
                                                                       cluster_mount) -> None:
    """The issue's ``kafka-topics --alter --partitions 3``: reading ``grow/1`` and writing
    ``grow/append.jsonl`` failed with EIO for minutes (``Failed to query partition leaders``), on a mount
    that had used the topic before."""
    m = cluster_mount(name="grow")
    _topics(kafka_cluster, "--create", "--topic", "grow", "--partitions", "1")
    wait_for(lambda: (m.path / "grow").exists(), "the topic listed", timeout=USABLE_WITHIN_S)
    with open(m.path / "grow/append.jsonl", "ab", buffering=0) as f:      # librdkafka knows the topic now
        f.write(b'{"value":"before"}\n')
    assert (m.path / "grow/0/records").read_bytes() == b"before\n"
    _topics(kafka_cluster, "--alter", "--topic", "grow", "--partitions", "3")
    wait_for(lambda: (m.path / "grow/2").exists(), "the new partitions listed", timeout=USABLE_WITHIN_S)
    started = time.monotonic()
    assert (m.path / "grow/1/records").read_bytes() == b""
    with open(m.path / "grow/2/append", "ab", buffering=0) as f:
        f.write(b"two\n")
    with open(m.path / "grow/append.jsonl", "ab", buffering=0) as f:
        for i in range(12):         # keys spread by murmur2 over the three partitions
            f.write(b'{"key":"k%d","value":"v%d"}\n' % (i, i))
    assert time.monotonic() - started < USABLE_WITHIN_S
    assert (m.path / "grow/2/records").read_bytes().startswith(b"two\n")
    spread = [(m.path / f"grow/{p}/records").read_bytes().count(b"\nv") + (m.path / f"grow/{p}/records")
              .read_bytes().startswith(b"v") for p in range(3)]
    assert sum(spread) == 12, spread
    assert spread[1] > 0, spread
    assert spread[2] > 0, spread
    assert "Failed to query partition leaders" not in m.log()


def _bump_leader_epoch(cluster: KafkaCluster, topic: str) -> None:
    """A leader change of ``topic``-0 (its replicas reordered, then a preferred leader election), as after
    a broker restart: the old topic's leader epoch is then above a recreated topic's."""
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    partition = admin.list_topics(topic, timeout=30).topics[topic].partitions[0]
    replicas = list(partition.replicas)
    new_order = replicas[1:] + replicas[:1]
    plan = cluster.base / f"{topic}-reassign.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": new_order}]}))
    cluster.tool("org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server",
                 cluster.bootstrap, "--reassignment-json-file", str(plan), "--execute")
    cluster.tool("org.apache.kafka.tools.LeaderElectionCommand", "--bootstrap-server", cluster.bootstrap,
                 "--election-type", "PREFERRED", "--topic", topic, "--partition", "0")
    wait_for(lambda: cluster.partition_state(topic, 0)[0] == new_order[0], "the preferred leader elected",
             timeout=60)


def test_a_topic_recreated_with_kafka_topics_is_the_new_topic_within_seconds(kafka_cluster: KafkaCluster,
                                                                             cluster_mount) -> None:
    """The issue's ``del``: after ``kafka-topics --delete`` and ``--create``, ``cat del/0/records`` and
    ``echo w >> del/0/append`` failed with EIO (UNKNOWN_LEADER_EPOCH) for about 15 minutes, ``ls del/0``
    was empty and ``tail -F`` never followed.  The new topic's records, and none of the old one's."""
    m = cluster_mount(name="del")
    _topics(kafka_cluster, "--create", "--topic", "del", "--partitions", "1")
    wait_for(lambda: (m.path / "del").exists(), "the topic listed", timeout=USABLE_WITHIN_S)
    with open(m.path / "del/0/append", "ab", buffering=0) as f:
        f.write(b"old 1\nold 2\n")
    _bump_leader_epoch(kafka_cluster, "del")
    with open(m.path / "del/0/append", "ab", buffering=0) as f:
        f.write(b"old 3\n")
    tail = subprocess.Popen(["tail", "-F", "-s", "0.2", "del/0/records"], cwd=m.path, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        assert tail.stdout is not None
        assert [tail.stdout.readline() for _ in range(3)] == [b"old 1\n", b"old 2\n", b"old 3\n"]
        _topics(kafka_cluster, "--delete", "--topic", "del")
        wait_for(lambda: "Created topic del" in _topics_create_quietly(kafka_cluster, "del"),
                 "the topic recreated (the cluster finishes the deletion first)", timeout=60)
        started = time.monotonic()

        def written() -> bool:
            result = subprocess.run(["bash", "-c", "echo w >> del/0/append"], cwd=m.path, capture_output=True,
                                    timeout=60)
            return result.returncode == 0
        wait_for(written, "a write to the recreated topic", timeout=USABLE_WITHIN_S, interval=0.5)
        assert (m.path / "del/0/records").read_bytes() == b"w\n"
        assert "records" in os.listdir(m.path / "del/0")
        assert time.monotonic() - started < USABLE_WITHIN_S
        assert tail.stdout.readline() == b"w\n"         # tail -F reopened the new topic's records
    finally:
        tail.kill()
        tail.communicate()
    assert [v for _, v in _consume(kafka_cluster, "del")] == [b"w"]
    assert "Deleting the local replica of topic del" in m.log()
    assert "UNKNOWN_LEADER_EPOCH" not in m.log()


def _topics_create_quietly(cluster: KafkaCluster, topic: str) -> str:
    from tests.jvm import run_tool
    result = run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", cluster.bootstrap, "--create",
                      "--topic", topic, "--partitions", "1", check=False, base=cluster.base)
    return result.stdout.decode(errors="replace")


def _consume(cluster: KafkaCluster, topic: str) -> list[tuple[int, bytes | None]]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "logfs-test-changes",
                         "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.assign([TopicPartition(topic, 0, low)])
        out: list[tuple[int, bytes | None]] = []
        while (out[-1][0] + 1 if out else low) < high:
            msg = consumer.poll(10)
            assert msg is not None, msg and msg.error()
            assert msg.error() is None, msg and msg.error()
            offset = msg.offset()
            assert offset is not None               # a consumed record has its offset
            out.append((offset, msg.value()))
        return out
    finally:
        consumer.close()


# --------------------------------------------------------------------------- the whole cluster away (last)


def test_a_partition_never_read_fails_with_etimedout_in_an_outage(kafka_cluster: KafkaCluster,
                                                                   cluster_mount) -> None:
    """Every broker stopped: a partition the mount holds no replica of cannot be read (ETIMEDOUT, as the
    docs say, within seconds), while one it holds is served."""
    m = cluster_mount(name="outage")
    _topics(kafka_cluster, "--create", "--topic", "away", "--partitions", "2")
    wait_for(lambda: (m.path / "away/1").exists(), "the topic listed", timeout=USABLE_WITHIN_S)
    with open(m.path / "away/0/append", "ab", buffering=0) as f:
        f.write(b"held\n")
    for node in kafka_cluster.nodes:
        node.kill()
    try:
        wait_for(lambda: "cannot be reached" in m.log(), "the mount to see the outage", timeout=60)
        assert (m.path / "away/0/records").read_bytes() == b"held\n"
        started = time.monotonic()
        with pytest.raises(OSError) as raised:
            (m.path / "away/1/records").read_bytes()
        assert raised.value.errno == errno.ETIMEDOUT, raised.value
        assert time.monotonic() - started < 10
    finally:
        for node in kafka_cluster.nodes:
            node.start()
        kafka_cluster.wait_ready()
    wait_for(lambda: (m.path / "away/1/records").read_bytes() == b"", "the partition read once the cluster is back",
             timeout=60, interval=1.0)
