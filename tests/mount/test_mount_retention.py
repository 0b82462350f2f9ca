"""Retention and deletion through a real mount: what goes, when, and what a crash at each step leaves.

Steps too quick to hit with a live ``kill -9`` (between two segment renames,
between two partition-dir renames) are reached by a real subprocess running
the engine over the data dir that ``os._exit``s itself at that step (a
monkeypatch in that subprocess only); the mount then starts over what it left.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT, kafka_records
from tests.helpers import (
    CLEANER_TASK,
    RETENTION_TASK,
    add_config,
    mount_stats,
    partition_state,
    wait_for,
    wait_for_task_runs,
)

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.mount

#: how much older than the young records the old ones are in the time retention test
AGE_GAP_MS = 3000

FAST = {
    "internal.log.segment.bytes": "2048",
    "log.initial.task.delay.ms": "0",
    "log.retention.check.interval.ms": "100",
    "log.segment.delete.delay.ms": "600",
}


def _write(mount, topic: str, first: int, count: int, per_write: int = 20, partition: int = 0) -> None:
    """Lines ``first .. first+count-1``, ``per_write`` lines per write() (each well under a segment)."""
    fd = os.open(mount / f"{topic}/{partition}/append", os.O_WRONLY)
    try:
        for start in range(first, first + count, per_write):
            end = min(start + per_write, first + count)
            os.write(fd, b"".join(b"line-%06d\n" % i for i in range(start, end)))
    finally:
        os.close(fd)


def _lines(first: int, last: int) -> bytes:
    return b"".join(b"line-%06d\n" % i for i in range(first, last))


def _files(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def _log_bytes(pdir: Path, deleted: bool = True) -> int:
    """Bytes of the .log files of a partition dir, with or without those renamed .deleted."""
    total = 0
    for entry in os.scandir(pdir):
        if entry.name.endswith(".log") or (deleted and entry.name.endswith(".log.deleted")):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass
    return total


def _deleted_fds(pid: int, data: Path) -> list[str]:
    """Descriptors of the mount process on unlinked segment files of ``data``."""
    out = []
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith(str(data)) and target.endswith("(deleted)") and ".log" in target:
            out.append(target)
    return out


@pytest.fixture
def tails():
    """Starts ``tail -f`` readers; any still running at the end is stopped before the unmount."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(mount, path: str, out: Path) -> subprocess.Popen[bytes]:
        with open(out, "wb") as sink:
            proc = subprocess.Popen(["tail", "-f", "-n", "+1", "-s", "0.05", str(mount / path)],
                                    stdout=sink, stderr=subprocess.PIPE)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stop_tail(proc: subprocess.Popen[bytes]) -> bytes:
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    return err


# --------------------------------------------------------------------------- retention by time and by size


