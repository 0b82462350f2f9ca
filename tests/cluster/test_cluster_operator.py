"""A cluster mount through an operator's routine work on the cluster (issue 33, second half).

Its own 3-node cluster (tests/kafka_cluster.py: KRaft, replication factor 3,
``min.insync.replicas=2``); the cluster is changed with Kafka's own tools
(ConfigCommand, DeleteRecordsCommand) and other users of the host are real
processes of another uid (``setpriv``).  The test that stops every broker runs
last and leaves the cluster whole again.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import threading
import time
from typing import TYPE_CHECKING

import pytest

from tests.cluster.test_cluster_mount import _consume
from tests.helpers import wait_for
from tests.kafka_cluster import KafkaCluster
from tests.mount.test_mount_shared_host import (
    check_group_acts_as_owner,
    check_others_read_only,
    shared_dir,
    shared_mounts,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.conftest import Mount, MountFactory

pytestmark = [pytest.mark.cluster, pytest.mark.kafka, pytest.mark.mount]


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """The module's 3-node cluster, whose brokers apply retention every second (Kafka's default: 5 minutes)."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), {"log.retention.check.interval.ms": "1000"})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_mount(kafka_cluster: KafkaCluster, logfs_mount: MountFactory) -> Callable[..., Mount]:
    """Factory: a started mount of the module's cluster (``options``: more ``-o`` settings)."""
    def make(options: dict[str, str] | None = None, name: str = "c", args: list[str] | None = None) -> Mount:
        return logfs_mount(options, name=name,
                           extra_args=["--bootstrap-server", kafka_cluster.bootstrap, *(args or [])])
    return make


@pytest.fixture
def shared_cluster_mount(kafka_cluster: KafkaCluster) -> Iterator[Callable[..., Mount]]:
    """Factory: a mount of the cluster other users can walk into (pytest's tmp dirs are 0700)."""
    with shared_dir() as base, shared_mounts(base, ["--bootstrap-server", kafka_cluster.bootstrap]) as make:
        yield make


# --------------------------------------------------------------------------- shared hosts


def test_other_users_of_a_cluster_mount_commit_nothing(shared_cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """``setpriv --reuid=65534 cat MNT/kh/0/consume/g-nobody`` committed offsets under the mount's principal:
    now refused by the mode bits, and a group allowed at mount time commits as the owner does."""
    m = shared_cluster_mount(["--allow-other"], "others")
    (m / "kh").mkdir()
    (m / "kh/0/append").write_bytes(b"a\nb\n")
    check_others_read_only(m, "kh")
    groups = kafka_cluster.tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                                "--bootstrap-server", kafka_cluster.bootstrap, "--list")
    assert "g-nobody" not in groups.split()
    m.stop()
    team = shared_cluster_mount(["--allow-other", "--allow-group", "nogroup"], "team")
    check_group_acts_as_owner(team, "kh")


# --------------------------------------------------------------------------- deleted means deleted


def _write_lines(m: Mount, path: str, start: int, count: int) -> None:
    with open(m / path, "ab", buffering=0) as f:
        for i in range(start, start + count, 5000):
            f.write(b"".join(b"%099d\n" % n for n in range(i, min(i + 5000, start + count))))


def _replica_segments(m: Mount, tp: str) -> dict[int, int]:
    """base offset -> bytes of each ``.log`` file of the replica (files being deleted, ``.deleted``, excluded)."""
    return {int(p.name[:-4]): p.stat().st_size for p in (m.data / tp).glob("*.log")}


