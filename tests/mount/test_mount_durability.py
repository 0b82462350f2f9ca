"""Remounts after clean shutdown and after kill -9, and the asynchronous deletion paths."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import kafka_records
from tests.helpers import wait_for

pytestmark = pytest.mark.mount


@pytest.mark.mount_options({"internal.log.segment.bytes": "8192"})
def test_remount_after_clean_shutdown_and_after_kill(mount):
    (mount / "d").mkdir()
    mount.sh("seq 1 500 > d/0/append")
    assert mount.terminate() == 0                   # SIGTERM: clean shutdown, unmounts itself
    assert (mount.data / ".kafka_cleanshutdown").exists()
    assert not os.path.ismount(mount.path)
    assert kafka_records(mount.partition_dir("d", 0))[-1].value == b"500"

    mount.start()
    assert not (mount.data / ".kafka_cleanshutdown").exists()
    assert (mount / "d/0/records").read_bytes() == b"".join(b"%d\n" % i for i in range(1, 501))
    fd = os.open(mount / "d/0/append", os.O_WRONLY)
    os.write(fd, b"".join(b"synced-%d\n" % i for i in range(300)))
    os.fsync(fd)                                    # Kafka's flush: on disk before kill -9
    os.close(fd)
    state = json.loads((mount / "d/0/state").read_bytes())
    assert state["recovery_point"] == state["log_end_offset"] == 800
    mount.kill()
    assert not (mount.data / ".kafka_cleanshutdown").exists()

    mount.start()                                   # recovery after an unclean shutdown
    lines = (mount / "d/0/records").read_bytes().splitlines()
    assert lines[:500] == [b"%d" % i for i in range(1, 501)]
    assert lines[500:800] == [b"synced-%d" % i for i in range(300)]
    mount.sh("echo after-crash >> d/0/append")
    assert mount.sh("cat d/0/offset/800").stdout == b"after-crash\n"
    assert "Loaded 1 logs in" in mount.log()
    assert mount.stop() == 0
    assert [r.offset for r in kafka_records(mount.partition_dir("d", 0))] == list(range(801))


@pytest.mark.mount_options({"num.partitions": "2", "internal.log.segment.bytes": "1024"})
def test_deletion_paths(mount):
    for topic in ("a", "b", "c"):
        (mount / topic).mkdir()
        for p in (0, 1):
            # 20 lines per write: a batch must fit in one segment (Kafka's rule)
            mount.sh(f"for i in $(seq 0 9); do seq $((i*20+1)) $((i*20+20)) > {topic}/{p}/append; done")

    # topic marker: gone from the namespace at once, files removed by the background task
    (mount / "a/delete").write_bytes(b"topic\n")
    assert "a" not in os.listdir(mount.path)
    wait_for(lambda: not any(n.startswith("a-") for n in os.listdir(mount.data)), what="a-*-delete removal")

    # rmdir of a topic: the same
    os.rmdir(mount / "b")
    assert not (mount / "b").exists()
    wait_for(lambda: not any(n.startswith("b-") for n in os.listdir(mount.data)), what="b-*-delete removal")
    (mount / "b").mkdir()                            # a topic of the same name starts empty
    assert (mount / "b/0/records").read_bytes() == b""

    # DeleteRecords: records below the offset disappear; segments before it are deleted
    segments_before = len(os.listdir(mount / "c/0/segments"))
    (mount / "c/0/delete").write_bytes(b"before 150\n")
    assert (mount / "c/0/records").read_bytes() == b"".join(b"%d\n" % i for i in range(151, 201))
    state = json.loads((mount / "c/0/state").read_bytes())
    assert state["log_start_offset"] == 150
    assert len(os.listdir(mount / "c/0/segments")) < segments_before
    wait_for(lambda: not any(n.endswith(".deleted") for n in os.listdir(mount.partition_dir("c", 0))),
              what=".deleted segment files removal")
    with pytest.raises(FileNotFoundError):
        open(mount / "c/0/offset/10")

    # key marker: a tombstone for that key
    (mount / "c/1/delete").write_bytes(b"key user-42\n")
    assert (mount / "c/1/records").read_bytes().endswith(b"200\n\n")
    assert mount.stop() == 0
    last = kafka_records(mount.partition_dir("c", 1))[-1]
    assert (last.offset, last.key, last.value) == (200, b"user-42", None)