@pytest.mark.mount_options(FAST)
def test_time_retention_deletes_only_expired_segments_through_deleted_files(mount, tails, tmp_path):
    (mount / "t").mkdir()
    add_config(mount / "t/config", b"file.delete.delay.ms=2000\n")
    tail = tails(mount, "t/0/records", tmp_path / "tail.out")
    _write(mount, "t", 0, 400)                                      # old: ~8 segments
    old_newest = partition_state(mount)["segments"][-1]["largest_timestamp"]
    # The young records come AGE_GAP_MS after the newest old one (their timestamps are the mount's
    # append time): retention.ms is placed inside that gap below.
    wait_for(lambda: time.time() * 1000 > old_newest + AGE_GAP_MS, "the old records to age", timeout=30)
    _write(mount, "t", 400, 400)                                    # young
    before = partition_state(mount)
    expired = [s for s in before["segments"] if s["largest_timestamp"] <= old_newest]
    assert len(expired) >= 3
    assert len(expired) < len(before["segments"])
    young_oldest = before["segments"][len(expired)]["largest_timestamp"]
    assert young_oldest - old_newest >= AGE_GAP_MS
    expected_start = before["segments"][len(expired)]["base_offset"]
    reader = open(mount / "t/0/records", "rb")                      # opened before the deletion
    head = reader.read(4096)

    # The horizon (now - retention.ms) just past the old records: they are expired from the first
    # retention run on, while the young ones expire only young_oldest - old_newest (>= AGE_GAP_MS)
    # later, which leaves a run due every 100 ms seconds of slack on a loaded machine.
    retention_ms = int(time.time() * 1000) - old_newest - 200
    add_config(mount / "t/config", b"retention.ms=%d\n" % retention_ms)
    wait_for(lambda: partition_state(mount)["log_start_offset"] >= expected_start, what="time retention")
    after = partition_state(mount)
    # still inside file.delete.delay.ms: the segments wait as .deleted files, counted everywhere
    waiting = mount_stats(mount)["topics"]["t"]["partitions"]["0"]
    assert waiting["pending_deletion"] == after["pending_deletion"]
    assert b'logfs_log_pending_deletion_segments{partition="0",topic="t"} %d.0' % len(expired) in \
        (mount / ".logfs/metrics").read_bytes()
    # The young segments are kept from here on, whatever the time the checks below take.
    add_config(mount / "t/config", b"retention.ms=3600000\n")
    assert after["log_start_offset"] == expected_start              # exactly the expired ones went
    assert [s["base_offset"] for s in after["segments"]] == [s["base_offset"] for s in
                                                            before["segments"][len(expired):]]
    pdir = mount.partition_dir("t", 0)
    deleted = [n for n in _files(pdir) if n.endswith(".deleted")]
    assert {n.split(".")[0] for n in deleted} == {"%020d" % s["base_offset"] for s in expired}
    assert after["pending_deletion"]["segments"] == len(expired)
    assert after["pending_deletion"]["bytes"] == sum(s["size_bytes"] for s in expired)
    # a file opened now starts at the new log start; the one opened before reads on, whole
    assert (mount / "t/0/records").read_bytes().startswith(b"line-%06d\n" % expected_start)
    assert head + reader.read() == _lines(0, 800)
    reader.close()
    wait_for(lambda: not any(n.endswith(".deleted") for n in _files(pdir)), what=".deleted removal")
    wait_for(lambda: not _deleted_fds(mount.proc.pid, mount.data), what="unlinked segments released")

    # then everything expires: the log rolls and keeps one empty active segment at the log end
    add_config(mount / "t/config", b"retention.ms=100\n")
    wait_for(lambda: partition_state(mount)["log_start_offset"] == 800, what="all segments expired")
    final = partition_state(mount)
    assert final["log_end_offset"] == 800
    assert [s["base_offset"] for s in final["segments"]] == [800]
    assert (mount / "t/0/records").read_bytes() == b""
    _write(mount, "t", 800, 20)
    wait_for(lambda: len((tmp_path / "tail.out").read_bytes()) >= len(_lines(0, 820)), "tail -f to reach line 819")
    assert _stop_tail(tail) == b""                                  # no "file truncated"
    assert (tmp_path / "tail.out").read_bytes() == _lines(0, 820)   # no repeats, no gaps
    stats = mount_stats(mount)
    assert stats["tasks"]["kafka-log-retention"]["last_run_ms"] is not None
    assert stats["tasks"]["kafka-delete-logs"]["runs"] > 0
    assert stats["topics"]["t"]["partitions"]["0"]["log_start_offset"] == 800