def test_cluster_retention_deletes_the_replica_segments(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """``retention.ms=1000`` set with ConfigCommand: the replica's log start moved within seconds, but its
    bytes stayed in its 1 GB active segment (6 minutes later, readable under ``segments/``).  Now the
    segment goes within seconds, files included."""
    m = cluster_mount()
    (m / "ret").mkdir()
    _write_lines(m, "ret/0/append", 0, 20_000)             # 2 MB
    assert sum(_replica_segments(m, "ret-0").values()) > 2_000_000
    kafka_cluster.tool("kafka.admin.ConfigCommand", "--bootstrap-server", kafka_cluster.bootstrap,
                       "--entity-type", "topics", "--entity-name", "ret", "--alter",
                       "--add-config", "retention.ms=1000")
    wait_for(lambda: sum(_replica_segments(m, "ret-0").values()) == 0, "the replica's segments to be deleted",
             timeout=60, interval=0.2)
    assert all(os.path.getsize(p) == 0 for p in (m / "ret/0/segments").iterdir())
    assert (m / "ret/0/records").read_bytes() == b""
    # the files go log.segment.delete.delay.ms later (200 ms here; Kafka's default 60 s)
    wait_for(lambda: not list((m.data / "ret-0").glob("*.deleted")), "the deleted segment's files to go",
             timeout=10)


def test_delete_records_past_a_replica_segment_deletes_it(cluster_mount, kafka_cluster: KafkaCluster,
                                                          tmp_path: Path) -> None:
    """DeleteRecords (kafka-delete-records) into the replica's active segment rolls it, and a second one past
    its end deletes it: the records below the cluster's log start leave the replica's disk."""
    m = cluster_mount()
    (m / "dr").mkdir()
    _write_lines(m, "dr/0/append", 0, 10_000)

    def delete_records(offset: int) -> None:
        spec = tmp_path / "offsets.json"
        spec.write_text(json.dumps({"version": 1, "partitions": [{"topic": "dr", "partition": 0,
                                                                  "offset": offset}]}))
        kafka_cluster.tool("org.apache.kafka.tools.DeleteRecordsCommand", "--bootstrap-server",
                           kafka_cluster.bootstrap, "--offset-json-file", str(spec))

    delete_records(5_000)
    wait_for(lambda: sorted(_replica_segments(m, "dr-0")) == [0, 10_000], "the replica's active segment to roll",
             timeout=30, interval=0.2)
    assert (m / "dr/0/records").read_bytes().split(b"\n")[0] == b"%099d" % 5_000
    _write_lines(m, "dr/0/append", 10_000, 10_000)
    delete_records(15_000)
    wait_for(lambda: min(_replica_segments(m, "dr-0")) == 10_000, "the segment below the log start to go",
             timeout=30, interval=0.2)
    assert (m / "dr/0/records").read_bytes().split(b"\n")[0] == b"%099d" % 15_000
    # the second DeleteRecords moved the start into the active segment again: rolled at 20,000
    assert {int(n.split(".")[0]) for n in os.listdir(m / "dr/0/segments")} == {10_000, 20_000}


# --------------------------------------------------------------------------- .logfs/config


def test_the_mount_config_shows_the_cluster_mounts_settings(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """``.logfs/config`` listed the local engine's defaults (``num.partitions=1``) and nothing of the cluster:
    now the cluster's address, the client, fetcher and replica settings the mount runs with."""
    m = cluster_mount({"delivery.timeout.ms": "7000", "fetch.max.wait.ms": "300", "log.segment.bytes": "1048576"})
    lines = (m / ".logfs/config").read_text().splitlines()
    for line in (f"bootstrap.servers={kafka_cluster.bootstrap}", "delivery.timeout.ms=7000", "acks=all",
                 "enable.idempotence=true", "fetch.max.wait.ms=300", "metadata.max.age.ms=2000",
                 "log.segment.bytes=1048576", "log.retention.ms=-1", "#num.partitions: the cluster's default"):
        assert line in lines, (line, lines)
    assert "num.partitions=1" not in lines


# --------------------------------------------------------------------------- timestamps


def _append_refused(path: Path, data: bytes) -> int:
    """The errno of a ``write()`` the mount refuses (0 if it was accepted)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
        return 0
    except OSError as exc:
        return exc.errno or -1
    finally:
        os.close(fd)


def test_timestamps_given_in_append_jsonl_are_kept_or_refused(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """A topic ``mkdir`` creates is CreateTime: a JSON line's ``timestamp`` is kept (it was replaced by the
    broker's clock, exit 0) and a plain line carries the mount's clock.  On a LogAppendTime topic a given
    timestamp is EINVAL, and one outside the topic's limits is EINVAL naming the limit (it was EIO)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    m = cluster_mount()
    (m / "ts").mkdir()
    given = int(time.time() * 1000) - 3_600_000
    before = int(time.time() * 1000)
    (m / "ts/0/append.jsonl").write_bytes(b'{"value":"given","timestamp":%d}\n' % given)
    (m / "ts/0/append").write_bytes(b"plain\n")
    after = int(time.time() * 1000)
    rows = [json.loads(line) for line in (m / "ts/0/records.jsonl").read_text().splitlines()]
    assert (rows[0]["value"], rows[0]["timestamp"], rows[0]["timestampType"]) == ("given", given, 0)
    assert rows[1]["timestampType"] == 0, (before, rows[1], after)
    assert before <= rows[1]["timestamp"] <= after, (before, rows[1], after)

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic("lat", 1, 3, config={"message.timestamp.type": "LogAppendTime"})])["lat"].result()
    wait_for(lambda: "lat" in os.listdir(m.path), "the topic another client created to be listed", timeout=30)
    stamped = b'{"value":"v","timestamp":%d}\n' % int(time.time() * 1000)
    assert _append_refused(m / "lat/0/append.jsonl", stamped) == errno.EINVAL
    assert (m / "lat/0/records").read_bytes() == b""
    errors = (m / ".logfs/errors").read_text().splitlines()
    assert any("lat/0/append.jsonl EINVAL" in e and "message.timestamp.type=LogAppendTime" in e for e in errors)
    assert _append_refused(m / "lat/0/append.jsonl", b'{"value":"v"}\n') == 0

    with open(m / "ts/config", "a") as f:
        f.write("message.timestamp.after.max.ms=60000\n")
    future = b'{"value":"late","timestamp":%d}\n' % (int(time.time() * 1000) + 3_600_000)
    assert _append_refused(m / "ts/0/append.jsonl", future) == errno.EINVAL
    errors = (m / ".logfs/errors").read_text().splitlines()
    assert any("ts/0/append.jsonl EINVAL" in e and "message.timestamp.after.max.ms=60000" in e for e in errors)
    assert (m / "ts/0/records").read_bytes() == b"given\nplain\n"


