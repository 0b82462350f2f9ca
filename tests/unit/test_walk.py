"""The compiled walk of a records section (kernels.records_text / records_jsonl, engine.views.walk) against the
general Python decoder it stands in for, on random batches of every layout a producer writes.

Each batch is run twice, with the kernels and without (``compiled.KERNELS = None``: the general loops and
render's column functions, what the views rendered before the walk), and must give the same text view,
JSON lines and sizes byte for byte, or the same CorruptRecordError at the same position.
"""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import CorruptRecordError
from engine.records import HEADER_SIZE, Compression, compiled, decode_batch, decode_columns, decode_text, read_header
from engine.records.encode import _assemble
from engine.records.format import CONTROL_FLAG_MASK, TIMESTAMP_TYPE_MASK
from engine.records.varint import _zigzag_varint
from engine.views import render, walk

TOPIC, PARTITION = "t.x-1", 3

# keys and values: null, empty, ASCII, text with escapes and non-ASCII, bytes that are not UTF-8
_FIELD = st.one_of(st.none(), st.just(b""), st.binary(max_size=40), st.text(max_size=12).map(str.encode),
                   st.sampled_from([b'"\\\x00\x1f\x7f', b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
                                    b"\xe2\x82", b"caf\xc3\xa9", b"\xf0\x9f\x98\x80"]),
                   st.binary(min_size=200, max_size=600))
_HEADER_KEY = st.one_of(st.sampled_from([b"", b"h", b"traceparent", b"caf\xc3\xa9", b'"\n', b"\xff\xfe"]),
                        st.text(max_size=6).map(str.encode))       # b"\xff\xfe", not UTF-8: the decoder refuses
_HEADERS = st.lists(st.tuples(_HEADER_KEY, _FIELD), max_size=3)
_DELTA = st.one_of(st.integers(-3, 70), st.integers(-2 ** 31, 2 ** 31 - 1))
_TS_DELTA = st.one_of(st.integers(-3, 70), st.integers(-2 ** 40, 2 ** 40))


def _section(records: list[tuple[int, int, bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]]) -> bytes:
    """A records section written field by field, any deltas (negative ones too) and raw header keys."""
    out = []
    for ts_delta, offset_delta, key, value, headers in records:
        parts = [b"\x00", _zigzag_varint(ts_delta), _zigzag_varint(offset_delta)]
        for field in (key, value):
            parts += [b"\x01"] if field is None else [_zigzag_varint(len(field)), field]
        parts.append(_zigzag_varint(len(headers)))
        for name, header_value in headers:
            parts += [_zigzag_varint(len(name)), name]
            parts += [b"\x01"] if header_value is None else [_zigzag_varint(len(header_value)), header_value]
        body = b"".join(parts)
        out += [_zigzag_varint(len(body)), body]
    return b"".join(out)


_RECORDS = st.lists(st.tuples(_TS_DELTA, _DELTA, _FIELD, _FIELD, _HEADERS), max_size=25)
_BATCH = st.tuples(_RECORDS, st.integers(0, 2 ** 50), st.integers(-1, 2 ** 45), st.booleans(),
                   st.sampled_from(list(Compression)), st.booleans(),
                   st.sampled_from([None, None, None, 2 ** 63 - 1, -2 ** 63, 2 ** 62]))    # a last timestamp delta


def _batch(records, base_offset, base_timestamp, log_append_time, codec, control, extreme=None) -> bytes:
    if records and extreme is not None:       # a varlong of 10 bytes; base + delta may leave 64 bits
        records = [*records[:-1], (extreme, *records[-1][1:])]
    attributes = (TIMESTAMP_TYPE_MASK if log_append_time else 0) | (CONTROL_FLAG_MASK if control else 0)
    return _assemble(base_offset, attributes, max(len(records) - 1, 0), base_timestamp, base_timestamp + 7,
                     len(records), _section(records), int(codec))


def _outcome(call, *args):
    try:
        result = call(*args)
    except CorruptRecordError as exc:
        return ("error", str(exc), exc.position)
    return bytes(result) if isinstance(result, (bytes, bytearray)) else result


def _python(call, *args):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(compiled, "KERNELS", None)
        return _outcome(call, *args)


