"""Consumer groups through a real mount: consume/<group>, groups/<group>, and __consumer_offsets as Kafka stores it.

The committed offsets are checked the way a Kafka tool would see them: the
``__consumer_offsets`` segment files are read with kafka-python and each
record's key and value decoded by the OffsetCommit schemas written out in this
test (kafka-python has no reader for them), independently of logfs's code.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import time
from typing import TYPE_CHECKING

import pytest

from tests.helpers import wait_for, write_then_refused
from tests.unit.test_consumer_offsets import batch, group_metadata_key, key_bytes, value_bytes

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.mount

PARTITIONS = 5
OPTIONS = {"offsets.topic.num.partitions": str(PARTITIONS)}


# ---------------------------------------------------------------- an independent reader of __consumer_offsets


def java_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


def offsets_partition(group: str, n: int = PARTITIONS) -> int:
    h = java_hash(group)
    return (0 if h == -2**31 else abs(h)) % n


def read_commits(data: Path) -> dict[tuple[str, str, int], int | None]:
    """(group, topic, partition) -> latest committed offset (None: tombstone), from kafka-python's decoding."""
    from kafka.record.memory_records import MemoryRecords

    def string(buf: bytes, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from(">h", buf, pos)
        return buf[pos + 2:pos + 2 + n].decode(), pos + 2 + n

    out: dict[tuple[str, str, int], int | None] = {}
    for p in range(PARTITIONS):
        d = data / f"__consumer_offsets-{p}"
        if not d.exists():
            continue
        for name in sorted(os.listdir(d)):
            if not name.endswith(".log"):
                continue
            records = MemoryRecords((d / name).read_bytes())
            while (b := records.next_batch()) is not None:
                assert b.validate_crc()
                for rec in b:
                    (key_version,) = struct.unpack_from(">h", rec.key, 0)
                    assert key_version == 1                         # OffsetCommitKey v1, as Kafka writes
                    group, pos = string(rec.key, 2)
                    topic, pos = string(rec.key, pos)
                    (partition,) = struct.unpack_from(">i", rec.key, pos)
                    assert p == offsets_partition(group)            # the partition Kafka would choose
                    if rec.value is None:
                        out[(group, topic, partition)] = None
                        continue
                    version, offset, _epoch = struct.unpack_from(">hqi", rec.value, 0)
                    assert version == 3                             # OffsetCommitValue v3
                    _metadata, pos = string(rec.value, 14)
                    (commit_ts,) = struct.unpack_from(">q", rec.value, pos)
                    assert pos + 8 == len(rec.value)
                    assert commit_ts > 1_600_000_000_000
                    out[(group, topic, partition)] = offset
    return out


def lines(text: bytes) -> list[str]:
    return text.decode().splitlines()


def group_rows(mount, topic: str, group: str) -> list[list[int]]:
    return [[int(x) for x in line.split()] for line in lines(mount.sh(f"cat {topic}/groups/{group}").stdout)]


# ---------------------------------------------------------------- consume/<group>


@pytest.mark.mount_options(OPTIONS)
def test_group_resumes_across_reads_and_remounts(mount):
    mount.sh("mkdir t && seq 1 5 > t/0/append")
    assert mount.sh("cat t/0/consume/billing").stdout == b"1\n2\n3\n4\n5\n"
    assert mount.sh("cat t/0/consume/billing").stdout == b""             # nothing new
    mount.sh("seq 6 8 >> t/0/append")
    assert mount.sh("wc -l < t/0/consume/billing").stdout.strip() == b"3"  # only what is new
    assert mount.sh("ls t/groups").stdout == b"billing\n"
    assert group_rows(mount, "t", "billing") == [[0, 8, 8, 0]]

    # a shell loop, run twice like a cron job: each run sees only the new records
    mount.sh("seq 9 12 >> t/0/append")
    loop = "n=0; while read -r line; do n=$((n+line)); done < t/0/consume/billing; echo $n"
    assert mount.sh(loop).stdout == b"42\n"
    assert mount.sh(loop).stdout == b"0\n"

    mount.stop()
    mount.start()
    assert group_rows(mount, "t", "billing") == [[0, 12, 12, 0]]
    mount.sh("seq 13 14 >> t/0/append")
    assert mount.sh("cat t/0/consume/billing.jsonl").stdout.count(b'"offset":') == 2
    assert [(o["offset"], o["value"]) for o in map(json.loads, lines(mount.sh("cat t/0/records.jsonl").stdout))][-2:] \
        == [(12, "13"), (13, "14")]
    mount.stop()
    commits = read_commits(mount.data)
    assert commits == {("billing", "t", 0): 14}


@pytest.mark.mount_options(OPTIONS)
def test_partial_reads_commit_whole_records_only(mount):
    mount.sh("mkdir t && printf 'alpha\\nbeta\\ngamma\\n' > t/0/append")
    assert mount.sh("head -c 8 t/0/consume/g").stdout == b"alpha\nbe"    # 1 whole record, part of the next
    assert group_rows(mount, "t", "g") == [[0, 1, 3, 2]]
    assert mount.sh("cat t/0/consume/g").stdout == b"beta\ngamma\n"
    # JSON: position -> offset through the JSON rendering's sizes
    mount.sh("echo reset earliest > t/groups/g")
    first = mount.sh("cat t/0/records.jsonl").stdout.splitlines(keepends=True)
    cut = len(first[0]) + len(first[1]) + 3
    assert mount.sh(f"head -c {cut} t/0/consume/g.jsonl").stdout == b"".join(first)[:cut]
    assert group_rows(mount, "t", "g") == [[0, 2, 3, 1]]


@pytest.mark.mount_options({**OPTIONS, "num.partitions": "3", "internal.log.segment.bytes": "300"})
def test_reset_commit_and_two_independent_groups(mount):
    mount.sh("mkdir t && for i in $(seq 0 29); do echo v$i; done > t/1/append")
    assert lines(mount.sh("cat t/1/consume/a").stdout) == [f"v{i}" for i in range(30)]
    assert group_rows(mount, "t", "a") == [[0, -1, 0, 0], [1, 30, 30, 0], [2, -1, 0, 0]]
    assert mount.sh("ls t/groups").stdout == b"a\n"
    assert not (mount / "t/groups/b").exists()                  # a group exists once it has committed
    # ... so globs over the topic's directories find only partitions' files
    assert mount.sh("cat t/*/records | wc -l").stdout.strip() == b"30"

    # b reads from the log start, independently of a
    assert mount.sh("head -c 3 t/1/consume/b").stdout == b"v0\n"
    assert mount.sh("ls t/groups").stdout == b"a\nb\n"
    assert group_rows(mount, "t", "b")[1] == [1, 1, 30, 29]
    assert group_rows(mount, "t", "a")[1] == [1, 30, 30, 0]

    mount.sh("echo '1 25' > t/groups/a")                        # explicit commit
    assert lines(mount.sh("cat t/1/consume/a").stdout) == ["v25", "v26", "v27", "v28", "v29"]
    mount.sh("echo 'reset earliest' > t/groups/a")
    assert mount.sh("wc -l < t/1/consume/a").stdout.strip() == b"30"
    mount.sh("echo 'reset 10' > t/groups/a")                   # every partition, clamped to its range
    assert group_rows(mount, "t", "a") == [[0, 0, 0, 0], [1, 10, 30, 20], [2, 0, 0, 0]]
    mount.sh("echo 'reset latest' > t/groups/a")
    assert mount.sh("cat t/1/consume/a").stdout == b""

    # by time: the records at or after T
    last_ts = json.loads(lines(mount.sh("tail -n 1 t/1/records.jsonl").stdout)[0])["timestamp"]
    wait_for(lambda: int(time.time() * 1000) > last_ts, "the clock to pass the last append's millisecond",
             interval=0.001)
    mount.sh("echo late >> t/1/append")
    t_ms = json.loads(lines(mount.sh("tail -n 1 t/1/records.jsonl").stdout)[0])["timestamp"]
    mount.sh(f"echo 'reset @{t_ms}' > t/groups/a")
    assert mount.sh("cat t/1/consume/a").stdout == b"late\n"
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_ms / 1000 - 3600))
    mount.sh(f"echo 'reset {iso}' > t/groups/a")
    assert mount.sh("wc -l < t/1/consume/a").stdout.strip() == b"31"
    assert group_rows(mount, "t", "b")[1] == [1, 1, 31, 30]     # b never moved

    # several lines of one opening apply together at close, in order
    mount.sh("printf 'reset earliest\\n1 7\\n' > t/groups/b")
    assert group_rows(mount, "t", "b")[1] == [1, 7, 31, 24]


