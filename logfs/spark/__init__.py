"""Spark on logfs: the ``logfs`` PySpark data source and appending from Spark tasks.

Three ways for Spark to use a mounted logfs, all of them through the mount's files
(nothing here opens a data directory; the source decodes the record batches the
mount serves byte for byte):

**Plain files.**  The views are ordinary files, so Spark's file sources work on them
as on any local directory, including split reads of large files while appends go
on (a view's size is fixed at each lookup and only grows, so the byte ranges Spark
plans at listing time stay valid)::

    spark.read.text("MOUNT/<topic>/*/records")              # one row per record value
    spark.read.json("MOUNT/<topic>/*/segments/*.jsonl")     # Kafka-source columns

**The ``logfs`` data source** gives the schema of Spark's Kafka source and takes
its options, so a job written for ``format("kafka")`` runs on the mount with the
format name and ``path`` changed::

    import logfs.spark
    logfs.spark.register(spark)
    df = (spark.read.format("logfs")
          .option("path", "/mnt/logfs")
          .option("subscribe", "events,clicks")
          .option("startingOffsets", "earliest")              # or JSON, see below
          .option("endingOffsets", '{"events":{"0":100,"1":-1}}')
          .load())
    stream = spark.readStream.format("logfs").option("path", "/mnt/logfs") \
        .option("subscribe", "events").load()

Schema (Kafka's): ``key binary, value binary, topic string, partition int,
offset long, timestamp timestamp, timestampType int`` and, with
``includeHeaders=true``, ``headers array<struct<key: string, value: binary>>``
(null for a record without headers, as in Spark's Kafka source).

Options (names and meaning as Spark's Kafka source):

- ``path`` (required): the mount point.
- exactly one of ``subscribe`` (``t1,t2``), ``subscribePattern`` (a Python
  regular expression matched against whole topic names) or ``assign``
  (``{"t1":[0,1]}``).
- ``startingOffsets``: ``earliest``, ``latest`` (streaming only; the streaming
  default) or JSON ``{"t":{"0":23,"1":-2}}`` where -2 means earliest and -1
  latest.  A JSON spec must name every partition subscribed to.  For a
  streaming query it applies only when the query starts without a checkpoint.
- ``endingOffsets`` (batch only): ``latest`` (default) or JSON as above
  (-1 latest; -2 is refused, as by Kafka).
- ``startingTimestamp`` (epoch ms, every subscribed partition) or
  ``startingOffsetsByTimestamp`` (JSON ``{"t":{"0":1700000000000}}`` naming
  every subscribed partition): start each partition at the earliest offset
  whose timestamp is at or after the given one, as Kafka's ``offsetsForTimes``
  finds it (the partition's ``since/<T>`` view).  A partition with no such
  record fails the query, or with ``startingOffsetsByTimestampStrategy=latest``
  starts at its log end.  Precedence as in Kafka: ``startingTimestamp``, then
  ``startingOffsetsByTimestamp``, then ``startingOffsets``.  For a streaming
  query they apply only when it starts without a checkpoint.
- ``endingTimestamp`` / ``endingOffsetsByTimestamp`` (batch only): end each
  partition before the earliest offset whose timestamp is at or after the
  given one (exclusive, like ``endingOffsets``), or at the log end when there
  is none.  Precedence: ``endingTimestamp``, ``endingOffsetsByTimestamp``,
  ``endingOffsets``.
- ``failOnDataLoss`` (default true): fail when a requested offset is below the
  log start offset because retention or DeleteRecords removed it; false skips
  to the log start offset with a warning.
- ``minPartitions`` / ``maxRecordsPerPartition``: split offset ranges so that
  one log partition can be read by several Spark tasks (Kafka's options).
- ``maxOffsetsPerTrigger`` (streaming): admission control, records per
  micro-batch spread over partitions in proportion to their lag.
- ``includeHeaders`` (default false).
- ``readFormat`` (logfs only): ``segments`` (default) or ``jsonl``, see below.
- ``group`` (logfs only, instead of ``startingOffsets``): start from the
  consumer group's committed offsets (``MOUNT/<topic>/groups/<group>``), as a
  Kafka consumer of that group would; a partition without a commit, or whose
  commit is outside [log start, log end], starts at its log start (as
  ``consume/<group>`` does).  The source does not commit: write
  ``<partition> <offset>`` lines to ``groups/<group>`` when the job is done.

How records travel: each Spark task reads one offset range ``[from, until)`` of one
partition.  Offsets come from ``MOUNT/<topic>/<p>/state`` (``log_start_offset``,
``log_end_offset``, ``segments`` and, with tiered storage, ``remote_segments``)
and partitions from listing ``MOUNT/<topic>``.  A tiered topic is read from its
log start: the remote log segments below the local log start are files of
``segments/`` like the local ones, which the mount reads from the object store
through its chunk cache (docs/tiering.md); while the store fails, a task
reading them fails with the store's errno.

- ``readFormat=segments``: the task reads the raw segment files
  ``MOUNT/<topic>/<p>/segments/<base>.log``, which the mount passes through
  without rendering, in 4 MiB reads; it starts at the batch the sparse
  ``<base>.index`` points to for ``from`` and decodes the batches in the Spark
  Python worker with :mod:`engine.records`, checking each batch's CRC first (a
  corrupt batch fails the task naming the file and the position in it).
  Control batches are skipped; timestamps and ``timestampType`` come from each
  batch; keys, values and headers are the stored bytes.  This keeps the
  single-threaded mount out of the decoding, so Spark's cores do it in parallel.
  Retention and the cleaner may delete or replace segment files between planning
  and reading: offsets are the identity, so a task that finds a file gone lists
  the segments again and continues from the first offset it has not emitted;
  no offset is emitted twice or out of order, and offsets below the log start
  offset at read time follow ``failOnDataLoss``.
- ``readFormat=jsonl``: the task reads the ``from/<from>.jsonl`` view, which the
  mount renders from its indexes, and parses it with Arrow's JSON reader.  A key
  or value that is not UTF-8 is rendered by the mount as base64 followed by
  ``"keyEncoding":"base64"``; this reader decodes it, so the binary columns hold
  the exact bytes appended.  Slower (the mount renders in one process), kept for
  comparison and as a fallback.

Streaming offsets are JSON objects ``{"topic": {"partition": next_offset}}``
(Kafka's ``KafkaSourceOffset`` format).  Spark writes them to the query's
checkpoint before a micro-batch runs and hands them back on restart, so a
restarted query continues exactly after the last committed micro-batch: a
micro-batch reads ``[start, end)`` per partition, which neither loses nor repeats
a record.  Partitions added while a query runs are read from their log start
(as Kafka does).  ``Trigger.AvailableNow`` is supported.

**Appending from Spark.**  :func:`append_rows` writes one column of a DataFrame
to ``MOUNT/<topic>/append`` from the executors (``foreachPartition``), one
``write()`` per chunk of lines; each write is appended atomically by the mount.
Like Kafka producers without idempotence, a retried Spark task appends its rows
again: delivery is at least once.

Worker processes must import this module and pyarrow: run Spark with
``PYSPARK_PYTHON`` pointing at the interpreter where logfs is installed;
:func:`register` switches a local session's workers to the current interpreter
when theirs cannot import logfs, and fails at once, saying so, otherwise.

Layout of the package (one job per module): :mod:`.options` (options and
schema), :mod:`.mount_client` (partitions, offsets, ``failOnDataLoss``),
:mod:`.planning` (offset ranges into Spark partitions), :mod:`.read_segments`
and :mod:`.read_jsonl` (reading one range), :mod:`.source` (the DataSource and
its batch/stream readers, which Spark's workers import by this path),
:mod:`.session` (registering, worker interpreter), :mod:`.append`
(:func:`append_rows`), :mod:`.kafka_jars` (Spark's own Kafka source).
"""

