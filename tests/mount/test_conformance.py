"""Conformance: the everyday tools on every kind of file of the namespace, with the expected outcome.

One mount holds a partition with records in several segments; every file kind
(views, single records, raw segment files, generated files, control files,
directories) is run through ``cat``, ``cp``, ``head``, ``tail``, ``wc``,
``less``, ``grep``, ``stat``, ``du``, ``find``, ``tar`` and Python's ``open``,
``shutil`` and ``mmap``.  The table below is the contract, errno included; the
reference content of each file is what Python's ``open().read()`` returns,
itself checked against kafka-python's reading of the segment files.

| kind | cat/cp/head/tail/wc/less/open/shutil | stat | du | mmap | write |
|---|---|---|---|---|---|
| view (records, from/N, since/T, *.jsonl) | the rendering | one inode, st_size = bytes read | 0 blocks | the rendering | EACCES |
| offset/N | the value and a newline | one inode, st_size = bytes read | 0 blocks | ENODEV | EACCES |
| segments/*.log/.index/.timeindex | the used bytes on disk | one inode, st_size = used bytes | the used bytes | ENODEV | EACCES |
| state, .logfs/*, config | the generated text | st_size = bytes read | the bytes | ENODEV | EACCES (.logfs, state) |
| append, delete (read) | empty (a reader has written no batch) | st_size 0 | 0 | empty file: ValueError | appends / deletes |
| directories | ls -la with . and ..; find lists files; offset/ from/ since/ list nothing | | sum of the files | | rm -rf of a topic deletes it |
"""  # noqa: E501 (the rows of the markdown table above cannot wrap)

from __future__ import annotations

import errno
import json
import mmap
import os
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import FAST_TASKS, Mount, kafka_records
from tests.helpers import text_view

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.mount

RECORDS = 400


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    mount = Mount(tmp_path_factory.mktemp("conformance"), {**FAST_TASKS, "internal.log.segment.bytes": "4000",
                                                             "log.index.interval.bytes": "200"}).start()
    os.mkdir(mount / "t")
    for start in range(0, RECORDS, 50):
        data = b"".join(b"record %d value\n" % i for i in range(start, start + 50))
        fd = os.open(mount / "t/0/append", os.O_WRONLY)
        os.write(fd, data)
        os.close(fd)
    yield mount
    assert mount.stop() == 0, mount.log()


def _segments(m: Mount) -> list[str]:
    return sorted(n[:-4] for n in os.listdir(m / "t/0/segments") if n.endswith(".log"))


def _kinds(m: Mount) -> dict[str, str]:
    first, last = _segments(m)[0], _segments(m)[-1]
    files = {
        "t/0/records": "view", "t/0/records.jsonl": "view", "t/0/from/123": "view",
        "t/0/from/123.jsonl": "view", "t/0/since/0": "view", "t/0/since/1970-01-01T00:00:00Z.jsonl": "view",
        f"t/0/segments/{first}.jsonl": "view", f"t/0/segments/{last}.jsonl": "view",
        "t/0/offset/7": "record",
        f"t/0/segments/{first}.log": "raw", f"t/0/segments/{first}.index": "raw",
        f"t/0/segments/{first}.timeindex": "raw", f"t/0/segments/{last}.log": "raw",
        f"t/0/segments/{last}.index": "raw", f"t/0/segments/{last}.timeindex": "raw",
        "t/config": "generated", ".logfs/config": "generated",
        # live figures (uptime, task runs): each reader gets a snapshot of its open
        "t/0/state": "live", ".logfs/stats.json": "live", ".logfs/metrics": "live",
        "t/0/append": "control", "t/append": "control", "t/0/delete": "control", "t/delete": "control",
    }
    return files


def _run(m: Mount, command: str) -> subprocess.CompletedProcess[bytes]:
    return m.sh(command, check=False)


def test_reference_contents_match_kafka(m):
    # the reference reader (Python open) agrees with kafka-python on what is stored
    values = [r.value for r in kafka_records(m.partition_dir("t", 0))]
    assert values == [b"record %d value" % i for i in range(RECORDS)]
    assert (m / "t/0/records").read_bytes() == text_view(values)
    rows = [json.loads(line) for line in (m / "t/0/from/123.jsonl").read_bytes().splitlines()]
    assert [r["offset"] for r in rows] == list(range(123, RECORDS))
    assert (m / "t/0/offset/7").read_bytes() == b"record 7 value\n"
    for base in _segments(m):
        on_disk = (m.partition_dir("t", 0) / f"{base}.log").read_bytes()
        assert (m / f"t/0/segments/{base}.log").read_bytes() == on_disk


