"""LogLoader on real directories: clean and unclean restarts, torn tails, bit flips, index rebuilds, suffixes."""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.clock import ManualClock
from engine.log import Log
from engine.records import HEADER_SIZE, Record, encode_records
from tests.helpers import make_config

if TYPE_CHECKING:
    from engine.segment import LogSegment

T0 = 1_700_000_000_000


CONFIG = {"internal_segment_bytes": 1000, "index_interval_bytes": 150}


def build_log(path: str, batches: int = 30, clock: ManualClock | None = None) -> tuple[Log, list[Record]]:
    clock = clock or ManualClock(T0)
    log = Log.load(path, make_config(**CONFIG), clock=clock)
    rng = random.Random(7)
    for i in range(batches):
        n = rng.randint(1, 6)
        values = [None if rng.random() < 0.1 else os.urandom(rng.randint(0, 40)) for _ in range(n)]
        keys = [b"k%d" % rng.randint(0, 9) for _ in range(n)] if i % 2 else None
        log.append_values(values, keys)
        clock.sleep(rng.randint(0, 50))
    return log, log.read_records(0)


def crash(log: Log) -> None:
    """Leave the files as a killed process would: nothing trimmed, nothing closed cleanly."""
    for segment in log.segments.values():
        segment.close_handlers()


def reload(path: str, **kw) -> Log:
    return Log.load(path, make_config(**CONFIG), clock=ManualClock(T0 + 10_000_000), **kw)


def test_reload_after_clean_shutdown(tmp_path):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    assert log.num_segments > 3
    bases = list(log.segments.keys())
    log.close()
    loaded = reload(path, had_clean_shutdown=True, recovery_point=0)
    assert loaded.read_records(0) == records
    assert list(loaded.segments.keys()) == bases
    assert loaded.recovery_point == loaded.log_end_offset == records[-1].offset + 1
    active = loaded.active_segment
    # re-grown to what a segment of this size can hold (engine.segment.index_bytes_needed)
    assert os.path.getsize(active.offset_index.path) == active.max_index_size // 8 * 8 > 4 * 8
    assert loaded.append_values([b"next"])[0] == records[-1].offset + 1
    loaded.close()


