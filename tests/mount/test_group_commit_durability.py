"""A group commit and power loss: what ``fsync()`` of ``groups/<group>`` and ``consume/<group>`` promises.

The mount's data dir is the mount point of tests/harness/powerloss_fs.py (writes and
new names held in memory until their fsync); after the commits, the mount is
killed (SIGKILL) and the layer loses power, and a fresh mount over what the
disk holds must show every commit whose ``fsync()`` returned.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import pytest

from tests.conftest import Mount
from tests.mount.test_powerloss_fs import Layer

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.mount

OPTIONS = {"offsets.topic.num.partitions": "5"}


def _write_fsync_close(path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _remounted_after_power_loss(tmp_path, layer, options: dict[str, str]) -> Iterator[Mount]:
    """A mount of what the disk kept (``layer.backing``) after the power went; stopped cleanly after."""
    after = Mount(tmp_path / "after", options)
    after.data = layer.backing
    after.start()
    try:
        yield after
    finally:
        assert after.stop() == 0, after.log_tail()


@pytest.fixture
def layer(tmp_path):
    (tmp_path / "disk").mkdir()
    lay = Layer(tmp_path / "disk").start()
    yield lay
    if lay.proc is not None:
        lay.stop()


def test_fsynced_commits_survive_a_power_loss(tmp_path, layer, logfs_mount):
    m = logfs_mount(OPTIONS, name="m", start=False)
    m.data = layer.mnt
    m.start()
    for t in ("t", "u"):
        m.sh(f"mkdir {t} && seq 1 10 > {t}/0/append")
    fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)                        # the topics' records are durable; no group has a commit yet
    os.close(fd)

    _write_fsync_close(m / "t/groups/edited", b"0 3\n")              # a groups/ write, fsynced before close
    m.sh("echo '0 4' > t/groups/synced && sync t/groups/synced")      # closed, then `sync FILE`
    fd = os.open(m / "t/0/consume/reader", os.O_RDONLY)               # a consumer: read, fsync, close
    try:
        assert os.read(fd, 6) == b"1\n2\n3\n"
        os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(m / "u/groups/kept-open", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, b"0 7\n")
    os.fsync(fd)                         # applied and durable although the file is still open
    assert m.sh("cat u/groups/kept-open").stdout == b"0 7 10 3\n"
    m.kill()                             # the mount dies with the descriptor open, then the power goes
    try:
        os.close(fd)
    except OSError:
        pass                             # ENOTCONN: the mount is gone
    layer.lose_power()

    with _remounted_after_power_loss(tmp_path, layer, OPTIONS) as after:
        assert after.sh("cat t/groups/edited").stdout == b"0 3 10 7\n"
        assert after.sh("cat t/groups/synced").stdout == b"0 4 10 6\n"
        assert after.sh("cat t/groups/reader").stdout == b"0 3 10 7\n"
        assert after.sh("cat u/groups/kept-open").stdout == b"0 7 10 3\n"


def test_a_closed_commit_without_fsync_survives_kill_9(logfs_mount):
    """What a commit promises without fsync: the close returned, so a crash of the mount keeps it."""
    m = logfs_mount(OPTIONS)
    m.sh("mkdir t && seq 1 5 > t/0/append && echo '0 2' > t/groups/g && head -c 2 t/0/consume/h > /dev/null")
    m.kill()
    m.start()
    assert m.sh("cat t/groups/g").stdout == b"0 2 5 3\n"
    assert m.sh("cat t/groups/h").stdout == b"0 1 5 4\n"


def test_a_commit_fsynced_into_a_new_segment_survives_a_power_loss(tmp_path, layer, logfs_mount):
    """Tiny segments: each commit rolls ``__consumer_offsets``; its fsync must also make the new segment's
    name durable (Log.flush fsyncs the partition directory when it flushes a segment created since)."""
    options = {"offsets.topic.num.partitions": "1", "internal.log.segment.bytes": "120"}
    m = logfs_mount(options, name="m", start=False)
    m.data = layer.mnt
    m.start()
    m.sh("mkdir t && seq 1 30 > t/0/append")
    fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    for offset in range(1, 8):
        _write_fsync_close(m / "t/groups/g", b"0 %d\n" % offset)
    segments = [p for p in (layer.mnt / "__consumer_offsets-0").iterdir() if p.suffix == ".log"]
    assert len(segments) > 3, segments                  # the commits rolled segments
    m.kill()
    layer.lose_power()

    with _remounted_after_power_loss(tmp_path, layer, options) as after:
        assert after.sh("cat t/groups/g").stdout == b"0 7 30 23\n"
