"""The mount as the source sees it: topics, partitions, offset bounds, timestamps and the
resolution of starting/ending offsets (``failOnDataLoss`` has its one home here).
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING, Any

import orjson

from engine.errors import (
    InvalidConfigError,
    OffsetOutOfRangeError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from logfs.spark.options import EARLIEST, LATEST, OffsetSpec, PartitionOffsets, SourceOptions

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

log = logging.getLogger(__name__)


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


def partition_state(mount: str, topic: str, partition: int) -> dict[str, Any]:     # Any: the state file's JSON
    """``MOUNT/<topic>/<p>/state`` parsed (log start/end offsets, segments, ...)."""
    path = os.path.join(mount, topic, str(partition), "state")
    try:
        with open(path, "rb") as f:
            state: dict[str, Any] = orjson.loads(f.read())     # Any: JSON values
            return state
    except FileNotFoundError:
        raise UnknownTopicOrPartitionError(f"No partition {topic}-{partition} under {mount}") from None
    except orjson.JSONDecodeError as exc:
        raise StorageError(f"Unreadable partition state {path}: {exc}") from None


def readable_start(state: Mapping[str, Any]) -> int:     # Any: the state file's JSON
    """The first offset the source can read: the log start offset (``state``'s).

    With tiered storage (docs/tiering.md) the records from the log start up to
    the local log start are only in the store: ``segments/`` serves the remote
    log segments' files from it (``state``'s ``remote_segments``), so they are
    read as local ones are.
    """
    return int(state["log_start_offset"])


def offset_bounds(mount: str, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, log end offset) of one partition, read through the mount (see readable_start)."""
    state = partition_state(mount, topic, partition)
    return readable_start(state), int(state["log_end_offset"])


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
    result: list[tuple[str, int]] = []
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


def skip_deleted(fail_on_data_loss: bool, name: str, first: int, log_start: int, log_end: int, *,
                 option: str | None = None) -> int:
    """Spark's ``failOnDataLoss`` rule, in its one home: offsets ``[first, log_start)`` of ``name`` are gone.

    Retention or DeleteRecords removed them before this query read them (at
    planning, when an option named an offset below the log start, or while a task
    read).  Like Spark's Kafka source: fail (the default), or skip to the log start
    offset with one warning.  Returns the offset to read from.
    """
    asked = f"{option} offset {first} for {name} is below the log start offset {log_start}: " if option else ""
    if fail_on_data_loss:
        raise OffsetOutOfRangeError(
            f"{asked}Offsets [{first}, {log_start}) of {name} were deleted (retention or DeleteRecords) "
            "before they were read; some data may have been missed. Set failOnDataLoss=false to skip them.",
            offset=first, log_start_offset=log_start, log_end_offset=log_end)
    log.warning("[logfs source] %sOffsets [%d, %d) of %s were deleted before they were read; "
                "skipping them (failOnDataLoss=false)", asked, first, log_start, name)
    return log_start


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
            resolved[tp] = skip_deleted(fail_on_data_loss, f"{tp[0]}-{tp[1]}", wanted, start, end,
                                        option=name)
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
        return dict.fromkeys(tps, single)
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
    """Where each partition starts: by timestamp when a timestamp option is given, else ``startingOffsets``.

    A timestamp no record is at or after starts at the log end, or is an OffsetOutOfRangeError with
    ``startingOffsetsByTimestampStrategy=error``.
    """
    return _offsets(opts, spec, tps, bounds, "starting", opts.starting_timestamp,
                    opts.starting_offsets_by_timestamp,
                    strict=opts.starting_offsets_by_timestamp_strategy == "error")


def ending_offsets(opts: SourceOptions, spec: OffsetSpec, tps: Sequence[tuple[str, int]],
                   bounds: Mapping[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], int]:
    """Where each partition ends (exclusive): by timestamp when a timestamp option is given, else ``endingOffsets``.

    A timestamp no record is at or after ends at the log end.
    """
    return _offsets(opts, spec, tps, bounds, "ending", opts.ending_timestamp, opts.ending_offsets_by_timestamp,
                    strict=False)


def _offsets(opts: SourceOptions, spec: OffsetSpec, tps: Sequence[tuple[str, int]],
             bounds: Mapping[tuple[str, int], tuple[int, int]], side: str, timestamp_option: int | None,
             by_timestamp_option: Mapping[tuple[str, int], int] | None, *,
             strict: bool) -> dict[tuple[str, int], int]:
    """The ``side`` ("starting" or "ending") offsets: by ``<side>Timestamp`` or ``<side>OffsetsByTimestamp``
    when one is given, else by the ``<side>Offsets`` spec."""
    name = f"{side}Timestamp" if timestamp_option is not None else f"{side}OffsetsByTimestamp"
    targets = _timestamp_targets(name, timestamp_option, by_timestamp_option, tps)
    if targets is None:
        return _resolve(spec, f"{side}Offsets", tps, bounds, opts.fail_on_data_loss)
    result = {}
    for tp, timestamp in targets.items():
        found = offset_for_time(opts.mount, *tp, timestamp)
        if found is None:
            if strict:
                raise OffsetOutOfRangeError(
                    f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} and timestamp "
                    f"{timestamp} ({name}); set {side}OffsetsByTimestampStrategy=latest to start at the "
                    "log end instead", log_start_offset=bounds[tp][0], log_end_offset=bounds[tp][1])
            found = bounds[tp][1]
        result[tp] = found
    return result
