"""engine.views: anchored, byte-addressable renderings of real logs."""

from __future__ import annotations

import gc
import json
import os
import random
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.clock import ManualClock
from engine.config import LogConfig
from engine.errors import OffsetOutOfRangeError
from engine.log import Log
from engine.views import LogView, ViewFormat, record_at, render

if TYPE_CHECKING:
    from engine.segment import LogSegment

TOPIC = "views"


def make_log(path, segment_bytes: int = 2048, index_interval: int = 100, **props) -> Log:
    directory = os.path.join(str(path), f"{TOPIC}-3")
    os.makedirs(directory, exist_ok=True)
    config = LogConfig.from_props({"internal.segment.bytes": str(segment_bytes),
                                   "index.interval.bytes": str(index_interval),
                                   **{k.replace("_", "."): str(v) for k, v in props.items()}})
    return Log.load(directory, config, clock=ManualClock())


def full_text(log: Log, start: int | None = None) -> bytes:
    """Independent expectation: each value plus a newline."""
    records = log.read_records(log.log_start_offset if start is None else start)
    return b"".join((r.value or b"") + b"\n" for r in records)


def full_json(log: Log, start: int | None = None) -> bytes:
    """One record at a time, so the batch-level fast paths are checked against the exact path."""
    records = log.read_records(log.log_start_offset if start is None else start)
    return b"".join(render.render_jsonl([r], TOPIC, 3, 1) for r in records)


def read_all(view: LogView, chunk: int) -> bytes:
    out: list[bytes] = []
    pos = 0
    while True:
        piece = view.read(pos, chunk)
        if not piece:
            return b"".join(out)
        out.append(piece)
        pos += len(piece)


def fill(log: Log, batches: int, rng: random.Random, special: bool = False, max_batch: int = 12) -> list[bytes]:
    values = []
    for b in range(batches):
        batch = []
        for i in range(rng.randint(1, max_batch)):
            value = b"v%d-%d " % (b, i) + b"x" * rng.randint(0, 60)
            if special and i % 3 == 0:
                value += b'"\\\n\t\xff\xc3\xa9'
            batch.append(value)
        log.append_values(batch)
        values.extend(batch)
    return values


@pytest.mark.parametrize("fmt", list(ViewFormat))
def test_sequential_reads_across_rolls_equal_full_rendering(tmp_path, fmt):
    log = make_log(tmp_path)
    values = fill(log, 120, random.Random(1), special=True)
    assert log.num_segments > 5
    expected = full_text(log) if fmt is ViewFormat.TEXT else full_json(log)
    view = LogView(log, fmt)
    assert view.size() == len(expected)
    for chunk in (37, 4096, 1 << 20):
        assert read_all(LogView(log, fmt), chunk) == expected
    if fmt is ViewFormat.JSONL:
        lines = expected.splitlines()
        assert len(lines) == len(values)
        assert json.loads(lines[5])["offset"] == 5
    else:
        assert expected.count(b"\n") == len(values) + sum(v.count(b"\n") for v in values)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_reads_equal_slices(tmp_path_factory, data):
    log = make_log(tmp_path_factory.mktemp("log"), segment_bytes=data.draw(st.sampled_from([900, 1500, 100000])))
    try:
        fill(log, data.draw(st.integers(1, 40)), random.Random(data.draw(st.integers(0, 100))), special=True)
        fmt = data.draw(st.sampled_from(list(ViewFormat)))
        start = data.draw(st.integers(log.log_start_offset, log.log_end_offset))
        expected = full_text(log, start) if fmt is ViewFormat.TEXT else full_json(log, start)
        view = LogView(log, fmt, start_offset=start)
        assert view.size() == len(expected)
        for _ in range(15):
            pos = data.draw(st.integers(0, len(expected) + 5))
            n = data.draw(st.integers(0, 3000))
            assert view.read(pos, n) == expected[pos:pos + n]
    finally:
        log.close()


def test_view_grows_while_appending_and_never_shows_partial_records(tmp_path):
    log = make_log(tmp_path, internal_segment_bytes=600)
    view = LogView(log, ViewFormat.TEXT)
    assert view.size() == 0
    assert view.read(0, 100) == b""
    seen = b""
    for i in range(50):
        log.append_values([b"line-%d" % i, b"second-%d" % i])
        size = view.size()
        assert size >= len(seen)
        seen += view.read(len(seen), size - len(seen))
        assert seen.endswith(b"\n")
    assert seen == full_text(log)
    assert log.num_segments > 3