@pytest.mark.mount_options(FAST)
def test_size_retention_follows_kafkas_diff_rule_and_bounds_disk_usage(mount, tails, tmp_path):
    (mount / "s").mkdir()
    _write(mount, "s", 0, 600)
    before = partition_state(mount, "s")
    limit = before["size_bytes"] - before["segments"][0]["size_bytes"] - before["segments"][1]["size_bytes"] + 100
    # Kafka's rule: drop the oldest segments while what is left stays >= retention.bytes
    diff, expect = before["size_bytes"] - limit, 0
    for seg in before["segments"]:
        if diff - seg["size_bytes"] < 0:
            break
        diff -= seg["size_bytes"]
        expect += 1
    assert expect == 1
    add_config(mount / "s/config", b"retention.bytes=%d\n" % limit)
    wait_for(lambda: partition_state(mount, "s")["num_segments"] == len(before["segments"]) - 1, what="size retention")
    wait_for_task_runs(mount, RETENTION_TASK, 2)                     # further runs delete nothing more
    after = partition_state(mount, "s")
    assert after["segments"] == before["segments"][1:]
    assert after["size_bytes"] >= limit

    # continuous appends with retention.bytes=8192: the partition stays bounded on disk
    add_config(mount / "s/config", b"retention.bytes=8192\nfile.delete.delay.ms=200\n")
    tail = tails(mount, "s/0/records", tmp_path / "tail.out")
    pdir = mount.partition_dir("s", 0)
    written, first = 0, 600
    while written < 20 * 8192:
        for _ in range(10):                                           # ~4.8 KB, several rolls
            _write(mount, "s", first, 40)
            first += 40
            written += 40 * 12
        # After a whole retention run with no append in between, Kafka's rule holds exactly:
        # without its oldest segment the log would be under retention.bytes.  However fast the
        # writes, the live segments are bounded by retention.bytes plus one segment.
        wait_for_task_runs(mount, RETENTION_TASK)
        live = partition_state(mount, "s")
        assert live["size_bytes"] - live["segments"][0]["size_bytes"] < 8192, live["segments"]
        assert _log_bytes(pdir, deleted=False) <= live["size_bytes"]     # a later run only removes more
    # .deleted ones add what arrives during file.delete.delay.ms and go once appends stop
    wait_for(lambda: _log_bytes(pdir) <= 8192 + 2048, what="disk usage back under retention.bytes + one segment")
    wait_for(lambda: (tmp_path / "tail.out").read_bytes().endswith(b"line-%06d\n" % (first - 1)),
             "tail -f to reach the log end")
    assert _stop_tail(tail) == b""
    got = (tmp_path / "tail.out").read_bytes().splitlines()
    numbers = [int(line[5:]) for line in got]
    assert numbers[0] == after["log_start_offset"]                    # from the log start at its open
    assert numbers[-1] == first - 1                                   # followed to the end
    assert all(a < b for a, b in itertools.pairwise(numbers))           # in order, never a line twice
    # A segment rolled and retained entirely between two of tail's polls is gone before the
    # reader gets there (a Kafka consumer would be reset to the log start): the only records a
    # reader may miss are ones retention deleted, all below the final log start offset.
    missed = set(range(numbers[0], first)) - set(numbers)
    assert not missed or max(missed) < partition_state(mount, "s")["log_start_offset"]


@pytest.mark.mount_options({**FAST, "log.cleaner.enable": "true", "log.cleaner.backoff.ms": "100"})
def test_compact_topics_skip_time_retention_and_compact_delete_does_both(mount):
    for topic, policy in (("c", "compact"), ("cd", "compact,delete")):
        (mount / topic).mkdir()
        add_config(mount / f"{topic}/config",
            b"cleanup.policy=%s\nretention.ms=500\nparse.key=true\n" % policy.encode())
        fd = os.open(mount / f"{topic}/0/append", os.O_WRONLY)
        for i in range(0, 300, 20):
            os.write(fd, b"".join(b"k%d\tv%d\n" % (j % 7, j) for j in range(i, i + 20)))
        os.close(fd)
    # with a cleaner, compact,delete logs get their retention from the cleaner's rounds
    wait_for(lambda: partition_state(mount, "cd")["log_start_offset"] > 0, timeout=30, what="compact,delete retention")
    # whole runs of retention and of the cleaner after that: neither retains the compact-only log
    wait_for_task_runs(mount, RETENTION_TASK, 2)
    wait_for_task_runs(mount, CLEANER_TASK, 2)
    assert partition_state(mount, "c")["log_start_offset"] == 0              # compact only: never retained
    assert partition_state(mount, "c")["segments"][0]["base_offset"] == 0


