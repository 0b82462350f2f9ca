"""``Log.append_as_follower``: a replica's append of fetched batches (the cluster mount's local replica)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.clock import ManualClock
from engine.errors import CorruptRecordError, InvalidRecordError
from engine.log import Log
from engine.records import Record, encode_records
from engine.views import LogView, ViewFormat
from tests.helpers import make_config

T0 = 1_700_000_000_000


def open_log(tmp_path, **overrides) -> Log:
    return Log.load(str(tmp_path / "t-0"), make_config(**overrides), clock=ManualClock(T0))


def batch(offsets: list[int], ts: int = T0 - 5_000) -> bytes:
    return encode_records([Record(o, ts + i, b"k%d" % o, b"v%d" % o, ()) for i, o in enumerate(offsets)])


def test_batches_are_kept_byte_for_byte_at_the_leaders_offsets(tmp_path):
    log = open_log(tmp_path)
    fetched = batch([0, 1, 2]) + batch([5, 7])      # a compacted leader's gaps
    assert log.append_as_follower(fetched) == 8
    assert log.log_end_offset == 8
    with open(log.active_segment.log_path, "rb") as f:
        assert f.read() == fetched
    assert [r.offset for r in log.read_records(0)] == [0, 1, 2, 5, 7]
    assert log.read_records(7)[0].timestamp == T0 - 5_000 + 1      # the batch's own timestamps


def test_a_torn_tail_of_the_fetch_is_left_out(tmp_path):
    log = open_log(tmp_path)
    whole, cut = batch([0, 1]), batch([2, 3])
    assert log.append_as_follower(whole + cut[:20]) == 2
    assert log.append_as_follower(cut) == 4


def test_a_damaged_batch_appends_nothing(tmp_path):
    log = open_log(tmp_path)
    damaged = bytearray(batch([0, 1]))
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(bytes(damaged))
    assert log.log_end_offset == 0
    assert log.size == 0


def test_offsets_below_the_log_end_are_refused(tmp_path):
    log = open_log(tmp_path)
    log.append_as_follower(batch([0, 1, 2]))
    with pytest.raises(InvalidRecordError, match="below the log end offset"):
        log.append_as_follower(batch([1, 2, 3]))
    assert log.log_end_offset == 3


def test_an_empty_log_starts_at_the_fetched_batch(tmp_path):
    """The leader's log start inside a batch (DeleteRecords): the whole batch comes back."""
    log = open_log(tmp_path)
    log.truncate_fully_and_start_at(5)
    assert log.append_as_follower(batch([3, 4, 5, 6])) == 7
    log.maybe_increment_log_start_offset(5, "leader log start offset")
    assert log.log_start_offset == 5
    view = LogView(log, ViewFormat.TEXT)
    assert view.read(0, 100) == b"v5\nv6\n"


def test_views_follow_follower_appends(tmp_path):
    log = open_log(tmp_path)
    view = LogView(log, ViewFormat.TEXT)
    log.append_as_follower(batch([0, 1]))
    assert view.read(0, 100) == b"v0\nv1\n"
    log.append_as_follower(batch([2]))
    assert view.size() == len(b"v0\nv1\nv2\n")
    assert view.read(6, 100) == b"v2\n"


def with_epoch(data: bytes, epoch: int) -> bytes:
    """The batch with its partitionLeaderEpoch set (bytes 12-16, outside the CRC, as a leader stamps it)."""
    return data[:12] + epoch.to_bytes(4, "big", signed=True) + data[16:]


def test_leader_epochs_come_from_the_batches(tmp_path):
    """Kafka's LeaderEpochFileCache.endOffsetFor, from the batches' own epochs, across segments."""
    log = open_log(tmp_path, internal_segment_bytes=200)
    assert log.latest_epoch() == -1
    assert log.end_offset_for_epoch(3) is None
    # epoch 0: offsets 0-3, epoch 2: 4-6, epoch 5: 7-8 (rolls in between: tiny segments)
    for offsets, epoch in (([0, 1], 0), ([2, 3], 0), ([4, 5, 6], 2), ([7], 5), ([8], 5)):
        log.append_as_follower(with_epoch(batch(offsets), epoch))
    assert log.num_segments > 1
    assert log.latest_epoch() == 5
    assert log.end_offset_for_epoch(5) == (5, 9)
    assert log.end_offset_for_epoch(9) == (5, 9)       # above the latest: the latest, to the log end
    assert log.end_offset_for_epoch(4) == (2, 7)       # not held: the largest epoch below it
    assert log.end_offset_for_epoch(2) == (2, 7)
    assert log.end_offset_for_epoch(1) == (0, 4)
    assert log.end_offset_for_epoch(0) == (0, 4)
    log.truncate_to(4)
    assert log.latest_epoch() == 0
    assert log.end_offset_for_epoch(5) == (0, 4)


def test_a_batch_without_an_epoch_ends_what_is_known(tmp_path):
    log = open_log(tmp_path)
    log.append_as_follower(batch([0, 1]))                    # -1: an embedded append
    log.append_as_follower(with_epoch(batch([2]), 3))
    assert log.end_offset_for_epoch(3) == (3, 3)
    assert log.end_offset_for_epoch(2) is None


def test_a_fetch_larger_than_a_segment_is_cut_into_segments(tmp_path, caplog):
    """A fetch returns many batches at once: the replica's log.segment.bytes holds, with plain rolls (no
    "Trying to roll a new log segment ... while it already exists")."""
    log = open_log(tmp_path, internal_segment_bytes=1024)
    batches = [batch(list(range(o, o + 10))) for o in range(0, 400, 10)]
    fetched = b"".join(batches)
    assert len(fetched) > 8 * 1024
    with caplog.at_level("INFO", logger="engine.log"):
        assert log.append_as_follower(fetched) == 400
    assert "already exists" not in caplog.text
    sizes = [s.size for s in log.segments.values()]
    assert len(sizes) >= 8
    assert max(sizes) <= 1024
    assert [r.offset for r in log.read_records(395)] == [395, 396, 397, 398, 399]
    assert b"".join(Path(s.log_path).read_bytes() for s in log.segments.values()) == fetched


def test_a_batch_larger_than_a_segment_fills_the_empty_active_segment(tmp_path, caplog):
    log = open_log(tmp_path, internal_segment_bytes=100)
    big = batch(list(range(20)))
    assert len(big) > 100
    with caplog.at_level("INFO", logger="engine.log"):
        log.append_as_follower(big)
        log.append_as_follower(batch([20, 21, 22, 23, 24, 25, 26, 27, 28]))
    assert "already exists" not in caplog.text
    assert list(log.segments.keys()) == [0, 20]