@pytest.mark.mount_options(OPTIONS)
def test_bad_group_lines_are_einval_and_apply_nothing(mount):
    mount.sh("mkdir t && seq 1 4 > t/0/append")
    mount.sh("echo '0 2' > t/groups/g")                         # creates the group
    assert mount.sh("ls t/groups").stdout == b"g\n"
    for bad in ["0 99", "7 1", "reset sideways", "0", "zero 1", "reset -1"]:
        mount.sh_refused(f"echo '{bad}' > t/groups/g")
    # a good line and a bad one through one opening: nothing applied
    write_then_refused(mount / "t/groups/g", os.O_WRONLY, b"0 3\n", b"0 nine\n")
    assert group_rows(mount, "t", "g") == [[0, 2, 4, 2]]
    assert "Invalid line '0 nine' for t/groups/g" in mount.log()


def test_group_numbers_have_one_spelling_and_huge_ones_are_einval(mount):
    """Issue 18: 5000 digits gave EIO and a traceback; '0 003', 'reset 002', '00 1' were accepted."""
    mount.sh("mkdir t && seq 1 4 > t/0/append && echo '0 2' > t/groups/g")
    huge = "9" * 5000
    for bad in [f"0 {huge}", f"reset {huge}", f"reset @{huge}", f"{huge} 1", "0 003", "reset 002", "00 1",
                "0 00", "reset 00"]:
        mount.sh_refused(f"printf '%s\\n' '{bad}' > t/groups/g")
    assert group_rows(mount, "t", "g") == [[0, 2, 4, 2]]
    log = mount.log()
    assert "Traceback" not in log
    assert "ERROR" not in log
    assert "'0 003' for t/groups/g: '003' is not an offset" in log
    assert huge not in log                              # named by its length, not dumped


