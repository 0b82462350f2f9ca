"""The everyday tools trust the mount (issue 10): each test drives the real tool through a real mount.

``cp``, ``install``, ``rsync``, ``tar``, ``tail -F``/``tail -f`` with idle
pauses, ``find -newer``, ``du``, ``ls -la``, ``rm -rf``, bash's ``printf`` into
``config``, an oversized single ``write()``, and the scripts and CLI around the
mount (``scripts/run.sh``, ``logfs umount``, ``--version``, the startup line).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import LOGFS, ROOT, Mount
from tests.helpers import json_object, mount_stats, wait_for, write_then_refused

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.mount

#: every kind of content file of a partition, as paths relative to the mount
VIEW_PATHS = ["t/0/records", "t/0/records.jsonl", "t/0/offset/3", "t/0/from/5", "t/0/from/5.jsonl",
              "t/0/since/0", "t/0/since/0.jsonl", "t/0/segments/00000000000000000000.log",
              "t/0/segments/00000000000000000000.index", "t/0/segments/00000000000000000000.timeindex",
              "t/0/segments/00000000000000000000.jsonl", "t/0/state", "t/config", ".logfs/config"]


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _lines(first: int, last: int) -> bytes:
    return b"".join(b"line-%d\n" % i for i in range(first, last + 1))


def _holds(path: Path, expected: bytes) -> Callable[[], bool]:
    """For wait_for: whether the file holds ``expected`` now."""
    return lambda: path.read_bytes() == expected


def _topic(mount: Mount, records: int = 200) -> None:
    os.mkdir(mount / "t")
    _append(mount / "t/0/append", _lines(1, records))


# --------------------------------------------------------------------------- one path, one file



def _popen_to_files(cmd: list[str], out: Path, err: Path | None, **kwargs) -> subprocess.Popen[bytes]:
    """``cmd`` with its stdout in the file ``out`` and its stderr in ``err`` (None: with stdout); this
    process's copies of the files are closed once the child has its own."""
    with open(out, "wb") as stdout, open(err or os.devnull, "wb") as stderr:
        return subprocess.Popen(cmd, stdout=stdout, stderr=stderr if err else subprocess.STDOUT, **kwargs)

def test_stat_gives_one_inode_per_path_until_the_content_is_deleted(mount):
    _topic(mount)
    for path in VIEW_PATHS:
        first = os.stat(mount / path)
        again = os.stat(mount / path)
        assert (first.st_ino, first.st_size) == (again.st_ino, again.st_size), path
    before = {path: os.stat(mount / path).st_ino for path in VIEW_PATHS}
    _append(mount / "t/0/append", _lines(201, 210))          # appends: the same files, grown
    grown = os.stat(mount / "t/0/records")
    assert grown.st_ino == before["t/0/records"]
    assert grown.st_size == len(_lines(1, 210))
    assert os.stat(mount / "t/0/offset/3").st_ino == before["t/0/offset/3"]
    # DeleteRecords below 5: records and since/0 are other files now, from/5 is the same file
    (mount / "t/0/delete").write_bytes(b"before 5\n")
    assert os.stat(mount / "t/0/records").st_ino != before["t/0/records"]
    assert os.stat(mount / "t/0/from/5").st_ino == before["t/0/from/5"]
    assert (mount / "t/0/records").read_bytes() == _lines(6, 210)
    assert not (mount / "t/0/offset/3").exists()


