"""Hypothesis fuzzing through a real mount: names, markers, config lines and binary appends.

Every input gets its errno from SPEC.md section 7 (never EIO, never a crash),
what was stored before stays intact, and the mount's log shows no traceback.
Examples are bounded so the file runs in seconds.
"""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.numbers import parse_canonical_int
from tests.conftest import FAST_TASKS, Mount

pytestmark = pytest.mark.mount

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

#: names as a shell user might type them: digits of any script, signs, dots, ISO-ish times, junk
names = st.one_of(
    st.text(alphabet="0123456789", min_size=1, max_size=25),
    st.text(alphabet="0123456789٠١٢٣٤٥٦٧٨٩²+-.eE:TZ ", min_size=1, max_size=30),
    st.text(min_size=1, max_size=60).filter(lambda s: "/" not in s and "\0" not in s),
    st.integers(min_value=0, max_value=10**30).map(str),
)


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    mount = Mount(tmp_path_factory.mktemp("fuzz"), {**FAST_TASKS, "internal.log.segment.bytes": "2000"}).start()
    os.mkdir(mount / "t")
    fd = os.open(mount / "t/0/append", os.O_WRONLY)
    os.write(fd, b"".join(b"v%d\n" % i for i in range(100)))
    os.close(fd)
    yield mount
    assert mount.stop() == 0
    log = mount.log()
    assert "Traceback" not in log, log[-3000:]
    assert "unexpected error" not in log, log[-3000:]


def _errno(fn, *args) -> int:
    """The errno of the OSError ``fn(*args)`` raises, or 0."""
    try:
        fn(*args)
    except OSError as exc:
        assert exc.errno is not None, exc           # a refused system call's error carries its errno
        return exc.errno
    return 0


def _valid_name(name: str) -> bool:
    return name not in (".", "..") and len(name.encode()) <= 255


@FUZZ
@given(name=names, where=st.sampled_from(["offset", "from", "since", "segments", "."]))
def test_lookups_of_any_name(m, name, where):
    if not _valid_name(name):
        return
    code = _errno(os.stat, m / "t/0" / where / name)
    assert code in (0, errno.ENOENT), (where, name, code)
    if code == 0 and where == "offset":
        # only the one spelling of an existing offset names a file
        offset = parse_canonical_int(name)
        assert offset is not None
        assert offset < 100
        assert (m / "t/0/offset" / name).read_bytes() == b"v%d\n" % offset


@FUZZ
@given(name=names)
def test_mkdir_of_any_partition_name(m, name):
    if not _valid_name(name):
        return
    partitions = sum(n.isdigit() for n in os.listdir(m / "t"))
    code = _errno(os.mkdir, m / "t" / name)
    assert code in (0, errno.EINVAL, errno.EEXIST), (name, code)
    if code == 0:
        assert name == str(partitions)        # only the next number, in its one spelling
    assert (m / "t/0/offset/0").read_bytes() == b"v0\n"


@FUZZ
@given(name=st.text(min_size=1, max_size=80).filter(lambda s: "/" not in s and "\0" not in s))
def test_mkdir_of_any_topic_name(m, name):
    if not _valid_name(name) or name == "t":
        return
    code = _errno(os.mkdir, m / name)
    assert code in (0, errno.EINVAL, errno.EEXIST, errno.EPERM), (name, code)
    if code == 0:
        assert _errno(os.rmdir, m / name) == 0


markers = st.one_of(
    st.builds(lambda n: b"before " + n.encode(), names),
    st.builds(lambda k: b"key " + k, st.binary(min_size=0, max_size=20)),
    st.binary(max_size=40),
)


@FUZZ
@given(marker=markers)
def test_any_marker(m, marker):
    end_before = len((m / "t/0/records").read_bytes().splitlines())
    code = _errno(_write, m / "t/0/delete", marker + b"\n")
    assert code in (0, errno.EINVAL), (marker, code)
    if code and marker.startswith(b"before "):
        assert len((m / "t/0/records").read_bytes().splitlines()) == end_before


