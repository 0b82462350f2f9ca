"""A cluster mount through what a company cluster does to it (issue 25): outages, leader moves, other clients.

Its own 3-node cluster (tests/kafka_cluster.py), fresh at the first test: the
first group write then meets a group coordinator that is still loading.  The
tests that kill brokers run last and leave the cluster whole again.
"""

from __future__ import annotations

import argparse
import errno
import json
import re
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.harness import outage_round
from tests.helpers import wait_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import Mount, MountFactory
    from tests.kafka_cluster import KafkaCluster

pytestmark = [pytest.mark.cluster, pytest.mark.kafka, pytest.mark.mount]


@pytest.fixture
def cluster_mount(kafka_cluster: KafkaCluster, logfs_mount: MountFactory) -> Callable[..., Mount]:
    """Factory: a started mount of the module's cluster (``options``: more ``-o`` settings)."""
    def make(options: dict[str, str] | None = None, name: str = "c") -> Mount:
        return logfs_mount(options, name=name, extra_args=["--bootstrap-server", kafka_cluster.bootstrap])
    return make


def _log_lines(text: str) -> list[str]:
    """The lines at INFO or above of a slice of a mount's log."""
    return [line for line in text.splitlines()
            if re.match(r"\[[^]]*\] (INFO|WARNING|ERROR|CRITICAL) ", line)]


def _batches(m: Mount, topic: str, partition: int = 0) -> list[tuple[int, int, int]]:
    """(base offset, records, max timestamp) of every batch of the replica's segments."""
    from engine.records import iter_batches

    data = b"".join(p.read_bytes() for p in sorted((m.data / f"{topic}-{partition}").glob("*.log")))
    return [(h.base_offset, h.records_count, h.max_timestamp) for _, h in iter_batches(data)]


# --------------------------------------------------------------------------- groups (first: a fresh cluster)


def test_the_first_group_write_on_a_fresh_cluster_waits_for_the_loading_coordinator(cluster_mount) -> None:
    """The cluster's first commit finds ``__consumer_offsets`` being created and its coordinator loading
    (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE): asked again, it succeeds.  (With librdkafka's
    ListConsumerGroupOffsets the mount died of SIGSEGV right here.)"""
    m = cluster_mount()
    (m / "fresh").mkdir()
    with open(m / "fresh/0/append", "ab", buffering=0) as f:
        f.write(b"".join(b"f%d\n" % i for i in range(5)))
    (m / "fresh/groups/first").write_text("0 2\n")
    assert (m / "fresh/groups/first").read_text() == "0 2 5 3\n"
    assert m.proc is not None
    assert m.proc.poll() is None


def test_a_group_commit_the_coordinator_refuses_is_ebusy(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """A Kafka consumer holds group H: the coordinator refuses the mount's commits for it per partition
    (UNKNOWN_MEMBER_ID); ``groups/H`` and the close of ``consume/H`` fail with EBUSY, its reason in the log,
    and the cluster keeps the consumer's offset."""
    from confluent_kafka import Consumer, TopicPartition

    m = cluster_mount()
    (m / "held").mkdir()
    with open(m / "held/0/append", "ab", buffering=0) as f:
        f.write(b"".join(b"h%d\n" % i for i in range(200)))
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "H",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["held"])
        wait_for(lambda: consumer.poll(0.5) is not None and bool(consumer.assignment()),
                 "the consumer to join group H and get held-0", timeout=60)
        consumer.commit(offsets=[TopicPartition("held", 0, 5)], asynchronous=False)
        result = m.sh("echo '0 150' > held/groups/H", check=False)
        assert result.returncode != 0, m.log_tail(3000)
        assert b"Device or resource busy" in result.stderr, result.stderr
        assert "Committing offsets for group H: the cluster refused it: the group has 1 active member" in m.log()
        assert consumer.committed([TopicPartition("held", 0)], timeout=30)[0].offset == 5
        assert "Group H committed offsets" not in m.log()
        # consume/H: reads from the consumer's commit; the commit at close is refused the same way
        with pytest.raises(OSError) as refused, open(m / "held/0/consume/H", "rb") as f:
            assert f.read() == b"".join(b"h%d\n" % i for i in range(5, 200))
        assert refused.value.errno == errno.EBUSY
        assert "Committing offsets for group H: the cluster refused it: held-0: UNKNOWN_MEMBER_ID" in m.log()
        assert consumer.committed([TopicPartition("held", 0)], timeout=30)[0].offset == 5
    finally:
        consumer.close()
    # the consumer gone (its group empty), the same write is applied
    wait_for(lambda: m.sh("echo '0 150' > held/groups/H", check=False).returncode == 0,
             "the commit to be accepted once the group is empty", timeout=60, interval=1.0)
    assert (m / "held/groups/H").read_text() == "0 150 200 50\n"


