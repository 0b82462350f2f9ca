"""LogSegment on real files: append/read, sparse indexes, roll triggers, recovery, deletion semantics."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from kafka.record import MemoryRecords

from engine.clock import ManualClock
from engine.errors import LogDirFullError, StorageError
from engine.records import Record, decode_batch, encode_records, encode_values
from engine.segment import FetchDataInfo, LogSegment
from engine.segment_checks import check_index_against_log
from engine.views.index import view_index, view_index_and_damage
from tests.helpers import make_config, small_tmpfs

T0 = 1_700_000_000_000


def fill(segment: LogSegment, batches: int, per_batch: int = 10, start: int = 0, ts: int = T0,
         value_size: int = 40) -> list[tuple[int, int, int]]:
    """Append ``batches`` batches; returns (base offset, position, timestamp) of each."""
    out = []
    offset = start
    for i in range(batches):
        values = [(b"%d:" % (offset + j)).ljust(value_size, b"x") for j in range(per_batch)]
        batch = encode_values(offset, values, ts + i)
        out.append((offset, segment.size, ts + i))
        last = offset + per_batch - 1
        segment.append(last, ts + i, last, batch)
        offset += per_batch
    return out


def all_records(segment: LogSegment) -> list[Record]:
    out = []
    for pos, header, buf, off in segment.batches_with_bytes(0):
        out.extend(segment.validate_and_decode(buf, off, header, pos))
    return out


@pytest.fixture
def segment(tmp_path):
    (tmp_path / "t-0").mkdir()
    seg = LogSegment.open(str(tmp_path / "t-0"), 0, make_config(index_interval_bytes=1000), ManualClock())
    yield seg
    seg.close()


def test_append_read_round_trip(segment):
    batches = fill(segment, 30)
    records = all_records(segment)
    assert [r.offset for r in records] == list(range(300))
    value = records[123].value
    assert value is not None
    assert value.startswith(b"123:")
    assert segment.next_offset == 300
    info = segment.read(155, 1 << 20)
    assert isinstance(info, FetchDataInfo)
    base, position, _ = batches[15]
    assert info.position == position
    assert info.segment_base_offset == 0
    assert decode_batch(info.records)[0].offset == base
    assert segment.read(300, 1000) is None                 # beyond the last batch
    assert segment.read(0, 0).records == b""
    one = segment.read(0, 1, min_one_message=True)         # widened to the first batch
    assert len(one.records) == batches[1][1]
    capped = segment.read(0, 1 << 20, max_position=batches[3][1])
    assert len(capped.records) == batches[3][1]


def test_sparse_offset_index_spacing_follows_index_interval(segment):
    batches = fill(segment, 60)
    index = segment.offset_index
    assert 0 < index.entries < len(batches)
    positions = {pos: base for base, pos, _ in batches}
    previous = 0
    for n in range(index.entries):
        offset, position = index.entry(n)
        assert position in positions
        assert offset == positions[position] + 9            # the batch's last offset, as Kafka indexes
        assert position - previous > 1000 or (n == 0 and position > 1000)
        previous = position
    # time index: strictly increasing timestamps at the same points
    stamps = [segment.time_index.entry(n)[0] for n in range(segment.time_index.entries)]
    assert stamps == sorted(set(stamps))
    assert len(stamps) == index.entries


def test_lookups_by_offset_and_timestamp(segment):
    batches = fill(segment, 40)
    for target in (0, 9, 10, 157, 399):
        found = segment.translate_offset(target)
        base, position, _ = batches[target // 10]
        assert (found.offset, found.position) == (base + 9, position)
    assert segment.translate_offset(400) is None
    assert segment.find_offset_by_timestamp(T0 + 17, 0) == (T0 + 17, 170)
    assert segment.find_offset_by_timestamp(T0 - 5, 0) == (T0, 0)
    assert segment.find_offset_by_timestamp(T0 + 17, 175) == (T0 + 17, 175)
    assert segment.find_offset_by_timestamp(T0 + 40, 0) is None
    assert segment.max_timestamp_so_far == T0 + 39
    assert segment.offset_of_max_timestamp == 399


def test_should_roll_on_each_trigger(tmp_path):
    clock = ManualClock(T0)
    config = make_config(internal_segment_bytes=2000, segment_ms=1000, segment_index_bytes=24, index_interval_bytes=1)
    seg = LogSegment.open(str(tmp_path), 0, config, clock)
    assert not seg.should_roll(config, T0, 0, T0, 100)              # empty: never by time
    fill(seg, 1, ts=T0)
    size = seg.size
    assert not seg.should_roll(config, T0 + 1000, 10, T0 + 1000, 10)
    assert seg.should_roll(config, T0 + 1001, 10, T0 + 1001, 10)     # segment.ms since first batch
    assert seg.should_roll(config, T0, 10, T0, 2000 - size + 1)      # size would exceed segment.bytes
    assert not seg.should_roll(config, T0, 10, T0, 2000 - size)
    assert seg.should_roll(config, T0, 2**31, T0, 10)                # relative offset overflow
    fill(seg, 1, start=10, ts=T0)           # first index entry: a 24-byte time index is then full
    assert seg.time_index.entries == 1
    assert seg.time_index.is_full()                                  # one slot kept for the final entry
    assert seg.should_roll(config, T0, 50, T0, 10)                   # index full
    seg.close()


def test_on_becoming_inactive_appends_final_time_entry_and_trims(segment):
    fill(segment, 2)                       # below the interval: no index entry yet
    assert segment.time_index.entries == 0
    segment.on_becoming_inactive_segment()
    assert segment.time_index.last_entry == (T0 + 1, 19)
    assert os.path.getsize(segment.time_index.path) == 12
    assert os.path.getsize(segment.offset_index.path) == segment.offset_index.entries * 8


def test_recover_truncates_torn_tail_and_rebuilds_indexes(segment):
    batches = fill(segment, 50)
    entries = [segment.offset_index.entry(n) for n in range(segment.offset_index.entries)]
    cut = batches[37][1] + 20                                    # in the middle of batch 37
    os.truncate(segment.log_path, cut)
    truncated = segment.recover()
    assert truncated == cut - batches[37][1]
    assert segment.size == batches[37][1] == os.path.getsize(segment.log_path)
    assert segment.next_offset == 370
    assert [r.offset for r in all_records(segment)] == list(range(370))
    rebuilt = [segment.offset_index.entry(n) for n in range(segment.offset_index.entries)]
    assert rebuilt == [e for e in entries if e[1] < cut]


def test_recover_truncates_at_crc_failure(segment):
    batches = fill(segment, 20)
    size = segment.size
    with open(segment.log_path, "r+b") as f:
        f.seek(batches[12][1] + 70)
        byte = f.read(1)
        f.seek(batches[12][1] + 70)
        f.write(bytes([byte[0] ^ 0x10]))
    assert segment.recover() == size - batches[12][1]      # the invalid bytes: batch 12 and all after it
    assert segment.next_offset == 120
    assert all_records(segment)[-1].offset == 119


def test_truncate_to_offset(segment):
    batches = fill(segment, 30)
    size = segment.size
    removed = segment.truncate_to(150)
    assert removed == size - batches[15][1] == size - os.path.getsize(segment.log_path)
    assert segment.next_offset == 150
    assert segment.size == batches[15][1]
    assert segment.max_timestamp_so_far == T0 + 14
    assert all(segment.offset_index.entry(n)[0] < 150 for n in range(segment.offset_index.entries))
    fill(segment, 2, start=150, ts=T0 + 100)
    assert [r.offset for r in all_records(segment)] == list(range(170))


def test_delete_keeps_reading_through_open_descriptor(segment):
    fill(segment, 10)
    segment.change_file_suffixes("", ".deleted")
    assert segment.has_suffix(".deleted")
    assert segment.log_path.endswith(".log.deleted")
    assert os.path.exists(segment.offset_index.path)
    before = segment.read_bytes(0, segment.size)
    segment.delete_if_exists()
    assert segment.deleted
    assert segment.read_bytes(0, segment.size) == before      # Unix semantics: the fd outlives the unlink
    assert len(all_records(segment)) == 100


def test_last_modified_round_trip(segment):
    fill(segment, 1)
    segment.set_last_modified(T0 - 86_400_000)
    assert segment.last_modified == T0 - 86_400_000
    assert os.stat(segment.offset_index.path).st_mtime_ns // 1_000_000 == T0 - 86_400_000
    empty = LogSegment.open(os.path.dirname(segment.log_path), 10_000, make_config(), ManualClock())
    empty.set_last_modified(T0)
    assert empty.largest_timestamp == T0                      # no record timestamp: mtime
    empty.close()


def test_kafka_python_reads_the_log_file(segment):
    fill(segment, 12)
    keyed = encode_records([Record(120, T0, b"k", b"v", (("h", b"1"),)), Record(125, T0 + 5, None, None)])
    segment.append(125, T0 + 5, 125, keyed)
    segment.flush()
    with open(segment.log_path, "rb") as f:
        records = MemoryRecords(f.read())
    offsets: list[int] = []
    while True:
        batch = records.next_batch()
        if batch is None:
            break
        assert batch.validate_crc()
        offsets.extend(r.offset for r in batch)
    assert offsets == [*range(120), 120, 125]


def test_enospc_truncates_back_and_raises_log_dir_full(tmp_path):
    with small_tmpfs(tmp_path / "small", "256k") as mnt:
        seg = LogSegment.open(str(mnt), 0, make_config(segment_index_bytes=4096), ManualClock())
        fill(seg, 2)
        size = seg.size
        big = encode_values(20, [b"z" * 1000] * 400, T0)      # ~400 KB: more than the filesystem holds
        with pytest.raises(LogDirFullError):
            seg.append(419, T0, 419, big)
        assert seg.size == size == os.path.getsize(seg.log_path)
        assert [r.offset for r in all_records(seg)] == list(range(20))
        seg.close()


def test_descriptor_closes_on_close_and_on_garbage_collection(tmp_path):
    import gc
    seg = LogSegment.open(str(tmp_path), 0, make_config(), ManualClock())
    fd = seg._log().fd
    os.fstat(fd)
    seg.delete_if_exists()
    del seg
    gc.collect()
    with pytest.raises(OSError) as closed:
        os.fstat(fd)
    assert closed.value.errno == errno.EBADF
    seg = LogSegment.open(str(tmp_path), 5, make_config(), ManualClock())
    fill(seg, 1, start=5)
    seg.close()
    with pytest.raises(StorageError, match="is closed"):
        seg.read_bytes(0, 10)         # never another file's reused descriptor, never reopened


# ---- damage: strict walkers, indexes checked against the log, in-memory recovery (issue 9/12)


def _reopen(tmp_path, **kw) -> LogSegment:
    return LogSegment.open(str(tmp_path / "t-0"), 0, make_config(index_interval_bytes=1000), ManualClock(),
                           file_already_exists=True, **kw)


def test_a_segment_cut_mid_batch_raises_with_file_and_position_as_fields(segment, tmp_path):
    from engine.errors import CorruptRecordError
    batches = fill(segment, 20)
    segment.close()
    cut_at = batches[12][1]
    with open(segment.log_path, "r+b") as f:
        f.truncate(cut_at + 30)
    seg = _reopen(tmp_path)
    try:
        with pytest.raises(CorruptRecordError) as info:
            all_records(seg)
        assert info.value.path == seg.log_path
        assert info.value.position == cut_at
        assert "(file " not in info.value.detail
        served = seg.read(45, 1 << 20)                  # before the damage: served
        assert served is not None
        assert served.records
        vi, damage = view_index_and_damage(seg)        # views: the good bytes, then the error
        assert vi.log_size == cut_at
        assert damage is not None
        assert damage.position == cut_at
        assert damage.path == seg.log_path
        with pytest.raises(CorruptRecordError):
            view_index(seg)
        with pytest.raises(CorruptRecordError):
            seg.translate_offset(125)                   # at the damage: never "no such offset"
        # Rebuilding the indexes of a sealed segment keeps its bytes (truncate=False)
        size = os.path.getsize(seg.log_path)
        assert seg.recover(truncate=False) == size - cut_at
        assert os.path.getsize(seg.log_path) == size
        assert seg.next_offset == 120
        with pytest.raises(CorruptRecordError):
            all_records(seg)
    finally:
        seg.close()


def test_a_damaged_length_field_is_damage_not_a_torn_tail(segment, tmp_path):
    from engine.errors import CorruptRecordError
    batches = fill(segment, 20)
    segment.close()
    with open(segment.log_path, "r+b") as f:
        f.seek(batches[5][1] + 8)
        f.write((10**6).to_bytes(4, "big"))
    seg = _reopen(tmp_path)
    try:
        with pytest.raises(CorruptRecordError) as info:
            list(seg.batches(0))
        assert info.value.position == batches[5][1]
    finally:
        seg.close()


def test_an_index_that_points_between_batches_fails_the_check_and_lookups_do_not_trust_it(segment, tmp_path):
    from engine.errors import CorruptIndexError
    fill(segment, 60, value_size=60)
    segment.close()
    index_path = segment.offset_index.path
    raw = bytearray(Path(index_path).read_bytes())
    assert len(raw) >= 5 * 8
    raw[len(raw) - 1] += 5                       # the last entry's position moves into its batch
    Path(index_path).write_bytes(bytes(raw))
    seg = _reopen(tmp_path)
    try:
        seg.sanity_check()                       # Kafka's own check passes...
        with pytest.raises(CorruptIndexError, match="disagrees with log"):
            check_index_against_log(seg)        # ...ours does not
        # A reader meeting the bad entry falls back to scanning: right answer, never ENOENT
        last_entry_offset = seg.offset_index.last_offset
        found = seg.translate_offset(last_entry_offset)
        assert found is not None
        assert found.offset >= last_entry_offset
        assert [r.offset for r in all_records(seg)] == list(range(600))
    finally:
        seg.close()


def test_read_only_recovery_is_in_memory_and_writes_nothing(segment, tmp_path):
    fill(segment, 30)
    segment.close()
    with open(segment.log_path, "ab") as f:
        f.write(b"\0" * 7 + b"\x09" + b"\0\0\x01\0" + b"torn")
    os.unlink(segment.offset_index.path)
    files = {p: (Path(p).read_bytes(), os.stat(p).st_mtime_ns) for p in
             (segment.log_path, segment.time_index.path)}
    seg = _reopen(tmp_path, read_only=True)
    try:
        assert seg.indexes_missing
        assert seg.offset_index.in_memory
        assert seg.recover(in_memory=True) == 16
        assert seg.size == os.path.getsize(seg.log_path) - 16
        assert seg.next_offset == 300
        assert seg.offset_index.entries > 0
        found = seg.translate_offset(155)
        assert found is not None
        assert found.offset == 159
        assert [r.offset for r in all_records(seg)] == list(range(300))
    finally:
        seg.close()
    assert not os.path.exists(segment.offset_index.path)
    assert {p: (Path(p).read_bytes(), os.stat(p).st_mtime_ns) for p in files} == files


def test_segment_files_are_never_opened_through_a_link(tmp_path):
    from engine.errors import UnsafeFileError
    (tmp_path / "t-0").mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious\n")
    (tmp_path / "t-0" / "00000000000000000000.index").symlink_to(outside)
    with pytest.raises(UnsafeFileError) as info:
        LogSegment.open(str(tmp_path / "t-0"), 0, make_config(), ManualClock())
    assert info.value.paths == [str(tmp_path / "t-0" / "00000000000000000000.index")]
    (tmp_path / "t-0" / "00000000000000000100.log").symlink_to(outside)
    with pytest.raises(UnsafeFileError):
        LogSegment.open(str(tmp_path / "t-0"), 100, make_config(), ManualClock())
    os.mkfifo(tmp_path / "t-0" / "00000000000000000200.log")
    with pytest.raises(UnsafeFileError, match="not a regular file"):
        LogSegment.open(str(tmp_path / "t-0"), 200, make_config(), ManualClock())
    assert outside.read_bytes() == b"precious\n"


def test_a_time_index_naming_offsets_outside_its_segment_fails_the_check(tmp_path):
    from engine.errors import CorruptIndexError
    (tmp_path / "t-0").mkdir()
    seg = LogSegment.open(str(tmp_path / "t-0"), 0, make_config(index_interval_bytes=100), ManualClock())
    fill(seg, 40)
    seg.close()
    path = seg.time_index.path
    raw = bytearray(Path(path).read_bytes())
    entries = len(raw) // 12
    assert entries >= 3
    raw[(entries // 2) * 12 + 8:(entries // 2) * 12 + 12] = (10_000).to_bytes(4, "big")   # offset 10000
    Path(path).write_bytes(bytes(raw))
    seg = _reopen(tmp_path)
    try:
        seg.sanity_check()                                   # Kafka's check looks at the last entry only
        with pytest.raises(CorruptIndexError, match="Time index"):
            check_index_against_log(seg)
    finally:
        seg.close()


def test_a_small_segment_preallocates_small_indexes_and_a_default_one_kafkas_size(tmp_path):
    """Issue 18: a roll of a 100-byte segment mapped two 10 MiB indexes (5-25 ms a roll)."""
    from engine.config import LogConfig
    from engine.segment import LogSegment, index_bytes_needed

    tiny = LogSegment.open(str(tmp_path), 0, LogConfig.from_props({"internal.segment.bytes": "100"}))
    assert os.path.getsize(tiny.offset_index.path) <= 4096
    assert os.path.getsize(tiny.time_index.path) <= 4096
    default = LogSegment.open(str(tmp_path), 1000, LogConfig.from_props({}))
    assert default.offset_index.max_index_size == LogConfig.from_props({}).segment_index_bytes
    # a segment never holds more batches (each at least 61 bytes) than its indexes have room for
    for segment_bytes in (14, 100, 8192, 1 << 20):
        room = index_bytes_needed(segment_bytes, 10 << 20) // 12
        assert room >= segment_bytes // 61 + 2
    tiny.close()
    default.close()