config_lines = st.one_of(
    st.builds(lambda n, v: f"{n}={v}".encode(), st.sampled_from(["retention.ms", "segment.bytes", "flush.ms",
                                                                 "min.cleanable.dirty.ratio", "x.y"]), names),
    st.binary(max_size=60),
)


@FUZZ
@given(lines=st.lists(config_lines, min_size=1, max_size=3))
def test_any_config_lines(m, lines):
    before = (m / "t/config").read_bytes()
    code = _errno(_write_lines_then_close, m / "t/config", lines)
    assert code in (0, errno.EINVAL), (lines, code)
    if code:
        assert (m / "t/config").read_bytes() == before          # nothing of that opening applied
    _write(m / "t/config", b"retention.ms=\nsegment.bytes=\nflush.ms=\nmin.cleanable.dirty.ratio=\n")


@FUZZ
@given(values=st.lists(st.binary(max_size=300).filter(lambda b: b"\n" not in b), min_size=1, max_size=20))
def test_binary_appends_read_back_byte_for_byte(m, values):
    size = os.stat(m / "t/0/records").st_size
    data = b"".join(v + b"\n" for v in values)
    _write(m / "t/0/append", data)
    with open(m / "t/0/records", "rb") as f:
        f.seek(size)
        assert f.read() == data


def _write(path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_lines_then_close(path, lines: list[bytes]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        for line in lines:
            os.write(fd, line + b"\n")
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- a seeded hostile session

#: How the session found issue 18: every namespace call with bad names, bytes, JSON, configs, markers
#: and group lines, racing threads, and a kill -9 and remount every few hundred calls.  Seeded and bounded
#: (operations and seconds), so a failure replays with the same seed.
SESSION_SEED = 18
SESSION_ROUNDS = 6
SESSION_OPS_PER_THREAD = 60
SESSION_THREADS = 3
SESSION_SECONDS = 45.0
#: topics the session creates, deletes and creates again (the recreated-topic path of issue 18)
SESSION_TOPICS = ["h0", "h1", "h.2", "h_3"]
HUGE = "9" * 5000


def _hostile_op(rnd, mount, topic: str) -> tuple[str, int]:
    """One random call through the mount; returns (what, errno or 0)."""
    p = rnd.choice(["0", "1", "00", "-1", "٣", HUGE[:30]])
    junk = bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))
    choice = rnd.randrange(13)
    if choice == 0:
        return "mkdir topic", _errno(os.mkdir, mount / rnd.choice([topic, topic + "x" * rnd.randrange(300), "..."]))
    if choice == 1:
        return "rmdir topic", _errno(os.rmdir, mount / topic)
    if choice == 2:
        lines = rnd.choice([b"a\nb\n", junk, junk + b"\n", b"\n" * 3, b"x" * 5000 + b"\n"])
        return "append", _errno(_write, mount / topic / p / "append", lines)
    if choice == 3:
        line = rnd.choice([b'{"value": "v"}\n', b'{"key": "k", "value": 1}\n', b"{bad\n", junk + b"\n",
                           b'{"value": "' + HUGE.encode() + b'"}\n'])
        return "append.jsonl", _errno(_write, mount / topic / p / "append.jsonl", line)
    if choice == 4:
        line = rnd.choice(["internal.segment.bytes=100", "internal.segment.bytes=14", "segment.bytes=" + HUGE,
                           "segment.bytes=100", "retention.ms=-1",
                           "cleanup.policy=compact", "cleanup.policy=delete", "x=y", "segment.bytes=",
                           "cleanup.policy=", "max.message.bytes=00"]).encode()
        return "config", _errno(_write, mount / topic / "config", line + b"\n")
    if choice == 5:
        marker = rnd.choice([b"before 3", b"before " + HUGE.encode(), b"before 003", b"key k", b"topic", junk])
        return "delete marker", _errno(_write, mount / topic / p / "delete", marker + b"\n")
    if choice == 6:
        line = rnd.choice(["0 1", "0 003", "reset 002", "00 1", "reset earliest", "reset latest", "0 " + HUGE,
                           "reset " + HUGE, "reset @" + HUGE, "reset 2020-01-01", "9 9"]).encode()
        return "group line", _errno(_write_created, mount / topic / "groups" / rnd.choice(["g", "g2"]), line + b"\n")
    if choice == 7:
        return "read", _errno(lambda: (mount / topic / p / rnd.choice(["records", "records.jsonl", "state"]))
                              .read_bytes())
    if choice == 8:
        return "offset lookup", _errno(os.stat, mount / topic / p / "offset" / rnd.choice(["0", "007", HUGE, "x"]))
    if choice == 9:
        return "add partition", _errno(os.mkdir, mount / topic / rnd.choice(["1", "2", "01", HUGE[:40]]))
    if choice == 10:
        return "stat junk", _errno(os.stat, mount / topic / junk.decode("latin-1").replace("/", "_").replace(
            "\0", "_")[:200] if junk else mount / topic)
    if choice == 11:
        return "consume", _errno(lambda: (mount / topic / p / "consume" / "g").read_bytes())
    return "listdir", _errno(os.listdir, mount / topic)


