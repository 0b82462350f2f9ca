"""Log on real directories: append, read, roll, flush, truncate, ListOffsets, kafka-python interop."""

from __future__ import annotations

import os
import threading

import pytest
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

from engine.clock import ManualClock
from engine.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogDirFullError,
    OffsetOutOfRangeError,
    ReadOnlyError,
    RecordTooLargeError,
)
from engine.log import Log
from engine.records import decode_batch, iter_batches
from engine.segment import LogSegment
from tests.helpers import make_config, small_tmpfs, tree_snapshot

T0 = 1_700_000_000_000


def open_log(tmp_path, clock=None, name="t-0", **overrides) -> Log:
    return Log.load(str(tmp_path / name), make_config(**overrides), clock=clock or ManualClock(T0))


def values_for(start: int, n: int) -> list[bytes]:
    return [b"value-%d" % i for i in range(start, start + n)]


def append_batches(log: Log, batches: int, size: int, clock: ManualClock | None = None, tick: int = 0) -> None:
    """``batches`` batches of ``size`` unkeyed values (``values_for``, from value-0 on), the ``clock`` moved
    ``tick`` ms after each."""
    for i in range(batches):
        log.append_values(values_for(i * size, size))
        if clock is not None:
            clock.sleep(tick)


def test_append_and_read_round_trip(tmp_path):
    clock = ManualClock(T0)
    log = open_log(tmp_path, clock)
    assert log.append_values(values_for(0, 5)) == (0, 4)
    clock.sleep(10)
    assert log.append_values(values_for(5, 3), [b"a", None, b"c"]) == (5, 7)
    assert log.log_end_offset == 8
    records = log.read_records(0)
    assert [(r.offset, r.value) for r in records] == list(enumerate(values_for(0, 8)))
    assert [r.timestamp for r in records] == [T0] * 5 + [T0 + 10] * 3       # LogAppendTime
    assert [r.key for r in records[5:]] == [b"a", None, b"c"]
    assert log.read_records(6, 1)[0].value == b"value-6"
    info = log.read(5, 1 << 20)
    assert [r.offset for r in decode_batch(info.records)] == [5, 6, 7]
    assert log.read(8, 1000).records == b""                                  # at the log end: empty
    with pytest.raises(OffsetOutOfRangeError):
        log.read(9, 1000)
    with pytest.raises(OffsetOutOfRangeError):
        log.read_records(-1)
    limited = log.read(0, 1 << 20, max_offset=5)
    assert [r.offset for b in [limited.records] for r in decode_batch(b)] == [0, 1, 2, 3, 4]
    assert len(list(iter_batches(limited.records))) == 1
    log.close()


def test_rolls_on_size_and_time(tmp_path):
    clock = ManualClock(T0)
    log = open_log(tmp_path, clock, internal_segment_bytes=1000, segment_ms=60_000)
    append_batches(log, 20, 10)
    assert log.num_segments > 3
    bases = list(log.segments.keys())
    for segment in list(log.segments.values())[:-1]:
        assert segment.size <= 1000
        assert os.path.getsize(segment.offset_index.path) == segment.offset_index.entries * 8   # trimmed
    assert [r.offset for r in log.read_records(0)] == list(range(200))
    # time: a new batch 60 s after the active segment's first batch rolls it
    timed = open_log(tmp_path, clock, name="t-1", segment_ms=60_000)
    timed.append_values([b"a"])
    clock.sleep(60_000)
    timed.append_values([b"b"])
    assert timed.num_segments == 1
    clock.sleep(1)
    timed.append_values([b"c"])
    assert list(timed.segments.keys()) == [0, 2]
    assert bases[0] == 0
    log.close()
    timed.close()


def test_roll_when_index_is_full(tmp_path):
    log = open_log(tmp_path, segment_index_bytes=24, index_interval_bytes=1)
    for _ in range(6):
        log.append_values([b"x" * 50])
    assert log.num_segments >= 3
    assert all(s.offset_index.entries <= 3 for s in log.segments.values())
    assert [r.offset for r in log.read_records(0)] == list(range(6))
    log.close()


