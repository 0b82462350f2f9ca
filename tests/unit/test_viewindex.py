"""ViewIndex: sparse floor lookups and, against engine.views.render, exact rendering positions."""

from __future__ import annotations

import itertools
import os
from bisect import bisect_right

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.views.index as view_index_module
from engine.clock import ManualClock
from engine.log import Log
from engine.topic import TopicPartition
from engine.views.index import SegmentViews, ViewIndex, attach, view_index
from engine.views.render import render_jsonl, render_text
from tests.helpers import make_config


def test_first_batch_always_indexed_and_totals_accumulate():
    vi = ViewIndex(100)
    assert vi.floor_by_text(0) == (100, 0, 0, 0)
    vi.append(100, 0, 30, 300, 110, indexed=False, batch_size=500)
    vi.append(110, 500, 20, 200, 115, indexed=False, batch_size=400)
    vi.append(115, 900, 10, 100, 120, indexed=True, batch_size=300)
    assert len(vi) == 2
    assert (vi.text_size, vi.json_size, vi.record_count, vi.next_offset, vi.log_size) == (60, 600, 20, 120, 1200)
    assert vi.floor_by_text(0) == (100, 0, 0, 0)
    assert vi.floor_by_text(49) == (100, 0, 0, 0)
    assert vi.floor_by_text(50) == (115, 900, 50, 500)
    assert vi.floor_by_json(499) == (100, 0, 0, 0)
    assert vi.floor_by_json(10_000) == (115, 900, 50, 500)
    assert vi.floor_by_offset(114) == (100, 0, 0, 0)
    assert vi.floor_by_offset(115) == (115, 900, 50, 500)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 400), st.integers(0, 4000), st.booleans()),
                min_size=1, max_size=60),
       st.integers(0, 30_000))
def test_floor_lookups_match_brute_force(batches, probe):
    vi = ViewIndex(0)
    entries: list[tuple[int, int, int, int]] = []
    offset = position = text = json = 0
    for count, text_size, json_size, indexed in batches:
        if indexed or not entries:
            entries.append((offset, position, text, json))
        vi.append(offset, position, text_size, json_size, offset + count, indexed, batch_size=100)
        offset += count
        position += 100
        text += text_size
        json += json_size
    for column, lookup in ((2, vi.floor_by_text), (3, vi.floor_by_json), (0, vi.floor_by_offset)):
        keys = [e[column] for e in entries]
        i = bisect_right(keys, probe) - 1
        assert lookup(probe) == (entries[i] if i >= 0 else (0, 0, 0, 0))
    assert (vi.text_size, vi.json_size, vi.next_offset) == (text, json, offset)


VALUES = [b"plain", "unicode \u00e9\u4e2d".encode(), b"\xff\xfe binary", None, b'quote " and \\ slash',
          b"tab\tcontrol\x01", b""]


def _segment_records(segment):
    out = []
    for pos, header, buf, off in segment.batches_with_bytes(0):
        out.extend(segment.validate_and_decode(buf, off, header, pos))
    return out


@pytest.mark.parametrize("keyed", [False, True])
def test_positions_equal_real_rendering_lengths(tmp_path, keyed, monkeypatch):
    # as dense as the offset index (the mount's default spacing is 64 KiB), so every
    # offset index entry's position is checked below
    monkeypatch.setattr(view_index_module, "VIEW_INDEX_INTERVAL_BYTES", 0)
    clock = ManualClock()
    config = make_config(internal_segment_bytes=3_000, index_interval_bytes=256)
    log = Log.load(str(tmp_path / "views-3"), config, clock=clock)
    attach(log)
    for i in range(60):
        values = [VALUES[(i + j) % len(VALUES)] for j in range(1 + i % 9)]
        keys = [b"k%d" % j if j % 3 else "\u00fc".encode() for j in range(len(values))] if keyed else None
        log.append_values(values, keys)
        clock.sleep(7)
    assert log.num_segments > 2

    def check(segment):
        vi = view_index(segment)
        records = _segment_records(segment)
        assert vi.text_size == len(render_text(records))
        assert vi.json_size == len(render_jsonl(records, "views", 3, 1))
        assert vi.next_offset == segment.next_offset
        assert vi.record_count == len(records)
        assert len(vi) >= max(segment.offset_index.entries, 1)
        for n in range(len(vi)):
            offset, log_pos, text_pos, json_pos = vi._entry(n)
            before = [r for r in records if r.offset < offset]
            assert text_pos == len(render_text(before))
            assert json_pos == len(render_jsonl(before, "views", 3, 1))
            assert segment.translate_offset(offset).position == log_pos

    for segment in log.segments.values():
        maintained = segment.attachment.index     # maintained on append by the observer, not by a scan
        assert maintained.log_size == segment.size
        check(segment)
        assert segment.attachment.index is maintained
    log.close()
    reloaded = Log.load(str(tmp_path / "views-3"), config, clock=clock, had_clean_shutdown=True)
    for segment in reloaded.segments.values():
        assert segment.attachment is None  # loaded from disk: built lazily
        check(segment)                     # built by one scan
    reloaded.close()


