"""append.jsonl through a real mount: records.jsonl out, append.jsonl in, every field kept.

The source records are written by kafka-python's batch builder (headers,
bytes that are not UTF-8, null keys and values, their own CreateTime
timestamps), and the copies are read back with kafka-python from the segment
files, so neither side of the comparison is our codec.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import time
from typing import TYPE_CHECKING

import pytest
from kafka.partitioner.default import murmur2
from kafka.record.default_records import DefaultRecordBatchBuilder

if TYPE_CHECKING:
    from pathlib import Path

    from engine.records.format import Headers

pytestmark = pytest.mark.mount

TS = int(time.time() * 1000) - 3_600_000   # recent: retention (7 days) keeps them


def kafka_records_full(partition_dir: Path) -> list[SourceRecord]:
    """(offset, timestamp, key, value, headers) of every record, decoded by kafka-python."""
    from kafka.record.memory_records import MemoryRecords

    out: list[SourceRecord] = []
    for name in sorted(os.listdir(partition_dir)):
        if name.endswith(".log"):
            records = MemoryRecords((partition_dir / name).read_bytes())
            while (b := records.next_batch()) is not None:
                assert b.validate_crc()
                out.extend((r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in b)
    return out


#: (offset, timestamp, key, value, headers) of one record
SourceRecord = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


def source_records(n: int) -> list[SourceRecord]:
    """Null, empty, non-UTF-8 and escaped keys and values; headers (null and empty values too); CreateTime."""
    out: list[SourceRecord] = []
    for i in range(n):
        if i % 4 == 0:
            key = None
        elif i % 3 == 0:
            key = b"\xff\xfekey%d" % i
        else:
            key = ("clé-%d" % (i % 10)).encode()
        if i % 7 == 0:
            value = None
        elif i % 5 == 0:
            value = b"\x00\x80binary" * (i % 3)          # empty when i % 3 == 0
        else:
            value = ('line "%d"\twith\nnewline \\ ünïcode' % i).encode()
        headers: Headers
        if i % 6 == 0:
            headers = (("trace", b"\x01\x02\xff"), ("empty", b""), ("null", None))
        else:
            headers = (("h", b"v%d" % i),) if i % 2 else ()
        out.append((i, TS + 1000 * (i % 13), key, value, headers))
    return out


def write_source(data: Path, topic: str, partition: int, records: list[SourceRecord], per_batch: int = 50) -> None:
    d = data / f"{topic}-{partition}"
    d.mkdir(parents=True)
    chunks = []
    for start in range(0, len(records), per_batch):
        part = records[start:start + per_batch]
        builder = DefaultRecordBatchBuilder(2, 1 if start % 100 else 0, False, -1, -1, -1, 1 << 22)   # gzip, none
        for offset, ts, key, value, headers in part:
            builder.append(offset - part[0][0], timestamp=ts, key=key, value=value, headers=list(headers))
        batch = bytearray(builder.build())
        struct.pack_into(">q", batch, 0, part[0][0])
        chunks.append(bytes(batch))
    (d / f"{0:020d}.log").write_bytes(b"".join(chunks))


def test_records_jsonl_appended_to_append_jsonl_copies_every_field(logfs_mount):
    m = logfs_mount({"num.partitions": "1"}, start=False)
    records = source_records(400)
    write_source(m.data, "a", 0, records)
    m.start()
    m.sh("mkdir b && cat a/0/records.jsonl >> b/0/append.jsonl")
    # a second copy through the topic-level file and a loop of single-line writes
    m.sh("mkdir c && while IFS= read -r line; do printf '%s\\n' \"$line\" >> c/append.jsonl; done "
         "< <(head -n 20 a/0/records.jsonl)")
    jl_a = m.sh("cat a/0/records.jsonl").stdout.replace(b'"topic":"a"', b'"topic":"b"')
    assert m.sh("cat b/0/records.jsonl").stdout == jl_a            # byte for byte, CreateTime kept
    m.stop()
    assert kafka_records_full(m.data / "b-0") == records
    assert kafka_records_full(m.data / "c-0") == records[:20]


def test_log_append_time_records_keep_their_timestamps(mount):
    mount.sh("mkdir a b && printf 'x\\ny\\n' > a/0/append && cat a/0/records.jsonl > b/0/append.jsonl")
    src = [json.loads(line) for line in mount.sh("cat a/0/records.jsonl").stdout.splitlines()]
    dst = [json.loads(line) for line in mount.sh("cat b/0/records.jsonl").stdout.splitlines()]
    assert [(r["timestamp"], r["value"]) for r in dst] == [(r["timestamp"], r["value"]) for r in src]
    assert {r["timestampType"] for r in src} == {1}
    assert {r["timestampType"] for r in dst} == {0}
    assert mount.sh("cat b/0/append.jsonl", check=False).stdout == b""    # replies go to the writer only


def test_a_malformed_line_fails_the_write_and_appends_nothing(mount, tmp_path):
    mount.sh("mkdir t && echo '{\"value\":\"kept\"}' > t/0/append.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"value":"a"}\n{"value":"b"}\n\n{"value":"c"}\n{"value": "d", "timestamp": "noon"}\n')
    mount.sh_refused(f"cat {bad} >> t/0/append.jsonl")
    assert mount.sh("cat t/0/records").stdout == b"kept\n"
    assert "Malformed JSON line 5 of t/0/append.jsonl: timestamp must be an integer" in mount.log()
    # the writer reads back one `<first> <last>` line per batch
    fd = os.open(mount / "t/0/append.jsonl", os.O_RDWR)
    try:
        os.write(fd, b'{"value":"1"}\n{"value":"2"}\n')
        os.write(fd, b'{"value":"3"}')
        with pytest.raises(OSError) as exc:
            os.write(fd, b'\n[]\n')
        assert exc.value.errno == errno.EINVAL
        assert os.pread(fd, 100, 0) == b"1 2\n"
    finally:
        os.close(fd)
    # the refused write appended nothing; the unterminated line it left buffered is dropped at close
    # (its writer saw the write fail), never appended as if its writer had ended normally; "[]" is not either
    assert mount.sh("cat t/0/records").stdout == b"kept\n1\n2\n"
    assert 'Dropped the unterminated last line (13 bytes) written to t/0/append.jsonl' in mount.log()


def test_an_unknown_member_is_refused_never_a_null_value(mount):
    """A log shipper's ``{"message": ...}`` or a typo: EINVAL naming the line and the member, never a tombstone."""
    mount.sh("mkdir t && echo cleanup.policy=compact >> t/config")
    mount.sh_refused("echo '{\"valu\":\"x\"}' >> t/0/append.jsonl")
    assert 'Malformed JSON line 1 of t/0/append.jsonl: unknown member "valu"' in mount.log()
    result = mount.sh("printf '%s\\n' '{\"key\":\"k\",\"value\":\"v\"}' '{\"key\":\"k\",\"message\":\"m\"}'"
                      " > t/0/append.jsonl", check=False)
    assert result.returncode != 0
    assert 'Malformed JSON line 2 of t/0/append.jsonl: unknown member "message"' in mount.log()
    # bash's builtin printf writes each line on its own: the good line went in, no null value after it
    assert [(r["key"], r["value"]) for r in map(json.loads, mount.sh("cat t/0/records.jsonl").stdout.splitlines())] \
        == [("k", "v")]


