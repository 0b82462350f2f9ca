"""RecordBatch v2 codec: round trips, and kafka-python as the independent byte check.

Every batch we encode must parse with kafka-python's reader with a valid CRC and
the same records; every batch kafka-python's builder writes (all codecs) must
decode with ours.  The CRC in hand-built batches comes from the ``crc32c``
package directly, never from engine.records.
"""

from __future__ import annotations

import mmap
import struct

import cramjam
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.codec import snappy_encode
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from engine.errors import CorruptRecordError, InvalidConfigError, InvalidRecordError
from engine.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    Compression,
    Record,
    TimestampType,
    decode_batch,
    decode_values,
    encode_records,
    encode_values,
    iter_batches,
    read_header,
    validate_batch,
)
from tests.helpers import text_view
from tests.record_strategies import CODECS, TS, field_strategies

blobs, nullable, header_lists = field_strategies(max_size=300, max_key_chars=10, max_headers=3)


def kafka_python_records(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, tuple[object, ...]]]:
    """Parse with kafka-python: every batch must have a valid CRC."""
    out: list[tuple[int, int, bytes | None, bytes | None, tuple[object, ...]]] = []
    memory = MemoryRecords(bytes(batch))
    while memory.has_next():
        kbatch = memory.next_batch()
        assert kbatch.validate_crc(), "kafka-python rejects the CRC"
        out.extend((r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in kbatch)
    return out


def as_tuples(records: list[Record]) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]


def rebuild(batch: bytes, *, attributes: int | None = None, records: bytes | None = None,
            magic: int | None = None) -> bytes:
    """Re-frame ``batch`` with other attributes/records/magic and a correct CRC."""
    fields = list(struct.unpack_from(">qiibIhiqqqhii", batch))
    body = batch[HEADER_SIZE:] if records is None else records
    if attributes is not None:
        fields[5] = attributes
    if magic is not None:
        fields[3] = magic
    fields[1] = HEADER_SIZE - LOG_OVERHEAD + len(body)
    fields[4] = 0
    raw = bytearray(struct.pack(">qiibIhiqqqhii", *fields) + body)
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    return bytes(raw)


# --- round trips ------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(nullable, min_size=1, max_size=50), st.integers(0, 2 ** 40),
       st.integers(0, 2 ** 42), st.sampled_from(CODECS))
def test_encode_values_round_trip(values, base_offset, timestamp, codec) -> None:
    batch = encode_values(base_offset, values, timestamp, compression=codec)
    header = validate_batch(batch)
    assert header.size == len(batch)
    assert header.base_offset == base_offset
    assert header.next_offset == base_offset + len(values)
    assert header.records_count == len(values)
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.producer_id == -1
    assert header.base_sequence == -1
    assert header.partition_leader_epoch == -1
    assert decode_values(batch) == values
    expected = [(base_offset + i, timestamp, None, v, ()) for i, v in enumerate(values)]
    assert as_tuples(decode_batch(batch)) == expected
    assert kafka_python_records(batch) == [(o, t, k, v, ()) for o, t, k, v, _ in expected]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(nullable, nullable), min_size=1, max_size=40), st.sampled_from(CODECS))
def test_encode_values_with_keys_round_trip(pairs, codec) -> None:
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    batch = encode_values(7, values, TS, keys=keys, compression=codec)
    validate_batch(batch)
    assert [(r.key, r.value) for r in decode_batch(batch)] == pairs
    assert decode_values(batch) == values
    assert [(k, v) for _, _, k, v, _ in kafka_python_records(batch)] == pairs


@st.composite
def record_lists(draw):
    n = draw(st.integers(1, 30))
    offset = draw(st.integers(0, 2 ** 40))
    base_ts = draw(st.integers(0, 2 ** 41))
    out = []
    for _ in range(n):
        out.append(Record(offset, base_ts + draw(st.integers(-10 ** 6, 10 ** 6)), draw(nullable),
                          draw(nullable), tuple(draw(header_lists))))
        offset += draw(st.integers(1, 100_000))      # the cleaner leaves holes
    return out


