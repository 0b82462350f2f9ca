"""The namespace of a real mount (SPEC.md section 4), driven by shell tools and file I/O.

Every view read through the mount is checked against the segment files decoded
by kafka-python after a clean unmount.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import time

import pytest

from tests.conftest import kafka_records
from tests.helpers import JsonObject, add_config, mount_stats, wait_for

pytestmark = pytest.mark.mount


def _json_lines(data: bytes) -> list[JsonObject]:
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.mount_options({"num.partitions": "2"})
def test_topic_partition_layout_and_views_match_kafka(mount):
    mount.sh("mkdir t")
    assert sorted(os.listdir(mount / "t")) == ["0", "1", "append", "append.jsonl", "config", "delete", "groups"]
    mount.sh("mkdir t/2")
    assert "2" in os.listdir(mount / "t")
    assert sorted(os.listdir(mount / "t/0")) == sorted(
        ["append", "append.jsonl", "consume", "records", "records.jsonl", "offset", "from", "since", "segments",
         "state", "delete"])

    mount.sh("for i in $(seq 1 100); do echo line-$i; done > t/0/append")
    mount.sh("printf 'a\\nb\\n' >> t/0/append && echo 'héllo \"q\"' >> t/0/append")
    out = mount.sh("cat t/0/records").stdout
    expected = [f"line-{i}".encode() for i in range(1, 101)] + [b"a", b"b", 'héllo "q"'.encode()]
    assert out.splitlines() == expected
    assert os.stat(mount / "t/0/records").st_size == len(out)

    assert mount.sh("wc -l < t/0/records").stdout.strip() == b"103"
    assert mount.sh("grep -c '^line-1' t/0/records").stdout.strip() == b"12"
    assert mount.sh("head -n 2 t/0/records").stdout == b"line-1\nline-2\n"
    assert mount.sh("cat t/0/offset/100").stdout == b"a\n"
    assert mount.sh("cat t/0/from/101").stdout == b"b\n" + 'héllo "q"'.encode() + b"\n"
    assert mount.sh("dd if=t/0/records bs=7 skip=1 count=1 status=none").stdout == out[7:14]

    jl = mount.sh("cat t/0/records.jsonl").stdout
    assert os.stat(mount / "t/0/records.jsonl").st_size == len(jl)
    rows = _json_lines(jl)
    assert [r["offset"] for r in rows] == list(range(103))
    assert all(r["topic"] == "t" and r["partition"] == 0 and r["timestampType"] == 1 and r["key"] is None
               for r in rows)
    assert rows[102]["value"] == 'héllo "q"'
    assert all(list(row) == ["topic", "partition", "offset", "timestamp", "timestampType", "key", "keyEncoding",
                             "value", "valueEncoding", "headers"] for row in rows)
    assert _json_lines(mount.sh("cat t/0/from/102.jsonl").stdout) == rows[102:]

    state = json.loads((mount / "t/0/state").read_bytes())
    assert state["topic"] == "t"
    assert state["partition"] == 0
    assert state["log_start_offset"] == 0
    assert state["log_end_offset"] == 103
    assert state["num_segments"] == len(state["segments"]) >= 1
    assert state["dir"] == str(mount.partition_dir("t", 0))

    # segments/: the raw files are the bytes on disk, up to their used size (the
    # active segment's indexes are preallocated; what follows the entries is zeros).
    seg_names = sorted(os.listdir(mount / "t/0/segments"))
    assert seg_names == ["00000000000000000000.index", "00000000000000000000.jsonl",
                         "00000000000000000000.log", "00000000000000000000.timeindex"]
    for suffix in (".log", ".index", ".timeindex"):
        through = (mount / f"t/0/segments/00000000000000000000{suffix}").read_bytes()
        on_disk = (mount.partition_dir("t", 0) / f"00000000000000000000{suffix}").read_bytes()
        assert through == on_disk[:len(through)], suffix
        assert not on_disk[len(through):].strip(b"\0"), suffix
        assert os.stat(mount / f"t/0/segments/00000000000000000000{suffix}").st_size == len(through)
    assert len((mount / "t/0/segments/00000000000000000000.timeindex").read_bytes()) % 12 == 0
    assert (mount / "t/0/segments/00000000000000000000.jsonl").read_bytes() == jl

    rows_by_offset = {r["offset"]: r for r in rows}
    assert mount.stop() == 0
    on_disk = kafka_records(mount.partition_dir("t", 0))
    assert [r.value for r in on_disk] == expected
    assert [r.offset for r in on_disk] == list(range(103))
    assert all(rows_by_offset[r.offset]["timestamp"] == r.timestamp for r in on_disk)
    assert (mount.data / ".kafka_cleanshutdown").exists()


def test_since_views_epoch_ms_and_iso(mount):
    (mount / "t").mkdir()
    mount.sh("echo old1 > t/0/append && echo old2 > t/0/append")
    # The cut is just after old2's append time; new1 is appended once the clock has passed it.
    cut = _json_lines((mount / "t/0/records.jsonl").read_bytes())[-1]["timestamp"] + 1
    wait_for(lambda: time.time() * 1000 >= cut + 1, "the clock to pass the cut")
    mount.sh("echo new1 > t/0/append && echo new2 > t/0/append")
    assert mount.sh(f"cat t/0/since/{cut}").stdout == b"new1\nnew2\n"
    iso = dt.datetime.fromtimestamp(cut / 1000, tz=dt.UTC).isoformat()
    assert mount.sh(f"cat 't/0/since/{iso}'").stdout == b"new1\nnew2\n"
    rows = _json_lines(mount.sh(f"cat t/0/since/{cut}.jsonl").stdout)
    assert [r["value"] for r in rows] == ["new1", "new2"]
    assert all(r["timestamp"] >= cut for r in rows)
    # A time after every record: an empty view that grows with new appends.
    future = cut + 3_600_000
    with open(mount / f"t/0/since/{future}", "rb") as f:
        assert f.read() == b""
    assert mount.sh("cat t/0/since/0").stdout == b"old1\nold2\nnew1\nnew2\n"


def test_write_semantics_partial_lines_replies_and_truncate(mount):
    (mount / "t").mkdir()
    with open(mount / "t/0/append", "wb", buffering=0) as f:
        f.write(b"par")
        f.write(b"tial\nsecond\nthi")
        f.write(b"rd")
    assert (mount / "t/0/records").read_bytes() == b"partial\nsecond\nthird\n"

    # O_RDWR: one "<first> <last>" line per batch of this handle.
    fd = os.open(mount / "t/0/append", os.O_RDWR | os.O_TRUNC)
    try:
        assert os.write(fd, b"x\ny\n") == 4
        assert os.pwrite(fd, b"z\n", 12345) == 2          # any position: still an append
        assert os.read(fd, 100) == b"3 4\n5 5\n"
    finally:
        os.close(fd)
    assert (mount / "t/0/records").read_bytes().splitlines()[-3:] == [b"x", b"y", b"z"]
    # Empty lines are records with empty values.
    mount.sh("printf '\\n\\n' >> t/0/append")
    assert mount.sh("tail -c 4 t/0/records").stdout == b"z\n\n\n"


@pytest.mark.mount_options({"num.partitions": "3"})
def test_topic_append_keys_null_marker_and_round_robin(mount, read_kafka):
    from kafka.partitioner.default import murmur2

    (mount / "k").mkdir()
    add_config(mount / "k/config", b"parse.key=true\nkey.separator=:\nnull.marker=NULL\n")
    config = (mount / "k/config").read_text()
    assert "parse.key=true\n" in config
    assert "key.separator=:\n" in config
    assert "null.marker=NULL\n" in config
    default_retention = [line for line in config.splitlines() if line.startswith("#retention.ms=")]
    assert len(default_retention) == 1                 # a default, shown as a comment
    with open(mount / "k/config", "a") as f:           # >>: adds to the overrides
        f.write("retention.ms=1234\n")
    assert "\nretention.ms=1234\n" in (mount / "k/config").read_text()
    with open(mount / "k/config", "a") as f:
        f.write("retention.ms=\n")                    # name= removes the override
    assert [line for line in (mount / "k/config").read_text().splitlines()
            if line.lstrip("#").startswith("retention.ms=")] == default_retention
    lines = [f"key{i}:value{i}" for i in range(60)] + ["key7:NULL"]
    mount.sh("cat > k/append", input=("\n".join(lines) + "\n").encode())
    # The unkeyed writes of another topic spread one write per partition.
    (mount / "u").mkdir()
    for i in range(6):
        mount.sh(f"echo w{i} >> u/append")
    counts = [len((mount / f"u/{p}/records").read_bytes().splitlines()) for p in range(3)]
    assert counts == [2, 2, 2]
    # A topic-level handle's replies name the partition: "<partition> <first> <last>".
    fd = os.open(mount / "u/append", os.O_RDWR)
    try:
        os.write(fd, b"a\nb\n")
        os.write(fd, b"c\n")
        assert os.read(fd, 100) == b"0 2 3\n1 2 2\n"
    finally:
        os.close(fd)
    assert mount.stop() == 0

    seen: dict[bytes | None, list[bytes | None]] = {}
    for p in range(3):
        for rec in read_kafka(mount.partition_dir("k", p)):
            expected = (murmur2(rec.key) & 0x7FFFFFFF) % 3
            assert expected == p, rec
            seen.setdefault(rec.key, []).append(rec.value)
    assert seen[b"key7"] == [b"value7", None]            # a tombstone after the value
    assert set(seen) == {f"key{i}".encode() for i in range(60)}


def test_broker_files_stats_and_metrics(mount):
    (mount / "t").mkdir()
    mount.sh("seq 1 1000 > t/0/append")
    assert sorted(os.listdir(mount / ".logfs")) == ["config", "errors", "metrics", "stats.json"]
    config = (mount / ".logfs/config").read_text()
    assert f"log.dirs={mount.data}\n" in config
    assert "log.segment.bytes=" in config
    assert os.stat(mount / ".logfs/config").st_size == len(config.encode())
    tasks = ("kafka-log-retention", "kafka-log-flusher", "kafka-recovery-point-checkpoint",
             "kafka-log-start-offset-checkpoint", "kafka-delete-logs")
    stats = wait_for(lambda: all((s := mount_stats(mount))["tasks"].get(t, {}).get("runs") for t in tasks) and s,
                     "every periodic task to run once")
    assert stats["topics"]["t"]["partitions"]["0"]["log_end_offset"] == 1000
    assert stats["appends"]["records"] == 1000
    for task in tasks:
        assert stats["tasks"][task]["runs"] >= 1, task
        assert stats["tasks"][task]["errors"] == 0, stats["tasks"][task]
    # Views live while open: stats and listings do not leave any anchored behind.
    mount.sh("cat t/0/records t/0/records.jsonl > /dev/null && ls -la t/0 t/0/segments > /dev/null")
    with open(mount / "t/0/records", "rb"):
        assert json.loads((mount / ".logfs/stats.json").read_bytes())["views_open"] == 1
    assert json.loads((mount / ".logfs/stats.json").read_bytes())["views_open"] == 0
    metrics = (mount / ".logfs/metrics").read_text()
    assert 'kafka_log_log_logendoffset{partition="0",topic="t"} 1000.0' in metrics
    assert "logfs_append_records_total 1000.0" in metrics
    assert 'logfs_task_runs_total{task="kafka-log-flusher"}' in metrics


def test_cat_of_a_big_file_appends_through_the_compiled_kernels(mount, tmp_path):
    """``cat file >> append`` in two big writes, both through the compiled kernels (loaded with the mount, not on
    its first write: issue 26): the same records, views of the sizes they say, and segment files kafka-python
    reads (the kernels encode without splitting the lines)."""
    lines = [b"line %06d " % i + (b"plain" if i % 3 else b'"quoted" \xc3\xa9 \t') * (i % 40) for i in range(60_000)]
    data = b"".join(line + b"\n" for line in lines)
    half = len(data) // 2
    (tmp_path / "first").write_bytes(data[:half])
    (tmp_path / "second").write_bytes(data[half:])
    mount.sh("mkdir t")
    assert mount_stats(mount)["compiled_kernels"] == "loaded"          # a fresh mount's first write takes them
    mount.sh(f"cat {tmp_path / 'first'} >> t/0/append")
    mount.sh(f"cat {tmp_path / 'second'} >> t/0/append")
    assert (mount / "t/0/records").read_bytes() == data
    jsonl = (mount / "t/0/records.jsonl").read_bytes()
    assert os.stat(mount / "t/0/records.jsonl").st_size == len(jsonl)
    assert os.stat(mount / "t/0/records").st_size == len(data)
    assert [json.loads(line)["value"].encode() for line in jsonl.splitlines()] == lines
    assert mount.stop() == 0
    assert [r.value for r in kafka_records(mount.data / "t-0")] == lines


def test_binary_values_survive_jsonl(mount):
    (mount / "b").mkdir()
    payload = b"\xff\xfe\x00bin"
    with open(mount / "b/0/append", "wb") as f:
        f.write(payload + b"\n")
    row = _json_lines((mount / "b/0/records.jsonl").read_bytes())[0]
    assert row["valueEncoding"] == "base64"
    assert base64.b64decode(row["value"]) == payload
    assert (mount / "b/0/records").read_bytes() == payload + b"\n"
