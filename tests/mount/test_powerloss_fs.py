"""The power-loss layer (tests/harness/powerloss_fs.py) through a real FUSE mount: what survives a power loss.

Each test mounts the layer over a backing directory, works through the mount
with ordinary system calls, "loses power" (SIGUSR1: the layer drops what was
not fsynced and exits) and then looks at the backing directory, which must hold
exactly what a disk would hold after the power came back (ext4's rules for
what an fsync of a file or of a directory makes durable).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, _is_mounted
from tests.helpers import wait_for

pytestmark = pytest.mark.mount

LAYER = ROOT / "tests" / "harness" / "powerloss_fs.py"
PAGE = 4096


class Layer:
    """One powerloss_fs process: ``backing`` holds the durable state, ``mnt`` shows the pending one."""

    def __init__(self, base: Path, *args: str) -> None:
        self.backing = base / "backing"
        self.mnt = base / "mnt"
        self.log_file = base / "layer.log"
        self.backing.mkdir(exist_ok=True)
        self.mnt.mkdir(exist_ok=True)
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Layer:
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen([sys.executable, str(LAYER), str(self.backing), str(self.mnt), *self.args],
                                    stdout=log, stderr=subprocess.STDOUT)
        self.proc = proc
        wait_for(lambda: _is_mounted(self.mnt) or proc.poll() is not None, "the layer to mount")
        assert proc.poll() is None, self.log()
        return self

    def lose_power(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1)
        assert self.proc.wait(timeout=60) == 0, self.log()
        self.proc = None
        assert not _is_mounted(self.mnt)

    def stop(self) -> None:
        """An orderly shutdown: unmount, everything is made durable."""
        if self.proc is None:
            return
        wait_for(lambda: subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True).returncode == 0,
                 "the layer to unmount")
        assert self.proc.wait(timeout=60) == 0, self.log()
        self.proc = None

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def durable(self) -> dict[str, bytes | None]:
        """The backing directory after the loss: relative path -> content (None for a directory)."""
        out: dict[str, bytes | None] = {}
        for dirpath, dirnames, filenames in os.walk(self.backing):
            for d in dirnames:
                out[os.path.relpath(os.path.join(dirpath, d), self.backing)] = None
            for f in filenames:
                out[os.path.relpath(os.path.join(dirpath, f), self.backing)] = Path(dirpath, f).read_bytes()
        return out


@pytest.fixture
def layer(tmp_path: Path):
    made: list[Layer] = []

    def make(*args: str) -> Layer:
        lay = Layer(tmp_path, *args).start()
        made.append(lay)
        return lay

    yield make
    for lay in made:
        if lay.proc is not None:
            lay.proc.kill()
            lay.proc.wait()
            subprocess.run(["fusermount3", "-uz", str(lay.mnt)], capture_output=True)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _durably_written(lay, files: dict[str, bytes]) -> None:
    """Each of ``files`` (name: bytes) in the layer's root, durable: each file and then the directory fsynced."""
    for name, data in files.items():
        write_file(lay.mnt / name, data, sync=True)
    fsync_path(lay.mnt)


def test_reads_see_pending_state_and_a_write_without_fsync_is_lost(layer):
    lay = layer()
    _durably_written(lay, {"f": b"old"})
    write_file(lay.mnt / "f", b"new and longer", sync=False)
    # through the mount: the pending state, as through a page cache
    assert (lay.mnt / "f").read_bytes() == b"new and longer"
    assert (lay.mnt / "f").stat().st_size == 14
    assert (lay.backing / "f").read_bytes() == b"old"
    lay.lose_power()
    assert lay.durable() == {"f": b"old"}


def test_fsynced_new_file_is_gone_until_its_directory_is_fsynced(layer):
    lay = layer()
    write_file(lay.mnt / "a", b"acknowledged", sync=True)
    write_file(lay.mnt / "b", b"acknowledged too", sync=True)
    assert sorted(os.listdir(lay.mnt)) == ["a", "b"]
    fd = os.open(lay.mnt / "b", os.O_RDONLY)
    os.close(fd)
    assert not (lay.backing / "a").exists()
    lay.lose_power()
    assert lay.durable() == {}


def test_file_and_directory_fsync_make_a_new_file_durable(layer):
    lay = layer()
    _durably_written(lay, {"a": b"x" * 10000})
    with open(lay.mnt / "a", "ab") as f:
        f.write(b"tail, never fsynced")
    lay.lose_power()
    assert lay.durable() == {"a": b"x" * 10000}


def test_new_directory_needs_its_parent_fsynced(layer):
    lay = layer()
    (lay.mnt / "d").mkdir()
    (lay.mnt / "d" / "sub").mkdir()
    write_file(lay.mnt / "d" / "sub" / "f", b"data", sync=True)
    fsync_path(lay.mnt / "d" / "sub")
    fsync_path(lay.mnt / "d")
    (lay.mnt / "e").mkdir()
    fsync_path(lay.mnt / "e")                 # its own names, but not its name in the root
    lay.lose_power()
    assert lay.durable() == {}


