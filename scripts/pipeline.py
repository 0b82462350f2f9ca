#!/usr/bin/env python3
"""A Spark pipeline over a mounted logfs: events in one topic, aggregates out to another.

Reads JSON events such as ``{"type": "click", "user": "u1", "amount": 3.5}`` from
the source topic with the ``logfs`` data source, counts them and sums ``amount``
per ``type``, and appends the results as JSON lines to the sink topic through its
``append`` file, the way a Kafka Streams or Spark job would between two Kafka
topics.  With the mount up (``scripts/run.sh`` mounts ``./mnt``)::

    .venv/bin/python scripts/pipeline.py --mount ./mnt --source events \\
        --sink events-by-type --generate 1000

    # continuous: per-minute windows, resumable from its checkpoint
    .venv/bin/python scripts/pipeline.py --mount ./mnt --source events \\
        --sink events-by-type --stream

    cat mnt/events-by-type/*/records

Batch mode aggregates the whole source topic once and appends one record per
type (a snapshot, tagged with the source offsets it covers).  Stream mode
aggregates per ``--window`` of the records' timestamps and, after each
micro-batch, appends the windows that changed (Spark's update output mode); a
restarted query resumes from ``--checkpoint`` without reading a record twice
(default: a directory per mount, source and sink under ``$XDG_STATE_HOME/logfs``,
``~/.local/state/logfs`` when unset, never the current directory).
Appends to the sink are at least once: a micro-batch replayed after a crash
appends its results again, tagged with the same ``batch`` number.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from logfs.spark import append_rows, list_partitions, offset_bounds, spark_session

log = logging.getLogger("pipeline")

EVENT_TYPES = ("click", "view", "purchase", "signup")
EVENT_SCHEMA = "type STRING, user STRING, amount DOUBLE"


def ensure_topic(mount: str, topic: str) -> None:
    """Create ``topic`` (mkdir in the mount) unless it exists."""
    path = os.path.join(mount, topic)
    if not os.path.isdir(path):
        os.mkdir(path)
        print(f"Created topic {topic} with {len(list_partitions(mount, topic))} partitions")


def end_offsets(mount: str, topic: str) -> dict[int, int]:
    return {p: offset_bounds(mount, topic, p)[1] for p in list_partitions(mount, topic)}


def generate_events(mount: str, topic: str, count: int, seed: int, chunk: int = 1000) -> None:
    """Append ``count`` sample events through ``MOUNT/<topic>/append``, ``chunk`` per write()."""
    rng = random.Random(seed)
    before = sum(end_offsets(mount, topic).values())
    fd = os.open(os.path.join(mount, topic, "append"), os.O_WRONLY | os.O_APPEND)
    try:
        for first in range(0, count, chunk):
            lines = [json.dumps({"type": rng.choice(EVENT_TYPES), "user": f"u{rng.randrange(100)}",
                                 "amount": round(rng.uniform(0.5, 100.0), 2)}, separators=(",", ":"))
                     for _ in range(min(chunk, count - first))]
            data = memoryview(("\n".join(lines) + "\n").encode())
            while data:
                data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    after = sum(end_offsets(mount, topic).values())
    print(f"Appended {count} events to topic {topic} ({before} -> {after} records in the log)")


def parse_events(df):
    from pyspark.sql import functions as F

    return (df.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"), "timestamp")
            .where(F.col("e.type").isNotNull())
            .select("e.type", "e.amount", "timestamp"))


def run_batch(spark, args) -> None:
    from pyspark.sql import functions as F

    covered = end_offsets(args.mount, args.source)
    ending = json.dumps({args.source: {str(p): o for p, o in covered.items()}})
    source = (spark.read.format("logfs").option("path", args.mount).option("subscribe", args.source)
              .option("startingOffsets", "earliest").option("endingOffsets", ending).load())
    totals = (parse_events(source).groupBy("type")
              .agg(F.count(F.lit(1)).alias("count"), F.round(F.sum("amount"), 2).alias("amount"))
              .orderBy("type")).cache()
    rows = totals.collect()
    events = sum(r['count'] for r in rows)
    # a record that is not a JSON event (a stray line, a typo) is not counted: say how many there were
    skipped = source.count() - events
    print(f"Read {events} events from topic {args.source} (end offsets {covered})"
          + (f"; skipped {skipped} records that are not JSON events" if skipped else ""))
    for r in rows:
        print(f"  {r['type']:<10} count={r['count']:<8} amount={r['amount']}")
    covered_offsets = F.from_json(F.lit(ending), "map<string, map<string, bigint>>")
    out = totals.select(F.to_json(F.struct("type", "count", "amount",
                                           covered_offsets.alias("source_offsets"))).alias("value"))
    appended = append_rows(out, args.mount, args.sink)
    totals.unpersist()
    print(f"Appended {appended} aggregate records to topic {args.sink}")


def run_stream(spark, args) -> None:
    from pyspark.sql import functions as F

    source = (spark.readStream.format("logfs").option("path", args.mount).option("subscribe", args.source)
              .option("startingOffsets", args.starting_offsets).load())
    windows = (parse_events(source)
               .withWatermark("timestamp", args.watermark)
               .groupBy(F.window("timestamp", args.window), "type")
               .agg(F.count(F.lit(1)).alias("count"), F.round(F.sum("amount"), 2).alias("amount")))

    def publish(batch_df, batch_id: int) -> None:
        out = batch_df.select(F.to_json(F.struct(
            F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
            F.date_format("window.end", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_end"),
            "type", "count", "amount", F.lit(batch_id).alias("batch"))).alias("value"))
        appended = append_rows(out, args.mount, args.sink)
        print(f"Micro-batch {batch_id}: appended {appended} window aggregates to topic {args.sink}", flush=True)

    writer = (windows.writeStream.outputMode("update").foreachBatch(publish)
              .option("checkpointLocation", args.checkpoint))
    writer = writer.trigger(availableNow=True) if args.available_now else \
        writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    query = writer.start()
    print(f"Streaming {args.source} -> {args.sink} (checkpoint {args.checkpoint}); "
          + ("stopping when caught up" if args.available_now else "Ctrl-C to stop"), flush=True)
    try:
        if args.available_now:
            query.awaitTermination()
        else:
            query.awaitTermination(args.timeout) if args.timeout else query.awaitTermination()
    except KeyboardInterrupt:
        pass
    finally:
        if query.isActive:
            query.stop()
    progress = query.lastProgress
    if progress:
        print(f"Stopped after batch {progress['batchId']}; source offsets {progress['sources'][0]['endOffset']}")


def default_checkpoint(mount: str, source: str, sink: str) -> str:
    """Where a stream keeps its checkpoint unless told: per user, per mount, never in the cwd."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    mount_id = os.path.abspath(mount).strip("/").replace("/", "_") or "root"
    return os.path.join(state, "logfs", "pipeline", mount_id, f"{source}-to-{sink}")