def test_explicit_roll_and_roll_flushes_old_segment(tmp_path):
    log = open_log(tmp_path)
    log.append_values(values_for(0, 4))
    assert log.recovery_point == 0
    segment = log.roll()
    assert segment.base_offset == 4
    assert log.active_segment is segment
    assert log.recovery_point == 4                    # the rolled segment was flushed
    log.append_values(values_for(4, 2))
    assert log.unflushed_messages == 2
    log.flush()
    assert log.recovery_point == 6
    assert log.unflushed_messages == 0
    log.close()


def test_flush_messages_triggers_flush(tmp_path):
    log = open_log(tmp_path, flush_messages=5)
    log.append_values(values_for(0, 3))
    assert log.recovery_point == 0
    log.append_values(values_for(3, 2))
    assert log.recovery_point == 5
    log.close()


def test_fetch_offset_by_timestamp(tmp_path):
    clock = ManualClock(T0)
    log = open_log(tmp_path, clock, internal_segment_bytes=600, index_interval_bytes=100)
    append_batches(log, 30, 3, clock, 100)
    assert log.num_segments > 2
    assert log.fetch_offset_by_timestamp(-2) == (0, -1)
    assert log.fetch_offset_by_timestamp(-1) == (90, -1)
    assert log.fetch_offset_by_timestamp(-3) == (87, T0 + 2900)
    assert log.fetch_offset_by_timestamp(T0) == (0, T0)
    assert log.fetch_offset_by_timestamp(T0 + 1250) == (39, T0 + 1300)
    assert log.fetch_offset_by_timestamp(T0 + 2000) == (60, T0 + 2000)
    assert log.fetch_offset_by_timestamp(T0 + 2901) is None
    log.close()


def test_truncate_to(tmp_path):
    log = open_log(tmp_path, internal_segment_bytes=500)
    append_batches(log, 10, 5)
    assert log.truncate_to(100) is False
    assert log.truncate_to(23) is True
    assert log.log_end_offset == 20                 # whole batches: the one holding 23 starts at 20
    assert [r.offset for r in log.read_records(0)] == list(range(20))
    assert all(b <= 20 for b in log.segments)
    assert log.append_values([b"again"]) == (20, 20)
    log.close()


def test_validation_refuses_without_appending(tmp_path):
    log = open_log(tmp_path, max_message_bytes=500)
    log.append_values([b"ok"])
    with pytest.raises(RecordTooLargeError, match="record at index 1 of the append to t-0 is 670 bytes"):
        log.append_values([b"small", b"x" * 600])
    log.append_values([b"y" * 200] * 5)          # a batch over the limit of records that each fit
    assert log.log_end_offset == 6
    compacted = open_log(tmp_path, name="c-0", cleanup_policy="compact")
    no_key = "Compacted topic cannot accept message without key in topic partition c-0"
    with pytest.raises(InvalidRecordError, match=no_key):
        compacted.append_values([b"v"])
    with pytest.raises(InvalidRecordError, match=no_key):
        compacted.append_values([b"v", b"w"], [b"k", None])
    assert compacted.append_values([b"v"], [b"k"]) == (0, 0)
    with pytest.raises(InvalidRecordError, match="Cannot append an empty batch to t-0"):
        log.append_values([])
    log.close()
    compacted.close()


@pytest.mark.parametrize("overrides", [{}, {"compression_type": "zstd"}, {"internal_segment_bytes": 20_000},
                                       {"max_message_bytes": 30_000}])
def test_append_text_lines_writes_what_append_values_writes(tmp_path, overrides):
    """A block of lines appended whole: the same batches as append_values of the lines, on the compiled path
    and on each path it hands over to (compression, a write over segment.bytes, over max.message.bytes)."""
    from engine.records import compiled

    assert compiled.KERNELS is not None
    lines = [b"line %05d " % i + b"z" * (i % 50) for i in range(2000)]
    block = b"".join(line + b"\n" for line in lines)
    by_lines, by_values = open_log(tmp_path, name="a-0", **overrides), open_log(tmp_path, name="b-0", **overrides)
    for target in (by_lines, by_values):
        target.append_values([b"first"])
    assert by_lines.append_text_lines(block) == by_values.append_values(lines) == (1, 2000)
    assert by_lines.append_text_lines(b"tiny\n") == by_values.append_values([b"tiny"]) == (2001, 2001)
    for a, b in zip(by_lines.segments.values(), by_values.segments.values(), strict=True):
        with open(a.log_path, "rb") as fa, open(b.log_path, "rb") as fb:
            assert fa.read() == fb.read()
    assert [r.value for r in by_lines.read_records(0)] == [b"first", *lines, b"tiny"]
    by_lines.close()
    by_values.close()