@pytest.mark.mount_options(OPTIONS)
def test_rm_deletes_a_groups_commits_with_tombstones(mount):
    mount.sh("mkdir t && seq 1 3 > t/0/append && cat t/0/consume/x > /dev/null && cat t/0/consume/y > /dev/null")
    assert mount.sh("ls t/groups").stdout == b"x\ny\n"
    mount.sh("rm t/groups/x")
    assert mount.sh("ls t/groups").stdout == b"y\n"
    assert not (mount / "t/groups/x").exists()
    assert mount.sh("rm t/groups/x", check=False).returncode != 0        # no commits left: ENOENT
    mount.stop()
    assert read_commits(mount.data) == {("x", "t", 0): None, ("y", "t", 0): 3}
    mount.start()
    assert mount.sh("ls t/groups").stdout == b"y\n"
    assert mount.sh("cat t/0/consume/x").stdout == b"1\n2\n3\n"


@pytest.mark.mount_options(OPTIONS)
def test_one_reader_per_group_and_partition(mount):
    mount.sh("mkdir t && seq 1 3 > t/0/append")
    path = mount / "t/0/consume/g"
    with open(path, "rb") as first:
        with pytest.raises(OSError) as exc:
            open(path, "rb")
        assert exc.value.errno == errno.EBUSY
        with pytest.raises(OSError) as exc:
            open(mount / "t/0/consume/g.jsonl", "rb")                      # the JSON rendering too
        assert exc.value.errno == errno.EBUSY
        assert mount.sh("cat t/0/consume/other").stdout == b"1\n2\n3\n"   # another group is independent
        assert first.read() == b"1\n2\n3\n"
    with open(path, "rb") as again:                                         # free after close
        assert again.read() == b""


