"""The command line around a mount: umount, dump-log and check on what a mount wrote."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import LOGFS

pytestmark = pytest.mark.mount


def _logfs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LOGFS), *args], capture_output=True, text=True, timeout=timeout)


def test_umount_dump_log_and_check(mount):
    (mount / "t").mkdir()
    mount.sh("seq 1 100 > t/0/append && echo last >> t/0/append")
    result = _logfs("umount", str(mount.path))
    assert result.returncode == 0, result.stderr
    assert mount.proc.wait(timeout=60) == 0
    mount.proc = None
    assert "Shutdown completed" in mount.log()

    seg = mount.partition_dir("t", 0) / "00000000000000000000.log"
    dump = _logfs("dump-log", str(seg), "--print-data-log")
    assert dump.returncode == 0, dump.stderr
    assert "baseOffset: 0 lastOffset: 99" in dump.stdout
    assert "payload: last" in dump.stdout

    check = _logfs("check", str(mount.data))
    assert check.returncode == 0, check.stdout + check.stderr
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF                                   # corrupt the last record's value
    seg.write_bytes(bytes(data))
    check = _logfs("check", str(mount.data))
    assert check.returncode == 1
    assert str(seg) in check.stdout + check.stderr


def test_bad_option_is_refused_with_its_name(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = _logfs("mount", str(mnt), "--data-dir", str(tmp_path / "d"), "-o", "log.segment.bytes=big")
        assert result.returncode == 2
        assert "log.segment.bytes" in result.stderr
        result = _logfs("mount", str(mnt), "--data-dir", str(tmp_path / "d"), "-o", "no.such.setting=1")
        assert result.returncode == 2
        assert "no.such.setting" in result.stderr
    finally:   # had a mount started by mistake, do not leave it behind
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def test_a_bad_topics_pattern_or_start_is_refused_naming_it(tmp_path):
    """``--topics`` and ``--from`` are checked before anything connects (the bootstrap address is closed)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cluster = ["--bootstrap-server", "127.0.0.1:1", "--data-dir", str(tmp_path / "d")]
    try:
        for args, named in ((["--topics", "orders("], "Invalid --topics 'orders('"),
                            (["--from", "yesterday"], "Invalid --from 'yesterday'"),
                            (["--from", "2026-13-01"], "Invalid --from '2026-13-01'")):
            result = _logfs("mount", str(mnt), *cluster, *args)
            assert result.returncode == 2, result.stderr
            assert named in result.stderr, result.stderr
            assert result.stderr.count("\n") == 1, result.stderr        # one line naming the cause
        result = _logfs("mount", str(mnt), "--data-dir", str(tmp_path / "e"), "--topics", "t")
        assert result.returncode == 2, result.stderr
        assert "give --bootstrap-server" in result.stderr, result.stderr
    finally:   # had a mount started by mistake, do not leave it behind
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
