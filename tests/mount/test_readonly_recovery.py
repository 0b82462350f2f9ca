"""``logfs mount --read-only`` of a directory that needs recovery (issue 12): recovered in memory only.

A copy of a live Kafka broker's ``log.dirs`` never has a clean-shutdown marker.
Here such a directory is made by a real mount killed with SIGKILL, then damaged
the ways a copy of a running broker is (a torn batch at the end of an active
segment, a missing index, an index that does not match its log) and given the
files a Kafka 3.x/4.x broker keeps beside its segments.  A read-only mount must
serve exactly what a Kafka consumer decodes from the segments (kafka-python is
the judge) and leave every byte, name, mode and mtime of the directory as it
was.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.clock import ManualClock
from engine.config import LogConfig
from engine.errors import CorruptRecordError
from engine.log import Log
from tests.conftest import Mount, MountFactory, kafka_records
from tests.helpers import add_config, append_lines, wait_for

pytestmark = pytest.mark.mount

SMALL_SEGMENTS = {"internal.log.segment.bytes": "4096", "log.index.interval.bytes": "256", "num.partitions": "2"}

KAFKA_ROOT_FILES = {
    "meta.properties": b"#\nnode.id=1\ndirectory.id=kH3sZ2Q0Tnu1oYxq2cJ1aw\nversion=1\n"
                       b"cluster.id=MkU3OEVBNTcwNTJENDM2Qg\n",
    "bootstrap.checkpoint": b"\x00\x01not-a-segment",
}
KAFKA_PARTITION_FILES = {
    "partition.metadata": b"version: 0\ntopic_id: 1pXAvvM8R8C2rUcSk9zRtw\n",
    "leader-epoch-checkpoint": b"0\n1\n0 0\n",
    "00000000000000000000.snapshot": b"\x00\x01" + b"\x00" * 20,
    "00000000000000000000.txnindex": b"",
    "00000000000000999999.txnindex": b"",        # orphaned: no segment of that base
}


def fingerprint(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry under ``root`` (itself included): kind, mode, size, mtime and content hash."""
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            digest = ""
            if os.path.isfile(path) and not os.path.islink(path):
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            result[os.path.normpath(os.path.relpath(path, root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return result


def _jsonl(mount: Mount, path: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    out = []
    for line in (mount / path).read_bytes().splitlines():
        doc = json.loads(line)
        key = None if doc["key"] is None else doc["key"].encode()
        value = None if doc["value"] is None else doc["value"].encode()
        out.append((doc["offset"], doc["timestamp"], key, value))
    return out


def _make_unclean_broker_like_dir(logfs_mount: MountFactory) -> Mount:
    m = logfs_mount(SMALL_SEGMENTS, name="rw")
    for topic in ("a", "b", "z"):
        (m / topic).mkdir()
    add_config(m / "z/config", b"compression.type=gzip\n")
    for i in range(60):
        for topic in ("a", "b", "z"):
            for p in (0, 1):
                append_lines(m / f"{topic}/{p}/append", [b"%s%d-%d-%d" % (topic.encode(), p, i, j) for j in range(5)])
    # fsync everything and wait for the recovery points to be checkpointed, so the
    # sealed segments are below the recovery point (checked, not recovered, at load)
    ends = {}
    for topic in ("a", "b", "z"):
        for p in (0, 1):
            fd = os.open(m / f"{topic}/{p}/append", os.O_WRONLY)
            os.fsync(fd)
            os.close(fd)
            ends[f"{topic} {p}"] = json.loads((m / f"{topic}/{p}/state").read_bytes())["log_end_offset"]
    checkpoint = m.data / "recovery-point-offset-checkpoint"
    wait_for(lambda: checkpoint.exists()
             and all(f"{tp} {end}" in checkpoint.read_text().splitlines() for tp, end in ends.items()),
             "recovery points to be checkpointed")
    m.kill()                                         # no clean-shutdown marker: recovery needed
    assert not (m.data / ".kafka_cleanshutdown").exists()
    return m


def test_read_only_mount_of_an_unclean_dir_recovers_in_memory_and_writes_nothing(logfs_mount):
    rw = _make_unclean_broker_like_dir(logfs_mount)
    data = rw.data
    # a torn batch at the end of a's active segment (a copy taken mid-write)
    active = sorted((data / "a-0").glob("*.log"))[-1]
    with open(active, "ab") as f:
        f.write(struct.pack(">qi", 10_000, 500) + b"\x00" * 40)
    # a missing index and an index that passes Kafka's sanity check but not ours
    sealed_b = sorted((data / "b-0").glob("*.log"))[0]
    sealed_b.with_suffix(".index").unlink()
    sealed_b.with_suffix(".timeindex").unlink()
    index = sorted((data / "b-1").glob("*.log"))[0].with_suffix(".index")
    raw = index.read_bytes()
    index.write_bytes(b"".join(struct.pack(">ii", rel, pos + 3)
                               for rel, pos in struct.iter_unpack(">ii", raw)))
    # Kafka's own files beside the segments, and the KRaft metadata log
    for name, content in KAFKA_ROOT_FILES.items():
        (data / name).write_bytes(content)
    for pdir in data.glob("*-[0-9]"):
        for name, content in KAFKA_PARTITION_FILES.items():
            (pdir / name).write_bytes(content)
    meta = data / "__cluster_metadata-0"
    meta.mkdir()
    (meta / "quorum-state").write_bytes(b'{"leaderId":1,"leaderEpoch":3,"votedId":-1}')
    (meta / "00000000000000000000.log").write_bytes(active.read_bytes()[:200])
    (meta / "00000000000000000000.index").write_bytes(b"\x00" * 80)

    expected = {(t, p): [(r.offset, r.timestamp, r.key, r.value) for r in kafka_records(data / f"{t}-{p}")]
                for t in ("a", "b", "z") for p in (0, 1)}
    assert all(len(v) > 100 for v in expected.values())
    before = fingerprint(data)

    ro = logfs_mount(SMALL_SEGMENTS, name="ro", read_only=True, start=False)
    ro.data.rmdir()
    ro.data = data
    ro.start()
    try:
        assert sorted(os.listdir(ro.path)) == [".logfs", "a", "b", "z"]      # no __cluster_metadata topic
        for (topic, p), records in expected.items():
            assert _jsonl(ro, f"{topic}/{p}/records.jsonl") == records, (topic, p)
        # offset/N goes through the offset index: rebuilt in memory where it was missing or wrong
        for topic, p in (("b", 0), ("b", 1)):
            for offset, _, _, value in expected[(topic, p)][::7]:
                assert value is not None                # every record was appended as a line
                assert ro.sh(f"cat {topic}/{p}/offset/{offset}").stdout == value + b"\n"
        result = ro.sh("echo x >> a/0/append", check=False)
        assert result.returncode != 0
        assert b"Read-only file system" in result.stderr
    finally:
        assert ro.stop() == 0
    assert fingerprint(data) == before
    log = ro.log()
    assert "recovering segment and rebuilding index files in memory (read-only)" in log
    assert "Ignoring" in log
    assert str(active) in log                                  # the torn tail, left out in memory

    # Read-write, the same directory is recovered on disk and Kafka's files stay as they were.
    kafka_files = {k: v for k, v in before.items()
                   if any(k.endswith(n) for n in (*KAFKA_ROOT_FILES, *KAFKA_PARTITION_FILES))
                   or k.startswith("__cluster_metadata-0")}
    rw.start()
    try:
        assert _jsonl(rw, "a/0/records.jsonl") == expected[("a", 0)]
        assert "__cluster_metadata" not in os.listdir(rw.path)
    finally:
        assert rw.stop() == 0
    after = fingerprint(data)
    assert {k: after.get(k) for k in kafka_files} == kafka_files


# --------------------------------------------------------------------------- property: read-only == read-write recovery


_CONFIG = LogConfig.from_props({"internal.segment.bytes": "1000", "index.interval.bytes": "150"})
_T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "t-0"
    clock = ManualClock(_T0)
    log = Log.load(str(path), _CONFIG, clock=clock)
    for i in range(40):
        log.append_values([b"%d-%d" % (i, j) * (1 + j % 3) for j in range(1 + i % 4)])
        clock.sleep(7)
    log.flush()
    log.close()
    return path


def _outcome(log: Log) -> tuple[object, ...]:
    """What a reader gets: offsets, then every record from the log start or the damage that stops it."""
    try:
        records = [(r.offset, r.timestamp, r.value) for r in log.read_records(log.log_start_offset)]
        return log.log_start_offset, log.log_end_offset, records
    except CorruptRecordError as exc:
        assert exc.path is not None                 # a log's read names the segment file it failed in
        return log.log_start_offset, log.log_end_offset, ("EIO", os.path.basename(exc.path), exc.position)


_DAMAGE = st.tuples(
    st.sampled_from(["truncate log", "flip log byte", "delete index", "delete time index", "flip index byte",
                     "append junk"]),
    st.integers(min_value=0, max_value=10_000),      # which segment (modulo)
    st.integers(min_value=0, max_value=100_000),     # where in the file (modulo its size)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damages=st.lists(_DAMAGE, min_size=1, max_size=3), clean=st.booleans(), recovery_point=st.integers(0, 60))
def test_read_only_load_serves_what_read_write_recovery_leaves_and_writes_nothing(template, tmp_path_factory,
                                                                                 damages, clean, recovery_point):
    import shutil
    base = tmp_path_factory.mktemp("case")
    ro_dir, rw_dir = base / "ro" / "t-0", base / "rw" / "t-0"
    shutil.copytree(template, ro_dir)
    logs = sorted(ro_dir.glob("*.log"))
    for kind, which, where in damages:
        segment = logs[which % len(logs)]
        target = {"delete index": segment.with_suffix(".index"), "delete time index": segment.with_suffix(".timeindex"),
                  "flip index byte": segment.with_suffix(".index")}.get(kind, segment)
        if not target.exists():
            continue
        size = target.stat().st_size
        if kind.startswith("delete"):
            target.unlink()
        elif kind == "truncate log":
            os.truncate(target, where % (size + 1))
        elif kind == "append junk":
            with open(target, "ab") as f:
                f.write(b"\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x30" + bytes(where % 50))
        elif size:
            with open(target, "r+b") as f:
                f.seek(where % size)
                byte = f.read(1)
                f.seek(where % size)
                f.write(bytes([byte[0] ^ 0x41]))
    shutil.copytree(ro_dir, rw_dir)
    before = fingerprint(ro_dir)
    clock = ManualClock(_T0 + 10_000_000)
    kw = {"had_clean_shutdown": clean, "recovery_point": recovery_point, "clock": clock}
    ro = Log.load(str(ro_dir), _CONFIG, read_only=True, **kw)
    try:
        seen = _outcome(ro)
    finally:
        ro.close()
    assert fingerprint(ro_dir) == before
    rw = Log.load(str(rw_dir), _CONFIG, **kw)
    try:
        assert seen == _outcome(rw)
    finally:
        rw.close()