def test_append_text_lines_refuses_what_append_values_refuses(tmp_path):
    from engine.records import compiled

    assert compiled.KERNELS is not None
    log = open_log(tmp_path, max_message_bytes=5000)
    with pytest.raises(RecordTooLargeError, match="record at index 2 of the append to t-0 is 6070 bytes"):
        log.append_text_lines(b"a\nb\n" + b"x" * 6000 + b"\n" + b"y\n" * 3000)
    with pytest.raises(InvalidRecordError, match="The last line of an append to t-0 has no newline"):
        log.append_text_lines(b"a\n" * 3000 + b"b")
    with pytest.raises(InvalidRecordError, match="Cannot append an empty batch to t-0"):
        log.append_text_lines(b"")
    assert log.log_end_offset == 0
    compacted = open_log(tmp_path, name="c-0", cleanup_policy="compact")
    with pytest.raises(InvalidRecordError, match="Compacted topic cannot accept message without key"):
        compacted.append_text_lines(b"v\n" * 5000)
    assert compacted.log_end_offset == 0
    log.close()
    compacted.close()


def test_concurrent_readers_never_see_partial_batches(tmp_path):
    log = open_log(tmp_path, internal_segment_bytes=4000)
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            try:
                records = log.read_records(log.log_start_offset)
                offsets = [r.offset for r in records]
                assert offsets == list(range(len(offsets)))
            except Exception as exc:      # pragma: no cover - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    append_batches(log, 200, 4)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert log.log_end_offset == 800
    log.close()


def test_crc_failure_on_read_names_file_and_position(tmp_path):
    log = open_log(tmp_path)
    log.append_values(values_for(0, 5))
    log.append_values(values_for(5, 5))
    found = log.active_segment.translate_offset(5)
    assert found is not None
    second = found.position
    with open(log.active_segment.log_path, "r+b") as f:
        f.seek(second + 65)
        f.write(b"\x00\x00\x00")
    with pytest.raises(CorruptRecordError) as err:
        log.read_records(0)
    assert err.value.path == log.active_segment.log_path
    assert err.value.position == second
    log.close()


def test_kafka_python_reads_every_log_file(tmp_path):
    log = open_log(tmp_path, internal_segment_bytes=800, compression_type="gzip")
    for i in range(20):
        log.append_values(values_for(i * 4, 4), [b"k%d" % j for j in range(4)])
    log.flush()
    offsets = []
    for segment in log.segments.values():
        with open(segment.log_path, "rb") as f:
            records = MemoryRecords(f.read())
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc()
            for record in batch:
                offsets.append(record.offset)
                assert record.value == b"value-%d" % record.offset
    assert offsets == list(range(80))
    log.close()


