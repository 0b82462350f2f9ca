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
``log_end_offset``, ``segments``) and partitions from listing ``MOUNT/<topic>``.

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
"""

from __future__ import annotations

import base64
import bisect
import errno
import functools
import logging
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Iterator, Mapping, Sequence

import orjson

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from engine.errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from engine.files import INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX, segment_file_name
from engine.index import offset_index_file_position
from engine.records import (
    HEADER_SIZE,
    MAGIC,
    BatchColumns,
    decode_columns,
    iter_batches,
    read_header,
    validate_batch,
)

if TYPE_CHECKING:  # pragma: no cover - imported lazily where used
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SOURCE_NAME = "logfs"

#: Kafka's ListOffsets sentinels, as used in startingOffsets/endingOffsets JSON.
EARLIEST = -2
LATEST = -1

KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
])
HEADERS_FIELD = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType(), True),
                          StructField("value", BinaryType(), True)]), True),
    True)

#: Offsets as Spark checkpoints them: {"topic": {"partition": offset}}.
PartitionOffsets = dict[str, dict[str, int]]


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------

def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise InvalidConfigError(f"Invalid value {raw!r} for option {name}: expected true or false")


def _int_option(options: Mapping[str, str], name: str, minimum: int = 1) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidConfigError(f"Invalid value {raw!r} for option {name}: expected an integer") from None
    if value < minimum:
        raise InvalidConfigError(f"Invalid value {value} for option {name}: must be >= {minimum}")
    return value


READ_FORMATS = ("segments", "jsonl")


def _group_option(options: Mapping[str, str]) -> str | None:
    group = options.get("group")
    if group is None:
        return None
    if not group or "/" in group or group in (".", ".."):
        raise InvalidConfigError(f"Invalid value {group!r} for option group: not a consumer group id")
    if options.get("startingOffsets"):
        raise InvalidConfigError("Options group and startingOffsets cannot be used together")
    return group


def group_offsets(mount: str, group: str, tps: Sequence[tuple[str, int]],
                  bounds: Mapping[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], int]:
    """Where ``group`` resumes on each partition: its committed offset, else the log start offset."""
    committed: dict[tuple[str, int], int] = {}
    for topic in sorted({t for t, _ in tps}):
        try:
            with open(os.path.join(mount, topic, "groups", group), "rb") as f:
                rows = [line.split() for line in f.read().splitlines()]
        except FileNotFoundError:       # no commit on this topic
            continue
        committed.update({(topic, int(row[0])): int(row[1]) for row in rows})
    out = {}
    for tp in tps:
        start, end = bounds[tp]
        offset = committed.get(tp, -1)
        out[tp] = offset if start <= offset <= end else start
    log.info("[logfs source] Group %s resumes at %s", group, out)
    return out


def _read_format_option(options: Mapping[str, str]) -> str:
    raw = options.get("readFormat")
    if raw is None:
        return READ_FORMATS[0]
    text = str(raw).strip().lower()
    if text not in READ_FORMATS:
        raise InvalidConfigError(f"Invalid value {raw!r} for option readFormat: expected one of {READ_FORMATS}")
    return text


@dataclass(frozen=True)
class OffsetSpec:
    """A parsed startingOffsets/endingOffsets value.

    ``position`` is ``EARLIEST`` or ``LATEST`` for the named forms; ``offsets``
    holds the JSON form, partition by partition (each value an offset or a sentinel).
    """

    position: int | None = None
    offsets: Mapping[tuple[str, int], int] | None = None

    @classmethod
    def parse(cls, name: str, raw: str | None, default: int) -> OffsetSpec:
        if raw is None or not str(raw).strip():
            return cls(position=default)
        text = str(raw).strip()
        if text.lower() == "earliest":
            return cls(position=EARLIEST)
        if text.lower() == "latest":
            return cls(position=LATEST)
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise InvalidConfigError(
                f"Invalid value for option {name}: {text!r} is neither 'earliest', 'latest' "
                f"nor JSON like {{\"topic\":{{\"0\":23,\"1\":-1}}}} ({exc})") from None
        if not isinstance(parsed, dict) or not parsed:
            raise InvalidConfigError(
                f"Invalid value for option {name}: expected a JSON object of topics, got {text!r}")
        offsets: dict[tuple[str, int], int] = {}
        for topic, partitions in parsed.items():
            if not isinstance(partitions, dict):
                raise InvalidConfigError(
                    f"Invalid value for option {name}: topic {topic!r} must map partitions to offsets")
            for partition, offset in partitions.items():
                if not str(partition).isdigit() or isinstance(offset, bool) or not isinstance(offset, int):
                    raise InvalidConfigError(
                        f"Invalid value for option {name}: {topic}-{partition} -> {offset!r} "
                        "is not a partition number mapped to an integer offset")
                if offset < EARLIEST:
                    raise InvalidConfigError(
                        f"Invalid value for option {name}: offset {offset} for {topic}-{partition}; "
                        "use -2 for earliest, -1 for latest or an offset >= 0")
                offsets[(topic, int(partition))] = offset
        return cls(offsets=offsets)

    def for_partition(self, topic: str, partition: int) -> int:
        if self.offsets is None:
            assert self.position is not None
            return self.position
        return self.offsets[(topic, partition)]

    def sentinels(self) -> set[int]:
        if self.offsets is None:
            return {self.position} if self.position is not None else set()
        return {o for o in self.offsets.values() if o < 0}


@dataclass(frozen=True)
class SourceOptions:
    """The validated options of one logfs source; picklable, shipped to executors."""

    mount: str
    subscribe: tuple[str, ...] | None
    subscribe_pattern: str | None
    assign: tuple[tuple[str, int], ...] | None
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    max_records_per_partition: int | None
    max_offsets_per_trigger: int | None
    starting_offsets: str | None
    ending_offsets: str | None
    read_format: str = "segments"
    #: Kafka's timestamp options, parsed: one timestamp for all partitions, or one per partition
    starting_timestamp: int | None = None
    starting_offsets_by_timestamp: Mapping[tuple[str, int], int] | None = None
    starting_offsets_by_timestamp_strategy: str = "error"
    ending_timestamp: int | None = None
    ending_offsets_by_timestamp: Mapping[tuple[str, int], int] | None = None

    @property
    def has_ending_options(self) -> bool:
        return bool(self.ending_offsets) or self.ending_timestamp is not None \
            or self.ending_offsets_by_timestamp is not None
    group: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        mount = options.get("path")
        if not mount:
            raise InvalidConfigError("Option 'path' (the logfs mount point) is required")
        if not os.path.isdir(mount):
            raise InvalidConfigError(f"Option 'path': {mount!r} is not a directory (is logfs mounted there?)")

        strategies = [n for n in ("subscribe", "subscribePattern", "assign") if options.get(n)]
        if len(strategies) != 1:
            raise InvalidConfigError(
                "Exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be "
                f"given, found {strategies or 'none'}")
        subscribe = subscribe_pattern = assign = None
        if options.get("subscribe"):
            subscribe = tuple(t.strip() for t in options["subscribe"].split(",") if t.strip())
            if not subscribe:
                raise InvalidConfigError("Option 'subscribe' names no topic")
        elif options.get("subscribePattern"):
            subscribe_pattern = options["subscribePattern"]
            try:
                re.compile(subscribe_pattern)
            except re.error as exc:
                raise InvalidConfigError(f"Option 'subscribePattern': invalid pattern ({exc})") from None
        else:
            try:
                parsed = orjson.loads(options["assign"])
                assign = tuple(sorted((str(t), int(p)) for t, ps in parsed.items() for p in ps))
            except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                raise InvalidConfigError(
                    f"Option 'assign': expected JSON like {{\"topic\":[0,1]}}, got {options['assign']!r}") from None
            if not assign:
                raise InvalidConfigError("Option 'assign' names no partition")

        return cls(
            mount=os.path.abspath(mount),
            subscribe=subscribe,
            subscribe_pattern=subscribe_pattern,
            assign=assign,
            fail_on_data_loss=_bool_option(options, "failOnDataLoss", True),
            include_headers=_bool_option(options, "includeHeaders", False),
            min_partitions=_int_option(options, "minPartitions"),
            max_records_per_partition=_int_option(options, "maxRecordsPerPartition"),
            max_offsets_per_trigger=_int_option(options, "maxOffsetsPerTrigger"),
            starting_offsets=options.get("startingOffsets"),
            ending_offsets=options.get("endingOffsets"),
            read_format=_read_format_option(options),
            starting_timestamp=_timestamp_option(options, "startingTimestamp"),
            starting_offsets_by_timestamp=_timestamps_by_partition(options, "startingOffsetsByTimestamp"),
            starting_offsets_by_timestamp_strategy=_strategy_option(options),
            ending_timestamp=_timestamp_option(options, "endingTimestamp"),
            ending_offsets_by_timestamp=_timestamps_by_partition(options, "endingOffsetsByTimestamp"),
            group=_group_option(options),
        )


STARTING_BY_TIMESTAMP_STRATEGIES = ("error", "latest")


def _timestamp_option(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None or not str(raw).strip():
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidConfigError(f"Invalid value {raw!r} for option {name}: expected epoch milliseconds") from None
    if value < 0:
        raise InvalidConfigError(f"Invalid value {value} for option {name}: a timestamp must be >= 0")
    return value


def _timestamps_by_partition(options: Mapping[str, str], name: str) -> dict[tuple[str, int], int] | None:
    raw = options.get(name)
    if raw is None or not str(raw).strip():
        return None
    try:
        parsed = orjson.loads(str(raw))
    except orjson.JSONDecodeError as exc:
        raise InvalidConfigError(f"Invalid value for option {name}: {raw!r} is not JSON like "
                                 f'{{"topic":{{"0":1700000000000}}}} ({exc})') from None
    if not isinstance(parsed, dict) or not parsed:
        raise InvalidConfigError(f"Invalid value for option {name}: expected a JSON object of topics, got {raw!r}")
    result: dict[tuple[str, int], int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise InvalidConfigError(f"Invalid value for option {name}: topic {topic!r} must map partitions "
                                     "to timestamps")
        for partition, timestamp in partitions.items():
            if not str(partition).isdigit() or isinstance(timestamp, bool) or not isinstance(timestamp, int) \
                    or timestamp < 0:
                raise InvalidConfigError(f"Invalid value for option {name}: {topic}-{partition} -> "
                                         f"{timestamp!r} is not a partition number mapped to epoch milliseconds")
            result[(str(topic), int(partition))] = timestamp
    return result


def _strategy_option(options: Mapping[str, str]) -> str:
    raw = options.get("startingOffsetsByTimestampStrategy")
    if raw is None:
        return STARTING_BY_TIMESTAMP_STRATEGIES[0]
    text = str(raw).strip().lower()
    if text not in STARTING_BY_TIMESTAMP_STRATEGIES:
        raise InvalidConfigError(f"Invalid value {raw!r} for option startingOffsetsByTimestampStrategy: "
                                 f"expected one of {STARTING_BY_TIMESTAMP_STRATEGIES}")
    return text


# --------------------------------------------------------------------------------------
# The mount: partitions and offsets
# --------------------------------------------------------------------------------------

def list_topics(mount: str) -> list[str]:
    """Topics of a mount: its directories, without the hidden ``.logfs``."""
    return sorted(e.name for e in os.scandir(mount) if not e.name.startswith(".") and e.is_dir())


def list_partitions(mount: str, topic: str) -> list[int]:
    """Partition numbers of a topic, from listing ``MOUNT/<topic>`` (empty if it does not exist)."""
    try:
        names = os.listdir(os.path.join(mount, topic))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def partition_state(mount: str, topic: str, partition: int) -> dict[str, Any]:
    """``MOUNT/<topic>/<p>/state`` parsed (log start/end offsets, segments, ...)."""
    path = os.path.join(mount, topic, str(partition), "state")
    try:
        with open(path, "rb") as f:
            return orjson.loads(f.read())
    except FileNotFoundError:
        raise UnknownTopicOrPartitionError(f"No partition {topic}-{partition} under {mount}") from None
    except orjson.JSONDecodeError as exc:
        raise StorageError(f"Unreadable partition state {path}: {exc}") from None


def offset_bounds(mount: str, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, log end offset) of one partition, read through the mount."""
    state = partition_state(mount, topic, partition)
    return int(state["log_start_offset"]), int(state["log_end_offset"])


