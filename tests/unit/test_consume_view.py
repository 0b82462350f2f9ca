"""ConsumerView: bounded at the log end at open, and byte position -> offset exact for every position."""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.topic import TopicPartition
from engine.views import ViewFormat
from engine.views.consume import open_consumer_view
from engine.views.render import json_sizes, text_sizes
from tests.helpers import log_of

values = st.one_of(st.none(), st.binary(max_size=30), st.text(max_size=30).map(str.encode))
writes = st.lists(st.lists(st.tuples(values, st.one_of(st.none(), st.binary(max_size=8))), min_size=1, max_size=8),
                  min_size=1, max_size=12)


@given(writes, st.integers(0, 200), st.sampled_from([ViewFormat.TEXT, ViewFormat.JSONL]), st.data())
@settings(max_examples=100, deadline=None)
def test_next_offset_at_is_the_first_record_not_wholly_given(batches, committed, fmt, data):
    with tempfile.TemporaryDirectory() as d:
        manager = LogManager(BrokerConfig.from_props({
            "log.dirs": d, "log.cleaner.enable": "false", "internal.log.segment.bytes": "300",
            "log.index.interval.bytes": "64"}))
        manager.startup()
        manager.create_topic("t", 1)
        log = log_of(manager, TopicPartition("t", 0))
        for batch in batches:
            log.append_values([v for v, _ in batch], [k for _, k in batch])
        view = open_consumer_view(log, fmt, committed)
        log.append_values([b"after the open"])                # beyond the view's end
        start = view.start_offset
        records = log.read_records(start)[:log.log_end_offset - 1 - start]
        sizes = text_sizes(records) if fmt is ViewFormat.TEXT else json_sizes(records, "t", 0, 1)
        assert view.size() == sum(sizes)
        assert view.read(0, 1 << 20) == view.read(0, view.size() + 100)
        assert view.end_offset == log.log_end_offset - 1
        ends = []
        total = 0
        for size in sizes:
            total += size
            ends.append(total)
        for position in [*data.draw(st.lists(st.integers(0, view.size()), max_size=20)), 0, view.size()]:
            expected = next((r.offset for r, end in zip(records, ends) if end > position), view.end_offset)
            assert view.next_offset_at(position) == expected, position
        view.close()
        manager.shutdown()


def test_position_at_the_end_of_a_released_and_deleted_segment(tmp_path):
    import gc

    manager = LogManager(BrokerConfig.from_props({
        "log.dirs": str(tmp_path), "log.cleaner.enable": "false", "internal.log.segment.bytes": "200",
        "log.segment.delete.delay.ms": "0"}))
    manager.startup()
    manager.create_topic("t", 1)
    log = log_of(manager, TopicPartition("t", 0))
    for i in range(20):
        log.append_values([b"value-%02d" % i])
    first_segment_end = log.segments.peekitem(1)[0]          # base offset of the second segment
    view = open_consumer_view(log, ViewFormat.TEXT, None)
    given = view.read(0, 9 * first_segment_end)               # exactly the first segment's records
    assert given.splitlines()[-1] == b"value-%02d" % (first_segment_end - 1)
    view.read(len(given), 1)                                  # the view moves on and releases the first slot
    manager.delete_records(TopicPartition("t", 0), first_segment_end + 1)
    manager.delete_expired_segment_files()
    gc.collect()
    assert view._slots[0].segment() is None                  # released, and the log let go of it too
    assert view.next_offset_at(len(given)) == first_segment_end
    view.close()
    manager.shutdown()
