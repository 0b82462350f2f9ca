"""Spark against a real logfs mount: plain-file reads, the ``logfs`` source, streaming, appends.

One local[2] SparkSession serves the whole module; every test gets its own
mount (conftest's ``mount`` fixture) and appends its records through the
mount's ``append`` files.  What Spark returns is compared with what was
appended, and the logfs source with kafka-python's decoding of the ``.log``
files (``read_kafka``), which shares no code with ours.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from logfs import spark as logfs_spark
from logfs.spark import read_segments, source
from tests.spark_util import (
    append_lines,
    create_topic,
    end_offsets,
    records_jsonl,
    run_pipeline,
    state,
    wait_until,
)

if TYPE_CHECKING:
    from tests.helpers import JsonObject

pytestmark = [pytest.mark.spark, pytest.mark.mount]



def _source(spark, mount, topic: str, **options):
    reader = spark.read.format("logfs").option("path", str(mount.path)).option("subscribe", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def _make_topic(mount, topic: str, partitions: int, config: str | None = None) -> None:
    create_topic(str(mount.path), topic, partitions, config)


def _fill(mount, topic: str, partitions: int, per_partition: int, tag: str = "r",
          chunk: int = 100) -> dict[int, list[bytes]]:
    """Append distinct values of varying length to every partition; return them by partition.

    ``chunk`` lines per write(): one batch each, which must fit in a segment (Kafka
    refuses a batch larger than segment.bytes), so small-segment tests keep it small.
    """
    appended = {}
    for p in range(partitions):
        values = [b"%s-%d-%06d-%s" % (tag.encode(), p, i, b"x" * (i % 37)) for i in range(per_partition)]
        append_lines(str(mount.path), topic, values, partition=p, chunk=chunk)
        appended[p] = values
    return appended


@pytest.fixture
def files_conf(spark):
    """Split files into 4 KiB tasks, so one view file is read by many tasks at once."""
    spark.conf.set("spark.sql.files.maxPartitionBytes", "4096")
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    yield
    spark.conf.unset("spark.sql.files.maxPartitionBytes")
    spark.conf.unset("spark.sql.files.openCostInBytes")


# ------------------------------------------------------------------------------------ plain files


def test_read_json_reads_every_value_when_encodings_change_after_row_30000(spark, mount):
    """Spark's read.json types each column from every row: base64 keys, values and headers after row 30,000."""
    from tests.mount.test_mount_json_readers import PLAIN, TAIL, decode, expected, fill

    fill(mount)
    rows = spark.read.json(str(mount / "t/0/records.jsonl")).orderBy("offset").collect()
    assert len(rows) == PLAIN + len(TAIL)
    for i, row in enumerate(rows):
        assert row["offset"] == i
        headers = tuple((h["key"], decode(h["value"], h["valueEncoding"])) for h in row["headers"])
        assert (decode(row["key"], row["keyEncoding"]), decode(row["value"], row["valueEncoding"]),
                headers) == expected(i), i



@pytest.mark.mount_options({"internal.log.segment.bytes": "16384"})
def test_read_text_and_json_split_reads_return_every_record_once(spark, mount, files_conf):
    _make_topic(mount, "plain", 3)
    appended = _fill(mount, "plain", 3, 1500)
    expected = collections.Counter(v for values in appended.values() for v in values)

    text = spark.read.text(str(mount / "plain" / "*" / "records"), wholetext=False)
    assert text.rdd.getNumPartitions() > 3 * 10  # the records files were split across tasks
    got = collections.Counter(r.value.encode() for r in text.collect())
    assert got == expected

    segments = spark.read.json(str(mount / "plain" / "*" / "segments" / "*.jsonl"))
    assert state(str(mount.path), "plain", 0)["num_segments"] > 1
    assert segments.rdd.getNumPartitions() > 3 * 10
    rows = segments.select("partition", "offset", "value", "timestampType").collect()
    by_offset = collections.Counter((r.partition, r.offset) for r in rows)
    assert set(by_offset.values()) == {1}
    for p, values in appended.items():
        assert sorted(o for (q, o) in by_offset if q == p) == list(range(len(values)))
    assert collections.Counter(r.value.encode() for r in rows) == expected
    assert {r.timestampType for r in rows} == {1}