@pytest.mark.mount_options(OPTIONS)
def test_the_hold_lasts_until_the_last_copy_of_the_descriptor_is_closed(mount):
    """A child inheriting the descriptor closes its copy (flush): the hold stays until the last close (release)."""
    mount.sh("mkdir t && seq 1 3 > t/0/append")
    path = mount / "t/0/consume/g"
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.read(fd, 2) == b"1\n"
        subprocess.run(["true"], pass_fds=(fd,), check=True)                # the child closes its copy at exit
        with pytest.raises(OSError) as exc:
            open(path, "rb")
        assert exc.value.errno == errno.EBUSY
        assert group_rows(mount, "t", "g") == [[0, 1, 3, 2]]                 # that close committed
        assert os.read(fd, 100) == b"2\n3\n"
    finally:
        os.close(fd)
    with open(path, "rb") as again:                                         # free after the last close
        assert again.read() == b""
    # the same from a shell: `exec 5<` and a command that inherits descriptor 5
    mount.sh("seq 4 6 >> t/0/append")
    script = "exec 5< t/0/consume/g; sh -c ':'; if cat t/0/consume/g; then exit 7; fi; cat <&5"
    result = mount.sh(script, check=False)
    assert (result.returncode, result.stdout) == (0, b"4\n5\n6\n")
    assert b"Device or resource busy" in result.stderr


@pytest.mark.mount_options(OPTIONS)
def test_a_commit_made_while_a_reader_is_open_wins(mount):
    mount.sh("mkdir t && seq 1 3 > t/0/append")
    with open(mount / "t/0/consume/g", "rb") as reader:
        assert reader.read() == b"1\n2\n3\n"
        # in this process: a forked shell would close (flush) the reader's descriptor at its exec
        (mount / "t/groups/g").write_bytes(b"0 1\n")
    assert group_rows(mount, "t", "g") == [[0, 1, 3, 2]]
    assert "the group's committed offset moved" in mount.log()


@pytest.mark.mount_options(OPTIONS)
def test_lag_in_stats_and_metrics(mount):
    mount.sh("mkdir t && seq 1 10 > t/0/append && head -c 4 t/0/consume/g > /dev/null")
    stats = json.loads((mount / ".logfs/stats.json").read_bytes())
    assert stats["consumer_groups"]["g"]["t"] == {
        "lag": 8, "partitions": {"0": {"committed": 2, "log_end_offset": 10, "lag": 8}}}
    metrics = mount.sh("cat .logfs/metrics").stdout.decode()
    assert 'kafka_consumergroup_lag{consumergroup="g",partition="0",topic="t"} 8.0' in metrics
    assert 'kafka_consumergroup_current_offset{consumergroup="g",partition="0",topic="t"} 2.0' in metrics
    assert 'kafka_consumergroup_lag_sum{consumergroup="g",topic="t"} 8.0' in metrics


@pytest.mark.mount_options(OPTIONS)
def test_deleting_a_topic_drops_its_commits(mount):
    mount.sh("mkdir t && seq 1 3 > t/0/append && cat t/0/consume/g > /dev/null && rmdir t && mkdir t")
    assert mount.sh("ls t/groups").stdout == b""
    assert mount.sh("cat t/0/consume/g").stdout == b""


# ---------------------------------------------------------------- commits written by Kafka's schemas, not ours


def _write_partition(data: Path, partition: int, batches: list[bytes]) -> None:
    d = data / f"__consumer_offsets-{partition}"
    d.mkdir(parents=True)
    (d / f"{0:020d}.log").write_bytes(b"".join(batches))