def _first_lines(content: bytes, n: int) -> bytes:
    """What ``head -n N`` prints: through the Nth newline (bytes.splitlines would also split at \\r)."""
    end = -1
    for _ in range(n):
        end = content.find(b"\n", end + 1)
        if end < 0:
            return content
    return content[:end + 1]


def _last_lines(content: bytes, n: int) -> bytes:
    """What ``tail -n N`` prints: the last N newline-terminated lines."""
    start = len(content) - 1 if content.endswith(b"\n") else len(content)
    for _ in range(n):
        start = content.rfind(b"\n", 0, start)
        if start < 0:
            return content
    return content[start + 1:]


def _expected_blocks(kind: str, size: int) -> int:
    return (size + 511) // 512 if kind in ("raw", "generated") else 0


@pytest.mark.parametrize("tool", ["cat", "cp", "head", "tail", "wc", "less", "stat", "du", "python",
                                  "shutil", "mmap", "write"])
def test_tool_on_every_kind_of_file(m, tool, tmp_path):
    for path, kind in _kinds(m).items():
        content = (m / path).read_bytes()
        where = f"{tool} {path}"
        if kind == "live":
            _check_live(m, tool, path, content, tmp_path)
            continue
        if tool == "cat":
            r = _run(m, f"cat '{path}'")
            assert (r.returncode, r.stdout, r.stderr) == (0, content, b""), where
        elif tool == "cp":
            r = _run(m, f"cp '{path}' {tmp_path}/copy")
            assert (r.returncode, r.stderr) == (0, b""), where
            assert (tmp_path / "copy").read_bytes() == content, where
            os.unlink(tmp_path / "copy")
        elif tool == "head":
            assert _run(m, f"head -c 11 '{path}'").stdout == content[:11], where
            assert _run(m, f"head -n 2 '{path}'").stdout == _first_lines(content, 2), where
        elif tool == "tail":
            assert _run(m, f"tail -c 11 '{path}'").stdout == content[-11:], where
            if kind != "raw":
                assert _run(m, f"tail -n 2 '{path}'").stdout == _last_lines(content, 2), where
        elif tool == "wc":
            assert _run(m, f"wc -c < '{path}'").stdout.strip() == str(len(content)).encode(), where
        elif tool == "less":
            # less with a pipe for output does not page: it copies the file, as cat does
            r = _run(m, f"less -f -F '{path}' | cat")     # -f: no "binary file" question
            assert (r.returncode, r.stdout) == (0, content), where
        elif tool == "stat":
            one, two = os.stat(m / path), os.stat(m / path)
            assert one.st_ino == two.st_ino, where
            if kind in ("view", "record", "raw", "generated"):
                assert one.st_size == len(content), where
            if kind == "control":
                assert one.st_size == 0, where
        elif tool == "du":
            blocks = int(_run(m, f"du -s --block-size=512 '{path}'").stdout.split()[0])
            assert blocks == _expected_blocks(kind, len(content)), where
        elif tool == "python":
            with open(m / path, "rb") as f:
                assert f.read() == content, where
                f.seek(3)
                assert f.read(5) == content[3:8], where
        elif tool == "shutil":
            shutil.copyfile(m / path, tmp_path / "copy")
            assert (tmp_path / "copy").read_bytes() == content, where
        elif tool == "mmap":
            # views are served through the page cache: a mapping reads the rendering; the other
            # files are served with direct I/O: mmap is refused cleanly (ENODEV), never a crash
            with open(m / path, "rb") as f:
                if kind == "control":
                    with pytest.raises(ValueError, match="cannot mmap an empty file"):
                        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                elif kind == "view":
                    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                        assert mapped[:] == content, where
                else:
                    with pytest.raises(OSError) as info:
                        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    assert info.value.errno == errno.ENODEV, where
        elif tool == "write" and (kind in ("view", "record", "raw") or path == ".logfs/config"):
            with pytest.raises(OSError) as info:
                os.close(os.open(m / path, os.O_WRONLY))
            assert info.value.errno in (errno.EACCES, errno.EPERM), where


def _check_live(m: Mount, tool: str, path: str, content: bytes, tmp_path: Path) -> None:
    """A live file: each tool gets a whole, well-formed snapshot (the figures may differ between reads)."""
    def well_formed(data: bytes) -> bool:
        if path.endswith(("stats.json", "state")):
            return isinstance(json.loads(data), dict)
        return data.startswith(b"# HELP ") and data.endswith(b"\n")

    if tool in ("cat", "less"):
        r = _run(m, f"cat '{path}'" if tool == "cat" else f"less -f -F '{path}' | cat")
        assert r.returncode == 0, (tool, path)
        assert well_formed(r.stdout), (tool, path)
    elif tool in ("cp", "shutil"):
        shutil.copyfile(m / path, tmp_path / "copy")
        assert well_formed((tmp_path / "copy").read_bytes()), (tool, path)
    elif tool == "python":
        assert well_formed((m / path).read_bytes())
    elif tool == "stat":
        assert os.stat(m / path).st_ino == os.stat(m / path).st_ino
    elif tool == "mmap":
        with open(m / path, "rb") as f:
            with pytest.raises(OSError) as info:
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert info.value.errno == errno.ENODEV
    elif tool == "write":
        with pytest.raises(OSError) as info:
            os.close(os.open(m / path, os.O_WRONLY))
        assert info.value.errno in (errno.EACCES, errno.EPERM)
    else:   # head, tail, wc, du: a snapshot of the right shape
        assert _run(m, f"{ {'head': 'head -c 5', 'tail': 'tail -c 5', 'wc': 'wc -c', 'du': 'du -s'}[tool]} "
                       f"'{path}'").returncode == 0