@settings(max_examples=60, deadline=None)
@given(record_lists(), st.sampled_from(CODECS))
def test_encode_records_round_trip_create_time(records, codec) -> None:
    batch = encode_records(records, compression=codec)
    header = validate_batch(batch)
    assert header.timestamp_type == TimestampType.CREATE_TIME
    assert header.base_offset == records[0].offset
    assert header.last_offset == records[-1].offset
    assert header.base_timestamp == records[0].timestamp
    assert header.max_timestamp == max(r.timestamp for r in records)
    assert header.compression == codec
    assert decode_batch(batch) == records
    assert decode_values(batch) == [r.value for r in records]
    assert kafka_python_records(batch) == as_tuples(records)


@settings(max_examples=30, deadline=None)
@given(record_lists())
def test_log_append_time_batches_read_max_timestamp(records) -> None:
    batch = encode_records(records, timestamp_type=TimestampType.LOG_APPEND_TIME)
    header = read_header(batch)
    decoded = decode_batch(batch)
    # Kafka (and kafka-python) give every record of a LogAppendTime batch the
    # batch's max timestamp.
    assert {r.timestamp for r in decoded} == {header.max_timestamp}
    assert [r.timestamp for r in decoded] == [t for _, t, _, _, _ in kafka_python_records(batch)]


@pytest.mark.parametrize(("count", "size"), [(1, 0), (63, 10), (64, 10), (100, 63), (100, 64),
                                         (9000, 5), (3, 8191), (3, 8192), (2, 70_000), (70_000, 1)])
def test_encode_values_table_boundaries(count, size) -> None:
    """Offset deltas and lengths across 1/2/3-byte varints and beyond the tables."""
    values = [bytes([i % 251]) * size for i in range(count)]
    batch = encode_values(1000, values, TS)
    validate_batch(batch)
    assert decode_values(batch) == values
    decoded = decode_batch(batch)
    assert [r.offset for r in decoded] == list(range(1000, 1000 + count))
    if count <= 9000:
        assert [v for _, _, _, v, _ in kafka_python_records(batch)] == values


def test_encode_values_fast_path_matches_general_path() -> None:
    values = [b"x" * (i % 300) for i in range(2000)]
    fast = encode_values(5, values, TS)
    general = encode_records([Record(5 + i, TS, None, v) for i, v in enumerate(values)],
                             timestamp_type=TimestampType.LOG_APPEND_TIME)
    assert fast == general
    keys = [b"k%d" % i for i in range(2000)]
    fast_keyed = encode_values(5, values, TS, keys=keys)
    general_keyed = encode_records([Record(5 + i, TS, keys[i], v) for i, v in enumerate(values)],
                                   timestamp_type=TimestampType.LOG_APPEND_TIME)
    assert fast_keyed == general_keyed


def test_buffers_of_every_kind(tmp_path) -> None:
    batches = encode_values(0, [b"a", b"bb"], TS) + encode_values(2, [b"ccc"], TS + 1)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(batches)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for buf in (batches, bytearray(batches), memoryview(batches), mm):
            found = [(pos, h.base_offset) for pos, h in iter_batches(buf)]
            assert [o for _, o in found] == [0, 2]
            second = found[1][0]
            assert validate_batch(buf, second).records_count == 1
            assert decode_values(buf, second) == [b"ccc"]
            assert [r.value for r in decode_batch(buf, 0)] == [b"a", b"bb"]


def test_header_properties() -> None:
    batch = encode_values(10, [b"a", b"b", b"c"], TS, compression=Compression.GZIP)
    h = read_header(batch)
    assert isinstance(h, BatchHeader)
    assert (h.magic, h.last_offset, h.next_offset, h.size) == (MAGIC, 12, 13, len(batch))
    assert h.compression == Compression.GZIP
    assert not h.is_control
    assert not h.is_transactional
    assert h.delete_horizon_ms is None
    assert h.last_sequence == -1


def test_compression_names() -> None:
    assert Compression.from_name("zstd") == Compression.ZSTD
    assert Compression.from_name("uncompressed") == Compression.NONE
    assert Compression.from_name("none") == Compression.NONE
    with pytest.raises(InvalidConfigError, match="brotli"):
        Compression.from_name("brotli")


def test_bad_inputs_refused() -> None:
    with pytest.raises(InvalidRecordError):
        encode_values(0, [], TS)
    with pytest.raises(InvalidRecordError, match="str"):
        encode_values(0, ["text"], TS)  # type: ignore[list-item]  # a str where bytes go: what is refused
    with pytest.raises(InvalidRecordError):
        encode_values(0, [b"a"], TS, keys=[b"k", b"l"])
    with pytest.raises(InvalidRecordError):
        encode_records([])
    with pytest.raises(InvalidRecordError, match="increase"):
        encode_records([Record(5, TS, None, b"a"), Record(5, TS, None, b"b")])