def test_a_seeded_hostile_session_with_crashes_loses_no_acknowledged_record(logfs_mount):
    import random
    import threading
    import time

    mount = logfs_mount({"internal.log.segment.bytes": "300", "log.cleaner.backoff.ms": "200"})
    os.mkdir(mount / "ctl")
    acknowledged: list[bytes] = []            # control records whose write() returned: never lost
    failures: list[str] = []
    deadline = time.monotonic() + SESSION_SECONDS
    rnd_main = random.Random(SESSION_SEED)
    calls = 0

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(SESSION_OPS_PER_THREAD):
            what, code = _hostile_op(rnd, mount, rnd.choice(SESSION_TOPICS))
            if code in (errno.EIO, errno.ENOTCONN, errno.ECONNABORTED):
                failures.append(f"{what}: {os.strerror(code)}")

    for round_ in range(SESSION_ROUNDS):
        if time.monotonic() > deadline:
            break
        threads = [threading.Thread(target=worker, args=(SESSION_SEED * 100 + round_ * 10 + i,))
                   for i in range(SESSION_THREADS)]
        for t in threads:
            t.start()
        for i in range(20):                   # control records, interleaved with the hostile calls
            value = b"ctl-%d-%d" % (round_, i)
            _write(mount / "ctl/0/append", value + b"\n")
            acknowledged.append(value)
        for t in threads:
            t.join()
        calls += SESSION_THREADS * SESSION_OPS_PER_THREAD
        assert not failures, failures
        assert mount.proc is not None, mount.log_tail()
        assert mount.proc.poll() is None, mount.log_tail()
        if rnd_main.random() < 0.7:           # kill -9 and remount; otherwise a clean restart
            mount.kill()
        else:
            assert mount.stop() == 0
        mount.start()
        assert (mount / "ctl/0/records").read_bytes().splitlines() == acknowledged
        for topic in SESSION_TOPICS:          # every surviving topic reads whole, without EIO
            for partition in (os.listdir(mount / topic) if (mount / topic).is_dir() else []):
                if partition.isdigit():
                    (mount / topic / partition / "records").read_bytes()
    assert calls >= SESSION_THREADS * SESSION_OPS_PER_THREAD * 2
    log = mount.log()
    assert "Traceback" not in log, log[-3000:]
    assert "unexpected error" not in log, log[-3000:]
    assert "checkpointed log start offset" not in log    # no false damage report (issue 18)


def _write_created(path, data: bytes) -> None:
    """``echo ... > path``: created if missing (a group file), then one write and close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
