"""engine.views.render: exact renderings, and sizes that equal them byte for byte."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.records import Record
from engine.views import render

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tests.helpers import JsonObject

TOPIC = "events.v1-x_y"

present_bytes = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(lambda s: s.encode("utf-8")),
    st.sampled_from([b"", b'"', b"\\", b"\x00", b"\x1f", b"\x7f", b"\xff", b"\xc3\xa9", b"\xe2\x80\xa8",
                     b"%s", b"%d", b"plain ascii", b'a "quoted" \\ value\n\t']),
)
byte_strings = st.one_of(st.none(), present_bytes)
headers = st.lists(st.tuples(st.text(max_size=8), byte_strings), max_size=3).map(tuple)


def decode_field(obj: JsonObject, name: str, encoding_name: str) -> bytes | None:
    """Independent inverse of the documented encoding (json module + base64)."""
    raw = obj[name]
    if raw is None:
        assert obj[encoding_name] is None
        return None
    if obj[encoding_name] == "base64":
        return base64.b64decode(raw, validate=True)
    assert obj[encoding_name] == "utf8"
    assert isinstance(raw, str)
    return raw.encode("utf-8")


def utf8(data: bytes | None) -> bool:
    try:
        return data is None or bool(data.decode("utf-8") or True)
    except UnicodeDecodeError:
        return False


def test_documented_line_format() -> None:
    record = Record(5, 1700000000000, None, b"hello", ())
    line = render.render_jsonl([record], "t", 0, 1)
    assert line == (b'{"topic":"t","partition":0,"offset":5,"timestamp":1700000000000,'
                    b'"timestampType":1,"key":null,"keyEncoding":null,"value":"hello","valueEncoding":"utf8",'
                    b'"headers":[]}\n')
    keyed = Record(6, 1, b"\xff", b"v", (("h", b"x"), ("n", None)))
    assert render.render_jsonl([keyed], "t", 3, 0) == (
        b'{"topic":"t","partition":3,"offset":6,"timestamp":1,"timestampType":0,'
        b'"key":"/w==","keyEncoding":"base64","value":"v","valueEncoding":"utf8",'
        b'"headers":[{"key":"h","value":"x","valueEncoding":"utf8"},{"key":"n","value":null,"valueEncoding":null}]}\n')


def test_text_rendering() -> None:
    records = [Record(0, 1, None, b"a", ()), Record(1, 1, None, None, ()), Record(2, 1, b"k", b"", ())]
    assert render.render_text(records) == b"a\n\n\n"
    assert render.render_text([]) == b""
    assert render.render_jsonl([], "t", 0, 1) == b""
    assert render.text_sizes(records) == [2, 1, 1]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(byte_strings, byte_strings, headers), max_size=12),
       st.integers(0, 2**40), st.integers(-1, 2**45), st.integers(0, 2**31 - 1), st.sampled_from([0, 1]))
def test_jsonl_round_trips_and_sizes_match(fields, first_offset, timestamp, partition, ts_type) -> None:
    records = [Record(first_offset + 3 * i, timestamp + i, key, value, hdrs)
               for i, (key, value, hdrs) in enumerate(fields)]
    rendered = render.render_jsonl(records, TOPIC, partition, ts_type)
    lines = rendered.split(b"\n")
    assert lines[-1] == b""
    assert len(lines) - 1 == len(records)
    assert render.json_sizes(records, TOPIC, partition, ts_type) == [len(line) + 1 for line in lines[:-1]]
    for record, line in zip(records, lines):
        obj = json.loads(line)
        # one schema for every row: the same members in the same order, whatever the record holds
        assert list(obj) == ["topic", "partition", "offset", "timestamp", "timestampType", "key", "keyEncoding",
                             "value", "valueEncoding", "headers"]
        assert obj["keyEncoding"] == (None if record.key is None else "utf8" if utf8(record.key) else "base64")
        assert obj["valueEncoding"] == (None if record.value is None else "utf8" if utf8(record.value)
                                        else "base64")
        assert (obj["topic"], obj["partition"], obj["offset"], obj["timestamp"], obj["timestampType"]) == (
            TOPIC, partition, record.offset, record.timestamp, ts_type)
        assert decode_field(obj, "key", "keyEncoding") == record.key
        assert decode_field(obj, "value", "valueEncoding") == record.value
        assert all(list(h) == ["key", "value", "valueEncoding"] for h in obj["headers"])
        decoded = tuple((h["key"], decode_field(h, "value", "valueEncoding")) for h in obj["headers"])
        assert decoded == record.headers
    text = render.render_text(records)
    assert len(text) == sum(render.text_sizes(records))
    assert text.count(b"\n") >= len(records)


@settings(max_examples=100, deadline=None)
@given(st.lists(byte_strings, max_size=30), st.booleans(), st.lists(byte_strings, min_size=30, max_size=30),
       st.integers(0, 10**12), st.integers(0, 2**45), st.integers(0, 1000))
def test_appended_view_sizes_equal_rendering(values, keyed, key_pool, first_offset, timestamp, partition) -> None:
    keys = key_pool[:len(values)] if keyed else None
    records = [Record(first_offset + i, timestamp, None if keys is None else keys[i], value, ())
               for i, value in enumerate(values)]
    expected = (len(render.render_text(records)), len(render.render_jsonl(records, TOPIC, partition, 1)))
    assert render.appended_view_sizes(values, keys, first_offset, timestamp, TOPIC, partition) == expected
    assert render.batch_view_sizes(records, TOPIC, partition, 1) == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(present_bytes.map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=30),
       st.integers(0, 10**12), st.integers(0, 2**45), st.integers(0, 1000))
def test_appended_lines_view_sizes_equal_rendering(values, first_offset, timestamp, partition) -> None:
    """The sizes of a block of lines appended whole (Log.append_text_lines) equal the rendered views."""
    block = b"".join(value + b"\n" for value in values)
    records = [Record(first_offset + i, timestamp, None, value, ()) for i, value in enumerate(values)]
    expected = (len(render.render_text(records)), len(render.render_jsonl(records, TOPIC, partition, 1)))
    assert render.appended_lines_view_sizes(block, len(values), first_offset, timestamp, TOPIC,
                                            partition) == expected


def test_appended_sizes_across_digit_boundaries() -> None:
    values = [b"x" * (i % 7) for i in range(2500)]
    for first in (0, 7, 95, 998, 9_999_000, 10**15 - 3):
        records = [Record(first + i, 1700000000000, None, v, ()) for i, v in enumerate(values)]
        assert render.appended_view_sizes(values, None, first, 1700000000000, "t", 0) == (
            len(render.render_text(records)), len(render.render_jsonl(records, "t", 0, 1)))


def test_render_values_matches_render_text() -> None:
    values = [b"a", None, b"", b"\xff\n"]
    records = [Record(i, 0, None, v, ()) for i, v in enumerate(values)]
    assert render.render_values(values) == render.render_text(records) == b"a\n\n\n\xff\n\n"


# --- column-wise rendering (the read and rebuild paths) ----------------------------------

def columns_of(records: list[Record]):
    """BatchColumns as records.decode_columns shapes them (None columns, a range when gap-free)."""
    from engine.records import BatchColumns
    offsets: Sequence[int] = [r.offset for r in records]
    if offsets and offsets[-1] - offsets[0] == len(offsets) - 1:
        offsets = range(offsets[0], offsets[0] + len(offsets))
    keys = [r.key for r in records]
    headers = [r.headers for r in records]
    return BatchColumns(offsets, [r.timestamp for r in records],
                        None if all(k is None for k in keys) else keys,
                        [r.value for r in records], headers if any(headers) else None)


plain_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30).map(str.encode)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), plain_values, byte_strings), st.one_of(plain_values, byte_strings),
                          st.one_of(st.just(()), headers), st.integers(1, 3), st.integers(0, 2)),
                max_size=25),
       st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 2**40), st.integers(-1, 2**45), st.integers(0, 1000), st.sampled_from([0, 1]))
def test_columns_render_and_sizes_equal_record_rendering(fields, keyed, with_headers, contiguous, first_offset,
                                                         timestamp, partition, ts_type) -> None:
    records, offset = [], first_offset
    for key, value, hdrs, gap, ts_delta in fields:
        records.append(Record(offset, timestamp + (0 if contiguous else ts_delta),
                              key if keyed else None, value, hdrs if with_headers else ()))
        offset += 1 if contiguous else gap
    columns = columns_of(records)
    expected = render.render_jsonl(records, TOPIC, partition, ts_type)
    assert render.render_jsonl_columns(columns, TOPIC, partition, ts_type) == expected
    assert render.columns_view_sizes(columns, TOPIC, partition, ts_type) == (
        len(render.render_text(records)), len(expected))


@settings(max_examples=60, deadline=None)
@given(st.lists(plain_values, min_size=1, max_size=40), st.booleans(), st.integers(0, 10**12),
       st.integers(0, 2**45))
def test_columns_fast_path_on_plain_ascii_batches(values, keyed, first_offset, timestamp) -> None:
    """The template path (no nulls, plain ASCII, no headers) against the per-record exact path."""
    keys = [b"k%d" % i for i in range(len(values))] if keyed else [None] * len(values)
    records = [Record(first_offset + i, timestamp, k, v, ()) for i, (k, v) in enumerate(zip(keys, values))]
    columns = columns_of(records)
    one_by_one = b"".join(render.render_jsonl_line(r, TOPIC, 7, 1) for r in records)
    assert render.render_jsonl_columns(columns, TOPIC, 7, 1) == one_by_one
    assert render.columns_view_sizes(columns, TOPIC, 7, 1) == (
        len(render.render_text(records)), len(one_by_one))


def test_columns_of_a_real_batch_render_like_records() -> None:
    from engine.records import decode_batch, decode_columns, encode_values
    values = [b"%08d value %%d \"q\"" % i if i % 5 == 0 else b"%08d plain" % i for i in range(300)]
    for batch in (encode_values(9_999_950, values, 1_700_000_000_000),
                  encode_values(0, [v for v in values if b'"' not in v], 5)):
        records = decode_batch(batch)
        columns = decode_columns(batch)
        assert render.render_jsonl_columns(columns, "t", 0, 1) == render.render_jsonl(records, "t", 0, 1)
        assert render.columns_view_sizes(columns, "t", 0, 1) == (
            len(render.render_text(records)), len(render.render_jsonl(records, "t", 0, 1)))
