"""AppendHandle (text lines, ``append``) without FUSE: lines in, record batches out, over a real LogManager on disk.

What ``cat file > MOUNT/t/0/append`` does, one ``write()`` call at a time:
line splitting across writes, keys and the null marker, Kafka's default
partitioner for keyed records and round-robin for unkeyed writes on a topic's
``append``, the offset replies, and all-or-nothing batches.  The records are
read back with kafka-python from the segment files (tests.conftest.kafka_records).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2

from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.errors import InvalidRecordError, RecordTooLargeError, UnknownTopicOrPartitionError
from engine.manager import LogManager
from engine.records import iter_batches
from engine.topic import TopicPartition
from logfs.appender import JSON_LINES, TEXT_LINES, AppendHandle, TopicRouter
from logfs.backend import EmbeddedBackend
from logfs.stats import MountStats
from tests.conftest import kafka_records
from tests.helpers import log_of


@pytest.fixture
def manager(tmp_path):
    m = LogManager(BrokerConfig.from_props({"log.dirs": str(tmp_path / "data"), "num.partitions": "3"}),
                   clock=ManualClock(1_700_000_000_000))
    m.startup()
    yield m
    m.shutdown()


def appender(manager: LogManager, topic: str = "t", partition: int | None = 0,
             router: TopicRouter | None = None, stats: MountStats | None = None, fmt=TEXT_LINES) -> AppendHandle:
    return AppendHandle(EmbeddedBackend(manager), topic, partition, fmt, router or TopicRouter(), stats or MountStats())


def values(manager: LogManager, topic: str = "t", partition: int = 0) -> list[bytes | None]:
    return [r.value for r in log_of(manager, TopicPartition(topic, partition)).read_records(0)]


def batch_sizes(manager: LogManager, topic: str = "t", partition: int = 0) -> list[int]:
    """Records per batch of a partition, in offset order (from the segment files)."""
    log = log_of(manager, TopicPartition(topic, partition))
    out = []
    for segment in log.segments.values():
        for _, header in iter_batches(segment.read_bytes(0, segment.size)):
            out.append(header.records_count)
    return out


def test_lines_split_across_writes_and_the_last_line_at_close(manager):
    manager.create_topic("t", 1)
    stats = MountStats()
    a = appender(manager, stats=stats)
    assert a.write(0, b"par") == 3
    assert values(manager) == []                        # a partial line is buffered, not a record
    assert a.write(3, b"tial\nsecond\nthi") == 15
    assert a.write(999, b"rd") == 2                     # any offset: always an append
    assert values(manager) == [b"partial", b"second"]
    a.flush()                                           # close(): the unterminated line is a record
    assert values(manager) == [b"partial", b"second", b"third"]
    assert a.read(0, 100) == b"0 1\n2 2\n"              # one "<first> <last>" reply per batch
    assert a.read(0, 100) == b""                        # replies are a stream: read once
    assert batch_sizes(manager) == [2, 1]
    assert (stats.appended_records, stats.append_batches) == (3, 2)
    assert stats.appended_bytes == len(b"partial\nsecond\nthird")   # every byte written, once flushed


def test_empty_lines_are_empty_records_and_crlf_is_kept(manager):
    manager.create_topic("t", 1)
    a = appender(manager)
    a.write(0, b"\n\na\r\n")
    assert values(manager) == [b"", b"", b"a\r"]       # console-producer semantics: bytes up to \n


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=30),
       cuts=st.lists(st.integers(0, 400), max_size=8), terminated=st.booleans())
def test_any_split_of_the_byte_stream_gives_the_same_records(tmp_path_factory, lines, cuts, terminated):
    manager = LogManager(BrokerConfig.from_props({"log.dirs": str(tmp_path_factory.mktemp("d"))}),
                         clock=ManualClock())
    manager.startup()
    try:
        manager.create_topic("t", 1)
        stream = b"\n".join(lines) + (b"\n" if terminated else b"")
        a = appender(manager)
        bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
        for lo, hi in itertools.pairwise(bounds):
            a.write(lo, stream[lo:hi])
        a.release()
        # An unterminated empty last line is no record (there is nothing to flush).
        expected = lines if terminated or lines[-1] else lines[:-1]
        assert values(manager) == expected
        log_dir = Path(log_of(manager, TopicPartition("t", 0)).dir)
        assert [r.value for r in kafka_records(log_dir)] == expected      # as Kafka's codec reads the files
    finally:
        manager.shutdown()


def test_keys_separator_and_null_marker_come_from_the_topic_config_at_each_write(manager):
    manager.create_topic("t", 1, {"parse.key": "true", "key.separator": ":", "null.marker": "NULL"})
    a = appender(manager)
    a.write(0, b"k1:v1\nk2:a:b\nNULL:v3\nk4:NULL\n:empty key\n")
    records = log_of(manager, TopicPartition("t", 0)).read_records(0)
    assert [(r.key, r.value) for r in records] == [
        (b"k1", b"v1"), (b"k2", b"a:b"), (None, b"v3"), (b"k4", None), (b"", b"empty key")]
    manager.alter_topic_config("t", {"parse.key": None, "null.marker": None})   # the open handle follows
    a.write(0, b"k5:v5\n")
    assert log_of(manager, TopicPartition("t", 0)).read_records(5)[0][2:4] == (None, b"k5:v5")


def test_a_line_without_separator_refuses_the_whole_write(manager):
    manager.create_topic("t", 1, {"parse.key": "true"})
    a = appender(manager)
    a.write(0, b"k0\tv0\n")
    with pytest.raises(InvalidRecordError, match=r"No key separator b'\\t' found on line 3 of t/0/append"):
        a.write(0, b"k1\tv1\nno separator\nk2\tv2\n")
    assert values(manager) == [b"v0"]                  # nothing of the refused write
    assert a.read(0, 100) == b"0 0\n"
    a.write(0, b"k3\tv3\n")                             # the handle is still usable, its buffer intact
    assert values(manager) == [b"v0", b"v3"]


def test_a_line_over_max_message_bytes_is_dropped_whole_and_nothing_else(manager):
    manager.create_topic("t", 1, {"max.message.bytes": "1000"})
    a = appender(manager)
    a.write(0, b"before\n" + b"x" * 600)               # the head of a long line is buffered
    with pytest.raises(RecordTooLargeError, match=r"A line of at least 1200 bytes written to t/0/append exceeds "
                                                  r"max\.message\.bytes=1000 of topic t; the line is dropped"):
        a.write(0, b"y" * 600)                           # refused before it is buffered without bound
    # not a retry, but the end of the refused line (a writer that took a short count and went on): the line's
    # rest is dropped with it and this write fails too, appending nothing
    with pytest.raises(RecordTooLargeError, match="The rest of an oversized line written to t/0/append was dropped"):
        a.write(0, b"after\n")
    a.write(0, b"next\n")                               # the line ended: the descriptor goes on
    a.flush()
    assert values(manager) == [b"before", b"next"]       # the oversized line, its head and its end, is gone


def test_a_refused_line_whose_end_comes_in_a_later_write_leaves_nothing(manager):
    """Python's unbuffered text file ignores a short count: ``print(long)`` is write(long), then write(newline)."""
    manager.create_topic("t", 1, {"max.message.bytes": "1000"})
    a = appender(manager)
    a.write(0, b"x" * 900)                               # the first request of the write(2): buffered
    with pytest.raises(RecordTooLargeError, match="the line is dropped"):
        a.write(0, b"x" * 200)                           # its second: refused; write(2) returns 900
    with pytest.raises(RecordTooLargeError):
        a.write(0, b"\n")                                # the newline ends the refused line: no empty record
    a.write(0, b"next\n")
    a.flush()
    assert values(manager) == [b"next"]
    b = appender(manager)
    b.write(0, b"x" * 900)
    with pytest.raises(RecordTooLargeError):
        b.write(0, b"x" * 200)                           # after a short request: the first of its write(2)
    b.flush()                                            # whose caller got the error: close() says it no more
    assert values(manager) == [b"next"]


