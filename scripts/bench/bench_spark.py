#!/usr/bin/env python3
"""Spark reading records through a logfs mount, next to reading the same records from local files.

With a mount up::

    .venv/bin/python scripts/bench/bench_spark.py --mount ./mnt [--records 1000000] [--value-bytes 100]

appends N records to a fresh topic through its ``append`` file (unless a topic of
that name already holds exactly N records), copies the mount's ``records`` and
``records.jsonl`` views to local files, and times the same Spark job on each
pair in one Spark session:

- ``text``: ``spark.read.text`` on ``MOUNT/<topic>/*/records`` vs the local copy;
- ``json``: ``spark.read.json`` (explicit schema) on ``MOUNT/<topic>/*/segments/*.jsonl``
  vs the local JSON-lines copy;
- ``logfs source``: ``format("logfs")`` (raw segment files decoded in the Spark
  workers, the default ``readFormat=segments``) vs ``spark.read.json`` on the local copy;
- ``logfs jsonl``: the same with ``readFormat=jsonl`` (the mount renders ``from/<N>.jsonl``).

With ``--kafka BOOTSTRAP`` (a running broker) or ``--kafka-broker`` (a throwaway
single-node KRaft broker started from the jars ``scripts/setup-kafka.sh`` fetched), the
same values are also produced to a Kafka topic of the same name and partition
count (kafka-python, unless it already holds N records), and the run adds:

- ``kafka source``: Spark's own ``format("kafka")`` (spark-sql-kafka-0-10) reading
  the broker vs ``format("logfs")`` reading the mount, in the same session;
  ``ratio`` is then Kafka time / logfs time.

Each job sums the value lengths (so every byte is read and parsed) and checks
the record count.  After one untimed warm-up round of all jobs, every job runs
``--repeat`` times and the best time is kept, so both sides are measured warm.  ``ratio`` is local time / mount time:
1.0 means the mount is as fast as a local file (the aim is >= 0.8).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from devtools.bench import best_of
from logfs.spark import list_partitions, offset_bounds, spark_kafka_jars, spark_session

JSON_SCHEMA = ("topic STRING, partition INT, offset BIGINT, timestamp BIGINT, timestampType INT, "
               "key STRING, value STRING")


def topic_records(mount: str, topic: str) -> int:
    return sum(offset_bounds(mount, topic, p)[1] - offset_bounds(mount, topic, p)[0]
               for p in list_partitions(mount, topic))


def append_records(mount: str, topic: str, count: int, value_bytes: int, write_bytes: int = 1 << 20) -> float:
    """Append ``count`` records of ``value_bytes`` through the mount; return the seconds taken."""
    pad = b"x" * max(0, value_bytes - 10)
    per_write = max(1, write_bytes // (value_bytes + 1))
    fd = os.open(os.path.join(mount, topic, "append"), os.O_WRONLY | os.O_APPEND)
    started = time.perf_counter()
    try:
        for first in range(0, count, per_write):
            last = min(count, first + per_write)
            data = memoryview(b"".join([b"%010d%s\n" % (i, pad) for i in range(first, last)]))
            while data:
                data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return time.perf_counter() - started


def copy_views(mount: str, topic: str, workdir: str) -> tuple[str, str, float]:
    """Copy every partition's records and records.jsonl to local files; return paths and seconds."""
    text_dir, json_dir = os.path.join(workdir, "text"), os.path.join(workdir, "jsonl")
    os.makedirs(text_dir, exist_ok=True)
    os.makedirs(json_dir, exist_ok=True)
    started = time.perf_counter()
    for p in list_partitions(mount, topic):
        for view, target in (("records", os.path.join(text_dir, f"{p}.txt")),
                             ("records.jsonl", os.path.join(json_dir, f"{p}.jsonl"))):
            with open(os.path.join(mount, topic, str(p), view), "rb") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return text_dir, json_dir, time.perf_counter() - started