@pytest.mark.mount_options({"num.partitions": "4"})
def test_topic_level_append_jsonl_routes_by_key_or_explicit_partition(mount):
    keys = [f"user-{i}" for i in range(40)]
    lines = "".join(json.dumps({"key": k, "value": f"v-{k}"}) + "\n" for k in keys)
    lines += json.dumps({"value": "pinned", "partition": 3, "key": "user-0"}) + "\n"
    mount.sh("mkdir t")
    (mount / "t/append.jsonl").write_text(lines)
    for p in range(4):
        got = mount.sh(f"cat t/{p}/records.jsonl").stdout.splitlines()
        keyed = [json.loads(line)["key"] for line in got if json.loads(line)["value"] != "pinned"]
        assert keyed == [k for k in keys if (murmur2(k.encode()) & 0x7FFFFFFF) % 4 == p]
    assert json.loads(mount.sh("tail -n 1 t/3/records.jsonl").stdout)["value"] == "pinned"
    mount.sh_refused("echo '{\"value\":\"x\",\"partition\":4}' >> t/append.jsonl")
    assert "names partition 4, but topic t has 4 partitions" in mount.log()


@pytest.mark.mount_options({"num.partitions": "3", "internal.log.segment.bytes": "65536"})
def test_export_and_reimport_a_whole_topic_with_cat_and_cp(mount, tmp_path):
    mount.sh("mkdir a && for p in 0 1 2; do "
             "for i in $(seq 1 3000); do echo \"p$p-record-$i\"; done > a/$p/append; done")
    export = tmp_path / "a.jsonl"
    mount.sh(f"cat a/*/records.jsonl > {export}")                       # docs/usage.md's export
    assert export.stat().st_size > 1 << 20                                 # several 1 MiB writes on import
    mount.sh(f"mkdir b && cp {export} b/append.jsonl")                    # ... and re-import
    for p in range(3):
        src = [json.loads(line) for line in mount.sh(f"cat a/{p}/records.jsonl").stdout.splitlines()]
        dst = [json.loads(line) for line in mount.sh(f"cat b/{p}/records.jsonl").stdout.splitlines()]
        assert [(r["offset"], r["timestamp"], r["key"], r["value"]) for r in dst] == \
            [(r["offset"], r["timestamp"], r["key"], r["value"]) for r in src]