def _topic_partitions(opts: SourceOptions, *, must_exist: bool) -> list[tuple[str, int]]:
    """The (topic, partition) pairs the subscription covers right now."""
    if opts.assign is not None:
        return list(opts.assign)
    if opts.subscribe is not None:
        topics = list(opts.subscribe)
    else:
        pattern = re.compile(opts.subscribe_pattern or "")
        # as a Kafka consumer (exclude.internal.topics=true), a pattern never matches __consumer_offsets
        topics = [t for t in list_topics(opts.mount) if pattern.fullmatch(t) and t != "__consumer_offsets"]
    result = []
    for topic in topics:
        partitions = list_partitions(opts.mount, topic)
        if not partitions and must_exist and opts.subscribe is not None:
            raise UnknownTopicOrPartitionError(f"Topic {topic!r} does not exist under {opts.mount}")
        result.extend((topic, p) for p in partitions)
    return result


def _as_offsets(pairs: Iterable[tuple[tuple[str, int], int]]) -> PartitionOffsets:
    """Build the checkpoint form in a stable order, so equal offsets serialise equally."""
    out: PartitionOffsets = {}
    for (topic, partition), offset in sorted(pairs):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def _from_offsets(offsets: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, ps in offsets.items() for p, o in ps.items()}


def _resolve(spec: OffsetSpec, name: str, tps: Sequence[tuple[str, int]],
             bounds: Mapping[tuple[str, int], tuple[int, int]], fail_on_data_loss: bool) -> dict[tuple[str, int], int]:
    """Turn an OffsetSpec into concrete offsets within each partition's [log start, log end]."""
    if spec.offsets is not None:
        missing = sorted(set(tps) - set(spec.offsets))
        if missing:
            raise InvalidConfigError(
                f"Option {name} must specify every subscribed partition; missing "
                + ", ".join(f"{t}-{p}" for t, p in missing) + " (use -2 for earliest, -1 for latest)")
        unknown = sorted(set(spec.offsets) - set(tps))
        if unknown:
            raise UnknownTopicOrPartitionError(
                f"Option {name} names partitions that are not subscribed or do not exist: "
                + ", ".join(f"{t}-{p}" for t, p in unknown))
    resolved = {}
    for tp in tps:
        start, end = bounds[tp]
        wanted = spec.for_partition(*tp)
        if wanted == EARLIEST:
            resolved[tp] = start
        elif wanted == LATEST:
            resolved[tp] = end
        elif wanted < start:
            if fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"{name} offset {wanted} for {tp[0]}-{tp[1]} is below the log start offset {start}: "
                    "the records were deleted (retention or DeleteRecords). Set failOnDataLoss=false "
                    "to start from the log start offset instead.",
                    offset=wanted, log_start_offset=start, log_end_offset=end)
            log.warning("[logfs source] %s offset %d for %s-%d is below the log start offset %d; "
                        "starting there (failOnDataLoss=false)", name, wanted, tp[0], tp[1], start)
            resolved[tp] = start
        elif wanted > end:
            raise OffsetOutOfRangeError(
                f"{name} offset {wanted} for {tp[0]}-{tp[1]} is beyond the log end offset {end}",
                offset=wanted, log_start_offset=start, log_end_offset=end)
        else:
            resolved[tp] = wanted
    return resolved


