"""The ``logfs`` source's Arrow batches (logfs.spark.columns, built from the compiled walk's spans) against the
columns it built before (``decode_columns``: a bytes object per key and value, ``pa.array`` of the lists), on
random batches of every layout a producer writes, read from real segment files laid out as the mount serves
them (``<topic>/<p>/state`` and ``<topic>/<p>/segments/<base>.log``).

``reference_read`` below is the reader as it was (the batch walk of ``SegmentRangeReader._read_segment`` and
its old column builder, verbatim but for the relisting, which these files never need): every row, every
field, every null and every error must be the same.
"""

from __future__ import annotations

import bisect
import os
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import CorruptRecordError
from engine.files import segment_file_name
from engine.records import (
    Compression,
    Record,
    TimestampType,
    compiled,
    decode_columns,
    decode_spans,
    encode_records,
    encode_values,
    read_header,
)
from engine.records.encode import _assemble
from engine.records.reader import read_chunks
from logfs.spark.columns import ColumnBuilder, headers_arrow_type
from logfs.spark.options import SourceOptions
from logfs.spark.planning import OffsetRangePartition
from logfs.spark.read_segments import read_range
from tests.record_strategies import RAW_BATCH, raw_batch, raw_section

TOPIC = "t"


class _OldColumnBuilder:
    """The source's column builder before the spans (logfs/spark/read_segments.py at b06925e)."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.timestamp_types: list[int] = []
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.any_key = False
        self.headers: list[list[dict[str, Any]] | None] = []

    def add(self, columns, lo: int, hi: int, timestamp_type: int) -> None:
        count = hi - lo
        whole = lo == 0 and hi == len(columns.values)
        self.offsets.extend(columns.offsets if whole else columns.offsets[lo:hi])
        self.timestamps.extend(columns.timestamps if whole else columns.timestamps[lo:hi])
        self.values.extend(columns.values if whole else columns.values[lo:hi])
        self.timestamp_types.extend([timestamp_type] * count)
        if columns.keys is not None:
            if not self.any_key:
                self.keys = [None] * (len(self.offsets) - count)
                self.any_key = True
            self.keys.extend(columns.keys[lo:hi])
        elif self.any_key:
            self.keys.extend([None] * count)
        if self.include_headers:
            if columns.headers is None:
                self.headers.extend([None] * count)
            else:
                self.headers.extend([{"key": k, "value": v} for k, v in record] if record else None
                                    for record in columns.headers[lo:hi])

    def flush(self, topic: str, partition: int) -> pa.RecordBatch | None:
        count = len(self.offsets)
        if count == 0:
            return None
        arrays = [
            pa.array(self.keys, pa.binary()) if self.any_key else pa.nulls(count, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.timestamp_types, pa.int32()),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.include_headers:
            arrays.append(pa.array(self.headers, headers_arrow_type()))
            names.append("headers")
        return pa.RecordBatch.from_arrays(arrays, names=names)


def reference_read(path: str, start: int, until: int, include_headers: bool) -> pa.RecordBatch | None:
    """The old reader's records of offsets [start, until) of one segment file, as one Arrow batch."""
    builder = _OldColumnBuilder(include_headers)
    next_offset = start
    if next_offset >= until:          # SegmentRangeReader.batches opens no segment
        return None
    with open(path, "rb") as f:
        raw = f.read()

    def read(position: int, size: int) -> bytes:
        return raw[position:position + size]

    try:
        for chunk in read_chunks(read, 0, None, 4 << 20, path=path, verify_crc=True):
            for pos, header in chunk.batches:
                if header.next_offset <= next_offset:
                    continue
                if header.base_offset >= until:
                    return builder.flush(TOPIC, 0)
                try:
                    columns = decode_columns(chunk.buf, pos, header)
                except CorruptRecordError as exc:
                    raise exc.at(path, chunk.position + pos) from None
                offsets = columns.offsets
                if offsets:
                    if type(offsets) is range:
                        lo = max(0, next_offset - offsets[0])
                        hi = min(len(offsets), until - offsets[0])
                    else:
                        lo = bisect.bisect_left(offsets, next_offset)
                        hi = bisect.bisect_left(offsets, until)
                    if hi > lo:
                        builder.add(columns, lo, hi, header.timestamp_type)
                next_offset = header.next_offset
                if next_offset >= until:
                    return builder.flush(TOPIC, 0)
        return builder.flush(TOPIC, 0)
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"{exc.detail} while reading {TOPIC}-0", path=path, position=exc.position) from exc


def lay_out(root: str, batches: list[bytes]) -> str:
    """``batches`` as the one segment of partition 0 of TOPIC under ``root``; the segment's path."""
    directory = os.path.join(root, TOPIC, "0")
    os.makedirs(os.path.join(directory, "segments"), exist_ok=True)
    end = read_header(batches[-1]).next_offset if batches else 0
    with open(os.path.join(directory, "state"), "wb") as f:
        f.write(orjson.dumps({"log_start_offset": 0, "log_end_offset": end, "segments": [{"base_offset": 0}]}))
    path = os.path.join(directory, "segments", segment_file_name(0, ".log"))
    with open(path, "wb") as f:
        f.write(b"".join(batches))
    return path


