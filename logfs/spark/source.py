"""The batch and streaming readers and the ``logfs`` DataSource Spark instantiates.

Spark pickles these classes by reference: its Python workers import them from
this module path, so moving them is a change of what workers import.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

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
from pyspark.sql.types import StructType

from engine.errors import (
    InvalidConfigError,
    OffsetOutOfRangeError,
)
from logfs.spark.mount_client import (
    _as_offsets,
    _from_offsets,
    _topic_partitions,
    ending_offsets,
    offset_bounds,
    starting_offsets,
)
from logfs.spark.options import (
    EARLIEST,
    HEADERS_FIELD,
    KAFKA_SCHEMA,
    LATEST,
    SOURCE_NAME,
    OffsetSpec,
    PartitionOffsets,
    SourceOptions,
    _bool_option,
    group_offsets,
)
from logfs.spark.planning import OffsetRangePartition, plan_ranges
from logfs.spark.read_segments import read_range

if TYPE_CHECKING:  # pragma: no cover - imported lazily where used
    from collections.abc import Iterator, Mapping, Sequence

    import pyarrow as pa

log = logging.getLogger(__name__)


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

    def initialOffset(self) -> PartitionOffsets:
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

    def reportLatestOffset(self) -> PartitionOffsets | None:
        return _as_offsets(self._latest().items())

    def latestOffset(self, start: PartitionOffsets | None = None, limit: ReadLimit | None = None) -> PartitionOffsets:
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

    def partitions(self, start: PartitionOffsets, end: PartitionOffsets) -> Sequence[InputPartition]:
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

    def commit(self, end: PartitionOffsets) -> None:
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
            return StructType([*KAFKA_SCHEMA.fields, HEADERS_FIELD])
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogfsBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogfsStreamReader(SourceOptions.parse(self.options))


#: What a Spark Python worker must import to run the logfs source.