def test_nested_directories_durable_once_every_parent_is_fsynced(layer):
    lay = layer()
    (lay.mnt / "d").mkdir()
    (lay.mnt / "d" / "sub").mkdir()
    write_file(lay.mnt / "d" / "sub" / "f", b"data", sync=True)
    for p in (lay.mnt / "d" / "sub", lay.mnt / "d", lay.mnt):
        fsync_path(p)
    lay.lose_power()
    assert lay.durable() == {"d": None, "d/sub": None, "d/sub/f": b"data"}


def test_rename_durable_after_the_directory_is_fsynced(layer):
    lay = layer()
    _durably_written(lay, {"a.tmp": b"one", "b.tmp": b"two"})
    os.rename(lay.mnt / "a.tmp", lay.mnt / "a")
    fsync_path(lay.mnt)
    os.rename(lay.mnt / "b.tmp", lay.mnt / "b")          # never made durable
    assert sorted(os.listdir(lay.mnt)) == ["a", "b"]
    lay.lose_power()
    assert lay.durable() == {"a": b"one", "b.tmp": b"two"}


def test_rename_over_an_existing_file(layer):
    lay = layer()
    _durably_written(lay, {"cfg": b"old", "cfg.tmp": b"new"})
    os.replace(lay.mnt / "cfg.tmp", lay.mnt / "cfg")
    assert (lay.mnt / "cfg").read_bytes() == b"new"
    lay.lose_power()
    assert lay.durable() == {"cfg": b"old", "cfg.tmp": b"new"}


def test_rename_exchange_durable_with_the_directory(layer):
    libc = ctypes.CDLL(None, use_errno=True)
    lay = layer()
    _durably_written(lay, {"x": b"X", "y": b"Y"})
    assert libc.renameat2(-100, bytes(lay.mnt / "x"), -100, bytes(lay.mnt / "y"), 2) == 0, ctypes.get_errno()
    assert (lay.mnt / "x").read_bytes() == b"Y"
    fsync_path(lay.mnt)
    lay.lose_power()
    assert lay.durable() == {"x": b"Y", "y": b"X"}


def test_rename_across_directories_durable_with_either_directory(layer):
    lay = layer()
    (lay.mnt / "a").mkdir()
    (lay.mnt / "b").mkdir()
    write_file(lay.mnt / "a" / "f", b"moved", sync=True)
    for p in (lay.mnt / "a", lay.mnt / "b", lay.mnt):
        fsync_path(p)
    (lay.mnt / "a" / "sub").mkdir()
    fsync_path(lay.mnt / "a")
    os.rename(lay.mnt / "a" / "f", lay.mnt / "b" / "f")
    os.rename(lay.mnt / "a" / "sub", lay.mnt / "b" / "sub")
    fsync_path(lay.mnt / "b")
    lay.lose_power()
    assert lay.durable() == {"a": None, "b": None, "b/f": b"moved", "b/sub": None}


def test_unlink_and_rmdir_durable_only_after_the_directory_is_fsynced(layer):
    lay = layer()
    (lay.mnt / "d").mkdir()
    write_file(lay.mnt / "d" / "f", b"kept", sync=True)
    write_file(lay.mnt / "g", b"gone", sync=True)
    for p in (lay.mnt / "d", lay.mnt):
        fsync_path(p)
    os.unlink(lay.mnt / "d" / "f")
    os.rmdir(lay.mnt / "d")
    os.unlink(lay.mnt / "g")
    assert os.listdir(lay.mnt) == []
    fsync_path(lay.mnt)                 # makes the rmdir and the unlink of g durable, with d's content
    lay.lose_power()
    assert lay.durable() == {}


def test_unlink_without_directory_fsync_comes_back(layer):
    lay = layer()
    _durably_written(lay, {"f": b"back"})
    os.unlink(lay.mnt / "f")
    lay.lose_power()
    assert lay.durable() == {"f": b"back"}


def test_open_file_stays_readable_after_its_name_is_durably_gone(layer):
    lay = layer()
    _durably_written(lay, {"f": b"still open"})
    fd = os.open(lay.mnt / "f", os.O_RDWR)
    try:
        os.unlink(lay.mnt / "f")
        fsync_path(lay.mnt)
        assert not (lay.backing / "f").exists()
        os.write(fd, b"STILL")
        assert os.pread(fd, 100, 0) == b"STILL open"
        os.fsync(fd)
    finally:
        os.close(fd)
    lay.lose_power()
    assert lay.durable() == {}