def test_cp_install_rsync_tar_shutil_copy_every_kind_of_file(mount, tmp_path):
    _topic(mount)
    out = tmp_path / "out"
    out.mkdir()
    def same(copy: bytes, expected: bytes, path: str) -> bool:
        if path != "t/0/state":
            return copy == expected
        # state is live (the flusher moves the recovery point between two reads):
        # a copy is a whole JSON snapshot of the same partition
        return bool(json_object(copy)["log_end_offset"] == json_object(expected)["log_end_offset"])

    for path in VIEW_PATHS:
        expected = (mount / path).read_bytes()
        name = path.replace("/", "_")
        for tool in (["cp", path], ["install", "-m", "0644", path]):
            target = out / f"{tool[0]}-{name}"
            result = mount.sh(" ".join([*tool, str(target)]), check=False)
            assert result.returncode == 0, (tool, path, result.stderr)
            assert result.stderr == b"", (tool, path, result.stderr)
            assert same(target.read_bytes(), expected, path), (tool, path)
        shutil.copyfile(mount / path, out / f"shutil-{name}")
        assert same((out / f"shutil-{name}").read_bytes(), expected, path), path
    result = mount.sh(f"rsync -a t/ {out}/rsync/", check=False)
    assert result.returncode == 0, result.stderr
    assert (out / "rsync/0/records").read_bytes() == (mount / "t/0/records").read_bytes()
    assert (out / "rsync/0/segments/00000000000000000000.log").read_bytes() == \
        (mount / "t/0/segments/00000000000000000000.log").read_bytes()
    result = mount.sh(f"tar cf {out}/t.tar t", check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b"", result.stderr
    subprocess.run(["tar", "xf", str(out / "t.tar"), "-C", str(out)], check=True)
    assert (out / "t/0/records.jsonl").read_bytes() == (mount / "t/0/records.jsonl").read_bytes()


@pytest.mark.mount_options({"internal.log.segment.bytes": "1000"})
def test_tail_F_and_tail_f_follow_appends_rolls_and_idle_pauses(mount, tmp_path):
    _topic(mount, records=50)
    followers = {}
    for mode in ("-F", "-f"):
        out, err = tmp_path / f"tail{mode}.out", tmp_path / f"tail{mode}.err"
        # -s 0.1 --max-unchanged-stats=2: tail -F re-checks the name after 0.2 s
        # without change (the default is after 5 s), so the pauses below are
        # several times longer than its poll and re-open interval
        proc = _popen_to_files(["tail", "-n", "+1", mode, "-s", "0.1", "--max-unchanged-stats=2", "records"],
                               out, err, cwd=mount / "t/0")
        followers[mode] = (proc, out, err)
    try:
        expected = _lines(1, 50)
        for round_ in range(6):
            for mode, (_, out, _) in followers.items():
                wait_for(_holds(out, expected), what=f"tail {mode} to catch up")
            time.sleep(0.8)     # the idle pause under test: 4 re-checks of the name
            first = 51 + round_ * 40
            for part in range(4):          # a roll every ~1000 bytes: several per round
                _append(mount / "t/0/append", _lines(first + 10 * part, first + 10 * part + 9))
            expected += _lines(first, first + 39)
        for mode, (_, out, _) in followers.items():
            wait_for(_holds(out, expected), what=f"tail {mode} to catch up")
    finally:
        for proc, _, _ in followers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    state = json.loads((mount / "t/0/state").read_bytes())
    assert state["num_segments"] >= 6                     # it did follow across rolls
    for mode, (_, out, err) in followers.items():
        assert out.read_bytes() == expected, mode        # no line repeated, none skipped
        assert err.read_bytes() == b"", (mode, err.read_bytes())   # no "replaced", no "truncated"


def test_less_follow_mode_shows_appends(mount, tmp_path):
    _topic(mount, records=5)
    out = tmp_path / "less.out"
    # less +F needs a terminal: script(1) gives it a pty and copies the screen to out
    proc = _popen_to_files(["script", "-qfec", "less +F records", "/dev/null"], out, None, cwd=mount / "t/0",
                           stdin=subprocess.DEVNULL, env={**os.environ, "TERM": "dumb", "LESS": ""},
                           start_new_session=True)
    try:
        wait_for(lambda: b"Waiting for data" in out.read_bytes(), what="less +F to follow")
        time.sleep(0.5)             # an idle pause while less polls the file
        _append(mount / "t/0/append", b"appended while less follows\n")
        wait_for(lambda: b"appended while less follows" in out.read_bytes(), what="less +F to show the append")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    screen = out.read_bytes()
    assert screen.count(b"line-5") == 1
    assert b"truncated" not in screen
    assert b"replaced" not in screen


def test_tail_f_and_tail_F_read_on_across_a_deletion_without_a_record_twice(mount, tmp_path):
    _topic(mount, records=20)
    out, err = tmp_path / "f.out", tmp_path / "f.err"
    proc = _popen_to_files(["tail", "-n", "+1", "-f", "-s", "0.1", "records"], out, err, cwd=mount / "t/0")
    out_F, err_F = tmp_path / "F.out", tmp_path / "F.err"
    proc_F = _popen_to_files(["tail", "-n", "+1", "-F", "-s", "0.1", "--max-unchanged-stats=2", "records"],
                             out_F, err_F, cwd=mount / "t/0")
    try:
        wait_for(lambda: out.read_bytes() == _lines(1, 20), what="tail -f")
        wait_for(lambda: out_F.read_bytes() == _lines(1, 20), what="tail -F")
        (mount / "t/0/delete").write_bytes(b"before 10\n")
        _append(mount / "t/0/append", _lines(21, 30))
        wait_for(lambda: out.read_bytes() == _lines(1, 30), what="tail -f after the deletion")
        # tail -F follows the name, which stays the file it follows while open: nothing re-fed
        wait_for(lambda: out_F.read_bytes() == _lines(1, 30), what="tail -F after the deletion")
        looked_up = mount_stats(mount)["metadata_requests"]
        wait_for(lambda: mount_stats(mount)["metadata_requests"] > looked_up + 20,
                 what="tail -F looking the name up again, many times")
    finally:
        for p in (proc, proc_F):
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=10)
    assert err.read_bytes() == b""
    assert out_F.read_bytes() == _lines(1, 30)
    assert b"replaced" not in err_F.read_bytes()
    # nobody has it open: the name now shows the records from the new log start (as after a log rotation)
    assert (mount / "t/0/records").read_bytes() == _lines(11, 30)