def _check(batch: bytes) -> None:
    header = read_header(batch, 0)
    text = _outcome(decode_text, batch, 0, header)
    assert text == _python(decode_text, batch, 0, header)
    lines = _outcome(walk.batch_jsonl, batch, 0, header, TOPIC, PARTITION)
    assert lines == _python(walk.batch_jsonl, batch, 0, header, TOPIC, PARTITION)
    sizes = _outcome(walk.batch_view_sizes, batch, 0, header, TOPIC, PARTITION)
    assert sizes == _python(walk.batch_view_sizes, batch, 0, header, TOPIC, PARTITION)
    if isinstance(lines, bytes) and isinstance(text, bytes):
        assert sizes == (len(text), len(lines), lines.count(b"\n"))
    # the readers that need objects (Spark, the cleaner, dump-log): kernels.records_columns
    columns = _outcome(decode_columns, batch, 0, header)
    assert columns == _python(decode_columns, batch, 0, header)
    assert _outcome(decode_batch, batch, 0, header) == _python(decode_batch, batch, 0, header)
    with_control = partial(decode_batch, include_control=True)
    assert _outcome(with_control, batch, 0, header) == _python(with_control, batch, 0, header)


def test_the_walk_renders_what_render_renders():
    """One batch of each kind of field, held to render's functions directly (not only to the fallback)."""
    records = [(0, 0, b"k", b'v\x00"', [(b"h", b"x"), (b"h2", None)]), (-5, 2, None, None, []),
               (9, 5, b"\xff", b"caf\xc3\xa9", [])]
    batch = _batch(records, 10, 1000, False, Compression.NONE, False)
    header = read_header(batch, 0)
    expected = render.render_jsonl_columns(decode_columns(batch, 0, header), TOPIC, PARTITION, 0)
    assert walk.batch_jsonl(batch, 0, header, TOPIC, PARTITION) == expected
    assert compiled.KERNELS is not None
    assert compiled.KERNELS.records_jsonl(batch[HEADER_SIZE:], 3, 10, 1000, False, 0,
                                          render.compiled_pieces(TOPIC, PARTITION, 0), True) == expected
    assert bytes(decode_text(batch, 0, header)) == b'v\x00"\n\ncaf\xc3\xa9\n'
    _check(batch)


@settings(max_examples=300, deadline=None)
@given(_BATCH)
def test_the_walk_is_the_general_decoder_on_random_batches(batch):
    _check(_batch(*batch))


@settings(max_examples=300, deadline=None)
@given(_BATCH, st.data())
def test_a_damaged_batch_is_the_same_error_at_the_same_place(batch, data):
    """Bytes of the records section changed, cut or added: the walk answers what the decoder answers."""
    records, base_offset, base_timestamp, log_append_time, _, control, extreme = batch
    whole = _batch(records, base_offset, base_timestamp, log_append_time, Compression.NONE, control, extreme)
    section = bytearray(whole[HEADER_SIZE:])
    how = data.draw(st.sampled_from(["flip", "cut", "add", "count"]))
    count = len(records)
    if how == "flip" and section:
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(section) - 1))
            section[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, section[at] ^ 1]))
    elif how == "cut" and section:
        del section[data.draw(st.integers(0, len(section) - 1)):]
    elif how == "add":
        section += data.draw(st.binary(min_size=1, max_size=4))
    else:
        count = data.draw(st.integers(-2, count + 2))
    attributes = (TIMESTAMP_TYPE_MASK if log_append_time else 0) | (CONTROL_FLAG_MASK if control else 0)
    damaged = _assemble(base_offset, attributes, max(count - 1, 0), base_timestamp, base_timestamp + 7, count,
                        bytes(section), 0)
    _check(damaged)


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x80" * 12, b"\x02\x00", b"\x0e\x00\x00\x00\x01\x7f"])
def test_hostile_sections_are_refused_without_reading_past_them(data):
    """Every length is checked against the record and the section: the walk says None, never reads on."""
    kernels = compiled.KERNELS
    assert kernels is not None
    pieces = render.compiled_pieces(TOPIC, PARTITION, 0)
    for count in (1, 2, 2 ** 40):
        # a copy that ends exactly at the section: a read past it would be a read past the buffer
        assert kernels.records_text(memoryview(bytearray(data)), count) is None
        assert kernels.records_jsonl(bytes(data), count, 0, 0, False, 0, pieces, True) is None