def test_close_reports_a_refusal_only_when_its_write_got_a_short_count(manager):
    """The kernel splits a write(2) into 1 MiB requests; a refused later one gives its caller a short count."""
    manager.create_topic("u", 1)                         # max.message.bytes 1048588: a line over 1 MiB
    b = appender(manager, "u")
    b.write(0, b"x" * (1 << 20))                         # the first request of the write(2): buffered
    with pytest.raises(RecordTooLargeError):
        b.write(0, b"x" * 200)                           # its second: refused; write(2) returns 1 MiB
    with pytest.raises(RecordTooLargeError, match="close"):
        b.flush()                                        # nothing reported the refusal yet: close() does
    b.flush()
    assert values(manager, "u") == []


def test_unkeyed_writes_to_a_topic_go_round_robin_one_write_per_partition(manager):
    manager.create_topic("u", 3)
    router = TopicRouter()                               # shared by every handle of the topic
    first, second = appender(manager, "u", None, router), appender(manager, "u", None, router)
    for i in range(4):
        (first if i % 2 else second).write(0, b"w%d-a\nw%d-b\n" % (i, i))
    assert [values(manager, "u", p) for p in range(3)] == [
        [b"w0-a", b"w0-b", b"w3-a", b"w3-b"], [b"w1-a", b"w1-b"], [b"w2-a", b"w2-b"]]
    # A topic-level handle names the partition in its replies: "<partition> <first> <last>".
    assert second.read(0, 100) == b"0 0 1\n2 0 1\n"
    assert first.read(0, 100) == b"1 0 1\n0 2 3\n"


