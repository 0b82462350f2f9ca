"""A cluster mount costs what is read, not what the cluster holds (issue 25, "Everything, from the beginning").

One 3-node cluster for the module (tests/kafka_cluster.py); each test mounts it
with ``logfs mount --bootstrap-server`` and checks, on the real mount and its
data dir: ``--topics`` lists and replicates only the matching topics;
``--from`` starts a new replica at the log start, the end or a time; a
partition's replica (its local dir, files and fetch) exists only once something
under its directory was opened; the replica's own retention holds with plain
segment rolls; ``offset/N`` below the replica's log start is read from the
cluster; a mount of a few hundred partitions keeps few descriptors open.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import time
from typing import TYPE_CHECKING

import pytest

from tests.helpers import JsonObject, wait_for

if TYPE_CHECKING:
    from pathlib import Path

    from tests.kafka_cluster import KafkaCluster

pytestmark = [pytest.mark.cluster, pytest.mark.kafka, pytest.mark.mount]

DAY_MS = 86_400_000
#: CreateTime of the two halves of topic "when" (in the past: brokers refuse timestamps far ahead)
FIRST_HALF_MS = int(time.time() * 1000) - 2 * DAY_MS
SECOND_HALF_MS = FIRST_HALF_MS + DAY_MS
#: the partitions of the "wide" topics (scale test); replication factor 1 to spare the brokers
WIDE_TOPICS, WIDE_PARTITIONS = 6, 50
#: records of about 1 KB in topic "ret": about 5 MB
RET_RECORDS = 5000


def _admin(cluster: KafkaCluster):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def _create(cluster: KafkaCluster, topics: dict[str, tuple[int, int]]) -> None:
    """Create ``name -> (partitions, replication factor)`` and wait until every partition has a leader."""
    from confluent_kafka.admin import NewTopic
    admin = _admin(cluster)
    futures = admin.create_topics([NewTopic(name, partitions, replication)
                                   for name, (partitions, replication) in topics.items()], request_timeout=120)
    for future in futures.values():
        future.result(timeout=180)

    def all_led() -> bool:
        md = admin.list_topics(timeout=30)
        return all(name in md.topics and len(md.topics[name].partitions) == topics[name][0]
                   and all(p.leader >= 0 for p in md.topics[name].partitions.values()) for name in topics)
    wait_for(all_led, "leaders for every created partition", timeout=180, interval=0.5)


def _produce(cluster: KafkaCluster, topic: str, values: list[bytes], *, partition: int = 0,
             timestamp: int | None = None) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20})
    for i, value in enumerate(values):
        if timestamp is None:
            producer.produce(topic, value, partition=partition)
        else:
            producer.produce(topic, value, partition=partition, timestamp=timestamp + i)
    assert producer.flush(60) == 0


@pytest.fixture(scope="module")
def topics(kafka_cluster: KafkaCluster) -> KafkaCluster:
    """The module's topics, with their records, made once."""
    _create(kafka_cluster, {"sel-a": (1, 3), "sel-b": (2, 3), "sel-ab": (1, 3), "other": (1, 3), "when": (1, 3),
                            "lazy": (4, 3), "ret": (1, 3),
                            **{f"wide-{i}": (WIDE_PARTITIONS, 1) for i in range(WIDE_TOPICS)}})
    for name in ("sel-a", "sel-ab", "other"):
        _produce(kafka_cluster, name, [f"{name} {i}".encode() for i in range(3)])
    _produce(kafka_cluster, "when", [b"old %d" % i for i in range(10)], timestamp=FIRST_HALF_MS)
    _produce(kafka_cluster, "when", [b"new %d" % i for i in range(10)], timestamp=SECOND_HALF_MS)
    for p in range(4):
        _produce(kafka_cluster, "lazy", [b"lazy %d-%d" % (p, i) for i in range(5)], partition=p)
    _produce(kafka_cluster, "ret", [b"%06d " % i + b"x" * 1000 for i in range(RET_RECORDS)])
    for i in range(WIDE_TOPICS):
        _produce(kafka_cluster, f"wide-{i}", [b"wide %d" % i], partition=i)
    return kafka_cluster