def fill_kafka(bootstrap: str, topic: str, partitions: int, count: int, value_bytes: int) -> float | None:
    """Create ``topic`` on the broker and produce the bench's values to it, unless it holds ``count`` already.

    Returns the seconds producing took, or None when the topic was already filled.
    """
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        deadline = time.monotonic() + 60
        while True:         # the new topic's leaders may take a moment
            try:
                ends, begins = consumer.end_offsets(tps), consumer.beginning_offsets(tps)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        have = sum(ends[tp] - begins[tp] for tp in tps)
    finally:
        consumer.close()
    if have == count:
        return None
    if have:
        raise SystemExit(f"Kafka topic {topic} holds {have} records, not {count}; pick another --topic")
    pad = b"x" * max(0, value_bytes - 10)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=1 << 20,
                             max_request_size=8 << 20)
    started = time.perf_counter()
    try:
        for i in range(count):
            producer.send(topic, value=b"%010d%s" % (i, pad), partition=i % partitions)
        producer.flush()
    finally:
        producer.close()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mount", required=True)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--topic", help="default bench-<records>x<value-bytes>")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", help="where the local copies go (default: a temporary directory)")
    kafka = parser.add_mutually_exclusive_group()
    kafka.add_argument("--kafka", metavar="BOOTSTRAP", help="also time Spark's kafka source on this broker")
    kafka.add_argument("--kafka-broker", action="store_true",
                       help="also time Spark's kafka source on a throwaway single-node broker started here")
    args = parser.parse_args(argv)
    mount, n = args.mount, args.records
    topic = args.topic or f"bench-{n}x{args.value_bytes}"

    if not os.path.isdir(os.path.join(mount, topic)):
        os.mkdir(os.path.join(mount, topic))
    have = topic_records(mount, topic)
    if have == 0:
        seconds = append_records(mount, topic, n, args.value_bytes)
        print(f"appended {n:,} records of {args.value_bytes} bytes to {topic} through the mount "
              f"in {seconds:.2f} s ({n / seconds:,.0f} records/s)")
    elif have != n:
        parser.error(f"topic {topic} already holds {have} records, not {n}; pick another --topic")
    workdir = args.workdir or tempfile.mkdtemp(prefix="logfs-bench-")
    text_dir, json_dir, copy_seconds = copy_views(mount, topic, workdir)
    copied = sum(os.path.getsize(os.path.join(d, f)) for d in (text_dir, json_dir) for f in os.listdir(d))
    print(f"copied records + records.jsonl ({copied / 1e6:.0f} MB) to {workdir} in {copy_seconds:.2f} s "
          f"({copied / 1e6 / copy_seconds:.0f} MB/s plain reads through the mount)")

    broker = None
    bootstrap = args.kafka
    if args.kafka_broker:
        from devtools.kafka import KafkaBroker
        broker = KafkaBroker(Path(workdir) / "kafka")
        atexit.register(broker.stop)        # whatever happens next, the JVM does not outlive the bench
        broker.start()
        bootstrap = broker.bootstrap
        print(f"started a KRaft broker at {bootstrap} (log.dirs {broker.log_dir})")
    if bootstrap:
        seconds = fill_kafka(bootstrap, topic, len(list_partitions(mount, topic)), n, args.value_bytes)
        if seconds is not None:
            print(f"produced {n:,} records to Kafka topic {topic} with kafka-python in {seconds:.2f} s")

    conf = {"spark.driver.memory": "2g"}
    if bootstrap:
        conf["spark.jars"] = ",".join(spark_kafka_jars())
    spark = spark_session(args.master, "logfs-bench", conf)
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark.sql import functions as F

    def text_job(path: str):
        return lambda: tuple(spark.read.text(path).agg(F.count(F.lit(1)), F.sum(F.length("value"))).first())

    def json_job(path: str):
        return lambda: tuple(spark.read.schema(JSON_SCHEMA).json(path)
                             .agg(F.count(F.lit(1)), F.sum(F.length("value"))).first())

    def source_job(read_format: str):
        def job():
            df = (spark.read.format("logfs").option("path", mount).option("subscribe", topic)
                  .option("readFormat", read_format)
                  .option("minPartitions", str(spark.sparkContext.defaultParallelism)).load())
            return tuple(df.agg(F.count(F.lit(1)), F.sum(F.length("value"))).first())
        return job

    def kafka_job():
        df = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("minPartitions", str(spark.sparkContext.defaultParallelism)).load())
        return tuple(df.agg(F.count(F.lit(1)), F.sum(F.length("value"))).first())

    jobs = [
        ("text", text_job(text_dir), text_job(os.path.join(mount, topic, "*", "records"))),
        ("json", json_job(json_dir), json_job(os.path.join(mount, topic, "*", "segments", "*.jsonl"))),
        ("logfs source", json_job(json_dir), source_job("segments")),
        ("logfs jsonl", json_job(json_dir), source_job("jsonl")),
    ]
    if bootstrap:
        jobs.append(("kafka source", kafka_job, source_job("segments")))
    expected = (n, n * args.value_bytes)
    rows = []
    try:
        # One untimed round first: the JVM's JIT and Spark's Python workers warm up on
        # whichever job runs first, which would otherwise penalise that job.
        for _, local_job, mount_job in jobs:
            local_job()
            mount_job()
        for name, local_job, mount_job in jobs:
            local_s, local_result = best_of(local_job, args.repeat)
            mount_s, mount_result = best_of(mount_job, args.repeat)
            for what, result in (("local", local_result), ("mount", mount_result)):
                if tuple(result) != expected:
                    raise SystemExit(f"{name} ({what}) read {result}, expected (records, bytes) = {expected}")
            rows.append((name, local_s, mount_s))
    finally:
        spark.stop()

    print(f"\nSpark ({args.master}) reading {n:,} records x {args.value_bytes} bytes, best of {args.repeat}:")
    print(f"{'job':<14}{'local s':>9}{'mount s':>9}{'local rec/s':>14}{'mount rec/s':>14}{'ratio':>8}"
          + ("   (kafka source: 'local' is Spark's kafka source on the broker)" if bootstrap else ""))
    for name, local_s, mount_s in rows:
        print(f"{name:<14}{local_s:>9.2f}{mount_s:>9.2f}{n / local_s:>14,.0f}{n / mount_s:>14,.0f}"
              f"{local_s / mount_s:>8.2f}")
    print(json.dumps({"records": n, "value_bytes": args.value_bytes,
                      "results": {name: {"local_s": round(loc, 3), "mount_s": round(m, 3), "ratio": round(loc / m, 3)}
                                  for name, loc, m in rows}}))
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