def test_a_consumer_offsets_partition_written_with_kafkas_schemas_shows_its_groups(logfs_mount):
    m = logfs_mount(OPTIONS, start=False)
    for p in range(2):
        (m.data / f"orders-{p}").mkdir()
    by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    written: dict[str, list[tuple[bytes | None, bytes | None]]] = {
        "spark-etl": [(key_bytes(1, "spark-etl", "orders", 0), value_bytes(3, 0)),
                      (group_metadata_key("spark-etl"), b"\x00\x03not an offset"),
                      (key_bytes(1, "spark-etl", "orders", 1), value_bytes(3, 0))],
        "legacy": [(key_bytes(0, "legacy", "orders", 1), value_bytes(1, 0))],
        "dropped": [(key_bytes(1, "dropped", "orders", 0), value_bytes(3, 0)),
                    (key_bytes(1, "dropped", "orders", 0), None)],
    }
    for group, records in written.items():
        by_partition.setdefault(offsets_partition(group), []).extend(records)
    for p, records in by_partition.items():
        _write_partition(m.data, p, [batch(0, records)])
    m.start()
    m.sh("seq 1 4 > orders/0/append && seq 1 2 > orders/1/append")
    assert m.sh("ls orders/groups").stdout == b"legacy\nspark-etl\n"
    assert group_rows(m, "orders", "spark-etl") == [[0, 0, 4, 4], [1, 0, 2, 2]]
    assert group_rows(m, "orders", "legacy") == [[0, -1, 4, 4], [1, 0, 2, 2]]
    assert m.sh("cat orders/0/consume/spark-etl").stdout == b"1\n2\n3\n4\n"


@pytest.mark.mount_options(OPTIONS)
def test_read_only_mount_shows_commits_and_commits_nothing(logfs_mount):
    m = logfs_mount(OPTIONS)
    m.sh("mkdir t && seq 1 3 > t/0/append && head -c 2 t/0/consume/g > /dev/null")
    m.stop()
    ro = logfs_mount(OPTIONS, read_only=True, name="m", start=False)
    ro.start()
    assert group_rows(ro, "t", "g") == [[0, 1, 3, 2]]
    assert ro.sh("cat t/0/consume/g").stdout == b"2\n3\n"
    assert group_rows(ro, "t", "g") == [[0, 1, 3, 2]]
    assert ro.sh("echo '0 2' > t/groups/g", check=False).returncode != 0


@pytest.mark.mount_options(OPTIONS)
def test_a_commit_below_the_log_start_reads_from_the_log_start(mount):
    mount.sh("mkdir t && seq 1 6 > t/0/append && echo '0 1' > t/groups/g")
    mount.sh("echo 'before 4' > t/0/delete")                     # DeleteRecords: 1-4 are gone
    assert group_rows(mount, "t", "g") == [[0, 1, 6, 2]]         # lag: what a read would return
    assert mount.sh("cat t/0/consume/g").stdout == b"5\n6\n"
    assert group_rows(mount, "t", "g") == [[0, 6, 6, 0]]


@pytest.mark.mount_options({**OPTIONS, "internal.log.segment.bytes": "160"})   # one commit per segment
def test_a_corrupt_commit_batch_is_skipped_at_load_naming_its_file(mount):
    # bad commits twice (offsets 1, then 3): the first commit lands in a sealed
    # segment, the second in the active one.  Damage in the active segment is
    # the loader's (truncated as after a crash); a sealed one is kept as it is
    # and the committed-offsets loader must skip its bad batch, naming it.
    mount.sh("mkdir t && seq 1 5 > t/0/append && head -c 2 t/0/consume/bad > /dev/null "
             "&& head -c 4 t/0/consume/bad > /dev/null")
    assert mount.sh("cat t/groups/bad").stdout == b"0 3 5 2\n"
    mount.stop()
    part = mount.data / f"__consumer_offsets-{offsets_partition('bad')}"
    sealed = part / f"{0:020d}.log"
    assert (part / f"{1:020d}.log").exists()                    # the second commit rolled a segment
    data = bytearray(sealed.read_bytes())
    data[-3] ^= 0xFF                                             # a bit flip in the first commit's value
    sealed.write_bytes(bytes(data))
    mount.start()
    assert "Skipping a corrupt batch of __consumer_offsets-" in mount.log()
    assert str(sealed) in mount.log()
    assert mount.sh("cat t/0/consume/bad").stdout == b"4\n5\n"     # the later commit still counts