# --------------------------------------------------------------------------- a full outage (last: stops the cluster)

_ACCOUNTED = re.compile(r"acknowledged (\d+) of its (\d+) records at offsets (\d+)-(\d+) of (\S+)")
#: the same when the outage came before the cluster acknowledged any record of the write
_ACCOUNTED_NONE = re.compile(r"acknowledged none of its (\d+) records of (\S+)")


def test_a_write_cut_by_a_full_outage_names_what_it_stored(cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """Every broker stops while a big write runs: the failing ``write()`` fails within ``delivery.timeout.ms``
    and ``.logfs/errors`` and the log name the partition, the offsets acknowledged and their count, so the
    writer resumes after them without a duplicate."""
    timeout_ms = 6000
    # small batches: each 1 MiB write() is many ProduceRequests, so an outage cuts one in the middle
    m = cluster_mount({"delivery.timeout.ms": str(timeout_ms), "batch.size": "16384"})
    (m / "out").mkdir()
    lines = [b"%09d\n" % i for i in range(3_000_000)]
    chunks = [b"".join(lines[i:i + 100_000]) for i in range(0, len(lines), 100_000)]   # 1 MB each
    written: list[int] = []          # lines of each write() that returned
    failure: list[tuple[OSError, float]] = []

    def writer() -> None:
        fd = os.open(m / "out/0/append", os.O_WRONLY | os.O_APPEND)
        try:
            for chunk in chunks:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    failure.append((exc, time.monotonic()))
                    return
                written.append(chunk.count(b"\n"))
        finally:
            os.close(fd)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for(lambda: len(written) >= 2 or not thread.is_alive(), "two writes to return", timeout=120)
        stopping = time.monotonic()
        kafka_cluster.stop()
        stopped = time.monotonic()
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert failure, f"every write returned ({len(written)} of {len(chunks)}): stop the cluster sooner"
        exc, failed_at = failure[0]
        assert exc.errno in (errno.ETIMEDOUT, errno.EIO), exc
        # the write in flight fails within delivery.timeout.ms (plus librdkafka's 1 s timeout scan) of the
        # cluster's going away
        assert failed_at - stopping < (stopped - stopping) + timeout_ms / 1000 + 3, (failed_at - stopping,
                                                                                     stopped - stopping)
        errors = (m / ".logfs/errors").read_text()
        found = [e for e in errors.splitlines()
                 if "out/0/append" in e and (_ACCOUNTED.search(e) or _ACCOUNTED_NONE.search(e))]
        assert found, errors
        accounted = _ACCOUNTED.search(found[-1])
        if accounted is not None:       # the outage cut the write: its first `count` lines are stored
            count, total, first, last, tp = accounted.groups()
            assert _ACCOUNTED.search(m.log())
        else:                           # it came before any of the write was acknowledged
            none = _ACCOUNTED_NONE.search(found[-1])
            assert none is not None
            total, tp = none.groups()
            count, first, last = "0", str(sum(written)), str(sum(written) - 1)
            assert _ACCOUNTED_NONE.search(m.log())
        assert (int(total), tp) == (100_000, "out-0")
        # a one-line write in the outage fails within the same bound
        started = time.monotonic()
        echo = subprocess.run(["bash", "-c", "echo x >> out/0/append"], cwd=m.path, capture_output=True,
                              timeout=120)
        took = time.monotonic() - started
        assert echo.returncode != 0, (took, echo.stderr)
        assert took < timeout_ms / 1000 + 3, (took, echo.stderr)
    finally:
        for node in kafka_cluster.nodes:
            node.start()
        kafka_cluster.wait_ready()
    before = sum(written)
    count_, first_, last_ = int(count), int(first), int(last)
    assert (first_, last_) == (before, before + count_ - 1)
    # the cluster holds every returned write, then the failed write's first `count` lines; resuming after
    # them leaves no duplicate (records in flight when it failed may follow: then the next lines, in order)
    def consumed() -> list[tuple[int, bytes | None, bytes | None]] | None:
        from confluent_kafka import KafkaException
        try:      # a restarted leader answers OFFSET_NOT_AVAILABLE until its high watermark caught up
            records = _consume(kafka_cluster, "out")
        except KafkaException:
            return None
        return records if records and records[-1][0] >= last_ else None

    values = [v for _, _, v in wait_for(consumed, "the cluster to serve the records again", timeout=120,
                                        interval=1.0)]
    assert values[:last_ + 1] == [line[:-1] for line in lines[:last_ + 1]]
    assert values[last_ + 1:] == [line[:-1] for line in lines[last_ + 1:len(values)]]
