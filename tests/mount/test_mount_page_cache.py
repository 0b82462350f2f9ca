"""Views read through the kernel's page cache (``--page-cache``): never a stale byte, never a silent end.

A view's inode keeps the pages the kernel cached across opens (``keep_cache``);
these tests read a view once (so its pages are cached), change the log in
every way that is not growth at the end, and read again: what comes back is
what the log holds, compared with an ``O_DIRECT`` read of the same file (which
bypasses the page cache and asks the mount) and with the lines written.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import TYPE_CHECKING

import pytest

from tests.helpers import QUICK_CLEANER, add_config, direct_read, partition_state, wait_for
from tests.mount.test_mount_everyday import test_tail_F_never_prints_a_record_twice_across_deletions as tail_F_scenario

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import Mount

pytestmark = pytest.mark.mount

PAGE_CACHE = ["--page-cache"]         # the default
DIRECT_IO = ["--no-page-cache"]
FAST = {**QUICK_CLEANER, "log.retention.check.interval.ms": "100", "log.segment.delete.delay.ms": "200"}


def _lines(first: int, last: int, tag: bytes = b"line") -> bytes:
    return b"".join(b"%s-%07d\n" % (tag, i) for i in range(first, last))


def _append(mount: Mount, data: bytes, topic: str = "t") -> None:
    with open(mount / f"{topic}/0/append", "ab") as f:
        f.write(data)


def _cached(path: Path) -> bytes:
    """A plain read (through the page cache when the mount allows it)."""
    return path.read_bytes()


def _read_twice_equal(path: Path) -> bytes:
    """Read twice through the cache (the second from cached pages) and once direct: all the same."""
    first, second, direct = _cached(path), _cached(path), direct_read(path)
    assert first == second == direct
    return first


@pytest.mark.parametrize("mode", [DIRECT_IO, PAGE_CACHE])
def test_a_reread_after_delete_records_shows_nothing_stale(logfs_mount, mode):
    mount = logfs_mount({**FAST, "internal.log.segment.bytes": "65536"}, extra_args=mode)
    mount.sh("mkdir t")
    _append(mount, _lines(0, 20_000))
    assert _read_twice_equal(mount / "t/0/records") == _lines(0, 20_000)
    held = open(mount / "t/0/from/0", "rb")       # opened before the deletion, read after
    try:
        mount.sh("echo 'before 12345' > t/0/delete")
        assert _read_twice_equal(mount / "t/0/records") == _lines(12_345, 20_000)
        rows = [json.loads(line) for line in _read_twice_equal(mount / "t/0/records.jsonl").splitlines()]
        assert [r["offset"] for r in rows] == list(range(12_345, 20_000))
        # the opening made before reads the file it opened (its view holds the segments it has not read)
        assert held.read() == _lines(0, 20_000)
    finally:
        held.close()
    assert direct_read(mount / "t/0/from/15000") == _cached(mount / "t/0/from/15000") == _lines(15_000, 20_000)


def test_a_reread_after_retention_deletes_segments_shows_nothing_stale(logfs_mount):
    mount = logfs_mount({**FAST, "internal.log.segment.bytes": "16384"}, extra_args=PAGE_CACHE)
    mount.sh("mkdir t")
    _append(mount, _lines(0, 5000))
    assert _read_twice_equal(mount / "t/0/records") == _lines(0, 5000)
    add_config(mount / "t/config", "retention.bytes=40000\n")
    start = wait_for(lambda: (s := partition_state(mount))["log_start_offset"] > 0 and s["log_start_offset"],
                     "retention moving the log start")
    assert _read_twice_equal(mount / "t/0/records") == _lines(start, 5000)


def test_a_reread_after_a_clean_shows_the_compacted_log(logfs_mount):
    mount = logfs_mount({**FAST, "internal.log.segment.bytes": "4096", "num.partitions": "1"}, extra_args=PAGE_CACHE)
    mount.sh("mkdir t")
    (mount / "t/config").write_text("parse.key=true\ninternal.segment.bytes=4096\nmin.cleanable.dirty.ratio=0.1\n")
    _append(mount, b"".join(b"k%02d\tv%05d\n" % (i % 20, i) for i in range(2000)))
    before = _read_twice_equal(mount / "t/0/records.jsonl")
    assert before.count(b"\n") == 2000
    add_config(mount / "t/config", "cleanup.policy=compact\n")
    wait_for(lambda: (s := partition_state(mount))["last_cleaning"] and s["dirty_ratio"] <= 0.1
             and s["cleaning_state"] is None, "the cleaner to clean and go idle")
    after = _read_twice_equal(mount / "t/0/records.jsonl")
    rows = [json.loads(line) for line in after.splitlines()]
    assert len(rows) < 2000, "nothing was compacted"
    assert {r["key"]: r["value"] for r in rows} == {"k%02d" % k: "v%05d" % (1980 + k) for k in range(20)}


def test_a_recreated_topic_of_the_same_size_shows_its_own_records(logfs_mount):
    mount = logfs_mount(FAST, extra_args=PAGE_CACHE)
    mount.sh("mkdir t")
    _append(mount, _lines(0, 3000, b"old"))
    assert _read_twice_equal(mount / "t/0/records") == _lines(0, 3000, b"old")
    mount.sh("rmdir t && mkdir t")
    _append(mount, _lines(0, 3000, b"new"))       # the same sizes, the same mtime second
    assert _read_twice_equal(mount / "t/0/records") == _lines(0, 3000, b"new")


def test_a_reader_at_eof_sees_appends_and_small_reads_equal_large(logfs_mount):
    mount = logfs_mount(FAST, extra_args=PAGE_CACHE)
    mount.sh("mkdir t")
    _append(mount, _lines(0, 1000))
    with open(mount / "t/0/records", "rb", buffering=0) as reader:
        assert reader.read() == _lines(0, 1000)
        assert reader.read() == b""                                          # at EOF, pages cached
        _append(mount, _lines(1000, 1500))
        assert os.fstat(reader.fileno()).st_size == len(_lines(0, 1500))
        assert reader.read() == _lines(1000, 1500)                          # the same descriptor
        reader.seek(0)
        assert reader.read() == _lines(0, 1500)
    small = mount.sh("dd if=t/0/records bs=4K status=none").stdout
    large = mount.sh("dd if=t/0/records bs=1M status=none").stdout
    assert small == large == _lines(0, 1500)
    follower = subprocess.Popen(["tail", "-c", "+1", "-f", "-s", "0.05", "---disable-inotify", "t/0/records"],
                                cwd=mount.path, stdout=subprocess.PIPE)
    try:
        got = b""
        _append(mount, _lines(1500, 1600))
        while not got.endswith(_lines(1599, 1600)):
            chunk = os.read(follower.stdout.fileno(), 1 << 16)     # type: ignore[union-attr]
            assert chunk, "tail -f ended"
            got += chunk
        assert got == _lines(0, 1600)
    finally:
        follower.terminate()
        follower.wait(timeout=30)
        follower.stdout.close()                                    # type: ignore[union-attr]


def test_readers_at_eof_of_a_growing_view_never_read_zeros(logfs_mount):
    """Readers at EOF of ``records`` while a writer appends three lines a millisecond and a loop stats the file.

    Each read at EOF is answered short: the kernel zero-fills the rest of the
    last page and keeps it, hidden by the size it holds.  Each append grows the
    file, and the kernel learns the new size (the ``stat`` loop, a reader's
    read at EOF).  It sets that size before it drops its pages, so a reader on
    the other CPU read the zeros in between, as NUL bytes in the middle of the
    file (about fifty in a 30 s run of this workload; the mount now has the
    pages dropped before it answers a size beyond them).  The race is inside
    the kernel and cannot be ordered from here: this workload makes it frequent,
    and tests/unit/test_page_cache_zero_fill.py orders it against a model of
    the kernel's pages.
    """
    mount = logfs_mount(FAST, extra_args=PAGE_CACHE)
    mount.sh("mkdir t")
    writes = 3000
    expected = _lines(0, 3 * writes)
    done = threading.Event()
    reads: list[bytearray] = [bytearray() for _ in range(3)]
    errors: list[BaseException] = []

    def reader(k: int) -> None:
        try:
            with open(mount / "t/0/records", "rb", buffering=0) as f:
                while len(reads[k]) < len(expected) and not done.is_set():
                    chunk = f.read(1000 + 97 * k)      # sizes that end inside lines and pages
                    if chunk:
                        reads[k].extend(chunk)
                    else:
                        done.wait(0.0005 * k)         # reader 0 spins at EOF, the others poll
        except BaseException as exc:       # reported by the test thread
            errors.append(exc)

    def stat_loop() -> None:
        while not done.is_set():
            os.stat(mount / "t/0/records")

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)] + [threading.Thread(target=stat_loop)]
    for thread in threads:
        thread.start()
    try:
        with open(mount / "t/0/append", "ab", buffering=0) as writer:
            for i in range(writes):
                writer.write(_lines(3 * i, 3 * i + 3))
                done.wait(0.001)
        wait_for(lambda: errors or all(len(data) >= len(expected) for data in reads), "the readers to read it all")
    finally:
        done.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    for k, data in enumerate(reads):
        zero = data.find(b"\0")
        assert zero < 0, f"reader {k} read NUL bytes at {zero}: {bytes(data[zero - 20:zero + 40])!r}"
        assert data == expected, f"reader {k}"


def test_tail_F_across_deletions_through_the_page_cache(logfs_mount, tmp_path):
    """A follower's file (records kept across deletions while open) reads the same with the page cache."""
    tail_F_scenario(logfs_mount(None, extra_args=PAGE_CACHE), tmp_path)