def _kafka_python_batch(base_offset: int, compression: int, n: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(n):
        builder.append(i, timestamp=T0 + i, key=b"key-%d" % i, value=b"payload-%d" % (base_offset + i),
                       headers=[("h", b"v%d" % i)])
    buf = bytearray(builder.build())
    buf[0:8] = base_offset.to_bytes(8, "big")     # kafka-python builds at 0; the base offset is outside the CRC
    return bytes(buf)


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_batches_built_by_kafka_python(tmp_path, compression):
    # a Kafka-layout directory whose .log was written by someone else
    d = tmp_path / "ext-0"
    d.mkdir()
    with open(d / "00000000000000000000.log", "wb") as f:
        for base in range(0, 40, 10):
            f.write(_kafka_python_batch(base, compression, 10))
    log = Log.load(str(d), make_config(), clock=ManualClock(T0))
    assert log.log_end_offset == 40
    records = log.read_records(0)
    assert [r.value for r in records] == [b"payload-%d" % i for i in range(40)]
    assert records[13].headers == (("h", b"v3"),)
    assert records[13].timestamp == T0 + 3
    # and appended through append_batch, offsets assigned by the log
    assert log.append_batch(_kafka_python_batch(0, compression, 5)) == (40, 44)
    assert [r.key for r in log.read_records(40)] == [b"key-%d" % i for i in range(5)]
    assert log.fetch_offset_by_timestamp(T0 + 4) == (4, T0 + 4)
    log.close()


def test_replace_segments_swaps_cleaned_files(tmp_path):
    log = open_log(tmp_path, internal_segment_bytes=400)
    append_batches(log, 12, 4)
    old = list(log.segments.values())[:2]
    cleaned = LogSegment.open(log.dir, old[0].base_offset, log.config, log.clock, file_suffix=".cleaned")
    for segment in old:
        for _pos, header, buf, off in segment.batches_with_bytes(0):
            cleaned.append(header.last_offset, header.max_timestamp, header.last_offset,
                           bytes(buf[off:off + header.size]))
    cleaned.on_becoming_inactive_segment()
    expected = log.read_records(0)
    log.replace_segments([cleaned], old)
    assert log.segments[old[0].base_offset] is cleaned
    assert old[1].base_offset not in log.segments
    assert not cleaned.has_suffix(".cleaned")
    assert cleaned.log_path.endswith("0.log")
    assert all(s.has_suffix(".deleted") for s in old)
    assert log.read_records(0) == expected
    assert log.pending_deletion_segments == 2
    log.close()


def test_rename_dir_keeps_segments_usable(tmp_path):
    log = open_log(tmp_path, internal_segment_bytes=400)
    append_batches(log, 6, 4)
    log.rename_dir("t-0.abc-delete")
    assert log.dir.endswith("t-0.abc-delete")
    assert os.path.isdir(log.dir)
    assert all(os.path.dirname(s.log_path) == log.dir for s in log.segments.values())
    log.roll()
    assert len(log.read_records(0)) == 24
    log.delete()
    assert not os.path.exists(log.dir)


def test_log_dir_full_appends_nothing_partial(tmp_path):
    from engine.errors import LogDirFullError
    with small_tmpfs(tmp_path / "small", "192k") as mnt:
        log = Log.load(str(mnt / "full-0"), make_config(segment_index_bytes=4096, index_interval_bytes=64),
                       clock=ManualClock(T0))
        acknowledged: list[int] = []
        with pytest.raises(LogDirFullError):
            for i in range(10_000):
                first, last = log.append_values([b"%06d" % i + b"." * 300] * 3)
                acknowledged.extend(range(first, last + 1))
        end = log.log_end_offset
        assert end == len(acknowledged)
        assert [r.offset for r in log.read_records(0)] == acknowledged
        assert os.path.getsize(log.active_segment.log_path) == log.active_segment.size
        log.close()
        reloaded = Log.load(str(mnt / "full-0"), make_config(), clock=ManualClock(T0), recovery_point=0)
        assert reloaded.log_end_offset == end
        reloaded.close()


def _closed_log(tmp_path, clock) -> str:
    log = open_log(tmp_path, clock, internal_segment_bytes=600, index_interval_bytes=64)
    for i in range(40):
        clock.sleep(5)
        log.append_values(values_for(i * 3, 3), [b"k%d" % i, None, b"x"])
    assert log.num_segments > 2
    log.flush()
    log.close()
    return log.dir


def test_read_only_load_of_a_clean_log_writes_nothing_and_refuses_every_change(tmp_path):
    clock = ManualClock(T0)
    d = _closed_log(tmp_path, clock)
    with open(os.path.join(d, "00000000000000000000.log.cleaned"), "wb") as f:
        f.write(b"stray")                    # the read-write loader would delete this
    before = tree_snapshot(tmp_path)
    config = make_config(internal_segment_bytes=600, index_interval_bytes=64)
    log = Log.load(d, config, had_clean_shutdown=True, clock=clock, read_only=True, recovery_point=0)
    assert log.read_only
    assert log.log_end_offset == 120
    assert log.recovery_point == 120
    assert [r.value for r in log.read_records(0)] == values_for(0, 120)
    found = log.fetch_offset_by_timestamp(T0 + 50)
    assert found is not None
    assert found[0] == 27
    assert log.read(60, 1 << 20).records
    for change in (lambda: log.append_values([b"x"]), log.roll, log.flush, lambda: log.truncate_to(3),
                   log.delete_old_segments, lambda: log.maybe_increment_log_start_offset(5),
                   log.delete_expired_segment_files, lambda: log.rename_dir("t-0.x-delete"), log.delete,
                   lambda: log.truncate_fully_and_start_at(7), lambda: log.replace_segments([], []),
                   lambda: log.active_segment.append(200, T0, 200, b"x"),
                   lambda: log.active_segment.truncate_to(0), log.active_segment.recover):
        with pytest.raises(ReadOnlyError, match="read-only"):
            change()
    assert [r.value for r in log.read_records(0)] == values_for(0, 120)
    log.close()
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", ["unclean", "unclean torn tail", "missing index", "corrupt index",
                                    "invalid swap"])