def test_start_offset_in_the_middle_of_a_segment(tmp_path):
    log = make_log(tmp_path, internal_segment_bytes=100000, index_interval=50)
    fill(log, 30, random.Random(3))
    for start in (0, 1, 17, 100, log.log_end_offset - 1, log.log_end_offset):
        for fmt, expect in ((ViewFormat.TEXT, full_text), (ViewFormat.JSONL, full_json)):
            view = LogView(log, fmt, start_offset=start)
            assert read_all(view, 333) == expect(log, start)
    with pytest.raises(OffsetOutOfRangeError):
        LogView(log, ViewFormat.TEXT, start_offset=log.log_end_offset + 1)


def test_view_reads_on_after_its_segments_are_deleted(tmp_path):
    log = make_log(tmp_path, internal_segment_bytes=500, retention_bytes=600, file_delete_delay_ms=0)
    fill(log, 60, random.Random(4), max_batch=4)
    expected = full_text(log)
    view = LogView(log, ViewFormat.TEXT)
    first = view.read(0, 10)
    assert log.delete_old_segments() > 0
    log.delete_expired_segment_files(log.clock.milliseconds() + 1)
    assert log.log_start_offset > 0
    # the view still renders what it opened, byte for byte
    assert first + read_all_from(view, 10, 97) == expected
    # a new view starts at the new log start
    assert read_all(LogView(log, ViewFormat.TEXT), 4096) == full_text(log)


def read_all_from(view: LogView, pos: int, chunk: int) -> bytes:
    out = []
    while piece := view.read(pos, chunk):
        out.append(piece)
        pos += len(piece)
    return b"".join(out)


def test_view_releases_segments_it_read_past(tmp_path):
    log = make_log(tmp_path, internal_segment_bytes=400, retention_bytes=500, file_delete_delay_ms=0)
    fill(log, 60, random.Random(5), max_batch=4)
    view = LogView(log, ViewFormat.TEXT)
    held = view.held_segments()
    assert held == log.num_segments > 3
    deleted_paths = [seg.log_path for seg in list(log.segments.values())[:-2]]
    log.delete_old_segments()
    log.delete_expired_segment_files(log.clock.milliseconds() + 1)
    assert all(not os.path.exists(p) for p in deleted_paths)
    read_all(view, 64)
    assert view.held_segments() <= 1
    gc.collect()
    fd_targets = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")}
    # no descriptor of this process still points at a deleted segment (kernel shows "(deleted)")
    assert not [t for t in fd_targets if any(t.startswith(p) for p in deleted_paths)]


def test_single_segment_view(tmp_path):
    log = make_log(tmp_path, internal_segment_bytes=700)
    fill(log, 30, random.Random(6))
    for base, segment in list(log.segments.items()):
        view = LogView(log, ViewFormat.JSONL, segment=segment)
        records = [r for r in log.read_records(base) if r.offset < segment.next_offset]
        assert read_all(view, 50) == render.render_jsonl(records, TOPIC, 3, 1)


def test_record_at(tmp_path):
    log = make_log(tmp_path)
    fill(log, 10, random.Random(7))
    assert record_at(log, 4).offset == 4
    assert record_at(log, 4).value == log.read_records(4, 1)[0].value
    with pytest.raises(OffsetOutOfRangeError):
        record_at(log, log.log_end_offset)


def test_view_reads_what_it_opened_across_a_cleaner_swap(tmp_path):
    """Segments replaced by compacted copies: an open view renders the originals; new views the copies."""
    from engine.records import encode_records
    from engine.segment import LogSegment

    log = make_log(tmp_path, internal_segment_bytes=600)
    for i in range(40):
        log.append_values([b"value-%d" % i], [b"key-%d" % (i % 4)])
    before = full_text(log)
    view = LogView(log, ViewFormat.JSONL)
    json_before = full_json(log)
    head = view.read(0, 50)
    old = list(log.segments.values())[:-1]
    survivors = [r for r in log.read_records(0) if r.offset < old[-1].next_offset and r.offset % 4 == 3]
    cleaned = LogSegment.open(log.dir, old[0].base_offset, log.config, log.clock, file_suffix=".cleaned")
    cleaned.append(survivors[-1].offset, survivors[-1].timestamp, survivors[-1].offset,
                   encode_records(survivors))
    log.replace_segments([cleaned], old)
    log.delete_expired_segment_files(log.clock.milliseconds() + 10**9)
    assert head + read_all_from(view, 50, 211) == json_before
    after = read_all(LogView(log, ViewFormat.TEXT), 4096)
    assert after == full_text(log)
    assert len(after) < len(before)
    assert after.startswith(b"value-3\nvalue-7\n")


