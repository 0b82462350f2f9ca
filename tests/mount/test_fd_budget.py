"""Segment files under a descriptor budget (engine.file_cache): lazily reopened, never more open than allowed.

The engine at a tiny budget (a few files) reads, appends, rolls, deletes by
retention, cleans and reloads correctly while the process holds few
descriptors; a real mount under a small ``ulimit -n`` serves more segments
than the limit would allow if each held its files open.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import pytest

from engine.clock import ManualClock
from engine.file_cache import FILE_CACHE
from engine.log import Log
from engine.views import LogView, ViewFormat, attach
from tests import ROOT
from tests.helpers import make_config, wait_for


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def tiny_budget(monkeypatch):
    monkeypatch.setattr(FILE_CACHE, "budget", 6)
    return 6


def _text(log: Log) -> bytes:
    view = LogView(log, ViewFormat.TEXT)
    try:
        return view.read(0, view.size())
    finally:
        view.close()


def test_reads_appends_rolls_retention_and_reload_at_a_tiny_budget(tmp_path, tiny_budget):
    before = _open_fds()
    clock = ManualClock(1_700_000_000_000)
    config = make_config(internal_segment_bytes=1500, index_interval_bytes=200, retention_bytes=60_000,
                         file_delete_delay_ms=0)
    log = Log.load(str(tmp_path / "t-0"), config, clock=clock)
    attach(log)
    expected: list[bytes] = []
    for i in range(1200):
        values = [b"value %d-%d" % (i, j) for j in range(1 + i % 3)]
        log.append_values(values)
        expected += values
        clock.sleep(1)
    assert log.num_segments > 60
    # every segment's .log and both indexes would be 3 descriptors each without the budget
    assert _open_fds() - before <= tiny_budget + 8
    assert _text(log).splitlines() == expected
    assert FILE_CACHE.evictions > 0
    # random reads by offset across the log reopen what was closed
    for offset in range(0, len(expected), 97):
        got = log.read_records(offset, 1)
        assert got[0].value == expected[offset]
    # retention deletes whole segments; the views read on from the log start
    log.delete_old_segments()
    log.delete_expired_segment_files()      # file.delete.delay.ms=0: the renamed ones go now
    start = log.log_start_offset
    assert start > 0
    assert _text(log).splitlines() == expected[start:]
    assert _open_fds() - before <= tiny_budget + 8
    log.close()
    log = Log.load(str(tmp_path / "t-0"), config, clock=clock)
    assert _text(log).splitlines() == expected[start:]
    log.append_values([b"after reload"])
    assert _text(log).splitlines()[-1] == b"after reload"
    assert _open_fds() - before <= tiny_budget + 8
    log.close()
    assert _open_fds() <= before


def test_a_view_reads_a_deleted_segment_it_holds_at_a_tiny_budget(tmp_path, tiny_budget):
    config = make_config(internal_segment_bytes=1000, index_interval_bytes=200)
    log = Log.load(str(tmp_path / "t-0"), config)
    for i in range(400):
        log.append_values([b"line %d" % i])
    view = LogView(log, ViewFormat.TEXT)
    first_page = view.read(0, 20)
    # delete every segment but the active one, then touch many others so the cache churns
    log.maybe_increment_log_start_offset(log.active_segment.base_offset)
    log.delete_old_segments()
    log.delete_expired_segment_files(1 << 62)
    rest = view.read(20, 1 << 20)
    assert (first_page + rest).splitlines() == [b"line %d" % i for i in range(400)]
    view.close()
    log.close()


@pytest.mark.mount
def test_a_mount_under_a_small_ulimit_serves_more_segments_than_descriptors(tmp_path):
    """Over 400 segments (1,200 files) under ``ulimit -n 256``: reads, appends and rolls stay correct."""
    data = tmp_path / "data"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from engine.config import BrokerConfig
        from engine.manager import LogManager
        from engine.views import attach
        m = LogManager(BrokerConfig.from_props({{"log.dirs": {str(data)!r}}}))
        m.startup()
        logs = m.create_topic("t", 3, {{"internal.segment.bytes": "1100"}})
        for log in logs:
            attach(log)
            for i in range(2000):
                log.append_values([b"p%d line %d" % (log.topic_partition.partition, i)])
        print(sum(log.num_segments for log in logs))
        m.shutdown()
    """)
    built = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True)
    assert int(built.stdout) >= 400         # 3 files each: over 1,200 descriptors if all were open
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    limit = 256

    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    log_file = open(tmp_path / "logfs.log", "ab")

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([str(ROOT / ".venv/bin/logfs"), "mount", str(mnt), "--data-dir", str(data)],
                                stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=set_limit)
        wait_for(lambda: subprocess.run(["mountpoint", "-q", str(mnt)]).returncode == 0 or proc.poll() is not None,
                 "the mount to start", timeout=120)
        assert proc.poll() is None, (tmp_path / "logfs.log").read_text()[-3000:]
        return proc

    # a crash (kill -9) while files are open lazily and evicted: the next mount recovers and serves everything
    proc = start()
    (mnt / "t/0/records").read_bytes()
    with open(mnt / "t/0/append", "ab") as f:
        f.write(b"p0 line 2000\n")
    proc.kill()
    proc.wait()
    subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    proc = start()
    try:
        lines = (mnt / "t/0/records").read_bytes().splitlines()
        # the append was acknowledged (close returned) before the kill: it is there
        assert lines == [b"p0 line %d" % i for i in range(2001)]
        for p in range(1, 3):
            lines = (mnt / f"t/{p}/records").read_bytes().splitlines()
            assert lines == [b"p%d line %d" % (p, i) for i in range(2000)]
        for p in range(3):
            with open(mnt / f"t/{p}/append", "ab") as f:
                for i in range(50):
                    f.write(b"p%d more %d\n" % (p, i))
                    f.flush()
        for p in range(3):
            jsonl = (mnt / f"t/{p}/records.jsonl").read_bytes().splitlines()
            assert len(jsonl) == 2050 + (p == 0)
            assert b"more 49" in jsonl[-1]
        assert len(os.listdir(f"/proc/{proc.pid}/fd")) < limit
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)])
        code = proc.wait(timeout=120)
        log_file.close()
    assert code == 0, (tmp_path / "logfs.log").read_text()[-3000:]
    assert "Too many open files" not in (tmp_path / "logfs.log").read_text()