def test_split_reads_while_appends_go_on(spark, mount, files_conf):
    _make_topic(mount, "busy", 2)
    before = _fill(mount, "busy", 2, 800, tag="before")
    stop = threading.Event()
    during: list[bytes] = []

    def appender() -> None:
        i = 0
        while not stop.is_set():
            batch = [b"during-%d-%06d" % (i % 2, i + k) for k in range(50)]
            append_lines(str(mount.path), "busy", batch, partition=i % 2)
            during.extend(batch)
            i += 50
            time.sleep(0.01)

    thread = threading.Thread(target=appender, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(during) >= 500, 60, "appends to start")
        text_values = [r.value.encode() for r in spark.read.text(str(mount / "busy" / "*" / "records")).collect()]
        json_rows = spark.read.json(str(mount / "busy" / "*" / "segments" / "*.jsonl")) \
            .select("partition", "offset", "value").collect()
    finally:
        stop.set()
        thread.join()

    everything = {v for vs in before.values() for v in vs} | set(during)
    for values in (text_values, [r.value.encode() for r in json_rows]):
        counts = collections.Counter(values)
        assert max(counts.values()) == 1, "a record was read twice"
        assert set(counts) <= everything, "a value was read that was never appended (torn line?)"
        assert all(counts[v] == 1 for vs in before.values() for v in vs), "a record appended before was missed"
    for p in (0, 1):
        offsets = sorted(r.offset for r in json_rows if r.partition == p)
        assert offsets == list(range(len(offsets))), "offsets of a partition are not contiguous from 0"


# ------------------------------------------------------------------------------------ logfs source


@pytest.mark.mount_options({"internal.log.segment.bytes": "8192"})
def test_source_returns_what_was_appended_with_kafka_columns(spark, mount, read_kafka):
    _make_topic(mount, "kv", 3, config="parse.key=true\n")
    lines = []
    for i in range(600):
        key = b"key-%d" % (i % 17) if i % 5 else b"\xffbin-key-%d" % (i % 3)
        value = b"value-%d" % i if i % 7 else b"\x80\xfe raw \x00 bytes %d" % i
        lines.append(key + b"\t" + (value if i % 50 else b""))
    started_ms = int(time.time() * 1000)
    append_lines(str(mount.path), "kv", lines, chunk=64)
    finished_ms = int(time.time() * 1000)

    df = _source(spark, mount, "kv", startingOffsets="earliest")
    assert [f.name for f in df.schema.fields] == \
        ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    rows = df.selectExpr("key", "value", "topic", "partition", "offset",
                         "unix_millis(timestamp) AS ts", "timestampType").collect()
    assert len(rows) == len(lines)
    assert {r.topic for r in rows} == {"kv"}
    assert {r.timestampType for r in rows} == {1}
    assert collections.Counter(bytes(r.key) + b"\t" + bytes(r.value) for r in rows) == collections.Counter(lines)

    # Against Kafka's own decoding of the .log files: same offsets, keys, values, timestamps.
    for p in range(3):
        kafka = [(k.offset, k.timestamp, k.key, k.value) for k in read_kafka(mount.partition_dir("kv", p))]
        ours = sorted((r.offset, r.ts, bytes(r.key), bytes(r.value)) for r in rows if r.partition == p)
        assert ours == kafka
        assert all(started_ms - 1000 <= ts <= finished_ms + 1000 for _, ts, _, _ in ours)

    # Keys were placed by Kafka's default partitioner (kafka-python's murmur2, independent of ours).
    from kafka.partitioner.default import murmur2
    for r in rows:
        assert (murmur2(bytes(r.key)) & 0x7FFFFFFF) % 3 == r.partition

    # One partition read by several tasks, and headers requested: same rows.
    split = _source(spark, mount, "kv", minPartitions="7", includeHeaders="true")
    assert split.rdd.getNumPartitions() >= 7
    split_rows = split.select("partition", "offset", "headers").collect()
    assert sorted((r.partition, r.offset) for r in split_rows) == sorted((r.partition, r.offset) for r in rows)
    assert all(r.headers is None for r in split_rows)     # no headers: null, as Spark's Kafka source

    # The JSON-lines view (readFormat=jsonl), rendered by the mount, gives the same columns.
    jsonl = _source(spark, mount, "kv", readFormat="jsonl").selectExpr(
        "key", "value", "partition", "offset", "unix_millis(timestamp) AS ts", "timestampType").collect()
    assert sorted(map(tuple, jsonl)) == sorted((r.key, r.value, r.partition, r.offset, r.ts, r.timestampType)
                                               for r in rows)
    with pytest.raises(Exception, match="readFormat"):
        _source(spark, mount, "kv", readFormat="avro").collect()