def offset_for_time(mount: str, topic: str, partition: int, timestamp: int) -> int | None:
    """Kafka's ``offsetsForTimes`` for one partition: the earliest offset whose timestamp is >= ``timestamp``.

    Read through the mount: the first line of ``since/<T>.jsonl``, a view that
    the mount positions with the time index as Kafka's ListOffsets does.  None
    when no record has such a timestamp (the view is empty).
    """
    path = os.path.join(mount, topic, str(partition), "since", f"{timestamp}.jsonl")
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except FileNotFoundError:
        raise UnknownTopicOrPartitionError(f"No partition {topic}-{partition} under {mount}") from None
    if not first:
        return None
    return int(orjson.loads(first)["offset"])


def _timestamp_targets(name: str, single: int | None, by_partition: Mapping[tuple[str, int], int] | None,
                       tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int] | None:
    """The timestamp to look up per partition, or None when neither timestamp option is given."""
    if single is not None:
        return {tp: single for tp in tps}
    if by_partition is None:
        return None
    missing = sorted(set(tps) - set(by_partition))
    if missing:
        raise InvalidConfigError(f"Option {name} must specify every subscribed partition; missing "
                                 + ", ".join(f"{t}-{p}" for t, p in missing))
    unknown = sorted(set(by_partition) - set(tps))
    if unknown:
        raise UnknownTopicOrPartitionError(f"Option {name} names partitions that are not subscribed or do not "
                                           "exist: " + ", ".join(f"{t}-{p}" for t, p in unknown))
    return dict(by_partition)


def starting_offsets(opts: SourceOptions, spec: OffsetSpec, tps: Sequence[tuple[str, int]],
                     bounds: Mapping[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], int]:
    """Where each partition starts: by timestamp when a timestamp option is given, else ``startingOffsets``."""
    name = "startingTimestamp" if opts.starting_timestamp is not None else "startingOffsetsByTimestamp"
    targets = _timestamp_targets(name, opts.starting_timestamp, opts.starting_offsets_by_timestamp, tps)
    if targets is None:
        return _resolve(spec, "startingOffsets", tps, bounds, opts.fail_on_data_loss)
    result = {}
    for tp, timestamp in targets.items():
        found = offset_for_time(opts.mount, *tp, timestamp)
        if found is None:
            if opts.starting_offsets_by_timestamp_strategy == "error":
                raise OffsetOutOfRangeError(
                    f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} and timestamp "
                    f"{timestamp} ({name}); set startingOffsetsByTimestampStrategy=latest to start at the "
                    "log end instead", log_start_offset=bounds[tp][0], log_end_offset=bounds[tp][1])
            found = bounds[tp][1]
        result[tp] = found
    return result


def ending_offsets(opts: SourceOptions, spec: OffsetSpec, tps: Sequence[tuple[str, int]],
                   bounds: Mapping[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], int]:
    """Where each partition ends (exclusive): by timestamp when a timestamp option is given, else ``endingOffsets``."""
    name = "endingTimestamp" if opts.ending_timestamp is not None else "endingOffsetsByTimestamp"
    targets = _timestamp_targets(name, opts.ending_timestamp, opts.ending_offsets_by_timestamp, tps)
    if targets is None:
        return _resolve(spec, "endingOffsets", tps, bounds, opts.fail_on_data_loss)
    result = {}
    for tp, timestamp in targets.items():
        found = offset_for_time(opts.mount, *tp, timestamp)
        result[tp] = bounds[tp][1] if found is None else found
    return result


# --------------------------------------------------------------------------------------
# Reading one offset range through the mount
# --------------------------------------------------------------------------------------

class OffsetRangePartition(InputPartition):
    """One Spark task's share: offsets [from_offset, until_offset) of one log partition."""

    def __init__(self, topic: str, partition: int, from_offset: int, until_offset: int) -> None:
        self.topic = topic
        self.partition = partition
        self.from_offset = from_offset
        self.until_offset = until_offset

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def plan_ranges(starts: Mapping[tuple[str, int], int], untils: Mapping[tuple[str, int], int], *,
                min_partitions: int | None = None,
                max_records_per_partition: int | None = None) -> list[OffsetRangePartition]:
    """One range per log partition with records, split like Kafka's KafkaOffsetRangeCalculator.

    Splitting lets several Spark tasks read one busy log partition: each piece
    starts at the batch the offset index points to (or opens its own
    ``from/<N>.jsonl``, which the mount positions the same way), so a piece
    costs what it reads and nothing before it.
    """
    ranges = [OffsetRangePartition(t, p, starts[(t, p)], untils[(t, p)])
              for (t, p) in sorted(untils) if untils[(t, p)] > starts[(t, p)]]
    pieces_of: list[int] = [1] * len(ranges)
    if max_records_per_partition:
        pieces_of = [max(1, math.ceil(r.size / max_records_per_partition)) for r in ranges]
    if min_partitions and sum(pieces_of) < min_partitions and ranges:
        total = sum(r.size for r in ranges)
        pieces_of = [max(n, math.ceil(r.size * min_partitions / total)) for r, n in zip(ranges, pieces_of)]
    result = []
    for r, pieces in zip(ranges, pieces_of):
        pieces = min(pieces, r.size)
        for i in range(pieces):
            lo = r.from_offset + r.size * i // pieces
            hi = r.from_offset + r.size * (i + 1) // pieces
            result.append(OffsetRangePartition(r.topic, r.partition, lo, hi))
    return result