def main(argv: list[str] | None = None, spark=None) -> int:
    """The command line; ``spark``, when given, is a running SparkSession to use (and leave running) instead
    of starting an application of its own: ``--master`` is then ignored (the tests share one session)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mount", required=True, help="logfs mount point")
    parser.add_argument("--source", required=True, help="topic of JSON events")
    parser.add_argument("--sink", required=True, help="topic the aggregates are appended to")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--generate", type=int, default=0, metavar="N",
                        help="first append N sample events to the source topic")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--stream", action="store_true", help="run as a Structured Streaming query")
    parser.add_argument("--checkpoint", help="streaming checkpoint directory (default "
                        "$XDG_STATE_HOME/logfs/pipeline/<mount>/<source>-to-<sink>)")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="streaming start when there is no checkpoint yet (earliest, latest or JSON)")
    parser.add_argument("--window", default="1 minute")
    parser.add_argument("--watermark", default="10 minutes")
    parser.add_argument("--trigger-seconds", type=int, default=5)
    parser.add_argument("--available-now", action="store_true",
                        help="stream mode: process what is there, then stop")
    parser.add_argument("--timeout", type=float, default=0, help="stream mode: stop after this many seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if not os.path.isdir(args.mount):
        parser.error(f"--mount {args.mount!r} is not a directory (is logfs mounted?)")
    ensure_topic(args.mount, args.source)
    ensure_topic(args.mount, args.sink)
    if args.generate:
        generate_events(args.mount, args.source, args.generate, args.seed)
    args.checkpoint = args.checkpoint or default_checkpoint(args.mount, args.source, args.sink)

    started = time.monotonic()
    own = spark is None
    if own:
        spark = spark_session(args.master, f"logfs-pipeline-{args.source}-to-{args.sink}")
        spark.sparkContext.setLogLevel("ERROR")
    try:
        if args.stream:
            run_stream(spark, args)
        else:
            run_batch(spark, args)
    finally:
        if own:
            spark.stop()
    print(f"Done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