def test_directories(m, tmp_path):
    first = _segments(m)[0]
    # ls -la: . and .. first, then the entries
    names = [line.split()[-1] for line in _run(m, "ls -la t/0").stdout.decode().splitlines()[1:]]
    assert names[:2] == [".", ".."]
    assert sorted(names[2:]) == sorted(["append", "append.jsonl", "records", "records.jsonl", "offset", "from",
                                        "since", "segments", "state", "delete", "consume"])
    for sub in ("offset", "from", "since", "consume"):
        assert os.listdir(m / "t/0" / sub) == []          # addressed by name only
    found = set(_run(m, "find t -type f").stdout.decode().split())
    assert {"t/append", "t/config", "t/delete", "t/0/records", f"t/0/segments/{first}.log"} <= found
    assert not any("/offset/" in f or "/from/" in f for f in found)
    # grep -r reads every file: the records view and the raw segment (binary) both match
    r = _run(m, "grep -r -c 'record 399 value' t/0")
    assert r.returncode == 0
    counts = dict(line.rsplit(":", 1) for line in r.stdout.decode().splitlines())
    assert counts["t/0/records"] == "1"
    assert counts["t/0/records.jsonl"] == "1"
    # du of the partition: the stored segment bytes, not the views and not the preallocation
    blocks = int(_run(m, "du -s --block-size=512 t/0/segments").stdout.split()[0])
    stored = sum(len((m / f"t/0/segments/{n}").read_bytes()) for n in os.listdir(m / "t/0/segments")
                 if not n.endswith(".jsonl"))
    assert stored // 512 <= blocks <= stored // 512 + 3 * len(os.listdir(m / "t/0/segments"))
    # tar and rsync of the whole topic reproduce every file
    assert _run(m, f"tar cf {tmp_path}/t.tar t").returncode == 0
    subprocess.run(["tar", "xf", str(tmp_path / "t.tar"), "-C", str(tmp_path)], check=True)
    assert (tmp_path / "t/0/records").read_bytes() == (m / "t/0/records").read_bytes()
    assert _run(m, f"rsync -a t/ {tmp_path}/rs/").returncode == 0
    assert (tmp_path / "rs/0/segments" / f"{first}.index").read_bytes() == \
        (m / f"t/0/segments/{first}.index").read_bytes()


def test_names_that_do_not_exist(m):
    # ENOENT for every name that names nothing, however it is spelt (SPEC section 7)
    for name in ("offset/007", "offset/00", "offset/٣", "offset/-1", "offset/1e3", "offset/" + "9" * 5000,
                 "offset/99999", "from/abc", "from/0400", "from/" + "1" * 30, "since/notatime",
                 "since/2026-13-45", "since/٢٠٢٦", "since/0099", "segments/0.log", "segments/x.jsonl",
                 "nothing", "records.txt"):
        with pytest.raises(OSError) as info:
            os.stat(m / "t/0" / name[:250])
        assert info.value.errno in (errno.ENOENT, errno.ENAMETOOLONG), name
    for name in ("03", "٣", "00"):
        with pytest.raises(OSError) as info:
            os.stat(m / "t" / name)
        assert info.value.errno == errno.ENOENT, name
        with pytest.raises(OSError) as info:
            os.mkdir(m / "t" / name)
        assert info.value.errno == errno.EINVAL, name


def test_appending_and_control_files_through_tools(m):
    before = len((m / "t/0/records").read_bytes().splitlines())
    assert _run(m, "echo one more >> t/0/append").returncode == 0
    assert _run(m, "printf 'a\\nb\\n' | tee -a t/0/append > /dev/null").returncode == 0
    assert (m / "t/0/records").read_bytes().splitlines()[before:] == [b"one more", b"a", b"b"]
    r = _run(m, "echo 'before 0100' > t/0/delete")     # one spelling per number
    assert r.returncode != 0
    assert b"Invalid argument" in r.stderr
    assert (m / "t/0/offset/50").exists()