def test_blocks_of_lines_keep_the_view_index_exact(tmp_path):
    """Log.append_text_lines tells the observer the sizes of its views without splitting the lines: plain
    blocks by arithmetic, the others (escapes, UTF-8, binary) line by line."""
    from engine.records import compiled

    assert compiled.KERNELS is not None
    clock = ManualClock()
    log = Log.load(str(tmp_path / "views-3"), make_config(internal_segment_bytes=60_000), clock=clock)
    attach(log)
    for i in range(20):
        lines = [VALUES[(i + j) % len(VALUES)] or b"%d" % j for j in range(300 + i)]
        if i % 2:
            lines = [b"plain line %d" % j for j in range(400 + i)]
        log.append_text_lines(b"".join(line + b"\n" for line in lines))
        clock.sleep(3)
    assert log.num_segments > 2
    for segment in log.segments.values():
        vi = segment.attachment.index          # maintained on append by the observer, not by a scan
        records = _segment_records(segment)
        assert vi.log_size == segment.size
        assert vi.text_size == len(render_text(records))
        assert vi.json_size == len(render_jsonl(records, "views", 3, 1))
        assert (vi.next_offset, vi.record_count) == (segment.next_offset, len(records))
    log.close()


def test_lazy_index_catches_up_with_batches_appended_without_sizes(tmp_path):
    from engine.records import encode_values
    clock = ManualClock()
    log = Log.load(str(tmp_path / "t-0"), make_config(), clock=clock)
    attach(log)
    log.append_values([b"a", b"bb"])
    log.append_batch(encode_values(0, [b"ccc", None], clock.now))     # not seen by the observer: falls behind
    log.append_values([b"dddd"])
    vi = view_index(log.active_segment)
    assert vi.text_size == len(b"a\nbb\nccc\n\ndddd\n")
    assert vi.next_offset == 5
    assert vi.record_count == 5
    log.close()


def test_multi_batch_append_counts_records_not_offsets(tmp_path):
    from engine.records import Record, encode_records
    from engine.segment import LogSegment
    segment = LogSegment.open(str(tmp_path), 0, make_config(), ManualClock(), topic_partition=TopicPartition("t", 0))
    first = [Record(0, 5, b"a", b"x"), Record(7, 6, b"b", None)]          # a compacted batch with a hole
    second = [Record(10, 9, b"c", b"yz")]
    data = encode_records(first) + encode_records(second)
    segment.append(10, 9, 10, data)
    assert segment.attachment is None       # the segment itself derives nothing from what it stores
    vi = view_index(segment)
    views = segment.attachment
    assert isinstance(views, SegmentViews)
    assert views.index is vi
    assert view_index(segment) is vi                                      # scanned once, then kept
    assert (vi.record_count, vi.next_offset, vi.log_size) == (3, 11, len(data))
    assert vi.text_size == len(render_text(first + second))
    assert vi.json_size == len(render_jsonl(first + second, "t", 0, 0))
    segment.close()


def test_view_index_exact_under_concurrent_appends_and_lookups(tmp_path):
    import threading
    config = make_config(index_interval_bytes=128)
    log = Log.load(str(tmp_path / "c-0"), config, clock=ManualClock())
    for i in range(50):
        log.append_values([b"before-%d" % i] * 3)
    log.close()
    log = Log.load(str(tmp_path / "c-0"), config, clock=ManualClock(), had_clean_shutdown=True)
    segment = log.active_segment
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            vi = view_index(segment)
            totals = vi.totals
            seen.append(totals)
            assert vi.floor_by_text(totals.text_size)[2] <= totals.text_size

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(300):
        log.append_values([b"during-%d" % i, "\u00e9".encode()])
    stop.set()
    thread.join()
    records = _segment_records(segment)
    vi = view_index(segment)
    assert vi.text_size == len(render_text(records))
    assert vi.json_size == len(render_jsonl(records, "c", 0, 1))
    assert all(a.text_size <= b.text_size for a, b in itertools.pairwise(seen))      # sizes only grow
    log.close()


_fields = st.one_of(st.none(), st.binary(max_size=20), st.sampled_from([b"plain", b'q"uote', "\u00e9".encode()]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 3), st.integers(-3, 3), _fields, _fields,
                                   st.lists(st.tuples(st.text(max_size=4), _fields), max_size=2)),
                         min_size=1, max_size=12), min_size=1, max_size=12),
       st.sampled_from([0, 1]))
def test_rebuilt_index_equals_rendering_of_any_producer_batches(tmp_path_factory, batches, ts_type):
    """The rebuild scan (columns + arithmetic sizes) against the renderings of decoded records.

    Batches as another producer or the cleaner writes them: offset gaps,
    per-record timestamps, keys, headers, nulls; appended without sizes so
    the index is built by the scan alone.
    """
    from engine.records import Record, TimestampType, decode_batch, encode_records
    from engine.segment import LogSegment

    directory = str(tmp_path_factory.mktemp("scan") / "views-3")
    os.makedirs(directory)
    segment = LogSegment.open(directory, 0, make_config(index_interval_bytes=64))
    offset, expected = 0, []
    for fields in batches:
        records = []
        for gap, ts_delta, key, value, headers in fields:
            records.append(Record(offset, 1_700_000_000_000 + ts_delta, key, value, tuple(headers)))
            offset += gap
        batch = encode_records(records, timestamp_type=TimestampType(ts_type))
        segment.append(records[-1].offset, max(r.timestamp for r in records), records[-1].offset, batch)
        expected.extend(decode_batch(batch))
    vi = view_index(segment)
    assert (vi.text_size, vi.json_size) == (len(render_text(expected)),
                                            len(render_jsonl(expected, "views", 3, ts_type)))
    assert vi.record_count == len(expected)
    assert vi.next_offset == offset - gap + 1
    for n in range(len(vi)):
        first, _, text_pos, json_pos = vi._entry(n)
        before = [r for r in expected if r.offset < first]
        assert (text_pos, json_pos) == (len(render_text(before)), len(render_jsonl(before, "views", 3, ts_type)))
    segment.close()
