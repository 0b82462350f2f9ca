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
from engine.views import render, walk
from tests.record_strategies import RAW_BATCH, raw_batch

TOPIC, PARTITION = "t.x-1", 3

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
    batch = raw_batch(records, 10, 1000, False, Compression.NONE, False)
    header = read_header(batch, 0)
    expected = render.render_jsonl_columns(decode_columns(batch, 0, header), TOPIC, PARTITION, 0)
    assert walk.batch_jsonl(batch, 0, header, TOPIC, PARTITION) == expected
    assert compiled.KERNELS is not None
    assert compiled.KERNELS.records_jsonl(batch[HEADER_SIZE:], 3, 10, 1000, False, 0,
                                          render.compiled_pieces(TOPIC, PARTITION, 0), True) == expected
    assert bytes(decode_text(batch, 0, header)) == b'v\x00"\n\ncaf\xc3\xa9\n'
    _check(batch)


@settings(max_examples=300, deadline=None)
@given(RAW_BATCH)
def test_the_walk_is_the_general_decoder_on_random_batches(batch):
    _check(raw_batch(*batch))


@settings(max_examples=300, deadline=None)
@given(RAW_BATCH, st.data())
def test_a_damaged_batch_is_the_same_error_at_the_same_place(batch, data):
    """Bytes of the records section changed, cut or added: the walk answers what the decoder answers."""
    records, base_offset, base_timestamp, log_append_time, _, control, extreme = batch
    whole = raw_batch(records, base_offset, base_timestamp, log_append_time, Compression.NONE, control, extreme)
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
        if count < 2 ** 40:     # (records_spans allocates its table first)
            assert kernels.records_spans(memoryview(bytearray(data)), count, 0, 0, False, 0) is None


def test_spans_outside_their_buffers_are_refused():
    """header_spans and gather_spans check every span against the data and the output."""
    import numpy as np
    kernels = compiled.KERNELS
    assert kernels is not None
    data = b"\x02h\x02v" + b"abcdef"             # one header: key "h", value "v"; then 6 bytes
    starts, counts = np.array([0], dtype=np.int64), np.array([1], dtype=np.int64)
    assert kernels.header_spans(data, starts, counts, 1).tolist() == [[1], [1], [3], [1]]
    assert kernels.header_spans(data, starts, np.array([2], dtype=np.int64), 2) is None   # runs past the data
    assert kernels.header_spans(data[:3], starts, counts, 1) is None
    out = np.zeros(4, dtype=np.uint8)
    assert kernels.gather_spans(data, np.array([4, 0, 8]), np.array([2, -1, 2]), out, 0) == 4
    assert bytes(out) == b"abef"
    for bad_starts, bad_lengths, position in (([9], [2], 0), ([-1], [1], 0), ([0], [5], 0), ([0], [1], 4),
                                              ([0], [0], 5)):
        with pytest.raises(ValueError, match="outside the data, or the output is too small"):
            kernels.gather_spans(data, np.array(bad_starts), np.array(bad_lengths), out, position)
