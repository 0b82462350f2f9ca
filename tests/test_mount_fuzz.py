"""Hypothesis fuzzing through a real mount: names, markers, config lines and binary appends.

Every input gets its errno from SPEC.md section 7 (never EIO, never a crash),
what was stored before stays intact, and the mount's log shows no traceback.
Examples are bounded so the file runs in seconds.
"""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

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
    mount = Mount(tmp_path_factory.mktemp("fuzz"), {**FAST_TASKS, "log.segment.bytes": "2000"}).start()
    os.mkdir(mount / "t")
    fd = os.open(mount / "t/0/append", os.O_WRONLY)
    os.write(fd, b"".join(b"v%d\n" % i for i in range(100)))
    os.close(fd)
    yield mount
    assert mount.stop() == 0
    log = mount.log()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


def _errno(fn, *args) -> int:
    try:
        fn(*args)
    except OSError as exc:
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
        assert offset is not None and offset < 100
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