def test_keyed_records_go_where_kafkas_default_partitioner_puts_them(manager):
    manager.create_topic("k", 3, {"parse.key": "true"})
    keys = [b"key%d" % i for i in range(40)]
    a = appender(manager, "k", None)
    a.write(0, b"".join(k + b"\tv-" + k + b"\n" for k in keys))
    for p in range(3):
        got = [(r.key, r.value) for r in log_of(manager, TopicPartition("k", p)).read_records(0)]
        want = [(k, b"v-" + k) for k in keys if (murmur2(k) & 0x7FFFFFFF) % 3 == p]
        assert got == want, p                            # the lines' order kept within a partition
        assert batch_sizes(manager, "k", p) == ([len(want)] if want else [])   # one batch per partition
    replies = a.read(0, 1000).splitlines()
    assert sorted(int(line.split()[0]) for line in replies) == [p for p in range(3)
                                                              if any((murmur2(k) & 0x7FFFFFFF) % 3 == p for k in keys)]


def test_null_keys_of_a_keyed_write_share_one_round_robin_partition(manager):
    manager.create_topic("k", 3, {"parse.key": "true", "null.marker": "-"})
    router = TopicRouter()
    router.next_partition(3)                             # the next unkeyed choice is partition 1
    a = appender(manager, "k", None, router)
    a.write(0, b"-\ta\n-\tb\n-\tc\n")
    assert [values(manager, "k", p) for p in range(3)] == [[], [b"a", b"b", b"c"], []]
    assert a.read(0, 100) == b"1 0 2\n"


def test_an_oversized_keyed_record_refuses_the_write_before_any_partition_is_appended(manager):
    manager.create_topic("k", 3, {"parse.key": "true", "max.message.bytes": "100"})
    a = appender(manager, "k", None)
    lines = b"".join(b"key%d\tsmall\n" % i for i in range(10)) + b"big\t" + b"x" * 200 + b"\n"
    with pytest.raises(RecordTooLargeError,
                       match=r"A record of 200 bytes \(line 11 of k/append\) exceeds max.message.bytes=100 of topic k"):
        a.write(0, lines)
    assert [values(manager, "k", p) for p in range(3)] == [[], [], []]


def test_unknown_partition_and_topic(manager):
    manager.create_topic("t", 1)
    with pytest.raises(UnknownTopicOrPartitionError, match="No partition t-5"):
        appender(manager, "t", 5).write(0, b"x\n")
    with pytest.raises(UnknownTopicOrPartitionError):
        appender(manager, "nope", None).write(0, b"x\n")


def test_append_jsonl_has_the_same_oversized_line_protocol_and_line_numbers(manager):
    """One handle for both formats: ``append.jsonl`` drops an oversized line whole and goes on, as ``append`` does."""
    manager.create_topic("t", 1, {"max.message.bytes": "1000"})
    a = appender(manager, fmt=JSON_LINES)
    a.write(0, b'{"value":"before"}\n{"value":"' + b"x" * 5000)    # the head of a long line is buffered
    head = b"y" * 4000
    with pytest.raises(RecordTooLargeError, match=r"A line of at least 9010 bytes written to t/0/append\.jsonl"):
        a.write(0, head)                                 # over 4 x max.message.bytes + 4096: never fits
    with pytest.raises(RecordTooLargeError):
        a.write(0, head)                                 # the writer's retry of the refused request
    a.write(0, head + b'"}\n{"value":"after"}\n')        # the second retry: the rest of the line is dropped
    assert values(manager) == [b"before", b"after"]
    with pytest.raises(InvalidRecordError, match=r"Malformed JSON line 5 of t/0/append\.jsonl"):
        a.write(0, b"\n[]\n")                            # numbered in the stream: the dropped line counts


@pytest.mark.parametrize("partition", [0, None], ids=["append_text_lines", "append_values"])
def test_appends_through_the_backend_keep_the_view_index_exact_without_a_scan(manager, partition):
    """The views observer is attached where the backend's produce reaches the log (the one write path):
    the segment's view index covers every appended byte before anything read a view."""
    from engine.views.index import SegmentViews

    manager.create_topic("t", 1)
    a = appender(manager, partition=partition)
    a.write(0, b"first\nsecond\n")
    a.write(0, b"third\n")
    segment = log_of(manager, TopicPartition("t", 0)).active_segment
    assert isinstance(segment.attachment, SegmentViews)
    assert segment.attachment.index.log_size == segment.size > 0
    assert segment.attachment.index.totals.text_size == len(b"first\nsecond\nthird\n")
