"""Spark's own Kafka source and the ``logfs`` source, side by side on the same data.

The data is written through a logfs mount, handed to a real KRaft broker with
the documented procedure (``logfs to-kafka plan`` / ``adopt --copy``, so the
logfs data dir stays as it was), and the mount is started again over it.  For
every option the two sources share, ``format("kafka")`` reading the broker and
``format("logfs")`` reading the mount must return the same schema and the same
rows -- including Kafka's timestamp options, where the broker answers from our
``.timeindex`` files and the logfs source from the mount's ``since/<T>`` view.

Spark's Kafka source is ``spark-sql-kafka-0-10`` from Maven Central
(``scripts/setup-kafka.sh``, ``scripts/spark-kafka/pom.xml``); a missing install is
an error, never a skip.  One Spark session and one broker for the module.
"""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import time
from typing import TYPE_CHECKING

import pytest

from logfs.spark import spark_kafka_jars
from tests.conftest import Mount
from tests.helpers import add_config, append_lines, wait_for
from tests.jvm import java_command
from tests.kafka.test_to_kafka import _logfs

if TYPE_CHECKING:
    from pyspark.sql import Row

pytestmark = [pytest.mark.mount, pytest.mark.spark, pytest.mark.kafka]

MOUNT_OPTIONS = {"num.partitions": "1", "log.initial.task.delay.ms": "0"}
ROUNDS = 6