def test_tail_while_another_thread_appends(tmp_path):
    import threading

    log = make_log(tmp_path, internal_segment_bytes=1500)
    view = LogView(log, ViewFormat.TEXT)
    done = threading.Event()

    def producer():
        for i in range(300):
            log.append_values([b"%d-a" % i, b"%d-b" % i])
        done.set()

    thread = threading.Thread(target=producer)
    thread.start()
    seen, pos = [], 0
    while not (done.is_set() and pos == view.size()):
        piece = view.read(pos, 100)
        seen.append(piece)
        pos += len(piece)
    thread.join()
    text = b"".join(seen)
    assert text == full_text(log)
    assert text.split(b"\n")[:-1] == [b"%d-%s" % (i, s) for i in range(300) for s in (b"a", b"b")]


def _flip_value_byte(segment: LogSegment, batch_number: int) -> int:
    """Flip one bit inside a value of the ``batch_number``-th batch of ``segment``; its position."""
    position, header = list(segment.batches())[batch_number]
    target = position + header.size - 3           # the last value's last byte (then the header count)
    with open(segment.log_path, "r+b") as f:
        f.seek(target)
        byte = f.read(1)[0]
        f.seek(target)
        f.write(bytes([byte ^ 0x01]))
    return position


@pytest.mark.parametrize("fmt", list(ViewFormat))
@pytest.mark.parametrize("reload", [False, True])
def test_corrupt_batch_fails_the_read_naming_file_and_position(tmp_path, fmt, reload):
    import errno

    from engine.errors import CorruptRecordError

    log = make_log(tmp_path, internal_segment_bytes=1 << 20, index_interval=200)
    batches = [[b"batch %d value %d" % (b, i) for i in range(5)] for b in range(40)]
    for values in batches:
        log.append_values(values)
    expected = full_text(log) if fmt is ViewFormat.TEXT else full_json(log)
    segment = log.active_segment
    position = _flip_value_byte(segment, 25)
    if reload:     # a remount: the view index is rebuilt by a scan of the corrupt file
        log.close()       # a clean shutdown: no recovery pass, which would truncate the corrupt batch
        log = Log.load(log.dir, log.config, clock=ManualClock(), had_clean_shutdown=True)
        segment = log.active_segment
        assert segment.attachment is None
    view = LogView(log, fmt)
    # everything before the corrupt batch reads as before, sequentially and at random
    lines_before = 25 * 5
    good = b"".join(expected.splitlines(keepends=True)[:lines_before])
    assert read_all_until(view, len(good), 97) == good
    assert LogView(log, fmt).read(len(good) // 2, len(good) - len(good) // 2) == good[len(good) // 2:]
    # a read spanning it returns the good bytes before it (`cat` prints them) ...
    whole = LogView(log, fmt)
    assert whole.read(0, len(expected)) == good
    # ... and the corrupt batch itself fails, however it is reached
    for reader in (lambda: view.read(len(good), 4096), lambda: whole.read(len(good), len(expected)),
                   lambda: LogView(log, fmt).read(len(good) + 3, 10)):
        with pytest.raises(CorruptRecordError) as info:
            reader()
        assert info.value.path == segment.log_path
        assert info.value.position == position
        assert info.value.errno == errno.EIO
        assert segment.log_path in str(info.value)
        assert f"position {position}" in str(info.value)
    log.close()


def read_all_until(view: LogView, end: int, chunk: int) -> bytes:
    out, pos = [], 0
    while pos < end:
        piece = view.read(pos, min(chunk, end - pos))
        assert piece
        out.append(piece)
        pos += len(piece)
    return b"".join(out)


def _compacted_log(tmp_path) -> Log:
    # rolls only when the test says so; the cleaner may merge every cleanable segment into one
    return make_log(tmp_path, internal_segment_bytes=1 << 20, cleanup_policy="compact",
                    min_cleanable_dirty_ratio="0.01", file_delete_delay_ms=200)


def _clean_and_delete(tmp_path, log: Log) -> None:
    """One run of the real LogCleaner, then file.delete.delay.ms passes and the .deleted files go."""
    from engine.cleaner import LogCleaner
    from engine.config import BrokerConfig

    config = BrokerConfig.from_props({"log.dirs": str(tmp_path),
                                      "log.cleaner.dedupe.buffer.size": str(1 << 20)})
    clock = log.clock
    assert isinstance(clock, ManualClock)         # make_log's: the delay passes by hand
    assert LogCleaner(config, [str(tmp_path)], lambda: [log], clock).clean_once() is not None
    clock.sleep(201)
    assert log.delete_expired_segment_files() > 0
    gc.collect()                      # the replaced segment objects are gone for good


def test_cursor_resting_at_the_end_of_a_cleaned_away_segment_reads_on(tmp_path):
    """The tail -f ENOENT: a read ends exactly at the end of a just-rolled segment, from the cursor's
    chunk, so the view releases that segment; the cleaner replaces it and its files are deleted; the
    next sequential read must go on to the next segment without needing the released one."""
    log = _compacted_log(tmp_path)
    for i in range(12):
        log.append_values([b"a-%d" % i, b"b-%d" % i], [b"a", b"b"])
    view = LogView(log, ViewFormat.TEXT)
    end = view.size()
    head = view.read(0, end - 3)          # renders whole batches: the chunk reaches the segment's end
    log.roll()
    assert view.read(end - 3, 100) == b"11\n"     # served from the chunk; the view ends with the segment
    assert view.held_segments() == 1
    _clean_and_delete(tmp_path, log)
    log.append_values([b"after"], [b"c"])
    assert view.read(end, 100) == b"after\n"
    assert head + b"11\n" == b"".join(b"a-%d\nb-%d\n" % (i, i) for i in range(12))


@pytest.mark.parametrize("fmt", list(ViewFormat))
def test_view_continues_inside_a_cleaned_segment_that_merged_its_last_segment(tmp_path, fmt):
    """The cleaner merges the view's last (formerly active) segment with the next one into a segment
    with the same base offset: the view renders the survivors of the next one, none twice."""
    log = _compacted_log(tmp_path)
    for i in range(10):
        log.append_values([b"first-%d" % i], [b"k%d" % (i % 3)])
    view = LogView(log, fmt)
    seen = read_all(view, 4096)
    log.roll()
    for i in range(10):
        log.append_values([b"second-%d" % i], [b"k%d" % (i % 3)])
    log.roll()
    _clean_and_delete(tmp_path, log)
    assert list(log.segments) == [0, 20]          # one cleaned segment at the old base offset
    log.append_values([b"third"], [b"k0"])
    rest = read_all_from(view, len(seen), 7)
    expected_records = list(log.read_records(10))
    assert [r.value for r in expected_records] == [b"second-7", b"second-8", b"second-9", b"third"]
    if fmt is ViewFormat.TEXT:
        assert rest == b"second-7\nsecond-8\nsecond-9\nthird\n"
    else:
        assert rest == render.render_jsonl(expected_records, TOPIC, 3, 1)


def test_a_reader_idle_at_the_end_releases_what_it_read_past(tmp_path):
    """tail -f resting at the end of a view: when DeleteRecords moves the log start
    past everything it read and a roll starts a new segment, a read that finds
    nothing new must still let the deleted segment go (its disk space with it)."""
    log = make_log(tmp_path, internal_segment_bytes=400, file_delete_delay_ms=0)
    fill(log, 30, random.Random(7), max_batch=4)
    view = LogView(log, ViewFormat.TEXT)
    read_all(view, 64)
    end = view.size()
    log.roll()
    old = [seg.log_path for seg in list(log.segments.values())[:-1]]
    log.maybe_increment_log_start_offset(log.log_end_offset, "ClientRecordDeletion")
    log.delete_old_segments()
    log.delete_expired_segment_files(log.clock.milliseconds() + 1)
    assert all(not os.path.exists(p) for p in old)
    assert view.read(end, 64) == b""                 # nothing new: tail -f keeps waiting
    assert view.held_segments() == 1                 # only the new active segment
    gc.collect()
    fd_targets = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")}
    assert not [t for t in fd_targets if any(t.startswith(p) for p in old)]