from __future__ import annotations

from engine.errors import OffsetOutOfRangeError
from logfs.spark.append import append_rows
from logfs.spark.kafka_jars import spark_kafka_jars
from logfs.spark.mount_client import (
    ending_offsets,
    list_partitions,
    list_topics,
    offset_bounds,
    offset_for_time,
    partition_state,
    starting_offsets,
)
from logfs.spark.options import EARLIEST, KAFKA_SCHEMA, LATEST, SOURCE_NAME, OffsetSpec, SourceOptions, group_offsets
from logfs.spark.planning import OffsetRangePartition, plan_ranges
from logfs.spark.read_jsonl import read_range_jsonl
from logfs.spark.read_segments import SegmentRangeReader, index_position, read_range
from logfs.spark.session import register, spark_session
from logfs.spark.source import LogfsBatchReader, LogfsDataSource, LogfsStreamReader

__all__ = [
    "EARLIEST", "KAFKA_SCHEMA", "LATEST", "SOURCE_NAME", "LogfsBatchReader", "LogfsDataSource",
    "LogfsStreamReader", "OffsetOutOfRangeError", "OffsetRangePartition", "OffsetSpec", "SegmentRangeReader",
    "SourceOptions", "append_rows", "ending_offsets", "group_offsets", "index_position", "list_partitions",
    "list_topics", "offset_bounds", "offset_for_time", "partition_state", "plan_ranges", "read_range",
    "read_range_jsonl", "register", "spark_kafka_jars", "spark_session", "starting_offsets",
]