# --- kafka-python's builder -> our decoder ----------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batches_decode(codec) -> None:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=int(codec), is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    expected = []
    for i in range(200):
        key = None if i % 3 == 0 else b"key-%d" % (i % 7)
        value = None if i % 17 == 0 else b"repetitive value %d " % i * 5
        headers = [("h", b"v%d" % i)] if i % 5 == 0 else []
        builder.append(i, timestamp=TS + i, key=key, value=value, headers=headers)
        expected.append((i, TS + i, key, value, tuple(headers)))
    batch = bytes(builder.build())
    header = validate_batch(batch)
    assert header.compression == codec      # the data compresses, so kafka-python keeps the codec
    assert as_tuples(decode_batch(batch)) == expected
    assert decode_values(batch) == [e[3] for e in expected]


@given(st.lists(st.tuples(nullable, nullable), min_size=1, max_size=20), st.sampled_from(CODECS))
@settings(max_examples=40, deadline=None)
def test_kafka_python_batches_decode_property(pairs, codec) -> None:
    builder = DefaultRecordBatchBuilder(2, int(codec), False, -1, -1, -1, 1 << 20)
    for i, (k, v) in enumerate(pairs):
        builder.append(i * 3, timestamp=TS - i, key=k, value=v, headers=[])
    batch = bytes(builder.build())
    validate_batch(batch)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decode_batch(batch)] == \
        [(i * 3, TS - i, k, v) for i, (k, v) in enumerate(pairs)]


def test_raw_snappy_and_xerial_snappy_both_decode() -> None:
    plain = encode_values(0, [b"snappy snappy snappy %d" % i for i in range(300)], TS)
    section = plain[HEADER_SIZE:]
    attrs = read_header(plain).attributes | Compression.SNAPPY
    raw = rebuild(plain, attributes=attrs, records=snappy_encode(section, xerial_compatible=False))
    xerial = rebuild(plain, attributes=attrs, records=snappy_encode(section, xerial_compatible=True))
    assert decode_values(raw) == decode_values(xerial) == decode_values(plain)


def test_our_snappy_is_xerial_framed_in_32k_blocks() -> None:
    values = [bytes(range(256)) * 2] * 200           # > 32 KiB of records: several blocks
    batch = encode_values(0, values, TS, compression=Compression.SNAPPY)
    section = batch[HEADER_SIZE:]
    assert section[:8] == b"\x82SNAPPY\x00"
    assert struct.unpack(">ii", section[8:16]) == (1, 1)
    first_block = struct.unpack(">i", section[16:20])[0]
    assert len(cramjam.snappy.decompress_raw(section[20:20 + first_block])) == 32 * 1024
    assert [v for _, _, _, v, _ in kafka_python_records(batch)] == values


# --- control batches and corruption ------------------------------------------------------