# --------------------------------------------------------------------------- writes


def test_the_first_write_after_a_fresh_mount_is_one_batch(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """``seq 4000 >> append`` as the first write of a fresh mount, to a topic its producer knows nothing of
    yet: one write(), one batch, one LogAppendTime.  It was two (librdkafka's ``batch.num.messages``,
    10,000 records, cut ``seq 25000`` into three; now at its maximum), and still two at times (the records
    waited for the topic's metadata in librdkafka's unassigned queue, and the sender took them as they were
    moved).  Kept well under what librdkafka enqueues within ``linger.ms`` on a loaded machine (11,000 was cut
    once at 7,160 in a full suite run: docs/cluster.md, "one write()")."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    topics = [f"firstw{i}" for i in range(3)]
    for future in admin.create_topics([NewTopic(t, 1, config={"message.timestamp.type": "LogAppendTime"})
                                       for t in topics]).values():
        future.result()
    m = cluster_mount()
    data = subprocess.run(["seq", "4000"], capture_output=True, check=True).stdout
    for topic in topics:       # each the producer's first write to that topic (the split was intermittent)
        wait_for((m / f"{topic}/0").exists, "the topic in the mount")
        with open(m / f"{topic}/0/append", "ab", buffering=0) as f:
            assert f.write(data) == len(data)       # one write() (19 KB: FUSE takes up to 1 MiB at once)
        batches = _batches(m, topic)
        assert [(base, count) for base, count, _ in batches] == [(0, 4000)], (topic, batches)
        stamps = {json.loads(line)["timestamp"] for line in (m / f"{topic}/0/records.jsonl").read_text()
                  .splitlines()}
        assert len(stamps) == 1
        assert (m / f"{topic}/0/records").read_bytes() == data


def test_an_append_jsonl_line_with_a_timestamp_and_no_headers(cluster_mount) -> None:
    """``{"value":..., "timestamp":...}`` without headers: produced (it was EIO: librdkafka's produce_batch
    takes no timestamps), the timestamp kept on a CreateTime topic, the write's records all delivered."""
    m = cluster_mount()
    (m / "stamped").mkdir()
    (m / "stamped/config").write_text("message.timestamp.type=CreateTime\n")
    lines = [{"value": f"v{i}", "timestamp": 1_700_000_000_000 + i} for i in range(50)]
    with open(m / "stamped/0/append.jsonl", "ab", buffering=0) as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines).encode())
    records = [json.loads(line) for line in (m / "stamped/0/records.jsonl").read_text().splitlines()]
    assert [(r["value"], r["timestamp"], r["timestampType"]) for r in records] == \
        [(f"v{i}", 1_700_000_000_000 + i, 0) for i in range(50)]


# --------------------------------------------------------------------------- editors, other clients