def _wait_past(ms: int) -> int:
    """Wait for the wall clock to pass ``ms`` (so the next round gets a later LogAppendTime)."""
    return wait_for(lambda: (now := time.time_ns() // 1_000_000) > ms and now, f"the clock to pass {ms}",
                    timeout=5, interval=0.1)


@pytest.fixture(scope="module")
def both(kafka_broker, tmp_path_factory, spark):
    """(mount, broker, spark, the first timestamp of each round); Spark's Kafka source is on the shared
    session's classpath (tests/conftest.py), ``spark_kafka_jars`` names the set-up step if it is missing."""
    spark_kafka_jars()
    base = tmp_path_factory.mktemp("side-by-side")
    mount = Mount(base / "m", MOUNT_OPTIONS).start()
    try:
        (mount / "a").mkdir()
        add_config(mount / "a/config", "parse.key=true\ninternal.segment.bytes=2048\n")
        for p in (1, 2):
            (mount / f"a/{p}").mkdir()
        (mount / "b").mkdir()
        (mount / "gone").mkdir()
        rounds = []
        last = 0
        for r in range(ROUNDS):
            last = _wait_past(last)
            for p in range(3):
                append_lines(mount / f"a/{p}/append", [b"key%d\tround %d partition %d line %d" % (i % 4, r, p, i)
                                                 for i in range(3 + p)])
            append_lines(mount / "b/0/append", [b"b %d \xff\x00 %d" % (r, i) for i in range(4)])
            append_lines(mount / "gone/0/append", [b"gone %d %d" % (r, i) for i in range(5)])
            rows = [json.loads(line) for line in (mount / "a/0/records.jsonl").read_bytes().splitlines()]
            rounds.append(rows[-1]["timestamp"])
            last = max(json.loads(line)["timestamp"]
                       for p in range(3) for line in (mount / f"a/{p}/records.jsonl").read_bytes().splitlines())
        (mount / "gone/0/delete").write_bytes(b"before 12\n")
        # CreateTime records out of timestamp order, with headers, through append.jsonl.
        (mount / "h").mkdir()
        an_hour_ago = int(time.time() * 1000) - 3_600_000    # within retention.ms
        shuffled = random.Random(534).sample(range(40), 40)
        append_lines(mount / "h/0/append.jsonl", [json.dumps(
            {"key": f"k{i}", "value": f"v{i}", "timestamp": an_hour_ago + 1000 * t,
             **({"headers": [{"key": "n", "value": str(i)}, {"key": "null", "value": None}]} if i % 2 else {})}
        ).encode() for i, t in enumerate(shuffled)])
        assert mount.stop() == 0

        kafka_topics = shlex.join(java_command("org.apache.kafka.tools.TopicCommand",
                                               jvm_opts=["-Xmx256m", "-XX:+UseSerialGC",
                                                         "-XX:TieredStopAtLevel=1"]))
        plan = _logfs("to-kafka", "plan", str(mount.data), "--bootstrap-server", kafka_broker.bootstrap,
                      "--kafka-topics", kafka_topics).stdout.decode()
        script = base / "create-topics.sh"
        script.write_text(plan)
        run = subprocess.run(["sh", str(script)], capture_output=True, timeout=600)
        assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
        kafka_broker.wait_for(lambda: all((kafka_broker.log_dir / d / "partition.metadata").exists()
                                          for d in ("a-0", "a-1", "a-2", "b-0", "gone-0", "h-0")), "the partitions")
        kafka_broker.stop()
        _logfs("to-kafka", "adopt", "--copy", str(mount.data), "--broker-log-dir", str(kafka_broker.log_dir))
        kafka_broker.start()
        mount.start()
        yield mount, kafka_broker, spark, rounds
    finally:
        if mount.proc is not None:
            mount.stop()


def _read(spark, fmt: str, location: dict[str, str], options: dict[str, str]):
    reader = spark.read.format(fmt)
    for name, value in {**location, **options}.items():
        reader = reader.option(name, value)
    return reader.load()


def _same(both, options: dict[str, str]) -> list[Row]:
    mount, broker, spark, _ = both
    kafka = _read(spark, "kafka", {"kafka.bootstrap.servers": broker.bootstrap}, options)
    logfs = _read(spark, "logfs", {"path": str(mount.path)}, options)
    assert logfs.schema == kafka.schema
    kafka_rows = sorted(kafka.collect(), key=lambda r: (r.topic, r.partition, r.offset))
    logfs_rows = sorted(logfs.collect(), key=lambda r: (r.topic, r.partition, r.offset))
    assert logfs_rows == kafka_rows, f"options {options}"
    return kafka_rows


def _by_partition(topic: str, values: list[int]) -> str:
    return json.dumps({topic: {str(p): v for p, v in enumerate(values)}})


def test_subscriptions_and_offsets(both):
    assert len(_same(both, {"subscribe": "a"})) == ROUNDS * (3 + 4 + 5)
    assert {r.topic for r in _same(both, {"subscribe": "a,b"})} == {"a", "b"}
    assert {r.topic for r in _same(both, {"subscribePattern": "a|b"})} == {"a", "b"}
    assert {(r.topic, r.partition) for r in _same(both, {"assign": '{"a":[0,2],"b":[0]}'})} == \
        {("a", 0), ("a", 2), ("b", 0)}
    rows = _same(both, {"subscribe": "a", "startingOffsets": _by_partition("a", [2, -2, 5]),
                        "endingOffsets": _by_partition("a", [7, -1, 6])})
    assert [r.offset for r in rows if r.partition == 2] == [5]
    rows = _same(both, {"subscribe": "a", "includeHeaders": "true", "minPartitions": "5",
                        "maxRecordsPerPartition": "4"})
    assert all(r.headers is None for r in rows)


def test_log_start_offsets_and_fail_on_data_loss(both):
    rows = _same(both, {"subscribe": "gone"})
    assert rows[0].offset == 12
    rows = _same(both, {"subscribe": "gone", "startingOffsets": '{"gone":{"0":3}}', "failOnDataLoss": "false"})
    assert rows[0].offset == 12


def test_timestamp_options(both):
    rounds = both[3]
    rows = _same(both, {"subscribe": "a", "startingTimestamp": str(rounds[2])})
    assert min(r.offset for r in rows if r.partition == 0) == 2 * 3
    _same(both, {"subscribe": "a", "startingOffsetsByTimestamp": _by_partition("a", rounds[1:4])})
    rows = _same(both, {"subscribe": "a", "endingTimestamp": str(rounds[4])})
    assert max(r.offset for r in rows if r.partition == 0) == 4 * 3 - 1
    _same(both, {"subscribe": "a", "startingOffsetsByTimestamp": _by_partition("a", rounds[0:3]),
                 "endingOffsetsByTimestamp": _by_partition("a", rounds[3:6])})
    # The precedence of Kafka's source: startingTimestamp over ByTimestamp over startingOffsets.
    _same(both, {"subscribe": "a", "startingTimestamp": str(rounds[3]),
                 "startingOffsetsByTimestamp": _by_partition("a", rounds[0:3]), "startingOffsets": "earliest",
                 "endingTimestamp": str(rounds[5]), "endingOffsets": _by_partition("a", [1, 1, 1])})
    # No record at or after the timestamp: latest with the strategy; the end defaults to latest.
    future = str(rounds[-1] + 3_600_000)
    assert _same(both, {"subscribe": "a", "startingTimestamp": future,
                        "startingOffsetsByTimestampStrategy": "latest"}) == []
    assert len(_same(both, {"subscribe": "a", "endingTimestamp": future})) == ROUNDS * (3 + 4 + 5)


def test_unmatched_starting_timestamp_fails_both(both):
    mount, broker, spark, rounds = both
    future = str(rounds[-1] + 3_600_000)
    for fmt, location in (("kafka", {"kafka.bootstrap.servers": broker.bootstrap}),
                          ("logfs", {"path": str(mount.path)})):
        with pytest.raises(Exception, match="No offset matched from request of topic-partition"):
            _read(spark, fmt, location, {"subscribe": "a", "startingTimestamp": future}).collect()


def test_streaming_available_now(both, tmp_path):
    mount, broker, spark, rounds = both
    results = {}
    for fmt, location in (("kafka", {"kafka.bootstrap.servers": broker.bootstrap}),
                          ("logfs", {"path": str(mount.path)})):
        reader = spark.readStream.format(fmt)
        for name, value in {**location, "subscribe": "a,b", "startingTimestamp": str(rounds[3]),
                            "maxOffsetsPerTrigger": "7"}.items():
            reader = reader.option(name, value)
        query = (reader.load().writeStream.format("memory").queryName(f"stream_{fmt}")
                 .option("checkpointLocation", str(tmp_path / fmt)).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None
        results[fmt] = sorted(spark.sql(f"select * from stream_{fmt}").collect(),
                              key=lambda r: (r.topic, r.partition, r.offset))
    assert results["logfs"] == results["kafka"]
    assert results["kafka"]


def test_timestamp_options_are_validated_with_a_clear_error(tmp_path):
    from engine.errors import InvalidConfigError, UnknownTopicOrPartitionError
    from logfs.spark import LogfsStreamReader, SourceOptions
    from logfs.spark.mount_client import _timestamp_targets

    base = {"path": str(tmp_path), "subscribe": "a"}
    for name, value, message in (
            ("startingTimestamp", "yesterday", "option startingTimestamp: expected epoch milliseconds"),
            ("endingTimestamp", "-5", "option endingTimestamp: a timestamp must be >= 0"),
            ("startingOffsetsByTimestamp", '{"a":{"0":"noon"}}', "is not a partition number mapped to epoch"),
            ("endingOffsetsByTimestamp", "[1]", "expected a JSON object of topics"),
            ("startingOffsetsByTimestampStrategy", "earliest", "expected one of ('error', 'latest')")):
        with pytest.raises(InvalidConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            SourceOptions.parse({**base, name: value})
    with pytest.raises(InvalidConfigError, match="not valid for streaming"):
        LogfsStreamReader(SourceOptions.parse({**base, "endingTimestamp": "1"}))
    with pytest.raises(InvalidConfigError, match="must specify every subscribed partition; missing a-1"):
        _timestamp_targets("startingOffsetsByTimestamp", None, {("a", 0): 5}, [("a", 0), ("a", 1)])
    with pytest.raises(UnknownTopicOrPartitionError, match="not subscribed or do not exist: b-0"):
        _timestamp_targets("endingOffsetsByTimestamp", None, {("a", 0): 5, ("b", 0): 1}, [("a", 0)])


def test_headers_and_out_of_order_create_times(both):
    rows = _same(both, {"subscribe": "h", "includeHeaders": "true"})
    assert {r.timestampType for r in rows} == {0}
    assert sum(r.headers is not None for r in rows) == 20
    timestamps = sorted(int(r.timestamp.timestamp() * 1000) for r in rows)
    # Kafka's offsetsForTimes over timestamps that go back and forth: same answer from both.
    for t in (timestamps[0], timestamps[7], timestamps[19] + 1, timestamps[33], timestamps[-1]):
        _same(both, {"subscribe": "h", "startingTimestamp": str(t)})
        _same(both, {"subscribe": "h", "endingTimestamp": str(t)})
        _same(both, {"subscribe": "h", "startingOffsetsByTimestamp": json.dumps({"h": {"0": t}}),
                     "endingOffsetsByTimestamp": json.dumps({"h": {"0": timestamps[-1] + 1}})})