def test_reload_after_unclean_shutdown(tmp_path):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    log.flush(records[len(records) // 2].offset)
    recovery_point = log.recovery_point
    crash(log)
    loaded = reload(path, had_clean_shutdown=False, recovery_point=recovery_point)
    assert loaded.read_records(0) == records
    assert loaded.recovery_point == recovery_point
    found = loaded.fetch_offset_by_timestamp(records[-1].timestamp)
    assert found is not None
    assert found[0] <= records[-1].offset
    loaded.close()


def test_torn_tail_is_truncated(tmp_path):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    active = log.active_segment
    batches = list(active.batches())
    last_pos, last_header = batches[-1]
    crash(log)
    os.truncate(active.log_path, last_pos + last_header.size - 3)
    loaded = reload(path, recovery_point=0)
    survivors = [r for r in records if r.offset < last_header.base_offset]
    assert loaded.read_records(0) == survivors
    assert loaded.log_end_offset == last_header.base_offset
    loaded.close()


def test_corrupt_segment_deletes_every_later_segment(tmp_path):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    segments = list(log.segments.values())
    victim = segments[1]
    pos, header = list(victim.batches())[1]
    crash(log)
    with open(victim.log_path, "r+b") as f:
        f.seek(pos + HEADER_SIZE + 2)
        b = f.read(1)
        f.seek(pos + HEADER_SIZE + 2)
        f.write(bytes([b[0] ^ 0x01]))
    loaded = reload(path, recovery_point=0)
    assert list(loaded.segments.keys()) == [segments[0].base_offset, victim.base_offset]
    assert loaded.read_records(0) == [r for r in records if r.offset < header.base_offset]
    assert loaded.pending_deletion_segments == len(segments) - 2
    assert all(f.endswith(".deleted") for f in os.listdir(path)
               if int(f.split(".")[0]) > victim.base_offset)
    assert loaded.delete_expired_segment_files(now_ms=T0 + 10_000_000 + 60_000) == len(segments) - 2
    assert not any(f.endswith(".deleted") for f in os.listdir(path))
    loaded.close()


def _flippable_positions(log_path: str) -> list[int]:
    """Every byte of the .log except base offset and leader epoch, which the v2 format leaves outside the CRC."""
    data = Path(log_path).read_bytes()
    positions: list[int] = []
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 8:pos + 12], "big")
        size = length + 12
        positions.extend(p for p in range(pos, pos + size) if not (p - pos < 8 or 12 <= p - pos < 16))
        pos += size
    return positions


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**9), st.integers(0, 7))
def test_random_bit_flip_recovers_exactly_the_batches_before_it(choice, bit):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t-0")
        log, records = build_log(path, batches=12)
        segments = list(log.segments.values())
        segment = segments[choice % len(segments)]
        candidates = _flippable_positions(segment.log_path)
        flip = candidates[(choice // len(segments)) % len(candidates)]
        batch_base: int | None = None
        for pos, header in segment.batches():
            if pos <= flip < pos + header.size:
                batch_base = header.base_offset
        assert batch_base is not None             # the flipped byte is in one of the segment's batches
        crash(log)
        with open(segment.log_path, "r+b") as f:
            f.seek(flip)
            b = f.read(1)
            f.seek(flip)
            f.write(bytes([b[0] ^ (1 << bit)]))
        loaded = reload(path, recovery_point=0)
        assert loaded.read_records(0) == [r for r in records if r.offset < batch_base]
        assert loaded.log_end_offset == batch_base
        loaded.close()


def test_missing_and_corrupt_indexes_are_rebuilt(tmp_path):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    segments = list(log.segments.values())
    expected = {s.base_offset: [s.offset_index.entry(n) for n in range(s.offset_index.entries)]
                for s in segments[:3]}
    log.close()
    os.unlink(segments[0].offset_index.path)
    os.unlink(segments[1].time_index.path)
    with open(segments[2].offset_index.path, "ab") as f:
        f.write(b"\x00\x01\x02")                 # not a multiple of the entry size
    orphan = os.path.join(path, "00000000000099999999.index")
    Path(orphan).write_bytes(b"\x00" * 8)
    loaded = reload(path, had_clean_shutdown=True)
    for s in list(loaded.segments.values())[:3]:
        assert [s.offset_index.entry(n) for n in range(s.offset_index.entries)] == expected[s.base_offset]
        assert s.time_index.entries >= 1
    assert not os.path.exists(orphan)
    assert loaded.read_records(0) == records
    loaded.close()


def test_deleted_and_cleaned_files_removed_and_swap_completed(tmp_path):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    segments = list(log.segments.values())
    first, second = segments[0], segments[1]
    # a cleaner's result for segments [first, second) that crashed after the .swap rename
    keep = [r for r in records if r.offset < segments[2].base_offset and r.offset % 2 == 0]
    swap = os.path.join(path, "%020d.log.swap" % first.base_offset)
    with open(swap, "wb") as f:
        f.write(encode_records(keep))
    stray_deleted = os.path.join(path, "%020d.log.deleted" % 777)
    Path(stray_deleted).write_bytes(b"junk")
    stray_cleaned = os.path.join(path, "%020d.log.cleaned" % segments[3].base_offset)
    Path(stray_cleaned).write_bytes(b"junk")
    # a .swap at or above the lowest .cleaned offset is an unfinished operation: rolled back
    invalid_swap = os.path.join(path, "%020d.log.swap" % segments[4].base_offset)
    Path(invalid_swap).write_bytes(b"junk")
    log.close()
    loaded = reload(path, had_clean_shutdown=True)
    names = os.listdir(path)
    assert not any(n.endswith((".deleted", ".cleaned", ".swap")) for n in names)
    assert second.base_offset not in loaded.segments          # replaced by the swapped-in segment
    expected = keep + [r for r in records if r.offset >= segments[2].base_offset]
    assert loaded.read_records(0) == expected
    loaded.close()


def _tree(path: str) -> dict[str, tuple[bytes, int]]:
    return {n: (Path(os.path.join(path, n)).read_bytes(), os.stat(os.path.join(path, n)).st_mtime_ns)
            for n in sorted(os.listdir(path))}


def _log_with_cleaned_swap(path: str) -> tuple[list[Record], list[LogSegment], list[Record]]:
    """A closed log whose first two segments a crashed clean left as one ``.log.swap`` (even offsets kept).

    Returns the records written, the segments, and the records the log holds once the swap is installed.
    """
    log, records = build_log(path)
    segments = list(log.segments.values())
    keep = [r for r in records if r.offset < segments[2].base_offset and r.offset % 2 == 0]
    log.close()
    with open(os.path.join(path, "%020d.log.swap" % segments[0].base_offset), "wb") as f:
        f.write(encode_records(keep))
    return records, segments, keep + [r for r in records if r.offset >= segments[2].base_offset]


@pytest.mark.parametrize("old_segments_left", [True, False])
def test_a_valid_swap_is_completed_in_memory_read_only_and_on_disk_read_write(tmp_path, old_segments_left):
    """Both crash points of replace_segments: before and after the old segments were renamed .deleted."""
    path = str(tmp_path / "t-0")
    _records, segments, expected = _log_with_cleaned_swap(path)
    if not old_segments_left:
        for segment in segments[:2]:
            for p in (segment.log_path, segment.offset_index.path, segment.time_index.path):
                os.rename(p, p + ".deleted")
    before = _tree(path)
    ro = reload(path, had_clean_shutdown=True, read_only=True)
    assert ro.read_records(0) == expected
    assert segments[1].base_offset not in ro.segments
    ro.close()
    assert _tree(path) == before
    rw = reload(path, had_clean_shutdown=True)
    assert rw.read_records(0) == expected
    assert rw.segments[segments[0].base_offset].time_index.entries >= 1     # rebuilt, not created empty
    rw.close()
    assert not any(n.endswith((".swap", ".deleted")) for n in os.listdir(path))


@pytest.mark.parametrize("content", ["garbage", "offsets beyond the replaced segments", "a copy from below"])
def test_an_invalid_swap_is_not_installed(tmp_path, content, caplog):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    segments = list(log.segments.values())
    log.close()
    swap = os.path.join(path, "%020d.log.swap" % segments[2].base_offset)
    if content == "garbage":
        data = os.urandom(5000)
    elif content == "offsets beyond the replaced segments":
        end = records[-1].offset + 1                         # a cleaner never writes past what it read
        data = encode_records([r for r in records if r.offset >= segments[2].base_offset]
                              + [Record(end + i, T0, b"k", b"v", ()) for i in range(5)])
    else:
        data = Path(segments[0].log_path).read_bytes()
    Path(swap).write_bytes(data)
    loaded = reload(path, had_clean_shutdown=True)
    assert loaded.read_records(0) == records
    loaded.close()
    assert Path(swap).read_bytes() == data                    # left for the operator
    assert [r.levelname for r in caplog.records if swap in r.getMessage()] == ["ERROR"]


def test_log_start_offset_checkpoint(tmp_path):
    path = str(tmp_path / "t-0")
    log, records = build_log(path)
    end = log.log_end_offset
    bases = list(log.segments.keys())
    log.close()
    loaded = reload(path, had_clean_shutdown=True, log_start_offset=bases[1] + 1)
    assert loaded.log_start_offset == bases[1] + 1
    assert loaded.read_records(loaded.log_start_offset)[0].offset == bases[1] + 1
    loaded.close()
    # a checkpoint beyond the log end is damage on a single node: every segment is kept (issue 9)
    beyond = reload(path, had_clean_shutdown=True, log_start_offset=end + 100)
    assert beyond.log_start_offset == bases[0]
    assert beyond.log_end_offset == end
    assert list(beyond.segments.keys()) == bases
    assert beyond.pending_deletion_segments == 0
    assert beyond.read_records(0) == records
    beyond.close()
    shutil.rmtree(path)


def test_a_swap_interrupted_between_its_renames_is_recovered_without_an_error(tmp_path, caplog):
    """Issue 18: a crash between the .log.swap and .index.swap renames logged ERROR for a normal recovery."""
    path = str(tmp_path / "t-0")
    records, _, expected = _log_with_cleaned_swap(path)   # its .index.swap / .timeindex.swap: not renamed yet
    with caplog.at_level(logging.INFO, logger="engine"):
        loaded = reload(path, had_clean_shutdown=False, recovery_point=records[-1].offset + 1)
    assert loaded.read_records(0) == expected
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "installed from an interrupted log cleaner swap" in caplog.text
    loaded.close()