def test_control_batch_is_skipped() -> None:
    # An end-transaction marker: key = version 0, type 1 (commit).
    control = encode_records([Record(42, TS, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")])
    control = rebuild(control, attributes=0x20 | 0x10)
    header = validate_batch(control)
    assert header.is_control
    assert header.is_transactional
    assert decode_batch(control) == []
    assert decode_values(control) == []
    assert [h.base_offset for _, h in iter_batches(control)] == [42]


def test_corrupt_crc_names_file_and_position() -> None:
    first = encode_values(0, [b"one", b"two"], TS)
    second = bytearray(encode_values(2, [b"three"], TS))
    second[-2] ^= 0xFF
    log = first + bytes(second)
    validate_batch(log, 0, path="/d/t-0/00000000000000000000.log")
    with pytest.raises(CorruptRecordError, match="crc") as info:
        validate_batch(log, len(first), path="/d/t-0/00000000000000000000.log")
    assert info.value.position == len(first)
    assert info.value.path == "/d/t-0/00000000000000000000.log"
    assert "00000000000000000000.log" in str(info.value)


def test_truncated_batch() -> None:
    batch = encode_values(0, [b"x" * 50] * 3, TS)
    for cut in (10, HEADER_SIZE - 1, HEADER_SIZE + 5, len(batch) - 1):
        torn = batch + batch[:cut]
        assert [pos for pos, _ in iter_batches(torn)] == [0]      # the torn tail ends the walk
        with pytest.raises(CorruptRecordError) as info:
            validate_batch(torn, len(batch))
        assert info.value.position == len(batch)
    with pytest.raises(CorruptRecordError):
        read_header(batch[:30])
    with pytest.raises(CorruptRecordError):
        decode_values(batch[:-1])


def test_bad_magic() -> None:
    batch = rebuild(encode_values(0, [b"a"], TS), magic=1)
    with pytest.raises(CorruptRecordError, match="magic"):
        validate_batch(batch)
    with pytest.raises(CorruptRecordError, match="magic"):
        decode_batch(batch)


def test_impossible_batch_length_raises_in_walk() -> None:
    batch = bytearray(encode_values(0, [b"a"], TS))
    struct.pack_into(">i", batch, 8, 3)
    with pytest.raises(CorruptRecordError, match="smaller than the minimum"):
        list(iter_batches(bytes(batch)))


def test_lenient_walk_stops_at_an_impossible_batch_length() -> None:
    # The tools' walk: the batches before the damage, then nothing.
    first = encode_values(0, [b"a"], TS)
    second = encode_values(1, [b"b", b"c"], TS)
    damaged = bytearray(encode_values(3, [b"d"], TS))
    struct.pack_into(">i", damaged, 8, 3)
    buf = first + second + bytes(damaged) + first
    assert [(pos, h.base_offset) for pos, h in iter_batches(buf, lenient=True)] == [(0, 0), (len(first), 1)]
    with pytest.raises(CorruptRecordError, match="smaller than the minimum"):
        list(iter_batches(buf))


@pytest.mark.parametrize("damage", ["record_length", "value_length", "count"])
def test_bad_record_framing_with_valid_crc(damage) -> None:
    good = encode_values(0, [b"hello", b"world"], TS)
    section = bytearray(good[HEADER_SIZE:])
    if damage == "record_length":
        section[0] += 2
        bad = rebuild(good, records=bytes(section))
    elif damage == "value_length":
        section[5] = 0x7E                 # value length 63 in a 12-byte record
        bad = rebuild(good, records=bytes(section))
    else:
        framed = bytearray(rebuild(good))
        struct.pack_into(">i", framed, 57, 3)
        bad = rebuild(bytes(framed))
    validate_batch(bad)                    # the CRC is fine; the structure is not
    with pytest.raises(CorruptRecordError):
        decode_values(bad)
    with pytest.raises(CorruptRecordError):
        decode_batch(bad)


def test_garbage_compressed_section() -> None:
    good = encode_values(0, [b"a"], TS)
    bad = rebuild(good, attributes=read_header(good).attributes | Compression.LZ4, records=b"not lz4 at all")
    with pytest.raises(CorruptRecordError, match="decompress"):
        decode_values(bad)


# --- decode fast paths == the general loop -------------------------------------------------
#
# decode_values / decode_text / decode_batch take batches written by encode_values
# through fast paths (fixed-size segments verified column-wise, variable-size ones
# verified by re-encoding).  The general loop (_values_of / _records_of) is the
# reference: for every batch, the public functions must return exactly what it
# returns, or raise CorruptRecordError exactly when it fails.

from engine.records import decode_text  # noqa: E402
from engine.records.decode import _records_of, _records_section, _values_of  # noqa: E402
from engine.records.fastpath import _uniform_values  # noqa: E402


def records_section(batch: bytes) -> tuple[BatchHeader, bytes]:
    """The header and records bytes of a batch of data (``_records_section`` answers None for a control batch)."""
    header, data = _records_section(batch, 0, None)
    assert data is not None, "a control batch"
    return header, data


def general_values(batch: bytes) -> list[bytes | None] | type[CorruptRecordError]:
    """The general loop's values, or the exception class it fails with."""
    header, data = records_section(batch)
    try:
        return _values_of(data, header.records_count)
    except (IndexError, ValueError):
        return CorruptRecordError


def general_records(batch: bytes):
    header, data = records_section(batch)
    try:
        return _records_of(data, header)
    except (IndexError, ValueError, UnicodeDecodeError):
        return CorruptRecordError


def assert_fast_equals_general(batch: bytes) -> list[bytes | None] | type[CorruptRecordError]:
    values = general_values(batch)
    records = general_records(batch)
    if values is CorruptRecordError:
        for decode in (decode_values, decode_text):
            with pytest.raises(CorruptRecordError):
                decode(batch)
    else:
        assert decode_values(batch) == values
        assert decode_text(batch) == text_view(values)
    if records is CorruptRecordError:
        with pytest.raises(CorruptRecordError):
            decode_batch(batch)
    else:
        assert decode_batch(batch) == records
    return values


def record_bounds(section: bytes) -> list[tuple[int, int]]:
    """(start, end) of every record, from the zig-zag length varints alone."""
    bounds = []
    pos = 0
    while pos < len(section):
        raw, shift, start = 0, 0, pos
        while True:
            b = section[pos]
            pos += 1
            raw |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        pos += raw >> 1
        bounds.append((start, pos))
    return bounds


def fixed_or_mixed_values(draw: st.DrawFn, count: int) -> list[bytes | None]:
    size = draw(st.sampled_from([0, 1, 5, 57, 58, 62, 63, 64, 100, 200, 8180, 8186]))
    if draw(st.booleans()):              # fixed size: the column-verified path
        return [bytes([i % 251]) * size for i in range(count)]
    jitter = draw(st.integers(1, 3))
    return [bytes([i % 251]) * max(0, size + (i * 7) % (2 * jitter + 1) - jitter) for i in range(count)]


@st.composite
def uniform_batches(draw):
    """encode_values batches without keys: the layout the fast paths are for."""
    count = draw(st.sampled_from([1, 2, 63, 64, 65, 200, 8191, 8192, 8193, 8300]))
    values = fixed_or_mixed_values(draw, count)
    if draw(st.booleans()) and count > 1:   # a null somewhere: the general loop takes over there
        values[draw(st.integers(0, count - 1))] = None
    return encode_values(draw(st.integers(0, 2 ** 40)), values, draw(st.integers(0, 2 ** 41)))


@settings(max_examples=40, deadline=None)
@given(uniform_batches())
def test_fast_paths_equal_general_loop_on_uniform_batches(batch) -> None:
    values = assert_fast_equals_general(batch)
    assert isinstance(values, list)                 # a uniform batch decodes
    if len(values) < 1000:                # kafka-python is slow; the big ones are compared above
        assert values == [v for _, _, _, v, _ in kafka_python_records(batch)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(nullable, nullable, header_lists), min_size=1, max_size=30),
       st.sampled_from(["builder", "keyed", "records"]))
def test_fast_paths_equal_general_loop_on_other_writers(rows, writer) -> None:
    """kafka-python's builder, keyed encode_values and encode_records: not uniform."""
    if writer == "builder":
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
        for i, (k, v, h) in enumerate(rows):
            builder.append(i, timestamp=TS + i, key=k, value=v, headers=h)
        batch = bytes(builder.build())
    elif writer == "keyed":
        batch = encode_values(3, [v for _, v, _ in rows], TS, keys=[k for k, _, _ in rows])
    else:
        batch = encode_records([Record(10 + 2 * i, TS, k, v, tuple(h)) for i, (k, v, h) in enumerate(rows)])
    assert assert_fast_equals_general(batch) == [v for _, v, _ in rows]


@pytest.mark.parametrize(("count", "size", "jitter"), [
    (8193, 100, 0), (9000, 100, 2), (70_000, 1, 0), (70_000, 3, 1), (3, 8189, 0), (3, 8191, 2),
    (2, 70_000, 0), (5, 60_000, 0)])
def test_fast_paths_across_table_bounds(count, size, jitter) -> None:
    """1-, 2- and 3-byte offset deltas and lengths, more records than the tables."""
    values = [b"v" * (size + (i % (2 * jitter + 1)) - jitter if jitter else size) for i in range(count)]
    batch = encode_values(0, values, TS)
    assert assert_fast_equals_general(batch) == values


@settings(max_examples=100, deadline=None)
@given(uniform_batches(), st.data())
def test_corrupt_uniform_batches_raise_or_match(batch, data) -> None:
    """Damage inside the records (CRC recomputed): the general loop's verdict, never garbage."""
    section = bytearray(batch[HEADER_SIZE:])
    kind = data.draw(st.sampled_from(["byte", "framing", "truncate", "extend", "count"]))
    if kind in ("byte", "framing"):
        if kind == "byte":
            at = data.draw(st.integers(0, len(section) - 1))
        else:                            # the bytes around a value, where the fast paths look
            start, end = data.draw(st.sampled_from(record_bounds(bytes(section))))
            at = data.draw(st.sampled_from(range(start, min(start + 10, end))) | st.just(end - 1))
        section[at] = data.draw(st.integers(0, 255).filter(lambda b: b != section[at]))
        bad = rebuild(batch, records=bytes(section))
    elif kind == "truncate":
        cut = data.draw(st.integers(1, min(len(section), 300)))
        bad = rebuild(batch, records=bytes(section[:-cut]))
    elif kind == "extend":
        bad = rebuild(batch, records=bytes(section) + data.draw(st.binary(min_size=1, max_size=5)))
    else:
        fields = bytearray(rebuild(batch))
        count = read_header(batch).records_count
        struct.pack_into(">i", fields, 57, count + data.draw(st.sampled_from([-1, 1, 64])))
        bad = rebuild(bytes(fields))
    assert_fast_equals_general(bad)
    if kind not in ("byte", "framing"):
        with pytest.raises(CorruptRecordError):
            decode_values(bad)


def test_decode_text_of_nulls_control_and_codecs() -> None:
    assert decode_text(encode_values(0, [b"a", None, b"", b"b"], TS)) == b"a\n\n\nb\n"
    fixed = [b"%05d" % i for i in range(300)]
    for codec in CODECS:
        assert decode_text(encode_values(0, fixed, TS, compression=codec)) == text_view(fixed)
    control = rebuild(encode_records([Record(42, TS, b"\x00\x00\x00\x01", b"\x00" * 6)]), attributes=0x30)
    assert decode_text(control) == b""


def test_fixed_size_text_from_a_log_of_several_batches(tmp_path) -> None:
    """decode_text reads mmap'ed logs at any batch position, like the text view."""
    first = [b"line %04d" % i for i in range(100)]
    second = [b"x" * 100] * 70
    log = encode_values(0, first, TS) + encode_values(100, second, TS)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(log)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        texts = [decode_text(mm, pos, header) for pos, header in iter_batches(mm)]
    assert texts == [text_view(first), text_view(second)]


@pytest.mark.parametrize("sizes", ["fixed", "mixed"])
def test_encode_values_batches_take_the_fast_path(sizes) -> None:
    """The equality tests above only prove something if the fast path really runs."""
    count = 9000
    values: list[bytes | None] = [b"%06d" % i + b"y" * (94 if sizes == "fixed" else i % 150) for i in range(count)]
    _header, data = records_section(encode_values(0, values, TS))
    for text in (False, True):
        _parts, taken, at = _uniform_values(data, count, text)
        assert (taken, at) == (count, len(data))
    assert _uniform_values(data, count, False)[0] == values
    # one null value: nothing of a mixed-size batch, the segments before it of a fixed one
    values[8500] = None
    _header, data = records_section(encode_values(0, values, TS))
    assert _uniform_values(data, count, False)[1] == (8192 if sizes == "fixed" else 0)


@pytest.mark.parametrize("sizes", ["fixed", "mixed"])
def test_every_framing_byte_is_checked(sizes) -> None:
    """Damage each non-value byte of records at the edges of every offset-delta width."""
    count = 8195
    values = [b"%05d" % i + b"z" * (95 if sizes == "fixed" else i % 40) for i in range(count)]
    batch = encode_values(0, values, TS)
    section = batch[HEADER_SIZE:]
    bounds = record_bounds(section)
    for index in (0, 1, 63, 64, 8191, 8192, 8194):
        start, end = bounds[index]
        value_start = end - 1 - len(values[index])
        for at in [*range(start, value_start), end - 1]:
            for replacement in (section[at] ^ 0x01, section[at] ^ 0x80):
                damaged = bytearray(section)
                damaged[at] = replacement
                assert_fast_equals_general(rebuild(batch, records=bytes(damaged)))


def test_the_text_of_mixed_sizes_is_the_compiled_walks() -> None:
    """engine.records.kernels takes a batch of mixed value sizes whole, and refuses a section it cannot frame."""
    from engine.records import compiled
    from engine.records.kernels import records_text

    assert compiled.KERNELS is not None       # so decode_text below takes the compiled walk too

    values = [b"v" * (i * 37 % 190) + b"\n" * (i % 3) for i in range(300)]     # empty values and newlines too
    batch = encode_values(0, values, TS)
    _, data = records_section(batch)
    assert records_text(data, len(values)) == text_view(values)
    assert decode_text(batch) == text_view(values)
    bad = bytearray(data)
    bad[len(data) - 1] = 1                                      # a header count of -1
    assert records_text(bytes(bad), len(values)) is None
    assert records_text(data, len(values) - 1) is None          # bytes left after the last record
    assert records_text(data[:-1], len(values)) is None         # a record cut short


# --- a block of text lines encoded whole (the hot path of ``cat file >> append``) ----------------

lines_without_newline = st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")), min_size=1,
                                 max_size=40)


@settings(max_examples=200, deadline=None)
@given(lines_without_newline, st.integers(1, 200), st.integers(0, 2 ** 40))
def test_a_block_of_lines_encodes_as_encode_values_encodes_them(lines, repeat, base_offset) -> None:
    """encode_text_lines (the compiled kernels) writes byte for byte what encode_values writes for the lines."""
    from engine.records import compiled, encode_text_lines
    from engine.records.encode import COMPILED_FROM

    assert compiled.KERNELS is not None
    values = lines * repeat
    block = b"".join(value + b"\n" for value in values)
    encoded = encode_text_lines(base_offset, block, TS)
    if len(block) < COMPILED_FROM:
        assert encoded is None                      # the Python path is as fast there
        return
    assert encoded is not None
    batch, layout = encoded
    assert bytes(batch) == encode_values(base_offset, values, TS)
    assert (layout.lines, layout.longest) == (len(values), max(map(len, values)))
    assert encode_text_lines(base_offset, block + b"x", TS) is None      # the last line not whole


def test_a_block_of_lines_is_encoded_by_the_kernels() -> None:
    """The equality above proves something only if the compiled path ran: a block it cannot take is refused."""
    from engine.records import compiled, encode_text_lines

    assert compiled.KERNELS is not None
    block = b"line\n" * 5000
    encoded = encode_text_lines(0, block, TS)
    assert encoded is not None
    batch, layout = encoded
    assert layout.lines == 5000
    assert decode_values(bytes(batch)) == [b"line"] * 5000
    assert encode_text_lines(0, block + b"no newline", TS) is None


# --- the decompressors of producers' frames ------------------------------------------------------------------

from engine.records.compression import _decompress  # noqa: E402


def _frames(codec: Compression, data: bytes) -> bytes:
    """``data`` as a producer frames it: zstd without its content size (zstd-jni's stream, Kafka's Java
    producer), LZ4 with independent 64 KiB blocks (KafkaLZ4BlockOutputStream)."""
    import lz4.frame
    import zstandard
    if codec == Compression.ZSTD:
        stream = zstandard.ZstdCompressor(write_content_size=False).compressobj()
        return stream.compress(data) + stream.flush()
    compressed: bytes = lz4.frame.compress(data, block_linked=False, store_size=False,
                                           block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    return compressed


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD])
@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.binary(max_size=200_000), min_size=1, max_size=3), cut=st.integers(1, 40))
def test_producer_frames_decompress_whole_or_fail(codec: Compression, parts: list[bytes], cut: int) -> None:
    """Concatenated frames read whole, as cramjam reads them; a frame cut short, trailing bytes or nothing at
    all fail (a damaged batch is EIO, never fewer records)."""
    import zstandard
    frames = [_frames(codec, p) for p in parts]
    framed = b"".join(frames)
    assert _decompress(codec, framed) == b"".join(parts)
    assert _decompress(codec, memoryview(framed)) == b"".join(parts)
    if codec == Compression.ZSTD:
        one = zstandard.ZstdCompressor().compress(parts[0])         # with its content size, as logfs writes
        assert _decompress(codec, one) == parts[0]
    cut = 1 + (cut - 1) % (len(frames[-1]) - 1)      # inside the last frame (a whole frame less is not damage)
    for damaged in (framed[:len(framed) - cut], framed + b"\x00" * cut, b""):
        with pytest.raises(Exception):  # noqa: B017, PT011 (each codec library has its own error type)
            _decompress(codec, damaged)