@pytest.mark.parametrize("mode", [DIRECT_IO, PAGE_CACHE])
def test_a_damaged_batch_fails_the_read_and_never_ends_the_file_early(logfs_mount, mode):
    """A flipped bit in a stored batch: `cat records` fails with EIO at it, in both modes.

    Through the page cache a short answer would read as the end of the file (`cat` would exit 0 with
    the records before it and nothing said): the request fails whole instead, and the kernel reads page
    by page up to the damaged batch.  Direct I/O hands over every record before it.
    """
    mount = logfs_mount({**FAST, "internal.log.segment.bytes": "16384"}, extra_args=mode)
    mount.sh("mkdir t")
    for start in range(0, 6000, 1000):            # a batch of 1000 lines each, a segment each
        _append(mount, _lines(start, start + 1000))
    third = sorted(mount.partition_dir("t", 0).glob("*.log"))[2]
    data = bytearray(third.read_bytes())
    data[data.find(b"line-")] ^= 0x20                  # one flipped bit in a value of its first batch
    third.write_bytes(bytes(data))
    base = int(third.name.split(".")[0])
    good = _lines(0, base)
    result = mount.sh("cat t/0/records", check=False)
    assert result.returncode != 0
    assert b"Input/output error" in result.stderr
    if mode == DIRECT_IO:
        assert result.stdout == good                   # every record before the damaged batch
    else:
        assert result.stdout == good[:len(good) // 4096 * 4096]     # the whole pages before it
    assert f"file {third}, position 0" in mount.log()