def test_source_starting_and_ending_offsets(spark, mount):
    _make_topic(mount, "range", 2)
    _fill(mount, "range", 2, 30)
    mp = str(mount.path)

    df = _source(spark, mount, "range", startingOffsets='{"range":{"0":5,"1":-2}}',
                 endingOffsets='{"range":{"0":12,"1":-1}}')
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(5, 12)] + [(1, o) for o in range(30)]

    latest_only = _source(spark, mount, "range", startingOffsets='{"range":{"0":30,"1":29}}')
    assert [(r.partition, r.offset) for r in latest_only.select("partition", "offset").collect()] == [(1, 29)]

    assign = (spark.read.format("logfs").option("path", mp).option("assign", '{"range":[1]}')
              .option("endingOffsets", '{"range":{"1":3}}').load())
    assert sorted(r.offset for r in assign.collect()) == [0, 1, 2]

    for options, message in [
        ({"startingOffsets": "latest"}, "can't be latest"),
        ({"endingOffsets": '{"range":{"0":-2,"1":-1}}'}, "can't be earliest"),
        ({"startingOffsets": '{"range":{"0":1}}'}, "missing range-1"),
        ({"startingOffsets": '{"range":{"0":31,"1":0}}'}, "beyond the log end offset 30"),
        ({"startingOffsets": "sometime"}, "neither 'earliest', 'latest'"),
    ]:
        with pytest.raises(Exception, match=message):
            _source(spark, mount, "range", **options).collect()
    with pytest.raises(Exception, match="does not exist"):
        _source(spark, mount, "no-such-topic").collect()


@pytest.mark.mount_options({"internal.log.segment.bytes": "4096"})
def test_source_data_loss_below_log_start_offset(spark, mount):
    _make_topic(mount, "trimmed", 1)
    _fill(mount, "trimmed", 1, 200, chunk=40)
    with open(mount / "trimmed" / "0" / "delete", "w") as f:
        f.write("before 50\n")
    wait_until(lambda: state(str(mount.path), "trimmed", 0)["log_start_offset"] >= 50, 30, "DeleteRecords")
    start = state(str(mount.path), "trimmed", 0)["log_start_offset"]

    with pytest.raises(Exception, match="below the log start offset"):
        _source(spark, mount, "trimmed", startingOffsets='{"trimmed":{"0":10}}').collect()
    rows = _source(spark, mount, "trimmed", startingOffsets='{"trimmed":{"0":10}}',
                   failOnDataLoss="false").select("offset").collect()
    assert sorted(r.offset for r in rows) == list(range(start, 200))