def test_vim_deleting_a_config_line_removes_the_setting_on_both_backends(cluster_mount, logfs_mount,
                                                                         kafka_cluster: KafkaCluster) -> None:
    """vim opens ``config`` without O_TRUNC and ``ftruncate(fd, 0)``s it: the text it writes is then the
    whole set of overrides, as after ``>`` (both backends ignored the truncation: the line vim deleted stayed)."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    for m in (logfs_mount(name="e"), cluster_mount()):
        (m / "vimmed").mkdir()
        with open(m / "vimmed/config", "a") as f:
            f.write("retention.ms=100000\nsegment.bytes=1048576\n")
        assert "retention.ms=100000\n" in (m / "vimmed/config").read_text()
        result = subprocess.run(["vim", "-es", "-u", "NONE", "-i", "NONE", "-c", "/^retention.ms=/d", "-c", "wq",
                                 "vimmed/config"], cwd=m.path, capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr
        overrides = [line for line in (m / "vimmed/config").read_text().splitlines() if not line.startswith("#")]
        assert "segment.bytes=1048576" in overrides
        assert not any(o.startswith("retention.ms=") for o in overrides)
    resource = ConfigResource(ConfigResource.Type.TOPIC, "vimmed")
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    entries = admin.describe_configs([resource])[resource].result()
    assert entries["retention.ms"].value != "100000"
    assert entries["segment.bytes"].value == "1048576"


def test_tail_f_of_a_topic_another_client_deletes_ends_with_an_error(cluster_mount,
                                                                    kafka_cluster: KafkaCluster) -> None:
    """``tail -f`` on a topic deleted on the cluster: its next poll gets ENOENT and it stops, and the mount
    logs the deletion once (it went silent, waiting for records that never come)."""
    from confluent_kafka.admin import AdminClient

    m = cluster_mount()
    (m / "gone").mkdir()
    with open(m / "gone/0/append", "ab", buffering=0) as f:
        f.write(b"one\ntwo\n")
    tail = subprocess.Popen(["tail", "-f", "gone/0/records"], cwd=m.path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert tail.stdout is not None
        assert tail.stdout.readline() == b"one\n"
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        admin.delete_topics(["gone"])["gone"].result()
        wait_for(lambda: tail.poll() is not None, "tail -f to stop", timeout=60)
        err = tail.stderr.read() if tail.stderr is not None else b""
        assert b"gone/0/records: No such file or directory" in err, err
    finally:
        if tail.poll() is None:
            tail.kill()
        tail.communicate()     # and its pipes closed
    assert m.log().count("Deleting the local replica of topic gone") == 1


# --------------------------------------------------------------------------- log lines of a leader change


def test_a_leader_kill_logs_one_line_not_one_per_partition(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """kill -9 of a broker leading many partitions: the mount logs the move once per metadata change, not a
    line per partition, and no traceback."""
    m = cluster_mount({"num.partitions": "30"})
    (m / "many").mkdir()
    for p in range(30):     # replicas are made on first use: the mount follows the leaders of those it holds
        assert (m / f"many/{p}/records").read_bytes() == b""
    leaders = {p: kafka_cluster.partition_state("many", p)[0] for p in range(30)}
    victim = max(set(leaders.values()), key=list(leaders.values()).count)
    moved = [p for p, leader in leaders.items() if leader == victim]
    assert len(moved) >= 5, leaders
    mark = len(m.log())
    kafka_cluster.node(victim).kill()
    try:
        wait_for(lambda: all(kafka_cluster.partition_state("many", p)[0] not in (victim, -1) for p in moved),
                 "new leaders for the killed broker's partitions", timeout=60)
        wait_for(lambda: "Partition leaders moved" in m.log()[mark:], "the mount to see the move", timeout=30)
        with open(m / f"many/{moved[0]}/append", "ab", buffering=0) as f:
            f.write(b"after the move\n")
        assert (m / f"many/{moved[0]}/records").read_bytes() == b"after the move\n"
    finally:
        kafka_cluster.node(victim).start()
        kafka_cluster.wait_ready()
    lines = _log_lines(m.log()[mark:])
    assert len(lines) <= 4, "\n".join(lines)
    assert "Traceback" not in m.log()


# --------------------------------------------------------------------------- the whole cluster away (last)


@pytest.mark.timeout(600)
def test_an_outage_round_the_mount_survives(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """tests/harness/outage_round.py's round: every broker killed for 60 s while readers read ``config`` and
    ``groups/``, admin changes and a write are in flight, then back.  The mount lives on (it died of
    librdkafka's coordinator admin requests: SIGSEGV, or ``Assertion 'eonce->refcnt > 0'``), a write
    succeeds within a minute of the return, and the outage costs a few log lines, no traceback."""
    m = cluster_mount()
    outage_round.prepare(kafka_cluster, m)
    args = argparse.Namespace(down_seconds=60.0, after_seconds=20.0, max_log_lines=8)
    result = outage_round.run_round(1, kafka_cluster, m, args)
    assert result.alive, m.log_tail(4000)
    assert result.write_back_s is not None, result
    assert result.write_back_s <= outage_round.WRITE_BACK_WITHIN_S, result
    assert result.tracebacks == 0, (result, m.log_tail(6000))
    assert result.log_lines <= args.max_log_lines, (result, m.log_tail(6000))
    # reads of the replica went on throughout; requests to the cluster failed with ETIMEDOUT, never hung
    assert result.reads.get("records: ok", 0) > 0, result
    assert not any(k.endswith(": hung") for k in result.reads), result
    assert any("Connection timed out" in k for k in result.reads), result.reads
    assert "cannot be reached" in m.log()
    assert "answers again after" in m.log()
    assert subprocess.run(["cat", "t/groups/g"], cwd=m.path, capture_output=True, timeout=60).returncode == 0
