"""Other local users of a mount served with ``--allow-other`` (logfs.access, SPEC.md section 7).

A real process of another uid (``setpriv --reuid=65534 --regid=65534
--clear-groups``: nobody, nogroup) reads and writes through the real FUSE
mount; the kernel enforces the mode bits the mount shows.  The cluster mount's
test (tests/cluster/test_cluster_operator.py) runs the same checks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import Mount

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

pytestmark = pytest.mark.mount

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def as_nobody(m: Mount, command: str) -> subprocess.CompletedProcess[bytes]:
    """``command`` run by bash as nobody:nogroup in the mount's directory."""
    return subprocess.run([*NOBODY, "bash", "-c", command], cwd=m.path, capture_output=True, timeout=120)


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """A directory every user can walk into (pytest's tmp dirs are 0700), removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="logfs-shared-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def shared_mounts(base: Path, extra_args: Sequence[str] = ()) -> Iterator[Callable[..., Mount]]:
    """Factory: a started mount at ``base/name`` that every user can walk into, with ``extra_args`` and the
    call's ``args``; each is stopped cleanly (exit code 0) at the end."""
    mounts: list[Mount] = []

    def make(args: list[str], name: str = "m", options: dict[str, str] | None = None) -> Mount:
        m = Mount(base / name, options, extra_args=[*extra_args, *args])
        os.chmod(m.base, 0o755)
        os.chmod(m.path, 0o755)
        mounts.append(m)
        return m.start()

    yield make
    for m in mounts:
        assert m.stop() == 0, m.log_tail()


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """:func:`shared_dir` for one test."""
    with shared_dir() as base:
        yield base


@pytest.fixture
def shared_mount(shared_base: Path) -> Iterator[Callable[..., Mount]]:
    """Factory: a started mount at ``shared_base/name`` with ``args`` (stopped cleanly at the end)."""
    with shared_mounts(shared_base) as make:
        yield make


def committed_groups(m: Mount, topic: str) -> list[str]:
    """The groups with offsets committed for ``topic``, as the mount's owner lists them."""
    return sorted(os.listdir(m / f"{topic}/groups"))


def check_others_read_only(m: Mount, topic: str) -> None:
    """With ``--allow-other`` alone: another user reads the records, and nothing they try changes anything."""
    mode = stat.S_IMODE(os.stat(m / f"{topic}/0/consume/g-nobody").st_mode)
    assert mode == 0o400, oct(mode)          # ls -l: -r-------- root root
    assert stat.S_IMODE(os.stat(m / f"{topic}/0/records").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(m / f"{topic}/append").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(m / topic).st_mode) == 0o755
    records = (m / f"{topic}/0/records").read_bytes()
    read = as_nobody(m, f"cat {topic}/0/records")
    assert read.returncode == 0, read.stderr
    assert read.stdout == records, read.stderr
    consume = as_nobody(m, f"cat {topic}/0/consume/g-nobody")
    assert consume.returncode == 1, consume
    assert b"Permission denied" in consume.stderr, consume
    for command in (f"echo '0 1' > {topic}/groups/g-nobody", f"echo x >> {topic}/0/append",
                    f"echo retention.ms=1 >> {topic}/config", "mkdir other", f"echo >> {topic}/delete"):
        refused = as_nobody(m, command)
        assert refused.returncode != 0, (command, refused)
        assert b"Permission denied" in refused.stderr, (command, refused)
    assert "g-nobody" not in committed_groups(m, topic)
    assert (m / f"{topic}/0/records").read_bytes() == records
    assert not (m / "other").exists()


def check_group_acts_as_owner(m: Mount, topic: str) -> None:
    """With ``--allow-group nogroup``: nobody (in nogroup) commits as the owner does; ``ls -l`` shows it."""
    st = os.stat(m / f"{topic}/0/consume/g-nobody")
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 0o440), (st.st_gid, oct(st.st_mode))
    assert stat.S_IMODE(os.stat(m / f"{topic}/append").st_mode) == 0o664
    records = (m / f"{topic}/0/records").read_bytes()
    consume = as_nobody(m, f"cat {topic}/0/consume/g-nobody")
    assert consume.returncode == 0, consume
    assert consume.stdout == records, consume
    assert "g-nobody" in committed_groups(m, topic)
    assert (m / f"{topic}/groups/g-nobody").read_text().split()[:2] == ["0", str(records.count(b"\n"))]


def test_other_users_read_and_change_nothing(shared_mount) -> None:
    m = shared_mount(["--allow-other"])
    (m / "t").mkdir()
    (m / "t/0/append").write_bytes(b"a\nb\n")
    check_others_read_only(m, "t")
    assert "Other users may use the mount (--allow-other)" in m.log()


def test_a_group_allowed_at_mount_time_acts_as_the_owner(shared_mount) -> None:
    m = shared_mount(["--allow-other", "--allow-group", "nogroup"])
    (m / "t").mkdir()
    (m / "t/0/append").write_bytes(b"a\nb\n")
    check_group_acts_as_owner(m, "t")
    appended = as_nobody(m, "echo c >> t/0/append")
    assert appended.returncode == 0, appended.stderr
    assert (m / "t/0/records").read_bytes() == b"a\nb\nc\n"


def test_a_umask_hides_the_mount_from_other_users(shared_mount) -> None:
    m = shared_mount(["--allow-other", "--umask", "027"])
    (m / "t").mkdir()
    (m / "t/0/append").write_bytes(b"a\n")
    assert stat.S_IMODE(os.stat(m / "t").st_mode) == 0o750
    read = as_nobody(m, "cat t/0/records")
    assert read.returncode == 1, read
    assert b"Permission denied" in read.stderr, read


def test_allow_group_without_allow_other_is_refused(shared_base: Path) -> None:
    m = Mount(shared_base / "m", None, extra_args=["--allow-group", "nogroup"])
    with pytest.raises(RuntimeError, match="--allow-group needs --allow-other"):
        m.start()
