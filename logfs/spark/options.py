"""The ``logfs`` source's options, parsed as Spark's Kafka source parses them, and its schema."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
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

from engine.errors import InvalidConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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


def _choice_option(options: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """An option with a few spellings (case-insensitive); the first is the default."""
    raw = options.get(name)
    if raw is None:
        return choices[0]
    text = str(raw).strip().lower()
    if text not in choices:
        raise InvalidConfigError(f"Invalid value {raw!r} for option {name}: expected one of {choices}")
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
            read_format=_choice_option(options, "readFormat", READ_FORMATS),
            starting_timestamp=_timestamp_option(options, "startingTimestamp"),
            starting_offsets_by_timestamp=_timestamps_by_partition(options, "startingOffsetsByTimestamp"),
            starting_offsets_by_timestamp_strategy=_choice_option(
                options, "startingOffsetsByTimestampStrategy", STARTING_BY_TIMESTAMP_STRATEGIES),
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
