"""Faults planted in a data dir between two mounts: ``-delete`` dirs, checkpoints, topic configs (issue 9).

Each test stops a real mount, damages what a crash, a bad disk or a careless
copy could leave, mounts again and checks that no stored record is lost, that
nothing outside the data dir is followed or touched, and that the damage is
named in one log line.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import Mount, kafka_records
from tests.helpers import add_config, mount_stats, partition_state, wait_for

pytestmark = pytest.mark.mount

FAST_DELETE = {"log.segment.delete.delay.ms": "200", "internal.log.segment.bytes": "2048"}




def _fill(mount: Mount, topic: str, count: int) -> list[bytes]:
    lines = [b"%s-%05d" % (topic.encode(), i) for i in range(count)]
    fd = os.open(mount / f"{topic}/0/append", os.O_WRONLY)
    for i in range(0, count, 25):
        os.write(fd, b"".join(line + b"\n" for line in lines[i:i + 25]))
    os.fsync(fd)
    os.close(fd)
    return lines


def _values(mount: Mount, topic: str) -> list[bytes]:
    return (mount / f"{topic}/0/records").read_bytes().splitlines()


@pytest.mark.mount_options(FAST_DELETE)
def test_delete_dirs_of_every_kind_are_removed_without_following_links(mount, tmp_path):
    (mount / "live").mkdir()
    expected = _fill(mount, "live", 300)
    (mount / "gone").mkdir()
    _fill(mount, "gone", 100)
    assert mount.stop() == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep me\n")
    data = mount.data
    # 1. a topic dir renamed -delete whose segment is torn (a crash in the middle of an append)
    torn = data / "gone-0.0123456789abcdef0123456789abcdef-delete"
    os.rename(data / "gone-0", torn)
    log = next(torn.glob("*.log"))
    os.truncate(log, log.stat().st_size - 7)
    # 2. a -delete dir holding a link to a dir outside, and one holding a link to a file outside
    linked = data / "old-0.fedcba9876543210fedcba9876543210-delete"
    linked.mkdir()
    (linked / "00000000000000000000.log").symlink_to(outside / "precious")
    (linked / "sub").symlink_to(outside)
    # 3. a symlink named like a -delete dir, pointing outside
    (data / "trap-0.00000000000000000000000000000000-delete").symlink_to(outside)
    # 4. a -delete dir of a name no topic could have (cut by Kafka's 255-byte rule)
    odd = data / ("x" * 200 + "-0.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-delete")
    odd.mkdir()
    (odd / "00000000000000000000.log").write_bytes(b"\0" * 100)
    mount.start()
    wait_for(lambda: not torn.exists() and not linked.exists() and not odd.exists(), what="-delete dirs removed")
    assert (outside / "precious").read_bytes() == b"keep me\n"
    assert sorted(os.listdir(outside)) == ["precious"]
    assert _values(mount, "live") == expected
    assert "gone" not in os.listdir(mount.path)
    assert mount.stop() == 0
    assert [r.value for r in kafka_records(data / "live-0")] == expected


@pytest.mark.mount_options(FAST_DELETE)
def test_corrupt_checkpoints_fall_back_to_their_previous_generation(mount):
    (mount / "t").mkdir()
    expected = _fill(mount, "t", 400)
    (mount / "t/0/delete").write_bytes(b"before 150\n")
    wait_for(lambda: os.path.exists(mount.data / "log-start-offset-checkpoint.prev"), what="two checkpoint writes")
    assert mount.stop() == 0
    data = mount.data
    start_cp = data / "log-start-offset-checkpoint"
    assert start_cp.read_text() == "0\n1\nt 0 150\n"
    previous = (data / "log-start-offset-checkpoint.prev").read_text()
    start_cp.write_bytes(b"0\n3\nt 0 15")                     # torn
    (data / "recovery-point-offset-checkpoint").write_bytes(b"\xff\xfe garbage")
    (data / ".kafka_cleanshutdown").unlink()                  # recover, from the previous recovery point
    mount.start()
    log = mount.log()
    assert "using its previous generation" in log
    assert "log-start-offset-checkpoint.prev" in log
    start = partition_state(mount, "t")["log_start_offset"]
    assert previous == "0\n1\nt 0 150\n"
    assert start == 150                                        # not the first segment's base offset
    values = _values(mount, "t")
    assert values == expected[start:]
    assert mount.stop() == 0


def test_links_planted_as_checkpoints_and_configs_are_never_followed(logfs_mount, tmp_path):
    mount = logfs_mount({"log.flush.start.offset.checkpoint.interval.ms": "100"})
    (mount / "c").mkdir()
    add_config(mount / "c/config", b"cleanup.policy=compact\nparse.key=true\n")
    add_config(mount / "c/config", b"min.cleanable.dirty.ratio=0.4\n")   # the previous generation is compact too
    fd = os.open(mount / "c/0/append", os.O_WRONLY)
    os.write(fd, b"k1\tv1\nk2\tv2\n")
    os.close(fd)
    assert mount.stop() == 0
    victim = tmp_path / "victim"
    victim.write_bytes(b'{"version": 1, "generation": 99, "topics": {}}\n')
    before = victim.read_bytes()
    data = mount.data
    for name in ("topic-configs.json", "log-start-offset-checkpoint", "recovery-point-offset-checkpoint.prev"):
        (data / name).unlink(missing_ok=True)
        (data / name).symlink_to(victim)
    mount.start()
    # the link was not read: the compacted topic kept its config from the previous generation
    assert b"cleanup.policy=compact" in (mount / "c/config").read_bytes()
    add_config(mount / "c/config", b"min.cleanable.dirty.ratio=0.2\n")     # writes go around the links
    wait_for(lambda: not os.path.islink(data / "log-start-offset-checkpoint"), what="checkpoint rewritten")
    assert mount.stop() == 0
    assert victim.read_bytes() == before
    assert not any(os.path.islink(data / n) and os.readlink(data / n) == str(victim)
                   for n in ("topic-configs.json", "log-start-offset-checkpoint"))
    assert [r.value for r in kafka_records(data / "c-0")] == [b"v1", b"v2"]


def test_missing_topic_configs_with_a_previous_generation_is_loaded(logfs_mount):
    mount = logfs_mount({"log.retention.ms": "100", "log.cleaner.enable": "false"})
    (mount / "c").mkdir()
    add_config(mount / "c/config", b"cleanup.policy=compact\nparse.key=true\n")
    fd = os.open(mount / "c/0/append", os.O_WRONLY)
    os.write(fd, b"".join(b"k%d\tv%d\n" % (i, i) for i in range(50)))
    os.close(fd)
    add_config(mount / "c/config", b"min.cleanable.dirty.ratio=0.3\n")
    assert mount.stop() == 0
    (mount.data / "topic-configs.json").unlink()
    mount.start()
    assert "loading the previous generation" in mount.log()
    assert b"cleanup.policy=compact" in (mount / "c/config").read_bytes()
    runs = mount_stats(mount)["tasks"]["kafka-log-retention"]["runs"]
    wait_for(lambda: mount_stats(mount)["tasks"]["kafka-log-retention"]["runs"]
              > runs + 2, what="retention runs")
    assert len(_values(mount, "c")) == 50


def test_a_link_planted_as_the_lock_file_refuses_the_mount_and_is_not_followed(tmp_path):
    import subprocess

    from tests.conftest import LOGFS
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (data / ".lock").symlink_to(victim)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run([str(LOGFS), "mount", str(mnt), "--data-dir", str(data)], capture_output=True,
                            timeout=60)
    assert result.returncode != 0
    assert f"Failed to open the lock file {data / '.lock'}" in result.stderr.decode()
    assert victim.read_bytes() == b"precious\n"
    assert sorted(os.listdir(data)) == [".lock"]