# --------------------------------------------------------------------------- DeleteRecords


@pytest.mark.mount_options({**FAST, "log.segment.delete.delay.ms": "60000",
                            "log.flush.start.offset.checkpoint.interval.ms": "3600000"})
def test_delete_records_survives_kill_right_after_it_returns(mount):
    (mount / "t").mkdir()
    _write(mount, "t", 0, 500)
    old_reader = open(mount / "t/0/records", "rb")
    with pytest.raises(OSError) as exc:
        (mount / "t/0/delete").write_bytes(b"before 501\n")
    assert exc.value.errno == 22                                     # EINVAL beyond the log end
    assert partition_state(mount)["log_start_offset"] == 0
    (mount / "t/0/delete").write_bytes(b"before 333\n")
    assert (mount / "t/0/records").read_bytes() == _lines(333, 500)  # at once, for every new view
    assert partition_state(mount)["log_start_offset"] == 333
    assert old_reader.read() == _lines(0, 500)                       # the reader opened before reads on
    old_reader.close()
    pdir = mount.partition_dir("t", 0)
    assert any(n.endswith(".log.deleted") for n in _files(pdir))
    mount.kill()                        # before the periodic checkpoint (1 h) and the file deletion (60 s)
    mount.start()
    assert partition_state(mount)["log_start_offset"] == 333
    assert (mount / "t/0/records").read_bytes() == _lines(333, 500)
    assert not any(n.endswith(".deleted") for n in _files(pdir))
    with pytest.raises(FileNotFoundError):
        (mount / "t/0/offset/100").read_bytes()
    assert min(r.offset for r in kafka_records(pdir)) <= 333


# --------------------------------------------------------------------------- kill -9 at each step


@pytest.mark.mount_options({**FAST, "log.segment.delete.delay.ms": "60000"})
def test_kill_while_segments_and_dirs_wait_for_removal(mount):
    (mount / "t").mkdir()
    (mount / "gone").mkdir()
    _write(mount, "t", 0, 400)
    _write(mount, "gone", 0, 100)
    add_config(mount / "t/config", b"retention.bytes=4096\n")
    wait_for(lambda: any(n.endswith(".deleted") for n in _files(mount.partition_dir("t", 0))),
              what="segments renamed .deleted")
    start = wait_for(lambda: partition_state(mount)["log_start_offset"], what="log start moved")
    os.rmdir(mount / "gone")
    assert "gone" not in os.listdir(mount.path)
    queued = [n for n in _files(mount.data) if n.startswith("gone-0.") and n.endswith("-delete")]
    assert len(queued) == 1, _files(mount.data)
    pending = mount_stats(mount)["pending_log_deletions"]
    assert [os.path.basename(p) for p in pending] == queued
    (mount / "gone").mkdir()                                          # recreated at once, empty
    assert (mount / "gone/0/records").read_bytes() == b""
    _write(mount, "gone", 1000, 20)
    mount.kill()                                                      # .deleted and -delete still on disk

    mount.options["log.segment.delete.delay.ms"] = "300"
    mount.start()
    assert partition_state(mount)["log_start_offset"] >= start
    assert (mount / "t/0/records").read_bytes().startswith(b"line-%06d\n" % partition_state(mount)["log_start_offset"])
    assert not any(n.endswith(".deleted") for n in _files(mount.partition_dir("t", 0)))
    assert (mount / "gone/0/records").read_bytes() == _lines(1000, 1020)   # the new topic, not the old
    wait_for(lambda: not any(n.endswith("-delete") for n in _files(mount.data)), what="-delete dir removal")


