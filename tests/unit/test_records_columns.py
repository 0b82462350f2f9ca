"""engine.records.decode_columns and decode_key_columns: the same records as decode_batch, as columns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import CorruptRecordError
from engine.records import (
    HEADER_SIZE,
    Compression,
    Record,
    TimestampType,
    decode_batch,
    decode_columns,
    decode_key_columns,
    encode_records,
    encode_values,
    read_header,
)
from tests.record_strategies import CODECS, TS, field_strategies

if TYPE_CHECKING:
    from engine.records.decode import BatchColumns

blobs, nullable, header_lists = field_strategies(max_size=120, max_key_chars=6, max_headers=2)


def as_records(columns: BatchColumns) -> list[tuple[object, ...]]:
    """Columns back to decode_batch's tuples, filling the columns that are None."""
    n = len(columns.values)
    for column in (columns.offsets, columns.timestamps, columns.keys, columns.headers):
        assert column is None or len(column) == n
    keys = columns.keys if columns.keys is not None else [None] * n
    headers = columns.headers if columns.headers is not None else [()] * n
    return list(zip(columns.offsets, columns.timestamps, keys, columns.values, headers))


def check_equal(batch: bytes) -> None:
    records = decode_batch(batch)
    columns = decode_columns(batch)
    assert as_records(columns) == [tuple(r) for r in records]
    # None columns mean exactly "all keys null" / "no headers"
    assert (columns.keys is None) == all(r.key is None for r in records)
    assert (columns.headers is None) == (not any(r.headers for r in records))
    if records and records[-1].offset - records[0].offset == len(records) - 1:
        assert isinstance(columns.offsets, range)


@settings(max_examples=80, deadline=None)
@given(st.lists(nullable, min_size=1, max_size=80), st.integers(0, 2 ** 40), st.sampled_from(CODECS),
       st.booleans())
def test_values_batches_equal_decode_batch(values, base_offset, codec, keyed) -> None:
    keys = [b"k%d" % i if i % 3 else None for i in range(len(values))] if keyed else None
    check_equal(encode_values(base_offset, values, TS, keys, compression=codec))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(-5, 5), nullable, nullable, header_lists),
                min_size=1, max_size=30),
       st.sampled_from(list(TimestampType)))
def test_general_batches_equal_decode_batch(fields, timestamp_type) -> None:
    records, offset = [], 100
    for gap, ts_delta, key, value, headers in fields:
        offset += gap
        records.append(Record(offset, TS + ts_delta, key, value, tuple(headers)))
    check_equal(encode_records(records, timestamp_type=timestamp_type))


@pytest.mark.parametrize(("count", "size"), [(64, 10), (65, 10), (8192, 3), (8193, 3), (300, 200)])
def test_fast_path_across_offset_delta_widths(count, size) -> None:
    values = [bytes([97 + i % 26]) * (size + i % 2) for i in range(count)]
    batch = encode_values(7, values, TS)
    columns = decode_columns(batch)
    assert columns.offsets == range(7, 7 + count)
    assert columns.keys is None
    assert columns.headers is None
    check_equal(batch)


def test_corrupt_records_section_raises_like_decode_batch() -> None:
    batch = bytearray(encode_values(0, [b"a" * 20, b"b" * 20, b"c" * 20], TS))
    batch[HEADER_SIZE + 30] = 0xFF          # a varint that runs on: no longer a valid record
    with pytest.raises(CorruptRecordError):
        decode_batch(bytes(batch))
    with pytest.raises(CorruptRecordError):
        decode_columns(bytes(batch))


# ---- decode_key_columns: what the log cleaner reads of a batch

key_column_records = st.tuples(
    st.integers(1, 300),                                        # offset gap from the previous record
    st.integers(-5000, 5000),                                   # timestamp delta
    st.one_of(st.none(), st.binary(max_size=80)),               # key (up to 2-byte varint lengths)
    st.one_of(st.none(), st.binary(max_size=9000)),             # value (records of 1 to 3 length bytes)
    st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=4))), max_size=2))


@settings(max_examples=60, deadline=None)
@given(st.lists(key_column_records, min_size=1, max_size=12), st.sampled_from(list(Compression)[:3]),
       st.integers(0, 2**40))
def test_key_columns_read_what_decode_batch_reads(specs, compression, base_offset):
    """Offsets, keys and tombstones of any batch, uncompressed or not, equal the full decoder's."""
    records, offset = [], base_offset
    for gap, ts, key, value, headers in specs:
        offset += gap
        records.append(Record(offset, 1_600_000_000_000 + ts, key, value, tuple(headers)))
    batch = b"junk" + encode_records(records, compression=compression)
    header = read_header(batch, 4)
    offsets, keys, tombstones = decode_key_columns(batch, 4, header)
    decoded = decode_batch(batch, 4, header)
    assert offsets == [r.offset for r in decoded] == [r.offset for r in records]
    assert keys == [r.key for r in decoded]
    assert tombstones == [i for i, r in enumerate(decoded) if r.value is None]


def test_key_columns_refuse_a_record_that_overruns_its_length():
    batch = bytearray(encode_records([Record(0, 0, b"key", b"value"), Record(1, 0, b"k2", b"v2")]))
    batch[HEADER_SIZE + 4] = 0x7E            # first key length 3 -> 63: past its record's end
    with pytest.raises(CorruptRecordError, match="invalid record structure in the batch at offset 0"):
        decode_key_columns(bytes(batch), 0, read_header(batch))
    batch = bytearray(encode_records([Record(0, 0, b"key", b"value")]))
    batch[HEADER_SIZE] = 0x03                # record length -2
    with pytest.raises(CorruptRecordError, match="invalid record structure"):
        decode_key_columns(bytes(batch), 0, read_header(batch))