def test_source_reads_a_tiered_topic_from_its_log_start_with_the_rows_of_a_local_read(spark, logfs_mount, tmp_path):
    """Tiered storage (docs/tiering.md): once local retention deleted the copied segments, the source reads the
    records only in the store (a file:// store here) through segments/, every row as when they were local."""
    store = tmp_path / "store"
    store.mkdir()
    mount = logfs_mount({"remote.log.storage.system.enable": "true", "rsm.config.uri": f"file://{store}",
                         "internal.log.segment.bytes": "8192", "log.index.interval.bytes": "512",
                         "log.initial.task.delay.ms": "0", "log.retention.check.interval.ms": "100",
                         "remote.log.manager.task.interval.ms": "100",
                         "rsm.config.chunk.size": "4096", "rsm.config.fetch.chunk.cache.size": "16384"})
    mp = str(mount.path)
    _make_topic(mount, "tiered", 2, config="remote.storage.enable=true\nparse.key=true\n")
    lines = [b"key-%d\tvalue-%06d-%s" % (i % 13, i, b"x" * (i % 41)) for i in range(3000)]
    append_lines(mp, "tiered", lines, chunk=40)

    def copied(p: int) -> bool:
        remote: JsonObject = state(mp, "tiered", p)["remote_storage"]
        return bool(remote["segments"] > 0 and remote["copy_lag_segments"] == 0)

    wait_until(lambda: copied(0) and copied(1), 60, "the closed segments copied")
    columns = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")

    def read(**options: str) -> list[tuple[Any, ...]]:  # Any: the values of a Spark Row
        df = _source(spark, mount, "tiered", includeHeaders="true", **options)
        return sorted(tuple(r[c] for c in columns) for r in df.collect())

    split = {"minPartitions": "9"}
    starting = {"startingOffsets": '{"tiered":{"0":7,"1":333}}', "endingOffsets": '{"tiered":{"0":900,"1":-1}}'}
    local = read()
    local_split, local_range = read(**split), read(**starting)
    assert len(local) == 3000
    assert state(mp, "tiered", 0)["remote_segments"] == []

    with open(os.path.join(mp, "tiered", "config"), "a") as f:
        f.write("local.retention.bytes=16384\n")

    def trimmed(p: int) -> bool:
        st = state(mp, "tiered", p)
        return bool(st["log_start_offset"] == 0 and st["local_log_start_offset"] > st["log_end_offset"] // 2)

    wait_until(lambda: trimmed(0) and trimmed(1), 60, "the copied segments deleted locally")
    for p in range(2):
        st = state(mp, "tiered", p)
        assert st["remote_segments"][0]["base_offset"] == 0
        assert not (mount.partition_dir("tiered", p) / "00000000000000000000.log").exists()
    # every row from the log start, as read locally; a range starting inside a remote segment (its .index
    # read through segments/) and split reads too; failOnDataLoss (the default) finds nothing lost
    assert read() == local
    assert read(**split) == local_split
    assert read(**starting) == local_range
    assert sorted(r.offset for r in _source(spark, mount, "tiered", readFormat="jsonl")
                  .where("partition = 0").select("offset").collect()) == \
        sorted(r[4] for r in local if r[3] == 0)


def test_segment_reader_fails_with_the_stores_errno_when_a_remote_segment_cannot_be_read(logfs_mount, tmp_path):
    """A task reading a remote log segment while the object store is down fails with the store's errno within
    the bound (the mount's read of segments/<base>.log fails), never with fewer rows."""
    import errno

    from tests.seaweedfs import SeaweedFS

    server = SeaweedFS(tmp_path / "weed").start()
    try:
        mount = logfs_mount({"remote.log.storage.system.enable": "true", **server.settings(prefix="spark"),
                             "rsm.config.request.timeout.ms": "2000", "internal.log.segment.bytes": "8192",
                             "log.initial.task.delay.ms": "0", "log.retention.check.interval.ms": "100",
                             "remote.log.manager.task.interval.ms": "100"})
        mp = str(mount.path)
        _make_topic(mount, "down", 1, config="remote.storage.enable=true\nlocal.retention.bytes=16384\n")
        _fill(mount, "down", 1, 2000, chunk=40)
        wait_until(lambda: state(mp, "down", 0)["local_log_start_offset"] > 1000, 60,
                   "the copied segments deleted locally")
        opts = logfs_spark.SourceOptions.parse({"path": mp, "subscribe": "down"})
        rng = logfs_spark.OffsetRangePartition("down", 0, 10, 2000)
        server.kill()
        started = time.monotonic()
        with pytest.raises(OSError) as failed:
            list(logfs_spark.SegmentRangeReader(opts, rng).batches())
        assert failed.value.errno == errno.ETIMEDOUT
        assert time.monotonic() - started < 30
        server.start()
        rows = [r for b in logfs_spark.SegmentRangeReader(opts, rng).batches() for r in b.to_pylist()]
        assert [r["offset"] for r in rows] == list(range(10, 2000))
    finally:
        server.stop()


#: Small segments, a fast cleaner and retention, so segment files change within seconds.
CHURN_OPTIONS = {
    "internal.log.segment.bytes": "4096",
    "log.index.interval.bytes": "512",
    "log.initial.task.delay.ms": "0",
    "log.retention.check.interval.ms": "100",
    "log.cleaner.backoff.ms": "50",
    "num.partitions": "1",
}


def _segment_bases(mount, topic: str) -> list[int]:
    return [s["base_offset"] for s in state(str(mount.path), topic, 0)["segments"]]


@pytest.mark.mount_options(CHURN_OPTIONS)
def test_source_reads_across_retention_and_compaction_replacing_segments(mount, monkeypatch, caplog):
    mp = str(mount.path)
    _make_topic(mount, "churn", 1, config="parse.key=true\nmin.cleanable.dirty.ratio=0.1\n")
    written: dict[int, tuple[bytes, ...]] = {}
    for round_ in range(60):                       # 1200 records, 20 keys, one batch per round
        lines = [b"k%02d\tv%03d-%02d-%s" % (k, round_, k, b"y" * 20) for k in range(20)]
        append_lines(mp, "churn", lines, chunk=20)
        for line in lines:
            written[len(written)] = tuple(line.split(b"\t"))
    planned_bases = _segment_bases(mount, "churn")
    assert len(planned_bases) > 8

    # Reads smaller than a batch (batches span reads) and one Arrow batch per read, so the
    # tasks below can be paused with a segment open, as if Spark were slow to pull rows.
    monkeypatch.setattr(read_segments, "_SEGMENT_READ_BYTES", 1000)
    monkeypatch.setattr(read_segments, "_FLUSH_RECORDS", 1)
    tasks = {}
    for fail_on_data_loss in ("false", "true"):
        reader = logfs_spark.LogfsBatchReader(logfs_spark.SourceOptions.parse(
            {"path": mp, "subscribe": "churn", "startingOffsets": "earliest", "failOnDataLoss": fail_on_data_loss}))
        (rng,) = reader.partitions()
        assert isinstance(rng, logfs_spark.OffsetRangePartition)
        assert (rng.from_offset, rng.until_offset) == (0, 1200)
        task = iter(reader.read(rng))
        first = next(task).to_pylist()
        assert first
        assert first[0]["offset"] == 0
        tasks[fail_on_data_loss] = (task, first)

    # Between planning and reading: DeleteRecords below 500 (retention deletes the segments
    # under it), then compaction rewrites the segments above and, as the segment size is
    # raised, merges them (Kafka groups segments whose sizes add up to the segment size; the
    # topic's internal.segment.bytes wins over the mount's internal.log.segment.bytes).
    with open(mount / "churn" / "0" / "delete", "w") as f:
        f.write("before 500\n")
    wait_until(lambda: _segment_bases(mount, "churn")[0] > 0, 30, "segments below the log start to go")
    with open(mount / "churn" / "config", "a") as f:
        f.write("cleanup.policy=compact\ninternal.segment.bytes=1048576\n")
    wait_until(lambda: (s := state(mp, "churn", 0))["last_cleaning"] and s["cleaning_state"] is None,
               60, "a clean to complete")
    assert {b for b in planned_bases if b >= 500} - set(_segment_bases(mount, "churn")), \
        "the cleaner merged no segment at or above the log start"

    caplog.set_level("INFO", logger="logfs.spark")
    task, first = tasks["false"]
    rows = first + [row for batch in task for row in batch.to_pylist()]
    offsets = [r["offset"] for r in rows]
    assert all(a < b for a, b in itertools.pairwise(offsets)), "an offset was emitted twice or out of order"
    for r in rows:
        assert (r["key"], r["value"]) == written[r["offset"]], f"offset {r['offset']} is not what was written"
    # Below the new log start only the rest of the segment that was open when it was deleted.
    assert [o for o in offsets if o < 500] == list(range(planned_bases[1]))
    above = [r for r in rows if r["offset"] >= 500]
    latest = {}
    for offset, (key, _) in written.items():
        latest[key] = offset
    assert set(latest.values()) <= set(offsets), "the latest record of a key was not read"
    assert len(above) < 700, "the compacted segments were not read"
    assert "listing the segments of churn-0 again" in caplog.text
    assert "skipping them (failOnDataLoss=false)" in caplog.text

    strict, _ = tasks["true"]
    with pytest.raises(logfs_spark.OffsetOutOfRangeError, match=r"were deleted .* failOnDataLoss=false"):
        for _ in strict:
            pass


def test_source_fails_on_a_corrupt_stored_batch_naming_the_file(spark, mount):
    from engine.records import HEADER_SIZE, iter_batches

    _make_topic(mount, "bad", 1)
    _fill(mount, "bad", 1, 300, chunk=50)
    log_file = mount.partition_dir("bad", 0) / ("0" * 20 + ".log")
    data = log_file.read_bytes()
    positions = [pos for pos, _ in iter_batches(data)]
    assert len(positions) == 6
    corrupt_at = positions[3]
    with open(log_file, "r+b") as f:                # one flipped bit inside the records
        f.seek(corrupt_at + HEADER_SIZE + 5)
        byte = f.read(1)
        f.seek(corrupt_at + HEADER_SIZE + 5)
        f.write(bytes([byte[0] ^ 0x10]))

    with pytest.raises(Exception, match="Record batch is corrupt") as failure:   # Spark's error, wrapping ours
        _source(spark, mount, "bad").collect()
    message = str(failure.value)
    assert "Record batch is corrupt" in message
    assert f"bad/0/segments/{'0' * 20}.log, position {corrupt_at}" in message
    # Records before the corrupt batch are still readable; the range ending there does not touch it.
    rows = _source(spark, mount, "bad", endingOffsets='{"bad":{"0":150}}').select("offset").collect()
    assert sorted(r.offset for r in rows) == list(range(150))


@pytest.mark.mount_options({"log.index.interval.bytes": "512"})
def test_segment_reader_skips_by_index_and_rescans_when_the_index_is_stale(mount, monkeypatch, caplog):
    _make_topic(mount, "idx", 1)
    appended = _fill(mount, "idx", 1, 3000, chunk=50)[0]
    opts = logfs_spark.SourceOptions.parse({"path": str(mount.path), "subscribe": "idx"})
    rng = logfs_spark.OffsetRangePartition("idx", 0, 2345, 2400)
    index = str(mount / "idx" / "0" / "segments" / ("0" * 20 + ".index"))
    position = logfs_spark.index_position(index, 0, 2345)
    assert position > 0, "the sparse index gave no position to start from"

    def read() -> list[JsonObject]:
        return [r for b in logfs_spark.SegmentRangeReader(opts, rng).batches() for r in b.to_pylist()]

    rows = read()
    assert [r["offset"] for r in rows] == list(range(2345, 2400))
    assert [r["value"] for r in rows] == appended[2345:2400]
    # An index that points into the middle of a batch (a segment swapped by the cleaner
    # between opening the .log and reading its .index) is detected, and the log scanned.
    caplog.set_level("INFO", logger="logfs.spark")
    monkeypatch.setattr(read_segments, "index_position", lambda *args: position + 7)
    assert read() == rows
    assert "does not match its log" in caplog.text


# ------------------------------------------------------------------------------------ streaming


def test_structured_streaming_resumes_from_checkpoint_exactly_once(spark, mount, tmp_path):
    _make_topic(mount, "stream", 2)
    mp = str(mount.path)
    first = _fill(mount, "stream", 2, 40, tag="first")
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    def start():
        stream = (spark.readStream.format("logfs").option("path", mp).option("subscribe", "stream")
                  .option("startingOffsets", "earliest").load()
                  .selectExpr("CAST(value AS STRING) AS value", "partition", "offset"))
        return (stream.writeStream.format("parquet").option("path", sink)
                .option("checkpointLocation", checkpoint).trigger(processingTime="500 milliseconds").start())

    query = start()
    try:
        query.processAllAvailable()
        second = _fill(mount, "stream", 2, 25, tag="second")   # appended while the query runs
        wait_until(lambda: spark.read.parquet(sink).count() >= 130, 120, "the running query to pick up appends")
    finally:
        query.stop()

    third = _fill(mount, "stream", 2, 15, tag="third")          # appended while it is stopped
    os.mkdir(mount / "stream" / "2")                            # a partition added while stopped
    append_lines(mp, "stream", [b"new-partition-%d" % i for i in range(5)], partition=2)

    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    rows = spark.read.parquet(sink).collect()
    expected = [v.decode() for batch in (first, second, third) for vs in batch.values() for v in vs]
    expected += ["new-partition-%d" % i for i in range(5)]
    assert collections.Counter(r.value for r in rows) == collections.Counter(expected)
    assert collections.Counter((r.partition, r.offset) for r in rows).most_common(1)[0][1] == 1


def test_streaming_rate_limit_and_available_now(spark, mount, tmp_path):
    _make_topic(mount, "paced", 2)
    _fill(mount, "paced", 2, 45)
    sizes: list[int] = []

    stream = (spark.readStream.format("logfs").option("path", str(mount.path)).option("subscribe", "paced")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "20").load())
    query = (stream.writeStream.foreachBatch(lambda df, batch_id: sizes.append(df.count()))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert not query.isActive
    assert sum(sizes) == 90
    assert max(sizes) <= 20
    assert len(sizes) >= 5

    # latest (the streaming default) sees only what comes after the start.
    fresh = logfs_spark.LogfsStreamReader(logfs_spark.SourceOptions.parse(
        {"path": str(mount.path), "subscribe": "paced"}))
    assert fresh.initialOffset() == {"paced": {"0": 45, "1": 45}}
    append_lines(str(mount.path), "paced", [b"late"], partition=1)
    assert fresh.latestOffset({"paced": {"0": 45, "1": 45}}, None) == {"paced": {"0": 45, "1": 46}}


# ------------------------------------------------------------------------------------ appending


def test_spark_tasks_append_through_append_files(spark, mount):
    _make_topic(mount, "out", 3)
    mp = str(mount.path)
    df = spark.range(0, 2000, numPartitions=4).selectExpr("concat('row-', CAST(id AS STRING)) AS value")
    assert logfs_spark.append_rows(df, mp, "out", chunk_bytes=4096) == 2000
    ends = end_offsets(mp, "out")
    assert sum(ends.values()) == 2000
    assert all(n > 0 for n in ends.values())                                 # unkeyed lines spread
    got = collections.Counter(r["value"] for r in records_jsonl(mp, "out"))
    assert got == collections.Counter(f"row-{i}" for i in range(2000))

    # Keyed: lines go to the partition Kafka's partitioner picks for the key.
    _make_topic(mount, "keyed", 3, config="parse.key=true\n")
    keyed = spark.range(0, 300, numPartitions=2).selectExpr(
        "concat('user-', CAST(id % 10 AS STRING)) AS user", "CAST(id AS STRING) AS value")
    assert logfs_spark.append_rows(keyed, mp, "keyed", key_column="user") == 300
    from kafka.partitioner.default import murmur2
    for record in records_jsonl(mp, "keyed"):
        assert (murmur2(record["key"].encode()) & 0x7FFFFFFF) % 3 == record["partition"]

    bad = spark.createDataFrame([("fine",), ("two\nlines",)], "value STRING").coalesce(1)
    with pytest.raises(Exception, match="newline"):
        logfs_spark.append_rows(bad, mp, "out")
    assert sum(end_offsets(mp, "out").values()) == 2000  # the failing task's chunk was never written


# ------------------------------------------------------------------------------------ the pipeline


def test_pipeline_script_end_to_end(spark, mount, tmp_path, monkeypatch):
    """scripts/pipeline.py's batch run, a stream and the stream resumed from its checkpoint."""
    mp = str(mount.path)
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> str:
        return run_pipeline(spark, mp, *args)

    # two records that are no event first
    mount.sh("mkdir events && printf 'not json\\n{\"type\": 3\\n' >> events/0/append")
    out = run("--source", "events", "--sink", "totals", "--generate", "500")
    assert "Appended 500 events to topic events (2 -> 502 records in the log)" in out
    bad = ("not json", '{"type": 3')
    events = [json.loads(r["value"]) for r in records_jsonl(mp, "events") if r["value"] not in bad]
    assert len(events) == 500
    assert "Read 500 events from topic events" in out
    assert "skipped 2 records that are not JSON events" in out
    counts = collections.Counter(e["type"] for e in events)
    totals = [json.loads(r["value"]) for r in records_jsonl(mp, "totals")]
    assert {t["type"]: t["count"] for t in totals} == counts
    for t in totals:
        assert t["amount"] == pytest.approx(sum(e["amount"] for e in events if e["type"] == t["type"]), abs=0.01)

    checkpoint = str(tmp_path / "cp")
    run("--source", "events", "--sink", "windows", "--stream", "--available-now", "--checkpoint", checkpoint)
    run("--source", "events", "--sink", "windows", "--stream", "--available-now", "--checkpoint", checkpoint,
        "--generate", "100", "--seed", "7")
    latest: dict[tuple[str, str], JsonObject] = {}
    for record in sorted(records_jsonl(mp, "windows"), key=lambda r: (r["partition"], r["offset"])):
        window = json.loads(record["value"])
        key = (window["window_start"], window["type"])
        if key not in latest or window["batch"] >= latest[key]["batch"]:
            latest[key] = window
    assert sum(w["count"] for w in latest.values()) == 600       # the resumed run read only the 100 new


# ------------------------------------------------------------------------------------ planning


@pytest.mark.parametrize(("min_partitions", "max_records"), [(None, None), (7, None), (None, 10), (50, 3)])
def test_planned_ranges_cover_each_offset_once(min_partitions, max_records):
    starts = {("a", 0): 5, ("a", 1): 0, ("b", 0): 100}
    untils = {("a", 0): 105, ("a", 1): 0, ("b", 0): 123}
    ranges = logfs_spark.plan_ranges(starts, untils, min_partitions=min_partitions,
                                     max_records_per_partition=max_records)
    covered = collections.Counter((r.topic, r.partition, o) for r in ranges
                                  for o in range(r.from_offset, r.until_offset))
    assert set(covered.values()) == {1}
    assert set(covered) == {(t, p, o) for (t, p), s in starts.items() for o in range(s, untils[(t, p)])}
    assert all(r.size > 0 for r in ranges)
    if min_partitions:
        assert len(ranges) >= min_partitions
    if max_records:
        assert max(r.size for r in ranges) <= max_records


def test_max_offsets_per_trigger_shares_by_lag():
    start = {("t", 0): 0, ("t", 1): 10}
    end = {("t", 0): 300, ("t", 1): 110}
    limited = source._rate_limit(start, end, 40, mount="/nonexistent")
    taken = {tp: limited[tp] - start.get(tp, 0) for tp in limited}
    assert sum(taken.values()) == 40
    assert taken[("t", 0)] == 30
    assert taken[("t", 1)] == 10