@pytest.fixture
def cluster_mount(topics: KafkaCluster, logfs_mount):
    """Factory: a started mount of the module's cluster with more arguments and ``-o`` settings."""
    def make(*args: str, options: dict[str, str] | None = None, name: str = "c"):
        return logfs_mount(options, name=name, extra_args=["--bootstrap-server", topics.bootstrap, *args])
    return make


def _replicas(data: Path) -> set[str]:
    """The partition dirs of the local replica (``topic-N``)."""
    return {p.name for p in data.iterdir() if p.is_dir() and p.name.rpartition("-")[2].isdigit()}


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _open_sockets(pid: int) -> int:
    """The process's sockets: connections to brokers come and go (first fetches, ListOffsets)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass
    return count


def test_topics_lists_and_replicates_only_whole_name_matches(cluster_mount) -> None:
    m = cluster_mount("--topics", "sel-.")
    mnt = m.path
    assert sorted(os.listdir(mnt)) == [".logfs", "sel-a", "sel-b"]      # not sel-ab (whole name), not other
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "other")
    assert (mnt / "sel-a" / "0" / "records").read_bytes() == b"sel-a 0\nsel-a 1\nsel-a 2\n"
    assert _replicas(m.data) == {"sel-a-0"}
    with pytest.raises(OSError) as refused:
        os.mkdir(mnt / "not-selected")
    assert refused.value.errno == errno.EINVAL
    assert "--topics 'sel-.'" in m.log_tail()


def test_from_starts_a_new_replica_at_the_log_start_the_end_or_a_time(cluster_mount, topics) -> None:
    old = b"".join(b"old %d\n" % i for i in range(10))
    new = b"".join(b"new %d\n" % i for i in range(10))
    earliest = cluster_mount(name="earliest")
    assert (earliest.path / "when" / "0" / "records").read_bytes() == old + new
    earliest.stop()

    iso = (datetime.datetime.fromtimestamp(SECOND_HALF_MS // 1000, datetime.UTC)
           + datetime.timedelta(milliseconds=SECOND_HALF_MS % 1000)).isoformat()
    since = cluster_mount("--from", iso, name="time")                   # as since/ takes it
    assert (since.path / "when" / "0" / "records").read_bytes() == new
    assert (since.path / "when" / "0" / "offset" / "3").read_bytes() == b"old 3\n"   # from the cluster
    since.stop()
    epoch = cluster_mount("--from", str(SECOND_HALF_MS + 5), name="epoch")
    assert (epoch.path / "when" / "0" / "records").read_bytes() == new[new.index(b"new 5"):]
    epoch.stop()

    latest = cluster_mount("--from", "latest", name="latest")
    records = latest.path / "when" / "0" / "records"
    assert records.read_bytes() == b""
    assert (latest.path / "when" / "0" / "offset" / "12").read_bytes() == b"new 2\n"      # from the cluster
    _produce(topics, "when", [b"after"])
    wait_for(lambda: records.read_bytes() == b"after\n", "the record produced after the start")
    # a replica already held keeps its start: --from applies to partitions the mount holds no replica of
    latest.stop()
    again = cluster_mount("--from", "latest", name="latest")
    assert (again.path / "when" / "0" / "records").read_bytes() == b"after\n"


def test_a_partition_replica_is_made_on_first_use_only(cluster_mount) -> None:
    m = cluster_mount()
    mnt = m.path
    assert "lazy" in os.listdir(mnt)
    assert sorted(os.listdir(mnt / "lazy"))[:4] == ["0", "1", "2", "3"]
    for p in range(4):
        os.stat(mnt / "lazy" / str(p))
    assert "retention.ms" in (mnt / "lazy" / "config").read_text()
    assert not any(name.startswith("lazy-") for name in _replicas(m.data))    # listing made no replica
    assert (mnt / "lazy" / "2" / "records").read_bytes() == b"".join(b"lazy 2-%d\n" % i for i in range(5))
    assert {name for name in _replicas(m.data) if name.startswith("lazy-")} == {"lazy-2"}
    assert "Replicating partition lazy-2 from offset 0 (--from earliest)" in m.log_tail()


def test_a_topic_without_a_replica_comes_and_goes_with_the_cluster(cluster_mount, topics) -> None:
    m = cluster_mount()
    _create(topics, {"passing": (2, 3)})
    wait_for(lambda: "passing" in os.listdir(m.path), "the new topic listed", timeout=60)
    assert sorted(os.listdir(m.path / "passing"))[:2] == ["0", "1"]
    admin = _admin(topics)          # kept: the future needs its client alive
    admin.delete_topics(["passing"])["passing"].result(timeout=60)

    def gone() -> bool:
        try:
            os.stat(m.path / "passing")
        except FileNotFoundError:
            return "passing" not in os.listdir(m.path)
        return False
    wait_for(gone, "the deleted topic gone from the mount, its cached entry too", timeout=60)
    assert not any(name.startswith("passing-") for name in _replicas(m.data))


def test_the_replicas_own_retention_holds_with_plain_rolls(cluster_mount) -> None:
    """The issue's settings: 1 MB segments and 1 MB per partition (Kafka's smallest log.segment.bytes)."""
    retention = segment = 1 << 20
    m = cluster_mount(options={"log.retention.bytes": str(retention), "log.segment.bytes": str(segment)})
    part = m.path / "ret" / "0"
    os.stat(part / "records")       # first use: the replica fetches about 5 MB

    def local_bytes() -> int:
        return sum(f.stat().st_size for f in (m.data / "ret-0").glob("*.log"))

    def bounded() -> JsonObject:
        state = json.loads((part / "state").read_bytes())      # first: once all is fetched, bytes only go down
        fetched = state["log_end_offset"] == RET_RECORDS and state["log_start_offset"] > 0
        return state if fetched and local_bytes() <= retention + segment else {}
    state = wait_for(bounded, "the replica bounded by log.retention.bytes with every record fetched", timeout=60)
    assert state["log_start_offset"] > 0
    log = m.log()
    assert log.count("Rolled new log segment") >= RET_RECORDS * 1007 // segment
    assert "already exists" not in log
    records = (part / "records").read_bytes().splitlines()
    assert records[0].startswith(b"%06d " % state["log_start_offset"])
    assert records[-1].startswith(b"%06d " % (RET_RECORDS - 1))
    # below the replica's log start: read from the cluster
    assert (part / "offset" / "0").read_bytes() == b"000000 " + b"x" * 1000 + b"\n"
    assert (part / "offset" / "1").read_bytes().startswith(b"000001 ")


def test_a_mount_of_hundreds_of_partitions_keeps_few_files_open(cluster_mount) -> None:
    m = cluster_mount("--topics", "wide-.*")
    assert m.proc is not None
    pid = m.proc.pid
    listed = sum(len([n for n in os.listdir(m.path / t) if n.isdigit()]) for t in os.listdir(m.path)
                 if t.startswith("wide-"))
    assert listed == WIDE_TOPICS * WIDE_PARTITIONS
    before = _open_files(pid)
    assert before < 60, f"{before} descriptors open with no partition read"
    before -= _open_sockets(pid)

    def read(topics: range) -> int:
        for i in topics:
            assert (m.path / f"wide-{i}" / str(i) / "records").read_bytes() == b"wide %d\n" % i
        return _open_files(pid) - _open_sockets(pid)
    # a partition read holds its segment's .log, .index and .timeindex open (sockets apart: connections of
    # first fetches and ListOffsets come and go, a few per broker)
    first = read(range(3))
    assert first - before <= 3 * 4, f"{first - before} more descriptors for the first 3 partitions read"
    more = read(range(3, 6))
    assert more - first <= 3 * 4, f"{more - first} more descriptors for 3 more partitions read"
    assert _open_sockets(pid) < 40, f"{_open_sockets(pid)} sockets open"
    assert _replicas(m.data) == {f"wide-{i}-{i}" for i in range(6)}