def test_find_newer_and_mtimes_follow_appends(mount, tmp_path):
    _topic(mount, records=10)
    ref = tmp_path / "ref"
    ref.write_bytes(b"")
    # mtimes have millisecond resolution: the append must come once the clock is past ref's
    wait_for(lambda: time.time_ns() > ref.stat().st_mtime_ns + 1_000_000, "the clock to pass ref's mtime")
    assert mount.sh(f"find t/0 -maxdepth 1 -newer {ref} -name records").stdout == b""
    _append(mount / "t/0/append", b"later\n")
    assert mount.sh(f"find t/0 -maxdepth 1 -newer {ref} -name records").stdout == b"t/0/records\n"
    assert os.stat(mount / "t/0/records").st_mtime_ns >= ref.stat().st_mtime_ns


def test_du_counts_what_is_stored_and_ls_la_shows_dot_entries(mount):
    _topic(mount, records=2000)
    listing = mount.sh("ls -la t/0").stdout.decode().splitlines()
    names = [line.split()[-1] for line in listing[1:]]
    assert names[:2] == [".", ".."]
    assert "records" in names
    du_mount = int(mount.sh("du -s --block-size=1 t").stdout.split()[0])
    stored = sum(p.stat().st_size for p in mount.partition_dir("t", 0).iterdir()
                 if p.suffix in (".log",))
    entries = sum((p.stat().st_blocks * 512) for p in mount.partition_dir("t", 0).iterdir()
                  if p.suffix in (".index", ".timeindex"))
    # the segment files' used bytes (rounded to blocks); not the preallocated 10 MiB
    # indexes, and not the views, which are renderings of the same bytes
    assert stored <= du_mount <= stored + entries + 8 * 4096, (du_mount, stored)
    assert os.stat(mount / "t/0/segments/00000000000000000000.index").st_size < 4096


