"""What the record codec's property tests (tests/unit/test_records*.py) draw: timestamps, codecs, fields."""

from __future__ import annotations

from hypothesis import strategies as st

from engine.records import Compression
from engine.records.encode import _assemble
from engine.records.format import CONTROL_FLAG_MASK, TIMESTAMP_TYPE_MASK
from engine.records.varint import _zigzag_varint

TS = 1_700_000_000_000
CODECS = list(Compression)


def field_strategies(max_size: int, max_key_chars: int, max_headers: int) -> tuple[
        st.SearchStrategy[bytes], st.SearchStrategy[bytes | None],
        st.SearchStrategy[list[tuple[str, bytes | None]]]]:
    """(blobs, nullable blobs, header lists): keys and values of up to ``max_size`` bytes, and up to
    ``max_headers`` headers of keys up to ``max_key_chars`` characters and nullable values."""
    blobs = st.binary(max_size=max_size)
    nullable = st.none() | blobs
    return blobs, nullable, st.lists(st.tuples(st.text(max_size=max_key_chars), nullable), max_size=max_headers)


# -- raw batches: every layout a producer writes, written field by field (tests/unit/test_walk.py,
#    tests/unit/test_spark_columns.py)

# keys and values: null, empty, ASCII, text with escapes and non-ASCII, bytes that are not UTF-8
RAW_FIELD = st.one_of(st.none(), st.just(b""), st.binary(max_size=40), st.text(max_size=12).map(str.encode),
                      st.sampled_from([b'"\\\x00\x1f\x7f', b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
                                       b"\xe2\x82", b"caf\xc3\xa9", b"\xf0\x9f\x98\x80"]),
                      st.binary(min_size=200, max_size=600))
RAW_HEADER_KEY = st.one_of(st.sampled_from([b"", b"h", b"traceparent", b"caf\xc3\xa9", b'"\n', b"\xff\xfe"]),
                           st.text(max_size=6).map(str.encode))       # b"\xff\xfe", not UTF-8: the decoder refuses
RAW_HEADERS = st.lists(st.tuples(RAW_HEADER_KEY, RAW_FIELD), max_size=3)
RAW_DELTA = st.one_of(st.integers(-3, 70), st.integers(-2 ** 31, 2 ** 31 - 1))
RAW_TS_DELTA = st.one_of(st.integers(-3, 70), st.integers(-2 ** 40, 2 ** 40))


#: (timestamp delta, offset delta, key, value, headers) of one record of a raw records section
RawRecord = tuple[int, int, bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]


def raw_section(records: list[RawRecord]) -> bytes:
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


RAW_RECORDS = st.lists(st.tuples(RAW_TS_DELTA, RAW_DELTA, RAW_FIELD, RAW_FIELD, RAW_HEADERS), max_size=25)
RAW_BATCH = st.tuples(RAW_RECORDS, st.integers(0, 2 ** 50), st.integers(-1, 2 ** 45), st.booleans(),
                      st.sampled_from(list(Compression)), st.booleans(),
                      st.sampled_from([None, None, None, 2 ** 63 - 1, -2 ** 63, 2 ** 62]))    # a last timestamp delta


def raw_batch(records, base_offset, base_timestamp, log_append_time, codec, control, extreme=None) -> bytes:
    if records and extreme is not None:       # a varlong of 10 bytes; base + delta may leave 64 bits
        records = [*records[:-1], (extreme, *records[-1][1:])]
    attributes = (TIMESTAMP_TYPE_MASK if log_append_time else 0) | (CONTROL_FLAG_MASK if control else 0)
    return _assemble(base_offset, attributes, max(len(records) - 1, 0), base_timestamp, base_timestamp + 7,
                     len(records), raw_section(records), int(codec))
