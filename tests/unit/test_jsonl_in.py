"""JSON lines in: parsing is the exact inverse of the records.jsonl rendering, and appends are all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import BrokerConfig
from engine.errors import InvalidRecordError, RecordTooLargeError
from engine.jsonl_in import JsonRecord, append_json_records, parse_jsonl_line, parse_jsonl_lines
from engine.manager import LogManager
from engine.records import Record
from engine.topic import TopicPartition
from engine.views.render import render_jsonl, render_jsonl_line
from tests.helpers import log_of

if TYPE_CHECKING:
    from pathlib import Path

# bytes that are often valid UTF-8 (rendered as strings, escapes included) and often not (base64)
data = st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40).map(str.encode))
headers = st.lists(st.tuples(st.text(max_size=10), data), max_size=4).map(tuple)
records = st.builds(Record, offset=st.integers(0, 2**62), timestamp=st.integers(-1, 2**62), key=data, value=data,
                    headers=headers)


@given(records, st.text(alphabet="abcXYZ019._-", min_size=1, max_size=20), st.integers(0, 1000),
       st.sampled_from([0, 1]))
@settings(max_examples=500, deadline=None)
def test_parse_inverts_render(record: Record, topic: str, partition: int, timestamp_type: int) -> None:
    line = render_jsonl_line(record, topic, partition, timestamp_type)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1                                # one record, one line
    parsed = parse_jsonl_line(line)
    assert parsed == JsonRecord(record.key, record.value, record.headers, record.timestamp, partition)


@given(st.lists(records, min_size=1, max_size=20))
@settings(max_examples=100, deadline=None)
def test_parse_inverts_the_batch_rendering(batch: list[Record]) -> None:
    rendered = render_jsonl(batch, "t", 0, 1)
    parsed = parse_jsonl_lines(rendered.splitlines())
    assert [(p.key, p.value, p.headers, p.timestamp) for p in parsed] == \
        [(r.key, r.value, r.headers, r.timestamp) for r in batch]


@pytest.mark.parametrize("line", [
    b'{"topic":"t","partition":0,"offset":3,"timestamp":5,"timestampType":1,"key":null,"keyEncoding":null,'
    b'"value":"x","valueEncoding":"utf8","headers":[]}',
    b'{"key":null,"keyEncoding":"utf8","value":"eA==","valueEncoding":"base64","headers":null,"timestamp":5}',
    b'{"value":"x","timestamp":5}',
    b'{"value":"x","valueEncoding":null,"timestamp":5,"headers":[]}',
])
def test_the_rendered_form_and_the_short_forms_are_one_record(line: bytes) -> None:
    assert parse_jsonl_line(line) == JsonRecord(None, b"x", (), 5, None if b"partition" not in line else 0)


@pytest.mark.parametrize(("line", "message"), [
    (b"not json", "not JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"value": 5}', "value must be a string"),
    (b'{"value": "***", "valueEncoding": "base64"}', "not valid base64"),
    (b'{"key": "a", "keyEncoding": "hex"}', "keyEncoding must be"),
    (b'{"value": "a", "timestamp": 1.5}', "timestamp must be an integer"),
    (b'{"value": "a", "timestamp": true}', "timestamp must be an integer"),
    (b'{"value": "a", "timestamp": -2}', "out of range"),
    (b'{"value": "a", "headers": {"k": "v"}}', "headers must be a list"),
    (b'{"value": "a", "headers": ""}', "headers must be a list"),
    (b'{"value": "a", "headers": 0, "keyEncoding": null}', "headers must be a list"),
    (b'{"value": "a", "valueEncoding": "UTF-8"}', "valueEncoding must be"),
    (b'{"value": "a", "headers": [{"value": "v"}]}', "headers\\[0\\].key must be a string"),
    (b'{"value": "a", "partition": -1}', "partition -1 is out of range"),
    (b'{"valu": "x"}', 'unknown member "valu"'),
    (b'{"key": "k", "message": "m", "host": "h"}', 'unknown member "host", "message"'),
    (b'{"value": "a", "headers": [{"key": "h", "val": "v"}]}', 'unknown member "val" in headers\\[0\\]'),
])
def test_malformed_lines_name_their_line_number(line: bytes, message: str) -> None:
    good = b'{"value": "fine"}'
    with pytest.raises(InvalidRecordError, match=f"line 12 of the write: .*{message}"):
        parse_jsonl_lines([good, line], first_line_number=11)


def test_members_may_be_missing() -> None:
    assert parse_jsonl_line(b"{}") == JsonRecord(None, None, (), None, None)


def _log(tmp_path: Path, **overrides: str):
    props = {"log.dirs": str(tmp_path / "data"), "log.cleaner.enable": "false", **overrides}
    manager = LogManager(BrokerConfig.from_props(props))
    manager.startup()
    manager.create_topic("t", 1)
    return manager, log_of(manager, TopicPartition("t", 0))


def test_append_keeps_timestamps_headers_and_nulls(tmp_path: Path) -> None:
    manager, log = _log(tmp_path)
    parsed = [JsonRecord(b"k", None, (("h", b"\xff"), ("n", None)), 5, None),
              JsonRecord(None, b"v", (), None, 3)]
    assert append_json_records(log, parsed, now_ms=777) == (0, 1)
    assert log.read_records(0) == [Record(0, 5, b"k", None, (("h", b"\xff"), ("n", None))),
                                   Record(1, 777, None, b"v", ())]
    manager.shutdown()


def test_a_write_larger_than_a_segment_is_split_and_atomic(tmp_path: Path) -> None:
    manager, log = _log(tmp_path, **{"internal.log.segment.bytes": "2000", "message.max.bytes": "1000"})
    parsed = [JsonRecord(None, b"x" * 100, (), i, None) for i in range(100)]
    assert append_json_records(log, parsed) == (0, 99)
    assert [r.timestamp for r in log.read_records(0)] == list(range(100))
    assert len(log.segments) > 5
    with pytest.raises(RecordTooLargeError):
        append_json_records(log, [*parsed, JsonRecord(None, b"y" * 5000, (), 0, None)])
    assert log.log_end_offset == 100                     # nothing of the refused write
    manager.shutdown()