_CRASHER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from engine.config import BrokerConfig
    from engine.log import Log
    from engine.manager import LogManager
    from engine.segment import LogSegment
    from engine.topic import TopicPartition

    step, data = sys.argv[1], sys.argv[2]
    manager = LogManager(BrokerConfig.from_props({{"log.dirs": data, "log.segment.delete.delay.ms": "60000"}}))
    manager.startup()
    renames = []

    def crash_after_first(real):
        def wrapper(*args):
            real(*args)
            renames.append(args)
            if len(renames) == 1:
                os._exit(9)           # a crash between two renames
        return wrapper

    if step == "delete-records":
        LogSegment.change_file_suffixes = crash_after_first(LogSegment.change_file_suffixes)
        manager.delete_records(TopicPartition("t", 0), int(sys.argv[3]))
    elif step == "retention":
        LogSegment.change_file_suffixes = crash_after_first(LogSegment.change_file_suffixes)
        manager.alter_topic_config("t", {{"retention.bytes": sys.argv[3]}})
        manager.cleanup_logs()
    elif step == "delete-topic":
        Log.rename_dir = crash_after_first(Log.rename_dir)
        manager.delete_topic("m")
    sys.exit("the step was never reached")
""").format(root=str(ROOT))


def _crash_at(mount, step: str, *args: str) -> None:
    result = subprocess.run([sys.executable, "-c", _CRASHER, step, str(mount.data), *args],
                            capture_output=True, timeout=60)
    assert result.returncode == 9, result.stderr.decode(errors="replace")


@pytest.mark.mount_options({**FAST, "num.partitions": "3"})
def test_crash_between_renames_never_resurrects(mount):
    (mount / "t").mkdir()
    (mount / "m").mkdir()
    _write(mount, "t", 0, 600)
    for p in range(3):
        _write(mount, "m", 0, 50, partition=p)
    segments = partition_state(mount)["segments"]
    assert mount.stop() == 0

    # DeleteRecords crashing after the first of several segment renames
    target = segments[3]["base_offset"] + 5
    _crash_at(mount, "delete-records", str(target))
    pdir = mount.partition_dir("t", 0)
    assert len([n for n in _files(pdir) if n.endswith(".log.deleted")]) == 1   # the others not renamed
    mount.start()
    assert partition_state(mount)["log_start_offset"] == target
    assert (mount / "t/0/records").read_bytes() == _lines(target, 600)
    wait_for(lambda: partition_state(mount)["segments"][0]["base_offset"] == segments[3]["base_offset"],
              what="retention finishing the deletion")
    assert mount.stop() == 0

    # retention crashing after the first rename
    sizes = [s["size_bytes"] for s in segments[3:]]
    limit = sum(sizes) - sizes[0] - sizes[1] - sizes[2]              # three more segments must go
    _crash_at(mount, "retention", str(limit))
    mount.start()
    start = partition_state(mount)["log_start_offset"]
    assert start == segments[6]["base_offset"]
    assert (mount / "t/0/records").read_bytes() == _lines(start, 600)
    with pytest.raises(FileNotFoundError):
        (mount / f"t/0/offset/{segments[5]['base_offset']}").read_bytes()
    assert mount.stop() == 0

    # topic deletion crashing after the first partition dir rename
    _crash_at(mount, "delete-topic")
    live = [n for n in _files(mount.data) if n.startswith("m-") and not n.endswith("-delete")]
    assert live == ["m-1", "m-2"]
    mount.start()
    assert "m" not in os.listdir(mount.path)
    wait_for(lambda: not any(n.startswith("m-") for n in _files(mount.data)), what="m-* removal")
    (mount / "m").mkdir()
    assert sorted(os.listdir(mount / "m")) == ["0", "1", "2", "append", "append.jsonl", "config", "delete", "groups"]
    assert all((mount / f"m/{p}/records").read_bytes() == b"" for p in range(3))