def _outcome(call, *args) -> Any:
    """A table of what ``call`` yields, or the error it raised (a CorruptRecordError's text and position)."""
    try:
        result = call(*args)
        batches = [result] if isinstance(result, pa.RecordBatch) else [] if result is None else list(result)
    except CorruptRecordError as exc:
        return ("corrupt", str(exc), exc.position)
    except (OverflowError, pa.ArrowInvalid, ValueError):
        return ("out of range",)     # an offset or timestamp outside 64 bits, or one Arrow cannot convert
    return batches


def _new_read(root: str, start: int, until: int, include_headers: bool) -> list[pa.RecordBatch]:
    opts = SourceOptions.parse({"path": root, "assign": orjson.dumps({TOPIC: [0]}).decode(),
                                "includeHeaders": str(include_headers).lower()})
    return list(read_range(opts, OffsetRangePartition(TOPIC, 0, start, until)))


def check_same_rows(root: str, batches: list[bytes], start: int, until: int, include_headers: bool) -> None:
    path = lay_out(root, batches)
    old = _outcome(reference_read, path, start, until, include_headers)
    new = _outcome(_new_read, root, start, until, include_headers)
    if isinstance(old, tuple) or isinstance(new, tuple):
        assert new == old
        return
    assert sum(b.num_rows for b in new) == sum(b.num_rows for b in old)
    if not old:
        return
    old_table, new_table = pa.Table.from_batches(old), pa.Table.from_batches(new)
    assert new_table.schema == old_table.schema
    assert new_table.equals(old_table)
    assert new_table.to_pylist() == old_table.to_pylist()      # field by field, as Python values
    for name in ("key", "value"):     # the same bytes, the same nulls
        new_column, old_column = new_table[name].combine_chunks(), old_table[name].combine_chunks()
        assert new_column.to_pylist() == old_column.to_pylist()
        assert new_column.null_count == old_column.null_count


def _sequenced(drawn: list[tuple[Any, ...]]) -> list[bytes]:  # Any: hypothesis draws of RAW_BATCH
    """Raw batches one after the other in offset order: each one's base offset the previous one's next."""
    batches, base = [], 0
    for records, _, base_timestamp, log_append_time, codec, control, extreme in drawn:
        batch = raw_batch(records, base, base_timestamp, log_append_time, codec, control, extreme)
        batches.append(batch)
        base = read_header(batch).next_offset
    return batches


@settings(max_examples=200, deadline=None)
@given(st.lists(RAW_BATCH, min_size=1, max_size=4), st.booleans(), st.data())
def test_the_arrow_batches_are_the_old_ones_on_random_batches(tmp_path_factory, drawn, include_headers, data):
    """Every producer's layout: own offset and timestamp deltas (negative, 10-byte varlongs, past 64 bits),
    null, empty and binary keys and values, headers with null values and keys that are not UTF-8, every
    codec, control batches, LogAppendTime; a random offset range of them."""
    batches = _sequenced(drawn)
    end = read_header(batches[-1]).next_offset
    start = data.draw(st.integers(0, end + 1))
    until = data.draw(st.integers(start, end + 2))
    check_same_rows(str(tmp_path_factory.mktemp("mount")), batches, start, until, include_headers)


records_strategy = st.lists(
    st.tuples(st.integers(1, 3), st.integers(-5, 5), st.none() | st.binary(max_size=30),
              st.none() | st.binary(max_size=300),
              st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=8)), max_size=2)),
    min_size=1, max_size=40)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(records_strategy, st.sampled_from(list(Compression)), st.sampled_from(list(TimestampType)),
                          st.booleans()), min_size=1, max_size=5),
       st.booleans(), st.data())
def test_the_arrow_batches_are_the_old_ones_on_encoded_batches(tmp_path_factory, specs, include_headers, data):
    """Batches the engine encodes (encode_records, gaps as the cleaner leaves; encode_values, logfs's own), each
    codec and timestamp type, read across batch boundaries."""
    batches, offset = [], 0
    for fields, codec, timestamp_type, own in specs:
        if own:
            values = [value for _, _, _, value, _ in fields]
            batches.append(encode_values(offset, values, 1_700_000_000_000, compression=codec))
            offset += len(values)
            continue
        records = []
        for gap, ts_delta, key, value, headers in fields:
            records.append(Record(offset, 1_700_000_000_000 + ts_delta, key, value, tuple(headers)))
            offset += gap
        batches.append(encode_records(records, compression=codec, timestamp_type=timestamp_type))
    start = data.draw(st.integers(0, offset))
    until = data.draw(st.integers(start, offset + 1))
    check_same_rows(str(tmp_path_factory.mktemp("mount")), batches, start, until, include_headers)