_MIN_READ = 64 << 10
_MAX_READ = 8 << 20
_BYTES_PER_RECORD_GUESS = 256


def _json_schema(include_headers: bool) -> pa.Schema:
    import pyarrow as pa
    fields = [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
              ("timestamp", pa.int64()), ("timestampType", pa.int32()),
              ("key", pa.string()), ("value", pa.string()),
              ("keyEncoding", pa.string()), ("valueEncoding", pa.string())]
    if include_headers:
        fields.append(("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.string()),
                                                      ("valueEncoding", pa.string())]))))
    return pa.schema(fields)


def _decode_bytes(text: pa.Array, encoding: pa.Array, what: str) -> pa.Array:
    """String column -> binary column, base64-decoding the rows the mount marked."""
    import pyarrow as pa
    binary = text.cast(pa.binary())
    if encoding.null_count == len(encoding):
        return binary  # the common case: every key/value was UTF-8, zero-copy cast
    values = binary.to_pylist()
    for i, enc in enumerate(encoding.to_pylist()):
        if enc is None:
            continue
        if enc != "base64":
            raise StorageError(f"Unknown {what} encoding {enc!r} in a logfs JSON view")
        values[i] = base64.b64decode(values[i])
    return pa.array(values, pa.binary())


def _decode_headers(headers: pa.Array) -> pa.Array:
    import pyarrow as pa
    out = []
    for row in headers.to_pylist():
        if not row:             # Spark's Kafka source: null, not [], for a record without headers
            out.append(None)
            continue
        decoded = []
        for h in row:
            value = h.get("value")
            if value is not None:
                value = base64.b64decode(value) if h.get("valueEncoding") == "base64" else value.encode()
            decoded.append({"key": h.get("key"), "value": value})
        out.append(decoded)
    return pa.array(out, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))