def test_read_only_load_recovers_in_memory_and_writes_nothing(tmp_path, damage):
    """Issue 12: what read-write recovery would repair on disk, a read-only load repairs in memory only."""
    clock = ManualClock(T0)
    d = _closed_log(tmp_path, clock)
    first = os.path.join(d, "00000000000000000000")
    last = sorted(n for n in os.listdir(d) if n.endswith(".log"))[-1]
    expected = values_for(0, 120)
    if damage == "unclean torn tail":
        with open(os.path.join(d, last), "ab") as f:
            f.write(b"\0\0\0\0\0\0\0\x07\0\0\0\x50torn")   # a batch header cut short
    elif damage == "missing index":
        os.unlink(first + ".timeindex")
        os.unlink(first + ".index")
    elif damage == "corrupt index":
        with open(first + ".index", "ab") as f:
            f.write(b"\0" * 3)            # not a multiple of the entry size
    elif damage == "invalid swap":
        with open(os.path.join(d, "00000000000000000100.log.swap"), "wb") as f:
            f.write(os.urandom(5000))
    before = tree_snapshot(tmp_path)
    log = Log.load(d, make_config(internal_segment_bytes=600, index_interval_bytes=64),
                   had_clean_shutdown=not damage.startswith("unclean"), clock=clock, read_only=True)
    try:
        assert [r.value for r in log.read_records(0)] == expected
        assert log.log_end_offset == 120
        found = log.fetch_offset_by_timestamp(T0 + 50)
        assert found is not None
        assert found[0] == 27
        with pytest.raises(ReadOnlyError):
            log.append_values([b"x"])
    finally:
        log.close()
    assert tree_snapshot(tmp_path) == before
    # Read-write, the loader repairs it on disk and every record is still there.
    log = Log.load(d, make_config(internal_segment_bytes=600), had_clean_shutdown=not damage.startswith("unclean"),
                   clock=clock)
    assert [r.value for r in log.read_records(0)][:120] == expected
    log.close()


def test_write_larger_than_a_segment_becomes_consecutive_batches(tmp_path):
    log = open_log(tmp_path, internal_segment_bytes=2000)
    log.append_values([b"before"])
    values = [b"%05d" % i + b"v" * 95 for i in range(100)]        # ~12 KB: six segments' worth
    assert log.append_values(values) == (1, 100)
    assert [r.value for r in log.read_records(1)] == values
    assert log.num_segments >= 6
    for segment in log.segments.values():
        assert segment.size <= 2000
    with pytest.raises(RecordTooLargeError):
        log.append_values([b"ok", b"z" * 2000])                  # one record that fits no segment
    assert log.log_end_offset == 101
    log.close()


def test_split_write_failing_part_way_is_rolled_back(tmp_path, monkeypatch):
    log = open_log(tmp_path, internal_segment_bytes=2000)
    log.append_values([b"kept"])
    real_append = type(log.active_segment).append
    calls = []

    def fail_on_third(segment, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise LogDirFullError("No space left on device")
        return real_append(segment, *args, **kwargs)

    monkeypatch.setattr(type(log.active_segment), "append", fail_on_third)
    with pytest.raises(LogDirFullError):
        log.append_values([b"v" * 100] * 60)
    monkeypatch.undo()
    assert log.log_end_offset == 1
    assert [r.value for r in log.read_records(0)] == [b"kept"]
    assert log.append_values([b"after"]) == (1, 1)
    log.close()
