"""Retention predicates: which of a log's oldest segments may go (Kafka's UnifiedLog.deleteOldSegments).

Kafka walks the segments from the oldest and stops at the first one the
predicate keeps, so retention only ever removes a prefix of the log.  Three
predicates exist, each a closure over what it needs:

* time: the segment's largest record timestamp (or, without one, its file's
  mtime) is more than ``retention.ms`` old;
* size: the log is ``diff = size - retention.bytes`` too big; a segment goes
  while it fits entirely in what is left of ``diff`` (so the log never drops
  below ``retention.bytes``);
* log start offset: the *next* segment starts at or below the log start offset
  (DeleteRecords moved it past this whole segment).

This module is pure policy: :class:`engine.log.Log` does the locking, the
rolling, the renaming to ``.deleted`` and the queueing.
The Log moves the log start offset *before* it renames any segment, through
its ``before_log_start_offset_moves`` hook, where the LogManager checkpoints it:
a crash between two renames then cannot bring back the records of the
segments not renamed yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from engine.segment import LogSegment


class SegmentBounds(Protocol):
    """What the predicates read of a segment (a :class:`engine.segment.LogSegment` has more)."""

    @property
    def base_offset(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def largest_timestamp(self) -> int: ...


#: A predicate gets a candidate segment and the next higher one (None for the last).
SegmentPredicate = Callable[[SegmentBounds, SegmentBounds | None], bool]

_Segment = TypeVar("_Segment", bound=SegmentBounds)


def retention_ms_breached(now_ms: int, retention_ms: int) -> SegmentPredicate:
    """Segments whose newest record is older than ``retention.ms``."""
    def should_delete(segment: SegmentBounds, next_segment: SegmentBounds | None) -> bool:
        return now_ms - segment.largest_timestamp > retention_ms
    return should_delete


def retention_size_breached(log_size: int, retention_bytes: int) -> SegmentPredicate:
    """Oldest segments while they fit in the excess ``log_size - retention.bytes`` (stateful)."""
    diff = log_size - retention_bytes

    def should_delete(segment: SegmentBounds, next_segment: SegmentBounds | None) -> bool:
        nonlocal diff
        size = segment.size
        if diff - size >= 0:
            diff -= size
            return True
        return False
    return should_delete


def log_start_offset_breached(log_start_offset: int) -> SegmentPredicate:
    """Segments wholly below the log start offset: the next one starts at or before it."""
    def should_delete(segment: SegmentBounds, next_segment: SegmentBounds | None) -> bool:
        return next_segment is not None and next_segment.base_offset <= log_start_offset
    return should_delete


def deletable_segments(segments: Sequence[_Segment], predicate: Callable[[_Segment, _Segment | None], bool],
                       high_watermark: int) -> list[_Segment]:
    """The oldest segments the predicate accepts, stopping at the first it refuses.

    An empty last (active) segment is never returned, and no segment holding an
    offset at or beyond the high watermark (here: the log end offset) is either,
    so the log start offset can never pass the log end.
    """
    deletable: list[_Segment] = []
    count = len(segments)
    for i, segment in enumerate(segments):
        next_segment = segments[i + 1] if i + 1 < count else None
        is_last_and_empty = next_segment is None and segment.size == 0
        upper_bound = next_segment.base_offset if next_segment is not None else high_watermark
        if high_watermark >= upper_bound and not is_last_and_empty and predicate(segment, next_segment):
            deletable.append(segment)
        else:
            break
    return deletable


def describe_retention_ms(segments: Sequence[LogSegment], retention_ms: int) -> list[str]:
    """Kafka's RetentionMsBreach log lines, one per segment."""
    lines = []
    for segment in segments:
        basis = ("the largest record timestamp in the segment" if segment.max_timestamp_so_far >= 0
                 else "the last modified time of the segment")
        lines.append(f"Deleting segment {segment} due to log retention time {retention_ms}ms breach "
                     f"based on {basis}")
    return lines


def describe_retention_size(segments: Sequence[LogSegment], retention_bytes: int, log_size: int) -> list[str]:
    """Kafka's RetentionSizeBreach log lines, one per segment."""
    lines = []
    size = log_size
    for segment in segments:
        size -= segment.size
        lines.append(f"Deleting segment {segment} due to log retention size {retention_bytes} breach. "
                     f"Log size after deletion will be {size}.")
    return lines
