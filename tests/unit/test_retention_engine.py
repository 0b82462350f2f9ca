"""Retention: predicates, Log.delete_old_segments, DeleteRecords and the asynchronous deletion queue."""

from __future__ import annotations

import os

import pytest

from engine import retention
from engine.clock import ManualClock
from engine.errors import InvalidRequestError, OffsetOutOfRangeError
from engine.log import Log
from tests.helpers import make_config

T0 = 1_700_000_000_000
HOUR = 3_600_000


class FakeSegment:
    """Just the attributes the predicates read; the Log tests below use real segments."""

    def __init__(self, base_offset: int, size: int, largest_timestamp: int) -> None:
        self.base_offset = base_offset
        self.size = size
        self.largest_timestamp = largest_timestamp


def test_predicates():
    a, b, c = FakeSegment(0, 100, T0), FakeSegment(10, 100, T0 + 10), FakeSegment(20, 0, T0 + 20)
    by_time = retention.retention_ms_breached(T0 + 1000, 995)
    assert by_time(a, b)
    assert by_time(b, c) is False
    by_size = retention.retention_size_breached(250, 100)       # diff 150: only one 100-byte segment fits
    assert by_size(a, b)
    assert not by_size(b, c)
    by_start = retention.log_start_offset_breached(10)
    assert by_start(a, b)
    assert not by_start(b, c)
    assert not by_start(c, None)


def test_deletable_segments_stops_at_first_kept_and_spares_empty_active():
    segs = [FakeSegment(0, 100, T0), FakeSegment(10, 100, T0 + 500), FakeSegment(20, 100, T0),
            FakeSegment(30, 0, T0)]
    always = lambda s, n: True
    assert retention.deletable_segments(segs, always, 30) == segs[:3]      # empty active never
    assert retention.deletable_segments(segs[:3], always, 30) == segs[:3]  # non-empty active may go
    by_time = retention.retention_ms_breached(T0 + 1000, 600)
    assert retention.deletable_segments(segs, by_time, 30) == segs[:1]    # stops at the first young one
    assert retention.deletable_segments(segs, always, 15) == segs[:1]     # never past the high watermark


def build(tmp_path, clock, **overrides) -> Log:
    config = {"internal_segment_bytes": 400, "retention_ms": 10 * HOUR, "file_delete_delay_ms": 60_000}
    config.update(overrides)
    log = Log.load(str(tmp_path / "r-0"), make_config(**config), clock=clock)
    for i in range(12):
        log.append_values([b"record-%03d" % (i * 5 + j) for j in range(5)])
        clock.sleep(HOUR)
    return log


def test_time_retention_deletes_oldest_and_queues_files(tmp_path):
    clock = ManualClock(T0)
    log = build(tmp_path, clock)
    segments = list(log.segments.values())
    assert len(segments) >= 4
    reader_held = segments[0]
    clock.now = segments[1].largest_timestamp + 10 * HOUR + 1     # the first two segments are too old
    assert log.delete_old_segments() == 2
    assert list(log.segments.values()) == segments[2:]
    assert log.log_start_offset == segments[2].base_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read_records(0)
    assert all(s.has_suffix(".deleted") and os.path.exists(s.log_path) for s in segments[:2])
    assert log.pending_deletion_segments == 2
    assert log.pending_deletion_bytes == segments[0].size + segments[1].size
    assert log.delete_expired_segment_files() == 0                  # file.delete.delay.ms not over
    clock.sleep(60_000)
    assert log.delete_expired_segment_files() == 2
    assert log.pending_deletion_segments == 0
    assert not any(n.endswith(".deleted") for n in os.listdir(log.dir))
    # a reader that held the segment keeps reading the unlinked file
    data = reader_held.read_bytes(0, reader_held.size)
    assert len(data) == reader_held.size
    assert b"record-000" in data
    log.close()


def test_size_retention_keeps_at_least_retention_bytes(tmp_path):
    clock = ManualClock(T0)
    log = build(tmp_path, clock, retention_ms=-1)
    sizes = [s.size for s in log.segments.values()]
    total = sum(sizes)
    limit = total - sizes[0] - sizes[1] // 2                        # room for deleting exactly one
    log.update_config(log.config.with_overrides({"retention.bytes": str(limit)}))
    assert log.delete_old_segments() == 1
    assert log.size == total - sizes[0] >= limit
    assert log.delete_old_segments() == 0
    log.close()


def test_all_segments_expired_rolls_so_an_empty_active_remains(tmp_path):
    clock = ManualClock(T0)
    log = build(tmp_path, clock)
    end = log.log_end_offset
    count = log.num_segments
    clock.sleep(100 * HOUR)
    assert log.delete_old_segments() == count
    assert list(log.segments.keys()) == [end]
    assert log.active_segment.size == 0
    assert log.log_start_offset == log.log_end_offset == end
    assert log.delete_old_segments() == 0                           # the empty active segment stays
    assert log.append_values([b"after"]) == (end, end)
    log.close()


def test_compacted_topic_only_deletes_below_log_start(tmp_path):
    clock = ManualClock(T0)
    log = Log.load(str(tmp_path / "c-0"),
                   make_config(internal_segment_bytes=600, retention_ms=1, cleanup_policy="compact"), clock=clock)
    for _ in range(12):
        log.append_values([b"v"] * 5, [b"k%d" % j for j in range(5)])
    clock.sleep(HOUR)
    assert log.delete_old_segments() == 0
    log.close()


def test_delete_records_moves_start_and_deletes_covered_segments(tmp_path):
    clock = ManualClock(T0)
    log = build(tmp_path, clock, retention_ms=-1)
    bases = list(log.segments.keys())
    with pytest.raises(InvalidRequestError):
        log.maybe_increment_log_start_offset(log.log_end_offset + 1)
    target = bases[2] + 1
    log.maybe_increment_log_start_offset(target)
    assert log.log_start_offset == target
    assert list(log.segments.keys()) == bases[2:]                   # wholly-below segments gone at once
    assert log.pending_deletion_segments == 2
    assert log.read_records(target)[0].offset == target
    with pytest.raises(OffsetOutOfRangeError):
        log.read_records(target - 1)
    log.maybe_increment_log_start_offset(bases[1])                  # never moves backwards
    assert log.log_start_offset == target
    assert log.fetch_offset_by_timestamp(-2) == (target, -1)
    log.close()