def _to_kafka_batch(table: pa.Table, lo: int, hi: int, include_headers: bool) -> pa.RecordBatch | None:
    """Parsed JSON rows -> a RecordBatch of the Kafka schema, keeping offsets in [lo, hi)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    table = table.combine_chunks()
    offsets = table.column("offset")
    if offsets[0].as_py() < lo or offsets[-1].as_py() >= hi:
        table = table.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
        if table.num_rows == 0:
            return None

    def col(name: str) -> pa.Array:
        return table.column(name).combine_chunks()

    timestamps = col("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
    arrays = [_decode_bytes(col("key"), col("keyEncoding"), "key"),
              _decode_bytes(col("value"), col("valueEncoding"), "value"),
              col("topic"), col("partition"), col("offset"), timestamps, col("timestampType")]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if include_headers:
        arrays.append(_decode_headers(col("headers")))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _skip_deleted(opts: SourceOptions, partition: str, start: int, log_start: int, log_end: int) -> int:
    """``failOnDataLoss`` for a read at ``start`` below the log start offset: raise, or warn and skip.

    The one statement of the rule for reads that find their offsets deleted
    (retention or DeleteRecords) under them; returns the log start offset to
    read from instead.  (Resolving ``startingOffsets`` applies the same rule
    with its own wording, in _resolve.)
    """
    if opts.fail_on_data_loss:
        raise OffsetOutOfRangeError(
            f"Offsets [{start}, {log_start}) of {partition} were deleted (retention or "
            "DeleteRecords) before they were read; some data may have been missed. Set "
            "failOnDataLoss=false to skip them.",
            offset=start, log_start_offset=log_start, log_end_offset=log_end)
    log.warning("[logfs source] Offsets [%d, %d) of %s were deleted before they were read; "
                "skipping them (failOnDataLoss=false)", start, log_start, partition)
    return log_start


def _open_view(opts: SourceOptions, rng: OffsetRangePartition) -> tuple[Any, int]:
    """Open ``from/<N>.jsonl`` for the range; handle a start below the log start offset."""
    start = rng.from_offset
    path = os.path.join(opts.mount, rng.topic, str(rng.partition), "from", f"{start}.jsonl")
    try:
        return open(path, "rb", buffering=0), start
    except FileNotFoundError:
        pass
    # The mount refuses offsets outside [log start, log end]: find out which case this is.
    log_start, log_end = offset_bounds(opts.mount, rng.topic, rng.partition)
    if start < log_start:
        start = _skip_deleted(opts, f"{rng.topic}-{rng.partition}", start, log_start, log_end)
        if start >= rng.until_offset:
            return None, start
        path = os.path.join(opts.mount, rng.topic, str(rng.partition), "from", f"{start}.jsonl")
        return open(path, "rb", buffering=0), start
    raise UnknownTopicOrPartitionError(
        f"No view {path}: offset {start} is outside [{log_start}, {log_end}] of {rng.topic}-{rng.partition}")


class _ViewChunks:
    """Chunks of an open view, read ahead by one thread while the caller parses.

    Reading a FUSE file and parsing JSON both release the GIL, so reading the
    next chunk while Arrow parses this one hides most of the read latency.  The
    reader counts lines as it goes and sizes each read to the records still
    wanted (at the average line length seen so far), so it stops close to the
    range's end instead of reading megabytes past it.
    """

    _QUEUE_DEPTH = 2

    def __init__(self, view: Any, records_wanted: int) -> None:
        import queue
        import threading

        self._view = view
        self._wanted = records_wanted
        self._queue: queue.Queue[bytes | BaseException] = queue.Queue(self._QUEUE_DEPTH)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"logfs-read-{view.name}", daemon=True)
        self._thread.start()

    def _put(self, item: bytes | BaseException) -> bool:
        import queue
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        lines = total = 0
        size = min(_MAX_READ, max(_MIN_READ, self._wanted * _BYTES_PER_RECORD_GUESS))
        try:
            while True:
                data = self._view.read(size)
                if not self._put(data) or not data:
                    return
                lines += data.count(b"\n")
                total += len(data)
                remaining = self._wanted - lines
                if remaining <= 0:
                    self._put(b"")  # every wanted record has been read
                    return
                average = total / lines if lines else 2 * size
                size = int(min(_MAX_READ, max(_MIN_READ, remaining * average * 1.05)))
        except BaseException as exc:  # handed to the consumer, which raises it in its task
            self._put(exc)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item

    def close(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._view.close()


def read_range_jsonl(opts: SourceOptions, rng: OffsetRangePartition) -> Iterator[pa.RecordBatch]:
    """``readFormat=jsonl``: the records of one offset range from ``from/<N>.jsonl``.

    Reads the JSON-lines view in chunks cut at the last newline and parses each
    chunk with Arrow's JSON reader (C++), which is what keeps the source close
    to Spark's own JSON reader on a local file.  Stops at the first offset >=
    ``until_offset`` or at the end of the view (a compacted log has gaps, so
    the range may hold fewer records than its width).
    """
    import pyarrow as pa
    import pyarrow.json as pj

    view, lo = _open_view(opts, rng)
    if view is None:
        return
    schema = _json_schema(opts.include_headers)
    parse_options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    chunks = _ViewChunks(view, rng.until_offset - lo)
    pending = b""
    try:
        for data in chunks:
            data = pending + data if pending else data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                pending = data  # a record longer than what was read so far
                continue
            chunk, pending = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
            table = pj.read_json(pa.BufferReader(chunk),
                                 read_options=pj.ReadOptions(use_threads=False, block_size=len(chunk) + 1),
                                 parse_options=parse_options)
            if table.num_rows == 0:
                continue
            last = table.column("offset")[-1].as_py()
            batch = _to_kafka_batch(table, lo, rng.until_offset, opts.include_headers)
            if batch is not None:
                yield batch
            if last >= rng.until_offset - 1:
                return
        if pending:
            raise StorageError(
                f"View {view.name} ended inside a record ({len(pending)} bytes without a newline)")
    finally:
        chunks.close()


# --------------------------------------------------------------------------------------
# Reading one offset range from the raw segment files (readFormat=segments)
# --------------------------------------------------------------------------------------

#: Bytes per read() of a ``.log`` file: large enough that the mount's per-request
#: cost vanishes, small enough that a task's memory stays bounded.
_SEGMENT_READ_BYTES = 4 << 20
#: How often one task re-lists a partition's segments after a file vanished under it
#: before giving up (each re-list follows a retention or cleaner pass that completed).
_MAX_RELISTS = 50
#: Records per Arrow batch handed to Spark (about one read's worth of small records).
_FLUSH_RECORDS = 1 << 15


def _segment_file(mount: str, topic: str, partition: int, base_offset: int, suffix: str) -> str:
    return os.path.join(mount, topic, str(partition), "segments", segment_file_name(base_offset, suffix))


def index_position(index_path: str, base_offset: int, target_offset: int) -> int:
    """Byte position in the ``.log`` from which a scan finds ``target_offset`` (0 without help).

    The search is :func:`engine.index.offset_index_file_position`; a missing
    ``.index`` (the segment was just deleted) gives 0.
    """
    try:
        fd = os.open(index_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        return offset_index_file_position(fd, base_offset, target_offset)
    finally:
        os.close(fd)


class _StaleIndex(Exception):
    """The ``.index`` position does not start a batch of the ``.log`` that is open.

    Happens when the cleaner swapped the segment between opening the ``.log`` and
    reading its ``.index``; the scan then starts at the beginning of the file.
    """


class _ColumnBuilder:
    """Records of one task accumulated as columns, turned into Arrow record batches."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.any_key = False
        self.headers: list[list[dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, columns: BatchColumns, lo: int, hi: int, timestamp_type: int) -> None:
        """Records ``lo:hi`` of one decoded batch."""
        count = hi - lo
        whole = lo == 0 and hi == len(columns.values)
        self.offsets.extend(columns.offsets if whole else columns.offsets[lo:hi])
        self.timestamps.extend(columns.timestamps if whole else columns.timestamps[lo:hi])
        self.values.extend(columns.values if whole else columns.values[lo:hi])
        self.timestamp_types.extend([timestamp_type] * count)
        if columns.keys is not None:
            if not self.any_key:
                self.keys = [None] * (len(self.offsets) - count)
                self.any_key = True
            self.keys.extend(columns.keys[lo:hi])
        elif self.any_key:
            self.keys.extend([None] * count)
        if self.include_headers:
            # Spark's Kafka source gives null, not [], for a record without headers.
            if columns.headers is None:
                self.headers.extend([None] * count)
            else:
                self.headers.extend([{"key": k, "value": v} for k, v in record] if record else None
                                    for record in columns.headers[lo:hi])

    def flush(self) -> pa.RecordBatch | None:
        import pyarrow as pa
        count = len(self.offsets)
        if count == 0:
            return None
        arrays = [
            pa.array(self.keys, pa.binary()) if self.any_key else pa.nulls(count, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.timestamp_types, pa.int32()),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.include_headers:
            arrays.append(pa.array(self.headers, _headers_arrow_type()))
            names.append("headers")
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, names=names)


def _headers_arrow_type() -> pa.DataType:
    import pyarrow as pa
    return pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class SegmentRangeReader:
    """One Spark task's offset range read from ``MOUNT/<topic>/<p>/segments/<base>.log``.

    The mount serves a segment file's bytes as they are on disk, so this is the
    consumer side of Kafka's fetch path moved into the Spark worker: find the
    segment holding the next offset, skip to the nearest indexed batch, walk the
    batches, check each one's CRC (Kafka's ``ensureValid``) before decoding it,
    and keep the records in ``[from, until)``.

    Offsets, not files, identify records.  ``next_offset`` is the first offset not
    yet emitted and only grows, so no offset is emitted twice or out of order.
    Retention may delete, and the cleaner replace, segment files between planning
    and reading: a file that is gone when opened makes the reader list the
    segments again and continue from ``next_offset`` in whatever segment holds it
    now.  A file already open stays readable (the mount reads the inode it
    opened), and its records are the ones a consumer fetching before the
    deletion or the clean would have seen.  Records below the log start offset
    at read time are data loss, handled by ``failOnDataLoss``.
    """

    def __init__(self, opts: SourceOptions, rng: OffsetRangePartition) -> None:
        self.opts = opts
        self.topic = rng.topic
        self.partition = rng.partition
        self.next_offset = rng.from_offset
        self.until_offset = rng.until_offset
        self.builder = _ColumnBuilder(rng.topic, rng.partition, opts.include_headers)
        self._relists = 0

    @property
    def _name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def _list_segments(self) -> list[int]:
        """Base offsets of the segments now; applies failOnDataLoss to the log start offset."""
        state = partition_state(self.opts.mount, self.topic, self.partition)
        log_start = int(state["log_start_offset"])
        if self.next_offset < log_start:
            self.next_offset = _skip_deleted(self.opts, self._name, self.next_offset, log_start,
                                             int(state["log_end_offset"]))
        return sorted(int(s["base_offset"]) for s in state["segments"])

    def _relist(self, why: str) -> list[int]:
        self._relists += 1
        if self._relists > _MAX_RELISTS:
            raise StorageError(f"Gave up reading {self._name} at offset {self.next_offset}: its segments "
                               f"changed {_MAX_RELISTS} times while one task read them ({why})")
        log.info("[logfs source] %s; listing the segments of %s again to continue from offset %d",
                 why, self._name, self.next_offset)
        return self._list_segments()

    def _segment_for(self, bases: Sequence[int], after: int | None) -> int | None:
        """The segment to read next: the one holding next_offset, past ``after`` (the one finished)."""
        first = 0 if after is None else bisect.bisect_right(bases, after)
        if first >= len(bases):
            return None
        holding = bisect.bisect_right(bases, self.next_offset, lo=first) - 1
        return bases[max(holding, first)]

    def batches(self) -> Iterator[pa.RecordBatch]:
        bases = self._list_segments()
        after: int | None = None       # base offset of the segment read to its end
        listing_is_fresh = True
        while self.next_offset < self.until_offset:
            base = self._segment_for(bases, after)
            if base is None:
                if listing_is_fresh:
                    break               # no segment holds [next, until): removed by the cleaner
                bases, listing_is_fresh = self._relist("Read past the last known segment"), True
                continue
            path = _segment_file(self.opts.mount, self.topic, self.partition, base, LOG_FILE_SUFFIX)
            try:
                segment = open(path, "rb", buffering=0)
            except FileNotFoundError:
                bases, listing_is_fresh, after = self._relist(f"Segment file {path} was deleted"), True, None
                continue
            with segment:
                start = 0
                if self.next_offset > base:
                    start = index_position(_segment_file(self.opts.mount, self.topic, self.partition,
                                                         base, INDEX_FILE_SUFFIX), base, self.next_offset)
                try:
                    yield from self._read_segment(segment, path, base, start)
                except _StaleIndex:
                    log.info("[logfs source] Index of %s does not match its log (replaced by the cleaner?); "
                             "scanning it from the start", path)
                    yield from self._read_segment(segment, path, base, 0)
            after, listing_is_fresh = base, False
        last = self.builder.flush()
        if last is not None:
            yield last

    def _read_segment(self, segment: Any, path: str, base: int, start: int) -> Iterator[pa.RecordBatch]:
        """Walk one ``.log`` from byte ``start``, adding the wanted records to the builder."""
        until = self.until_offset
        builder = self.builder
        segment.seek(start)
        file_position = start            # file position of buf[0]
        buf = b""
        want = _SEGMENT_READ_BYTES
        # A position from the index is trusted once the batch there proves to be one of
        # this segment's (magic, base offset in range, CRC): see _StaleIndex.
        trusted = start == 0
        while True:
            data = segment.read(want)
            if not data:
                if not trusted:
                    raise _StaleIndex()
                return                   # end of the segment (a torn tail is not part of the log)
            buf = buf + data if buf else data
            consumed = 0
            try:
                if not trusted:
                    self._check_index_position(buf, base)
                    trusted = True
                for pos, header in iter_batches(buf):
                    consumed = pos + header.size
                    if header.next_offset <= self.next_offset:
                        continue         # before the range, or emitted: skipped without decoding
                    if header.base_offset >= until:
                        return
                    validate_batch(buf, pos)
                    columns = decode_columns(buf, pos, header)   # a control batch gives no records
                    offsets = columns.offsets
                    if offsets:
                        if type(offsets) is range:
                            lo = max(0, self.next_offset - offsets[0])
                            hi = min(len(offsets), until - offsets[0])
                        else:            # a compacted batch: offsets with gaps, still increasing
                            lo = bisect.bisect_left(offsets, self.next_offset)
                            hi = bisect.bisect_left(offsets, until)
                        if hi > lo:
                            builder.add(columns, lo, hi, header.timestamp_type)
                    self.next_offset = header.next_offset
                    if self.next_offset >= until:
                        return
                if consumed:
                    buf = buf[consumed:]
                    file_position += consumed
                want = _SEGMENT_READ_BYTES
                if len(buf) >= HEADER_SIZE:
                    # A batch larger than one read: read the rest of it in one go.
                    pending = read_header(buf)
                    if pending.magic != MAGIC:
                        raise CorruptRecordError(f"Record batch has magic {pending.magic}, only magic "
                                                 f"{MAGIC} is supported", position=0)
                    want = max(want, pending.size - len(buf))
            except CorruptRecordError as exc:
                # Name the file and the position in it, not in this read's buffer.
                raise CorruptRecordError(f"{exc} while reading {self._name}", path=path,
                                         position=file_position + max(exc.position, 0)) from exc
            if len(builder) >= _FLUSH_RECORDS:
                yield builder.flush()

    def _check_index_position(self, buf: bytes, base: int) -> None:
        """Raise _StaleIndex unless ``buf`` starts with a valid batch at or before next_offset."""
        try:
            header = validate_batch(buf, 0)
        except CorruptRecordError:
            if len(buf) >= HEADER_SIZE and read_header(buf).magic == MAGIC \
                    and read_header(buf).size > len(buf):
                return           # larger than this read; it is checked when decoded
            raise _StaleIndex() from None
        if not base <= header.base_offset <= self.next_offset:
            raise _StaleIndex()


def read_range(opts: SourceOptions, rng: OffsetRangePartition) -> Iterator[pa.RecordBatch]:
    """Yield the records of one offset range as Arrow batches of the Kafka schema.

    ``readFormat=segments`` (the default) decodes the raw ``.log`` files in this
    worker; ``readFormat=jsonl`` parses the mount's rendered JSON-lines view.
    """
    if opts.read_format == "jsonl":
        return read_range_jsonl(opts, rng)
    return SegmentRangeReader(opts, rng).batches()


# --------------------------------------------------------------------------------------
# Batch and streaming readers
# --------------------------------------------------------------------------------------

class LogfsBatchReader(DataSourceReader):
    """``spark.read.format("logfs")``: offsets resolved once, at planning time."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        starting = OffsetSpec.parse("startingOffsets", opts.starting_offsets, EARLIEST)
        ending = OffsetSpec.parse("endingOffsets", opts.ending_offsets, LATEST)
        # Kafka refuses the two meaningless combinations for a bounded read.
        if LATEST in starting.sentinels():
            raise InvalidConfigError("startingOffsets can't be latest (-1) for batch queries on logfs")
        if EARLIEST in ending.sentinels():
            raise InvalidConfigError("endingOffsets can't be earliest (-2) for batch queries on logfs")
        self.starting = starting
        self.ending = ending

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        tps = _topic_partitions(opts, must_exist=True)
        bounds = {tp: offset_bounds(opts.mount, *tp) for tp in tps}
        starts = group_offsets(opts.mount, opts.group, tps, bounds) if opts.group else \
            starting_offsets(opts, self.starting, tps, bounds)
        untils = ending_offsets(opts, self.ending, tps, bounds)
        for tp in tps:
            if untils[tp] < starts[tp]:
                raise InvalidConfigError(
                    f"endingOffsets {untils[tp]} is below startingOffsets {starts[tp]} for {tp[0]}-{tp[1]}")
        ranges = plan_ranges(starts, untils, min_partitions=opts.min_partitions,
                             max_records_per_partition=opts.max_records_per_partition)
        log.info("[logfs source] Planned %d offset ranges over %d partitions: %s", len(ranges), len(tps),
                 ", ".join(f"{r.topic}-{r.partition}[{r.from_offset},{r.until_offset})" for r in ranges[:20]))
        # Spark needs at least one partition to plan a scan; an empty range reads nothing.
        return ranges or [OffsetRangePartition(tps[0][0] if tps else "", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRangePartition)
        if partition.size <= 0:
            return iter(())
        return read_range(self.opts, partition)


class LogfsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("logfs")``: micro-batches of [start, end) per partition.

    This object lives in Spark's long-running planner process for the query;
    ``read`` runs on executors and uses only the options and its partition.
    """

    def __init__(self, opts: SourceOptions) -> None:
        if opts.has_ending_options:
            raise InvalidConfigError("endingOffsets, endingTimestamp and endingOffsetsByTimestamp are not "
                                     "valid for streaming queries on logfs")
        self.opts = opts
        self.starting = OffsetSpec.parse("startingOffsets", opts.starting_offsets, LATEST)
        self._available_now_target: dict[tuple[str, int], int] | None = None

    def _latest(self) -> dict[tuple[str, int], int]:
        return {tp: offset_bounds(self.opts.mount, *tp)[1]
                for tp in _topic_partitions(self.opts, must_exist=False)}

    def initialOffset(self) -> dict:
        tps = _topic_partitions(self.opts, must_exist=False)
        bounds = {tp: offset_bounds(self.opts.mount, *tp) for tp in tps}
        offsets = group_offsets(self.opts.mount, self.opts.group, tps, bounds) if self.opts.group else \
            starting_offsets(self.opts, self.starting, tps, bounds)
        log.info("[logfs source] Initial offsets %s", offsets)
        return _as_offsets(offsets.items())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_target = self._latest()
        log.info("[logfs source] Trigger.AvailableNow: reading up to %s", self._available_now_target)

    def reportLatestOffset(self) -> dict | None:
        return _as_offsets(self._latest().items())

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        started = _from_offsets(start or {})
        latest = self._available_now_target if self._available_now_target is not None else self._latest()
        end: dict[tuple[str, int], int] = {}
        for tp, offset in latest.items():
            begin = started.get(tp)
            if begin is not None and offset < begin:
                # The log end moved backwards: the topic was deleted and re-created.
                if self.opts.fail_on_data_loss:
                    raise OffsetOutOfRangeError(
                        f"Log end offset of {tp[0]}-{tp[1]} went back from {begin} to {offset}; "
                        "the topic was probably deleted and re-created. Set failOnDataLoss=false to continue.",
                        offset=begin, log_end_offset=offset)
                log.warning("[logfs source] Log end offset of %s-%d went back from %d to %d; "
                            "restarting it from there", tp[0], tp[1], begin, offset)
            end[tp] = offset
        # A partition that disappeared keeps the offset it had, so it is not re-read if it returns.
        for tp, offset in started.items():
            end.setdefault(tp, offset)
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(started, end, limit.max_rows, self.opts.mount)
        result = _as_offsets(end.items())
        return start if start is not None and result == start else result

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        started = _from_offsets(start or {})
        ended = _from_offsets(end)
        starts = {}
        for tp, until in ended.items():
            if tp in started:
                starts[tp] = min(started[tp], until)
            else:
                # A partition added after the query started: read it from its log start (Kafka).
                starts[tp] = min(offset_bounds(self.opts.mount, *tp)[0], until)
                log.info("[logfs source] New partition %s-%d, reading it from offset %d", tp[0], tp[1], starts[tp])
        return plan_ranges(starts, ended, min_partitions=self.opts.min_partitions,
                           max_records_per_partition=self.opts.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRangePartition)
        return read_range(self.opts, partition)

    def commit(self, end: dict) -> None:
        # Nothing to release: the log is the buffer and Spark's checkpoint holds the position.
        log.debug("[logfs source] Committed offsets %s", end)


def _rate_limit(start: Mapping[tuple[str, int], int], end: Mapping[tuple[str, int], int],
                max_rows: int, mount: str) -> dict[tuple[str, int], int]:
    """Kafka's maxOffsetsPerTrigger: give each partition a share proportional to its lag."""
    begins = {tp: start[tp] if tp in start else min(offset_bounds(mount, *tp)[0], end[tp]) for tp in end}
    lags = {tp: max(0, end[tp] - begins[tp]) for tp in end}
    total = sum(lags.values())
    if total <= max_rows:
        return dict(end)
    limited = {tp: begins[tp] + lags[tp] * max_rows // total for tp in end}
    spare = max_rows - sum(limited[tp] - begins[tp] for tp in end)
    for tp in sorted(end, key=lambda tp: -lags[tp]):
        if spare <= 0:
            break
        if limited[tp] < end[tp]:
            limited[tp] += 1
            spare -= 1
    # Partitions the limit gave nothing stay at their start (or unknown to this batch).
    return {tp: off for tp, off in limited.items() if tp in start or off > begins[tp]}


class LogfsDataSource(DataSource):
    """The ``logfs`` format: Spark's Kafka source over a mounted logfs."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        if _bool_option(self.options, "includeHeaders", False):
            return StructType(KAFKA_SCHEMA.fields + [HEADERS_FIELD])
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogfsBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogfsStreamReader(SourceOptions.parse(self.options))


#: What a Spark Python worker must import to run the logfs source.
_WORKER_IMPORTS = "import logfs.spark, engine.records, cramjam, crc32c, pyarrow"


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("logfs")`` and ``readStream.format("logfs")`` available.

    The source runs in Spark's Python workers, which Spark starts with the
    interpreter it was given (``PYSPARK_PYTHON``/``spark.pyspark.python``,
    default ``python3``); that interpreter must import logfs and its
    dependencies (cramjam, crc32c, pyarrow).  When it cannot and the session
    runs locally, its workers are switched to this interpreter (the one that
    imported logfs); otherwise this fails at once saying what to set, rather
    than failing later in every task with ModuleNotFoundError.
    """
    _ensure_worker_python(spark.sparkContext)
    spark.dataSource.register(LogfsDataSource)


def _worker_python_ok(executable: str) -> bool:
    if os.path.realpath(executable) == os.path.realpath(sys.executable):
        return True
    try:
        result = subprocess.run([executable, "-c", _WORKER_IMPORTS], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _ensure_worker_python(sc: Any) -> None:
    current = getattr(sc, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON", "python3")
    if _worker_python_ok(current):
        return
    if str(sc.master).startswith("local"):
        log.info("Spark's Python workers would run %s, which cannot import logfs; "
                    "using %s for them (set PYSPARK_PYTHON to choose)", current, sys.executable)
        # Functions registered from now on (this data source included) carry the
        # interpreter of sc.pythonExec; later SparkContexts read PYSPARK_PYTHON.
        sc.pythonExec = sys.executable
        sc.pythonVer = "%d.%d" % sys.version_info[:2]
        os.environ["PYSPARK_PYTHON"] = sys.executable
        return
    raise RuntimeError(
        f"Spark's Python workers run {current!r}, which cannot import logfs and its dependencies "
        f"({_WORKER_IMPORTS[len('import '):]}). Start the SparkSession with PYSPARK_PYTHON (or "
        f"spark.pyspark.python) set to an interpreter where logfs is installed, e.g. {sys.executable}, "
        "on every worker, then call logfs.spark.register(spark) again.")


def spark_session(master: str = "local[2]", app_name: str = "logfs",
                  config: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession whose Python workers can import logfs, with the source registered.

    Spark starts its Python workers with ``PYSPARK_PYTHON`` (default ``python3``),
    which must be the interpreter logfs and pyarrow are installed in; unless the
    caller chose one, this is the interpreter running this code.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC"))
    for name, value in (config or {}).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


# --------------------------------------------------------------------------------------
# Appending from Spark tasks
# --------------------------------------------------------------------------------------

def _line_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        raise InvalidRecordError(f"Cannot append {what} of type {type(value).__name__}: expected string or binary")
    if b"\n" in data:
        raise InvalidRecordError(f"Cannot append {what} containing a newline: a line of an append file is one record")
    return data


def _append_partition(rows: Iterator[Any], *, path: str, value_index: int, key_index: int | None,
                      separator: bytes, null_marker: bytes | None, chunk_bytes: int,
                      counter: Any) -> None:
    """Executor side of :func:`append_rows`: lines of one Spark partition, one write per chunk."""
    fd = None
    buf: list[bytes] = []
    size = appended = 0

    def flush() -> None:
        nonlocal buf, size, appended
        view = memoryview(b"".join(buf))
        while view:
            written = os.write(fd, view)
            view = view[written:]
        appended += len(buf)
        buf, size = [], 0

    try:
        for row in rows:
            value = row[value_index]
            if key_index is None:
                if value is None:
                    raise InvalidRecordError("Cannot append a null value without a key: a line has no null")
                line = _line_bytes(value, "a value")
            else:
                if row[key_index] is None:
                    raise InvalidRecordError("Cannot append a keyed line with a null key")
                key = _line_bytes(row[key_index], "a key")
                if separator in key:
                    raise InvalidRecordError(f"Cannot append key {key!r}: it contains the key.separator {separator!r}")
                if value is None:
                    if null_marker is None:
                        raise InvalidRecordError("Cannot append a null value: the topic has no null.marker set")
                    line = key + separator + null_marker
                else:
                    line = key + separator + _line_bytes(value, "a value")
            if fd is None:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            buf.append(line + b"\n")
            size += len(line) + 1
            if size >= chunk_bytes:
                flush()
        if buf:
            flush()
    except OSError as exc:
        if exc.errno == errno.EMSGSIZE:
            raise InvalidRecordError(f"A record is larger than max.message.bytes of {path}") from exc
        raise
    finally:
        if fd is not None:
            os.close(fd)
        counter.add(appended)


def _topic_config(mount: str, topic: str) -> dict[str, str]:
    with open(os.path.join(mount, topic, "config"), encoding="utf-8") as f:
        pairs = (line.split("=", 1) for line in f.read().splitlines() if "=" in line and not line.startswith("#"))
        return {name.strip(): value for name, value in pairs}


def append_rows(df: DataFrame, mount: str, topic: str, column: str = "value", *,
                key_column: str | None = None, chunk_bytes: int = 256 << 10) -> int:
    """Append one column of ``df`` to ``topic`` through ``MOUNT/<topic>/append``; return the count.

    Runs on the executors (``foreachPartition``), so it works from any Spark task
    that sees the mount.  Each value (string or binary, no newline) becomes one
    record; the lines of a task are written in chunks of about ``chunk_bytes``,
    one ``write()`` each, which the mount appends as one batch.  With
    ``key_column`` the topic must have ``parse.key=true``; lines are
    ``key<key.separator>value`` and the mount's partitioner places them by key
    (a null value becomes the topic's ``null.marker``, i.e. a tombstone).
    """
    path = os.path.join(mount, topic, "append")
    if not os.path.exists(path):
        raise UnknownTopicOrPartitionError(f"Topic {topic!r} does not exist under {mount} (no {path})")
    columns = df.columns
    if column not in columns:
        raise InvalidConfigError(f"DataFrame has no column {column!r} to append (columns: {columns})")
    separator, null_marker, key_index = b"\t", None, None
    if key_column is not None:
        if key_column not in columns:
            raise InvalidConfigError(f"DataFrame has no key column {key_column!r} (columns: {columns})")
        config = _topic_config(mount, topic)
        if config.get("parse.key", "false").strip().lower() != "true":
            raise InvalidConfigError(
                f"Topic {topic!r} has parse.key=false: write parse.key=true to {mount}/{topic}/config "
                "to append keyed lines")
        separator = config.get("key.separator", "\t").encode() or b"\t"
        marker = config.get("null.marker", "")
        null_marker = marker.encode() if marker else None
        key_index = columns.index(key_column)
    counter = df.sparkSession.sparkContext.accumulator(0)
    df.foreachPartition(functools.partial(
        _append_partition, path=path, value_index=columns.index(column), key_index=key_index,
        separator=separator, null_marker=null_marker, chunk_bytes=chunk_bytes, counter=counter))
    log.info("[logfs sink] Appended %d records to topic %s through %s", counter.value, topic, path)
    return int(counter.value)


# --------------------------------------------------------------------------------------
# Spark's own Kafka source, for side-by-side runs
# --------------------------------------------------------------------------------------

def spark_kafka_jars() -> list[str]:
    """The jars of Spark's ``kafka`` source (spark-sql-kafka-0-10) that ``scripts/setup.sh`` fetched.

    For ``spark.jars`` when a job (a test, ``scripts/bench_spark.py``) reads a
    Kafka broker with ``format("kafka")`` beside the mount.  They live in a
    cache outside the repo (``$LOGFS_SPARK_KAFKA_JARS``, else
    ``~/.cache/logfs/spark-sql-kafka-<version>/jars``); a missing install is an
    error naming the set-up step.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "scripts", "spark-kafka", "pom.xml"), encoding="utf-8") as f:
        match = re.search(r"<spark.kafka.version>([^<]+)</spark.kafka.version>", f.read())
    if match is None:
        raise StorageError("scripts/spark-kafka/pom.xml names no spark.kafka.version")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    jars = os.environ.get("LOGFS_SPARK_KAFKA_JARS") or os.path.join(
        cache, "logfs", f"spark-sql-kafka-{match.group(1)}", "jars")
    if not os.path.exists(os.path.join(jars, ".complete")):
        raise StorageError(f"Spark's Kafka source is not in {jars}: run scripts/setup-kafka.sh")
    return sorted(os.path.join(jars, name) for name in os.listdir(jars) if name.endswith(".jar"))
