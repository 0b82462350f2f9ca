"""A full data directory, on a real 4 MiB tmpfs the test mounts itself (issue 9).

Appends on a full disk fail with ENOSPC and append nothing partial; deleting
data (``before N``, ``rmdir``, retention after a config change) still works,
because checkpoints and ``topic-configs.json`` are rewritten in place over
their previous generation; once the deleted files are removed appends work
again.  A background job whose run fails (here: the file system remounted
read-only under the mount) counts as an error in ``stats.json``.
"""

from __future__ import annotations

import errno
import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import Mount, kafka_records
from tests.helpers import add_config, mount_stats, partition_state, wait_for

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.mount

OPTIONS = {
    "internal.log.segment.bytes": "65536",
    "log.retention.check.interval.ms": "200",
    "log.segment.delete.delay.ms": "300",
    "log.cleaner.enable": "false",
}




@pytest.fixture
def small_fs(tmp_path: Path):
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(fs)], check=True)
    try:
        yield fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


@pytest.fixture
def full_mount(tmp_path: Path, small_fs: Path):
    m = Mount(tmp_path / "m", OPTIONS)
    m.data = small_fs / "data"
    m.start()
    yield m
    if m.proc is not None:
        m.stop()


def _fill(mount: Mount, topic: str) -> int:
    """Append 2 KiB batches until ENOSPC; returns the number of records acknowledged by fsync."""
    fd = os.open(mount / f"{topic}/0/append", os.O_WRONLY)
    written = 0
    try:
        while True:
            try:
                os.write(fd, b"".join(b"%s-%08d-%s\n" % (topic.encode(), written + i, b"x" * 100)
                                      for i in range(18)))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
            written += 18
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def test_deleting_data_works_on_a_full_disk_and_frees_it(full_mount, small_fs):
    m = full_mount
    for topic in ("keep", "gone", "big"):
        (m / topic).mkdir()
    add_config(m / "keep/config", b"cleanup.policy=compact\nparse.key=true\n")
    (m / "keep/0/append").write_bytes(b"k\tv\n")
    wait_for(lambda: os.path.exists(m.data / "log-start-offset-checkpoint.prev"), what="two checkpoint writes")
    fd = os.open(m / "gone/0/append", os.O_WRONLY)
    os.write(fd, b"".join(b"g-%d\n" % i for i in range(2000)))
    os.fsync(fd)
    os.close(fd)
    big = _fill(m, "big")
    assert big > 10000
    end = partition_state(m, "big")["log_end_offset"]
    assert end == big                                    # nothing partial: every record acknowledged

    # the disk is full: a config write still fits in place over its previous generation ...
    add_config(m / "big/config", b"retention.bytes=1000000\n")
    # ... and retention acts on it: its log-start-offset checkpoint is written on the full disk too
    start = wait_for(lambda: partition_state(m, "big")["log_start_offset"], what="retention on a full disk")
    assert 0 < start < end
    # DeleteRecords, then a whole topic
    (m / "big/0/delete").write_bytes(b"before %d\n" % ((start + end) // 2))
    assert partition_state(m, "big")["log_start_offset"] == (start + end) // 2
    os.rmdir(m / "gone")
    assert "gone" not in os.listdir(m.path)
    # the deleted files go after file.delete.delay.ms; then appends work again
    wait_for(lambda: not any(n.endswith("-delete") for n in os.listdir(m.data)), what="topic dir removed")
    wait_for(lambda: partition_state(m, "big")["pending_deletion"]["segments"] == 0, what="segments removed")
    fd = os.open(m / "big/0/append", os.O_RDWR)
    os.write(fd, b"after\n")
    os.fsync(fd)
    ack = os.read(fd, 100).split()
    os.close(fd)
    assert int(ack[0]) == end
    tasks = mount_stats(m)["tasks"]
    assert tasks["kafka-log-retention"]["errors"] == 0, tasks["kafka-log-retention"]
    assert m.stop() == 0
    records = kafka_records(m.data / "big-0")
    assert records[-1].value == b"after"
    assert records[-1].offset == end
    assert [r.value for r in kafka_records(m.data / "keep-0")] == [b"v"]


def test_failed_task_runs_count_as_errors(full_mount, tmp_path):
    """A checkpoint that cannot be written (a directory planted as its previous generation) fails each run."""
    m = full_mount
    (m / "t").mkdir()
    (m / "t/0/append").write_bytes(b"a\n")
    job = "kafka-log-start-offset-checkpoint"
    previous = m.data / "log-start-offset-checkpoint.prev"
    wait_for(lambda: previous.exists(), what="two checkpoint runs")
    previous.unlink()
    previous.mkdir()
    record = wait_for(lambda: (r := mount_stats(m)["tasks"][job])["errors"] >= 2 and r, what="failed runs counted")
    assert "log-start-offset-checkpoint" in record["last_error"]
    metrics = (m / ".logfs/metrics").read_text()
    assert any(line.startswith(f'logfs_task_errors_total{{task="{job}"}}') and float(line.split()[-1]) >= 2
               for line in metrics.splitlines()), metrics
    assert m.log().count(f"Scheduled task '{job}' failed") >= 2
    assert "Traceback" not in m.log()
    previous.rmdir()
    runs = mount_stats(m)["tasks"][job]["runs"]
    wait_for(lambda: (r := mount_stats(m)["tasks"][job])["runs"] > runs + 1 and r["last_error"] is None,
              what="a successful run once the directory is gone")


def test_a_line_buffered_when_a_write_fails_is_not_appended_at_close(full_mount):
    """``head -c N big.txt >> append`` on a full disk: the write that gets ENOSPC leaves the line its previous
    write began buffered; close() drops it (logged, in .logfs/errors) instead of storing its head as a record."""
    m = full_mount
    (m / "t").mkdir()
    fd = os.open(m / "t/0/append", os.O_WRONLY)
    heads = 0
    try:
        while True:
            try:                                        # each write ends the line before it and begins one
                os.write(fd, b"x" * 2000 + b"\nline-%07d" % heads)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
            heads += 1
    finally:
        os.close(fd)                                    # the writer was told at its write: close() succeeds
    values = (m / "t/0/records").read_bytes().split(b"\n")[:-1]
    assert len(values) == heads > 100
    assert values[0] == b"x" * 2000
    assert all(v == b"line-%07d" % i + b"x" * 2000 for i, v in enumerate(values[1:]))
    errors = (m / ".logfs/errors").read_text()
    assert " t/0/append ENOSPC flush: Dropped the unterminated last line (12 bytes)" in errors, errors
