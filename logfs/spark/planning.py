"""Planning: offset ranges of partitions cut into Spark input partitions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

if TYPE_CHECKING:
    from collections.abc import Mapping


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
