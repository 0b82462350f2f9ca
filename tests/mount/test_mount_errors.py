"""Every errno of SPEC.md section 7 that the mount can produce, and that nothing stored is lost."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from tests.conftest import kafka_records

pytestmark = pytest.mark.mount


def _errno_of(fn, *args) -> int:
    with pytest.raises(OSError) as info:
        fn(*args)
    assert info.value.errno is not None, info.value  # a refused system call's error carries its errno
    return info.value.errno


def _write(path, data: bytes, flags: int = os.O_WRONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.mark.mount_options({"message.max.bytes": "1000"})
def test_errnos(mount):
    m = mount
    os.mkdir(m / "t")
    _write(m / "t/0/append", b"kept\n")

    # ENOENT: no such topic, partition, offset or view
    assert _errno_of(os.stat, m / "nope") == errno.ENOENT
    assert _errno_of(os.stat, m / "t/7") == errno.ENOENT
    assert _errno_of(open, m / "t/0/offset/99") == errno.ENOENT
    assert _errno_of(open, m / "t/0/from/50") == errno.ENOENT
    assert _errno_of(open, m / "t/0/from/abc") == errno.ENOENT
    assert _errno_of(open, m / "t/0/since/yesterday") == errno.ENOENT
    assert _errno_of(open, m / "t/0/segments/00000000000000000099.log") == errno.ENOENT
    assert _errno_of(open, m / "t/0/nosuchview") == errno.ENOENT

    # EINVAL: bad topic name, config name or value, marker, partition number
    assert _errno_of(os.mkdir, m / "bad$name") == errno.EINVAL
    assert _errno_of(os.mkdir, m / ("x" * 250)) in (errno.EINVAL, errno.ENAMETOOLONG)
    assert _errno_of(os.mkdir, m / "t/5") == errno.EINVAL            # not the next partition
    assert _errno_of(os.mkdir, m / "t/01") == errno.EINVAL
    assert _errno_of(_write, m / "t/config", b"no.such.config=1\n") == errno.EINVAL
    assert _errno_of(_write, m / "t/config", b"retention.ms=soon\n") == errno.EINVAL
    assert _errno_of(_write, m / "t/config", b"retention.ms=5000\nsegment.bytes=-4\n") == errno.EINVAL
    assert "retention.ms=5000" not in (m / "t/config").read_text()    # all or nothing
    assert _errno_of(_write, m / "t/delete", b"everything\n") == errno.EINVAL
    assert _errno_of(_write, m / "t/0/delete", b"before soon\n") == errno.EINVAL
    os.mkdir(m / "k")
    _write(m / "k/config", b"parse.key=true\n")
    assert _errno_of(_write, m / "k/0/append", b"k1\tv1\nno separator\n") == errno.EINVAL

    # EEXIST: topic exists
    assert _errno_of(os.mkdir, m / "t") == errno.EEXIST
    assert _errno_of(os.mkdir, m / "t/0") == errno.EEXIST

    # EMSGSIZE: a record over max.message.bytes; nothing of that write appended
    big = b"y" * 2000
    assert _errno_of(_write, m / "t/0/append", b"small\n" + big + b"\n") == errno.EMSGSIZE
    assert _errno_of(_write, m / "t/0/append", big) == errno.EMSGSIZE

    # EPERM/EACCES: writes to read-only views, create/unlink/rename of fixed files
    for view in ("t/0/records", "t/0/records.jsonl", "t/0/state", "t/0/offset/0", "t/0/from/0",
                 ".logfs/config", ".logfs/stats.json", "t/0/segments/00000000000000000000.log"):
        assert _errno_of(_write, m / view, b"x\n") in (errno.EPERM, errno.EACCES), view
    assert _errno_of(os.unlink, m / "t/0/records") in (errno.EPERM, errno.EACCES)
    assert _errno_of(os.rename, m / "t/0/records", m / "t/0/r2") in (errno.EPERM, errno.EACCES)
    # (a new file next to config and append is an editor's temporary file: logfs.tempfiles)
    for new in ("t/0/segments/newfile", "t/0/from/newfile", ".logfs/newfile", "newfile"):
        assert _errno_of(_write, m / new, b"x", os.O_WRONLY | os.O_CREAT) in (errno.EPERM, errno.EACCES), new
    assert _errno_of(os.rmdir, m / "t/0") in (errno.EPERM, errno.EACCES)
    assert _errno_of(os.truncate, m / "t/0/records", 0) in (errno.EPERM, errno.EACCES)

    # Nothing stored before any of those errors is lost.
    assert (m / "t/0/records").read_bytes() == b"kept\n"
    assert m.stop() == 0
    assert "failed (EMSGSIZE)" in m.log()
    assert "failed (EINVAL)" in m.log()


def test_read_only_mount_gives_erofs(logfs_mount):
    rw = logfs_mount(name="rw")
    os.mkdir(rw / "t")
    _write(rw / "t/0/append", b"one\ntwo\n")
    assert rw.stop() == 0

    ro = logfs_mount(read_only=True, name="ro", start=False)
    ro.data = rw.data
    ro.start()
    assert (ro / "t/0/records").read_bytes() == b"one\ntwo\n"
    assert _errno_of(_write, ro / "t/0/append", b"x\n") == errno.EROFS
    assert _errno_of(_write, ro / "t/config", b"retention.ms=1\n") == errno.EROFS
    assert _errno_of(os.mkdir, ro / "u") == errno.EROFS
    assert _errno_of(os.rmdir, ro / "t") == errno.EROFS
    assert _errno_of(_write, ro / "t/delete", b"topic\n") == errno.EROFS
    assert _errno_of(os.truncate, ro / "t/0/append", 0) == errno.EROFS
    assert _errno_of(os.unlink, ro / "t/0/records") == errno.EROFS
    assert ro.stop() == 0
    # each refusal is one log line naming it (the kernel's "ro" flag would answer
    # EROFS without asking the mount, so nothing would be logged)
    refusals = [line for line in ro.log().splitlines() if "(EROFS)" in line]
    assert len(refusals) == 7, refusals
    assert sum("mkdir failed" in line for line in refusals) == 1


@pytest.mark.mount_options({"internal.log.segment.bytes": "1000"})
def test_corrupt_batch_gives_eio_naming_file_and_position(mount):
    os.mkdir(mount / "t")
    for i in range(4):
        _write(mount / "t/0/append", b"".join(b"val-%d-%d\n" % (i, j) for j in range(30)))
    first = mount.partition_dir("t", 0) / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[data.find(b"val-0-7")] ^= 0x20                 # flip one bit of a stored value
    first.write_bytes(bytes(data))
    assert _errno_of(open, mount / "t/0/offset/7") == errno.EIO
    assert (mount / "t/0/offset/40").read_bytes() == b"val-1-10\n"   # other segments still read
    assert _logged_eio_for(mount.log(), str(first))


def _logged_eio_for(log: str, path: str) -> bool:
    return any("EIO" in line and path in line and "position" in line for line in log.splitlines())


@pytest.mark.mount_options({"log.flush.interval.messages": "1"})
def test_flush_messages_appends_are_on_disk_when_write_returns(mount):
    os.mkdir(mount / "f")
    for i in range(20):
        _write(mount / "f/0/append", b"r%d\n" % i)
        state = json.loads((mount / "f/0/state").read_bytes())
        assert state["recovery_point"] == state["log_end_offset"] == i + 1


def test_full_data_dir_gives_enospc_and_appends_nothing_partial(logfs_mount, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        m = logfs_mount({"log.segment.bytes": "8388608", "log.index.size.max.bytes": "4096"}, start=False)
        m.data = small
        m.start()
        os.mkdir(m / "t")
        line = b"z" * 1000 + b"\n"
        accepted = 0
        code = None
        for _ in range(4000):
            try:
                _write(m / "t/0/append", line * 50)
                accepted += 50
            except OSError as exc:
                code = exc.errno
                break
        assert code == errno.ENOSPC
        records = (m / "t/0/records").read_bytes()
        assert records == line * accepted                    # nothing of the failed write
        assert m.stop() == 0
        assert len(kafka_records(m.partition_dir("t", 0))) == accepted
    finally:
        subprocess.run(["umount", "-l", str(small)])
