"""Concurrent writers, and ``tail -f`` following a log across rolls and retention."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import kafka_records
from tests.helpers import add_config, wait_for

pytestmark = pytest.mark.mount

WRITER = r"""
import os, sys
path, wid, writes, per_write = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
for b in range(writes):
    data = b"".join(b"w%d-%d-%d\n" % (wid, b, j) for j in range(per_write))
    assert os.write(fd, data) == len(data)
os.close(fd)
"""


def test_eight_concurrent_writers_lose_nothing_and_never_interleave(mount):
    (mount / "c").mkdir()
    writers, writes, per_write = 8, 100, 100       # 8 x 10,000 lines
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(mount / "c/0/append"), str(w), str(writes),
                               str(per_write)]) for w in range(writers)]
    for p in procs:
        assert p.wait(timeout=240) == 0
    lines = (mount / "c/0/records").read_bytes().splitlines()
    assert len(lines) == writers * writes * per_write
    assert len(set(lines)) == len(lines)
    # Each write's lines are contiguous and in order; each writer's writes are in order.
    last_batch: dict[int, int] = {}
    i = 0
    while i < len(lines):
        w, b, j = (int(x) for x in lines[i][1:].split(b"-"))
        assert j == 0, lines[i]
        assert b == last_batch.get(w, -1) + 1
        last_batch[w] = b
        assert lines[i:i + per_write] == [b"w%d-%d-%d" % (w, b, k) for k in range(per_write)]
        i += per_write
    assert mount.stop() == 0
    on_disk = kafka_records(mount.partition_dir("c", 0))
    assert [r.value for r in on_disk] == lines


@pytest.mark.mount_options({"internal.log.segment.bytes": "4096", "log.index.interval.bytes": "512"})
def test_tail_f_follows_across_rolls_and_retention(mount):
    (mount / "t").mkdir()
    mount.sh("seq 1 50 | sed 's/^/first-/' > t/0/append")
    tail = subprocess.Popen(["tail", "-s", "0.1", "-n", "+1", "-f", str(mount / "t/0/records")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        expected = [f"first-{i}" for i in range(1, 51)]
        for round_ in range(12):                     # ~12 x 1.2 KB per round: several rolls
            batch = [f"r{round_}-{i:03d}-" + "x" * 40 for i in range(25)]
            mount.sh("cat >> t/0/append", input=("\n".join(batch) + "\n").encode())
            expected += batch
            time.sleep(0.05)
        segments_before = len(list((mount / "t/0/segments").glob("*.log")))
        assert segments_before >= 4, "expected at least 3 rolls"
        # Retention now deletes the oldest segments under the running tail.
        add_config(mount / "t/config", "retention.bytes=4096\n")
        wait_for(lambda: len(list((mount / "t/0/segments").glob("*.log"))) < segments_before,
                 "retention to delete segments")
        more = [f"after-retention-{i}" for i in range(30)]
        mount.sh("cat >> t/0/append", input=("\n".join(more) + "\n").encode())
        expected += more
        want = ("\n".join(expected) + "\n").encode()
        got = bytearray()
        stdout = tail.stdout
        assert stdout is not None                   # a pipe
        os.set_blocking(stdout.fileno(), False)

        def read_tail() -> bool:
            got.extend(stdout.read() or b"")
            return len(got) >= len(want)
        wait_for(read_tail, "tail -f to reach the log end")
        assert got == want
    finally:
        tail.kill()
        _, err = tail.communicate()
    assert b"truncated" not in err, err
