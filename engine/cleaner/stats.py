"""What cleaning did: one clean's figures (Kafka's ``CleanerStats``), running totals, and their export."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.topic import TopicPartition

# -- statistics ----------------------------------------------------------------------------------

@dataclass
class CleanerStats:
    """What one round of cleaning did (Kafka's ``CleanerStats``), plus which log and range."""

    topic_partition: TopicPartition | None = None
    first_dirty_offset: int = -1
    end_offset: int = -1
    start_time: float = field(default_factory=time.monotonic)
    map_complete_time: float = -1.0
    end_time: float = -1.0
    bytes_read: int = 0
    bytes_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    messages_read: int = 0
    invalid_messages_read: int = 0
    messages_written: int = 0
    buffer_utilization: float = 0.0
    segments_cleaned: int = 0
    groups: int = 0
    #: batches given a delete horizon (KIP-534) by this clean
    horizons_set: int = 0
    #: tombstones and transaction markers dropped because their delete horizon had passed
    deletes_expired: int = 0
    #: records of aborted transactions dropped
    aborted_records_removed: int = 0

    def read_messages(self, count: int, size: int) -> None:
        self.messages_read += count
        self.bytes_read += size

    def recopy_messages(self, count: int, size: int) -> None:
        self.messages_written += count
        self.bytes_written += size

    def index_done(self) -> None:
        self.map_complete_time = time.monotonic()

    def all_done(self) -> None:
        self.end_time = time.monotonic()

    @property
    def elapsed_secs(self) -> float:
        return max(self.end_time - self.start_time, 1e-9)

    @property
    def elapsed_index_secs(self) -> float:
        return max(self.map_complete_time - self.start_time, 1e-9)

    @property
    def messages_dropped(self) -> int:
        return self.messages_read - self.messages_written


@dataclass
class CleanerTotals:
    """Running sums over every finished clean of this cleaner (what the mount's metrics export).

    Kafka exposes only last-run gauges; cumulative counters let a Prometheus
    ``rate()`` show cleaning throughput and how much compaction removes.
    """

    runs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    segments_cleaned: int = 0
    elapsed_secs: float = 0.0
    horizons_set: int = 0
    deletes_expired: int = 0
    aborted_records_removed: int = 0

    def add(self, stats: CleanerStats) -> None:
        self.runs += 1
        self.horizons_set += stats.horizons_set
        self.deletes_expired += stats.deletes_expired
        self.aborted_records_removed += stats.aborted_records_removed
        self.bytes_read += stats.bytes_read
        self.bytes_written += stats.bytes_written
        self.records_read += stats.messages_read
        self.records_written += stats.messages_written
        self.segments_cleaned += stats.segments_cleaned
        self.elapsed_secs += stats.elapsed_secs

    @property
    def records_dropped(self) -> int:
        return self.records_read - self.records_written


def mb(size: float) -> float:
    return size / (1024 * 1024)


def run_dict(stats: CleanerStats) -> dict[str, object]:
    """One clean's figures in the units an operator reads (bytes, records, seconds, MB/s)."""
    tp = stats.topic_partition
    return {
        "topic_partition": None if tp is None else str(tp),
        "first_dirty_offset": stats.first_dirty_offset,
        "end_offset": stats.end_offset,
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "records_read": stats.messages_read,
        "records_written": stats.messages_written,
        "records_dropped": stats.messages_dropped,
        "segments_cleaned": stats.segments_cleaned,
        "horizons_set": stats.horizons_set,
        "deletes_expired": stats.deletes_expired,
        "aborted_records_removed": stats.aborted_records_removed,
        "duration_secs": round(stats.elapsed_secs, 6),
        "mb_per_sec": round(mb(stats.bytes_read) / stats.elapsed_secs, 3),
        "buffer_utilization": round(stats.buffer_utilization, 6),
    }