def test_hard_link_durable_with_its_directory(layer):
    lay = layer()
    _durably_written(lay, {"f": b"linked"})
    os.link(lay.mnt / "f", lay.mnt / "g")
    assert (lay.mnt / "f").stat().st_nlink == 2
    fsync_path(lay.mnt)
    lay.lose_power()
    assert lay.durable() == {"f": b"linked", "g": b"linked"}
    assert (lay.backing / "f").stat().st_ino == (lay.backing / "g").stat().st_ino


def test_truncate_without_fsync_is_lost_and_with_fsync_durable(layer):
    lay = layer()
    _durably_written(lay, {"a": b"a" * 9000, "b": b"b" * 9000})
    os.truncate(lay.mnt / "a", 100)
    fd = os.open(lay.mnt / "b", os.O_RDWR)
    os.ftruncate(fd, 5000)
    os.ftruncate(fd, 6000)                      # grows again: zeros, not the old bytes
    assert os.pread(fd, 2000, 4000) == b"b" * 1000 + bytes(1000)
    os.fsync(fd)
    os.close(fd)
    lay.lose_power()
    assert lay.durable() == {"a": b"a" * 9000, "b": b"b" * 5000 + bytes(1000)}


def test_mmap_writes_durable_after_msync_only(layer):
    lay = layer()
    _durably_written(lay, {"idx": bytes(2 * PAGE)})
    with open(lay.mnt / "idx", "r+b") as f:
        mm = mmap.mmap(f.fileno(), 2 * PAGE)
        mm[0:5] = b"first"
        mm.flush()                              # msync: an fsync of the file
        mm[PAGE:PAGE + 6] = b"second"            # written back maybe, never fsynced
        mm.close()
    assert (lay.mnt / "idx").read_bytes()[PAGE:PAGE + 6] == b"second"
    lay.lose_power()
    assert lay.durable() == {"idx": b"first" + bytes(2 * PAGE - 5)}


def test_torn_writes_apply_some_whole_pages(layer):
    lay = layer("--torn-writes", "--seed", "7")
    _durably_written(lay, {"seg": b"." * (16 * PAGE)})
    fd = os.open(lay.mnt / "seg", os.O_WRONLY)
    os.pwrite(fd, b"N" * (32 * PAGE), 0)               # overwrite and append, never fsynced
    os.close(fd)
    lay.lose_power()
    data = (lay.backing / "seg").read_bytes()
    pages = [data[i:i + PAGE] for i in range(0, len(data), PAGE)]
    assert all(p in (b"." * PAGE, b"N" * PAGE, bytes(PAGE)) for p in pages)
    assert b"N" * PAGE in pages
    assert b"." * PAGE in pages                              # torn: some new pages, some old
    assert "torn_pages_written" in lay.log()


def test_orderly_shutdown_makes_everything_durable(layer):
    lay = layer()
    (lay.mnt / "d").mkdir()
    write_file(lay.mnt / "d" / "f", b"unsynced", sync=False)
    lay.stop()
    assert lay.durable() == {"d": None, "d/f": b"unsynced"}


def test_durable_state_survives_a_second_layer(layer, tmp_path):
    lay = layer()
    (lay.mnt / "d").mkdir()
    write_file(lay.mnt / "d" / "f", b"v1", sync=True)
    for p in (lay.mnt / "d", lay.mnt):
        fsync_path(p)
    lay.lose_power()
    again = layer()
    assert (again.mnt / "d" / "f").read_bytes() == b"v1"
    write_file(again.mnt / "d" / "f", b"v2", sync=True)
    write_file(again.mnt / "d" / "g", b"new", sync=True)
    again.lose_power()
    assert again.durable() == {"d": None, "d/f": b"v2"}


def test_the_staging_directory_is_not_reachable(layer):
    lay = layer()
    write_file(lay.mnt / "f", b"pending", sync=True)
    assert os.listdir(lay.mnt) == ["f"]
    with pytest.raises(PermissionError):
        (lay.mnt / ".powerloss-fs-staging").mkdir()
    assert "staging directory" in lay.log()
    lay.lose_power()
    assert os.listdir(lay.backing) == []


def test_lying_fsync_makes_nothing_durable(layer):
    lay = layer("--lying-fsync")
    _durably_written(lay, {"f": b"acknowledged"})
    lay.lose_power()
    assert lay.durable() == {}


def test_refusals_name_their_cause(layer):
    lay = layer()
    (lay.mnt / "d").mkdir()
    write_file(lay.mnt / "d" / "f", b"x", sync=False)
    with pytest.raises(OSError) as exc:
        os.rmdir(lay.mnt / "d")
    assert exc.value.errno == errno.ENOTEMPTY
    with pytest.raises(PermissionError):
        os.symlink("f", lay.mnt / "d" / "link")
    assert "symlink b'link': only regular files and directories are supported" in lay.log()
    lay.stop()
    assert lay.durable() == {"d": None, "d/f": b"x"}