def test_rm_rf_of_a_topic_deletes_it_like_rmdir(mount):
    _topic(mount, records=50)
    os.mkdir(mount / "u")
    _append(mount / "u/0/append", b"keep\n")
    result = mount.sh("rm -rf t", check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b"", result.stderr
    assert sorted(os.listdir(mount.path)) == [".logfs", "u"]
    assert "(EPERM)" not in mount.log()                       # no refusal from rm -rf
    # files of a topic still cannot be removed one by one, by anyone not removing the topic,
    # nor can a partition
    result = mount.sh("rm u/0/records; rmdir u/0", check=False)
    assert b"Operation not permitted" in result.stderr
    result = mount.sh("rm -rf u/0", check=False)
    assert result.returncode != 0
    assert b"Operation not permitted" in result.stderr
    assert (mount / "u/0/records").read_bytes() == b"keep\n"
    shutil.rmtree(mount / "u")
    assert os.listdir(mount.path) == [".logfs"]
    assert mount.stop() == 0
    assert "(EPERM)" in mount.log()


# --------------------------------------------------------------------------- writing


def test_config_written_line_by_line_is_applied_whole_at_close(mount):
    os.mkdir(mount / "t")
    # bash's builtin printf writes each line with its own write(2)
    mount.sh_refused("printf 'retention.ms=5000\\nsegment.bytes=xyz\\n' > t/config")
    assert "retention.ms=604800000\n" in (mount / "t/config").read_text()     # nothing applied
    result = mount.sh("printf 'retention.ms=5000\\nsegment.ms=60000\\n' > t/config", check=False)
    assert result.returncode == 0, result.stderr
    config = (mount / "t/config").read_text()
    assert "retention.ms=5000\n" in config
    assert "segment.ms=60000\n" in config
    # a bad name later in the same opening: the good lines written before it are not applied
    write_then_refused(mount / "t/config", os.O_WRONLY | os.O_TRUNC, b"retention.ms=1\n", b"no.such.name=1\n",
                       b"segment.ms=2\n")
    assert "retention.ms=5000\n" in (mount / "t/config").read_text()
    assert mount.stop() == 0
    log = mount.log()
    assert log.count("Updated config of topic t") == 1      # once per applied change, not twice
    assert log.count("xyz") == 1
    assert log.count("no.such.name") == 1                             # one line per refusal


@pytest.mark.mount_options({"log.segment.bytes": "8000000"})
def test_an_oversized_single_write_fails_with_emsgsize_and_loses_nothing_else(mount):
    os.mkdir(mount / "t")
    big = b"x" * (1536 * 1024) + b"\n"            # over the default max.message.bytes (1 MiB + 12)
    fd = os.open(mount / "t/0/append", os.O_WRONLY)
    try:
        os.write(fd, b"before\n")
        # The kernel splits the write into <= 1 MiB requests: the first is buffered
        # (a line's head), the request carrying the end fails, so write(2) reports
        # the first part written; the writer's retry of the rest gets EMSGSIZE.
        view = memoryview(big)
        with pytest.raises(OSError) as info:
            while view:
                view = view[os.write(fd, view):]
        assert info.value.errno == errno.EMSGSIZE
        os.write(fd, b"after\n")                      # the descriptor stays usable
        os.write(fd, b"last without newline")
    finally:
        os.close(fd)
    # Python's buffered file keeps the refused bytes and sends them again at close:
    # it sees EMSGSIZE once, and the lines after the oversized one are appended
    f = open(mount / "t/0/append", "ab")
    with pytest.raises(OSError) as info:
        f.write(big + b"kept\n")
        f.flush()
    assert info.value.errno == errno.EMSGSIZE
    f.write(b"kept too\n")
    f.close()
    result = mount.sh("printf '%s\\n' \"$(head -c 1572864 /dev/zero | tr '\\0' y)\" >> t/0/append", check=False)
    assert result.returncode != 0
    assert b"Message too long" in result.stderr
    assert (mount / "t/0/records").read_bytes() == b"before\nafter\nlast without newline\nkept\nkept too\n"
    assert mount.stop() == 0
    assert "Dropped the unterminated" not in mount.log()


# --------------------------------------------------------------------------- reading


@pytest.mark.mount_options({"internal.log.segment.bytes": "2000"})
def test_every_view_opened_after_delete_records_starts_at_the_new_log_start(mount):
    _topic(mount, records=300)
    state = json.loads((mount / "t/0/state").read_bytes())
    active = state["segments"][-1]["base_offset"]
    target = active + 2
    early = open(mount / "t/0/records", "rb")      # opened before: reads on what it opened
    (mount / "t/0/delete").write_bytes(b"before %d\n" % target)
    try:
        assert early.read().splitlines()[0] == b"line-1"
    finally:
        early.close()
    first_value = b"line-%d" % (target + 1)
    assert (mount / "t/0/records").read_bytes().splitlines()[0] == first_value
    rows = [json.loads(line) for line in (mount / "t/0/records.jsonl").read_bytes().splitlines()]
    assert rows[0]["offset"] == target
    seg = json.loads((mount / f"t/0/segments/{active:020d}.jsonl").read_bytes().splitlines()[0])
    assert seg["offset"] == target
    assert (mount / "t/0/since/0").read_bytes().splitlines()[0] == first_value
    assert not (mount / f"t/0/offset/{target - 1}").exists()


@pytest.mark.parametrize("mode", [["--no-page-cache"], ["--page-cache"]], ids=["direct-io", "page-cache"])
def test_cat_prints_the_good_bytes_before_a_corrupt_batch_then_fails(logfs_mount, mode):
    mount = logfs_mount({"internal.log.segment.bytes": "1000"}, extra_args=mode)
    os.mkdir(mount / "t")
    written = [b"val-%d-%d-%s\n" % (i, j, b"v" * 90) for i in range(6) for j in range(30)]
    for i in range(6):
        _append(mount / "t/0/append", b"".join(written[i * 30:(i + 1) * 30]))
    # the first segment after 6 KB of records: a page and a half of good bytes before it
    damaged = next(p for p in sorted(mount.partition_dir("t", 0).glob("*.log")) if int(p.stem) >= 60)
    data = bytearray(damaged.read_bytes())
    bad = data.find(b"val-")
    data[bad] ^= 0x20                       # one flipped bit in a stored value of its first batch
    damaged.write_bytes(bytes(data))
    base = int(damaged.name.split(".")[0])
    result = mount.sh("cat t/0/records", check=False)
    assert result.returncode != 0
    assert b"Input/output error" in result.stderr
    good = b"".join(written[:base])
    if mode == ["--no-page-cache"]:
        assert result.stdout == good                            # every record before the damaged batch
    else:
        assert result.stdout == good[:len(good) // 4096 * 4096]
        assert result.stdout                                                        # its whole pages
    assert mount.stop() == 0
    assert mount.log().count(f"file {damaged}, position 0") == 1


# --------------------------------------------------------------------------- memory


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_repeated_lookups_reuse_inodes_and_keep_memory_flat(mount):
    _topic(mount, records=100)
    paths = [str(mount / p) for p in ("t/0/records", "t/0/from/5", "t/0/offset/3", "t/0/since/0.jsonl",
                                      "t/0/segments/00000000000000000000.jsonl")]
    inodes = {p: os.stat(p).st_ino for p in paths}
    for _ in range(500):                      # warm up allocator pools
        for p in paths:
            os.stat(p)
    assert json.loads((mount / ".logfs/stats.json").read_bytes())["compiled_kernels"] == "loaded"
    before = _rss_kib(mount.proc.pid)
    for _ in range(6000):                     # 30,000 lookups (and getattrs)
        for p in paths:
            assert os.stat(p).st_ino == inodes[p]
    grown = _rss_kib(mount.proc.pid) - before
    # a fresh inode per lookup grew the mount by 170-550 bytes each (5-16 MiB here)
    assert grown < 2048, f"RSS grew {grown} KiB over 30,000 lookups"


# --------------------------------------------------------------------------- refusals, logs, CLI, scripts


def test_refusals_are_logged_once_each_naming_the_cause(mount):
    _topic(mount, records=5)
    for name in ("since/notatime", "offset/007", "offset/00", "from/٣", "offset/99"):
        for _ in range(3):                  # a tool polling a bad name: one line, not three
            assert not (mount / "t/0" / name).exists()
    with pytest.raises(OSError) as info:
        os.mkdir(mount / "t/٣")
    assert info.value.errno == errno.EINVAL
    (mount / "t/0/delete").write_bytes(b"before 3\n")
    assert mount.stop() == 0
    log = mount.log()
    for needle in ("since/'notatime'", "offset '007'", "offset '00'", "from/'٣'", "offset 99 ",
                   "Invalid partition number '٣'"):
        assert log.count(needle) == 1, needle
    assert log.splitlines()[0].split("] ", 1)[1].startswith("INFO logfs ")   # the startup summary first
    assert " loaded 0 logs from " in log.splitlines()[0]


def test_numbers_of_thousands_of_digits_are_einval_with_one_log_line(mount):
    _topic(mount, records=5)
    huge = "1" * 5000                      # int() refuses more than 4,300 digits: never EIO
    for path, data in (("t/0/delete", f"before {huge}\n"), ("t/config", f"retention.ms={huge}\n")):
        fd = os.open(mount / path, os.O_WRONLY)
        try:
            with pytest.raises(OSError) as info:
                os.write(fd, data.encode())
            assert info.value.errno == errno.EINVAL, path
        finally:
            os.close(fd)
    with pytest.raises(OSError) as info:
        os.mkdir(mount / "t" / ("2" * 250))
    assert info.value.errno == errno.EINVAL
    assert (mount / "t/0/records").read_bytes() == _lines(1, 5)
    assert mount.stop() == 0
    log = mount.log()
    assert "Traceback" not in log
    assert "unexpected error" not in log
    assert log.count("(5007 characters)") == 1
    assert log.count("(5000 characters)") == 1
    assert log.count("(250 characters)") == 1


def test_cli_version_log_level_help_and_umount_messages(tmp_path):
    out = subprocess.run([str(LOGFS), "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.startswith("logfs ")
    out = subprocess.run([str(LOGFS), "mount", "--help"], capture_output=True, text=True)
    assert "--log-level" in out.stdout
    out = subprocess.run([str(LOGFS), "umount", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.strip() == f"logfs umount: {tmp_path} is not mounted"


def _scripts_tree(tmp_path: Path) -> Path:
    """A copy of the project root's run.sh with the shared .venv, so run.sh mounts tmp_path/mnt.

    setup.sh is a stub here: the real one, run from this copy with the shared
    .venv, reinstalls the editable package from the copy whenever
    pyproject.toml is newer than the venv's stamp, and leaves every work tree
    sharing that .venv without a working ``logfs``.
    """
    root = tmp_path / "root"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "run.sh", root / "scripts" / "run.sh")
    (root / "scripts" / "setup.sh").write_text("#!/usr/bin/env bash\n# the installation is the shared .venv\n")
    (root / ".venv").symlink_to(ROOT / ".venv")
    (root / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    return root


def test_run_sh_help_mounts_nothing(tmp_path):
    root = _scripts_tree(tmp_path)
    out = subprocess.run(["bash", "scripts/run.sh", "--help"], cwd=root, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("usage: scripts/run.sh")
    assert "--data-dir" in out.stdout
    assert "mounting" not in out.stdout
    assert not (root / "mnt").exists()


def test_run_sh_detaches_a_killed_mount_and_mounts_again(tmp_path):
    root = _scripts_tree(tmp_path)
    dead = Mount(root, {}).start()
    os.mkdir(dead / "t")
    proc = dead.proc
    assert proc is not None                 # started
    proc.kill()                             # kill -9: mnt answers "Transport endpoint is not connected"
    proc.wait()
    with pytest.raises(OSError) as info:
        os.stat(root / "mnt/t")
    assert info.value.errno == errno.ENOTCONN
    proc = subprocess.Popen(["bash", "scripts/run.sh"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (root / "mnt/t").is_dir() if _stat_ok(root / "mnt") else False,
                 timeout=60, what="run.sh to mount again")
        assert (root / "mnt/t/0/records").read_bytes() == b""
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert b"stale mount" in out, out.decode(errors="replace")
    assert proc.returncode == 0, out.decode(errors="replace")


def _stat_ok(path: Path) -> bool:
    try:
        os.stat(path)
        return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0
    except OSError:
        return False


def test_pipeline_stream_checkpoint_is_not_in_the_current_directory(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import pipeline
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    path = pipeline.default_checkpoint("mnt", "events", "windows")
    assert path.startswith(str(tmp_path / "state" / "logfs" / "pipeline"))
    assert path.endswith("events-to-windows")
    assert not Path(path).is_relative_to(tmp_path / "mnt")


def test_sendfile_of_a_generated_file_that_shrank_while_open_copies_what_it_opened(mount):
    """``shutil.copyfile``'s ``sendfile`` stops at the size the kernel last got, even from a direct-I/O file.

    The metrics of a deleted topic go: a ``stat`` after the open used to give the new, shorter size
    and the copy of the opening's snapshot was cut there with no error.
    """
    for topic in ("a", "b"):
        os.mkdir(mount / topic)
        _append(mount / f"{topic}/0/append", b"x\n")
    path = mount / ".logfs/metrics"
    fd = os.open(path, os.O_RDONLY)
    try:
        opened = b""
        while chunk := os.pread(fd, 1 << 20, len(opened)):
            opened += chunk
        os.rmdir(mount / "b")
        wait_for(lambda: b'topic="b"' not in path.read_bytes(), what="the deleted topic's metrics to go")
        os.stat(path)                           # the kernel learns the size of a newer rendering
        with open(mount.path.parent / "copy", "wb") as out:
            copied = 0
            while sent := os.sendfile(out.fileno(), fd, copied, 1 << 23):
                copied += sent
        assert (mount.path.parent / "copy").read_bytes() == opened
    finally:
        os.close(fd)