def test_the_builder_takes_the_compiled_walk_and_flushes_across_batches(tmp_path, monkeypatch):
    """Many batches in one flush, and a flush per batch: the same rows; the walk is the compiled one."""
    batches, offset = [], 0
    for i in range(30):
        records = [Record(offset + j, 1_700_000_000_000 + j, None if j % 4 else b"k%d" % j,
                          None if j % 7 == 3 else b"v" * (i + j), (("h", b"x"),) if j % 5 == 0 else ())
                   for j in range(50)]
        batches.append(encode_records(records, compression=list(Compression)[i % 5]))
        offset += 50
    assert compiled.KERNELS is not None
    spans = decode_spans(batches[0], 0, with_headers=True)
    # an uncompressed batch is walked where it lies: the spans point into a view of the read buffer
    assert isinstance(spans.data, memoryview)
    assert spans.data.obj is batches[0]
    assert spans.table.shape == (8, 50)
    assert spans.headers is not None
    assert spans.headers.shape == (4, 10)
    assert isinstance(decode_spans(batches[1], 0).data, bytes)       # a compressed one: its decompressed bytes
    check_same_rows(str(tmp_path / "one"), batches, 0, offset, True)
    check_same_rows(str(tmp_path / "part"), batches, 77, offset - 33, True)
    monkeypatch.setattr("logfs.spark.read_segments._FLUSH_SECTION_BYTES", 1)      # one Arrow batch per batch
    check_same_rows(str(tmp_path / "many"), batches, 10, offset, True)
    assert len(_new_read(str(tmp_path / "many"), 10, offset, True)) == 30


def test_without_the_extension_the_rows_are_the_same(tmp_path, monkeypatch):
    """compiled.KERNELS None: decode_columns's fields laid out in a buffer, copied one by one."""
    records = [Record(i, 1_700_000_000_000, b"k" if i % 2 else None, None if i == 3 else b"value %d" % i,
                      (("a", None), ("b", b"")) if i % 3 == 0 else ()) for i in range(20)]
    batches = [encode_records(records), encode_values(20, [b"x", None, b""], 1_700_000_000_000)]
    expected = _new_read(str(tmp_path / "mount"), 0, 23, True) if lay_out(str(tmp_path / "mount"), batches) else []
    monkeypatch.setattr(compiled, "KERNELS", None)
    check_same_rows(str(tmp_path / "python"), batches, 0, 23, True)
    assert pa.Table.from_batches(_new_read(str(tmp_path / "mount"), 0, 23, True)).equals(
        pa.Table.from_batches(expected))


def test_the_arrow_columns_are_built_from_buffers_not_per_value(tmp_path):
    """The value column's data buffer is one gathered buffer: the values back to back, nulls as no bytes."""
    values = [b"abc", None, b"", b"de"]
    lay_out(str(tmp_path), [encode_values(0, values, 1_700_000_000_000)])
    (batch,) = _new_read(str(tmp_path), 0, 4, False)
    column = batch.column("value")
    validity, offsets, data = column.buffers()
    assert validity is not None
    assert np.frombuffer(offsets, dtype=np.int32)[:5].tolist() == [0, 3, 3, 3, 5]
    assert data.to_pybytes()[:5] == b"abcde"
    assert column.to_pylist() == values
    assert batch.column("key").null_count == 4


def test_a_damaged_batch_is_the_same_error_at_the_same_place(tmp_path):
    """A records section that is not one, behind a valid CRC: the decoder's error, named at the batch."""
    good = encode_values(0, [b"a" * 20, b"b" * 20], 1_700_000_000_000)
    section = bytearray(raw_section([(0, 0, b"k", b"v" * 30, [(b"h", b"1")])]))
    section[6] = 0x7E                   # the value's length runs past its record
    bad = _assemble(2, 0, 0, 1_700_000_000_000, 1_700_000_000_000, 1, bytes(section), 0)
    path = lay_out(str(tmp_path), [good, bad])
    old = _outcome(reference_read, path, 0, 3, True)
    assert old[0] == "corrupt"
    assert _outcome(_new_read, str(tmp_path), 0, 3, True) == old


@pytest.mark.parametrize("include_headers", [False, True])
def test_a_batch_past_the_column_limit_is_flushed_alone(tmp_path, monkeypatch, include_headers):
    """A builder over the section bound flushes before the next batch: every Arrow batch stays addressable."""
    batches = [encode_values(i * 3, [b"x" * 100] * 3, 1_700_000_000_000) for i in range(4)]
    monkeypatch.setattr("logfs.spark.read_segments._FLUSH_SECTION_BYTES", 700)
    lay_out(str(tmp_path), batches)
    got = _new_read(str(tmp_path), 0, 12, include_headers)
    assert [b.num_rows for b in got] == [6, 6]
    builder = ColumnBuilder(TOPIC, 0, include_headers)
    assert builder.flush() is None
