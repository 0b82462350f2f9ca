"""The one chunked batch reader (engine.records.reader) and the readers built on it.

The segment's whole-batch walk, the view rendering, the cleaner and the
offline tools all read ``.log`` bytes through ``read_chunks``: a damaged
batch is reported with the same file and byte by each of them.
"""

from __future__ import annotations

import os

import pytest

from engine.cleaner import Cleaner, Throttler
from engine.cleaner.cleaner_manager import LogToClean, cleanable_offsets
from engine.cleaner.offset_map import OffsetMap
from engine.config import LogConfig
from engine.errors import CorruptRecordError
from engine.log import Log
from engine.records import encode_values
from engine.records.reader import read_batches, read_chunks, read_headers
from engine.views.log_view import LogView, ViewFormat


def _batches(sizes: list[int]) -> bytes:
    return b"".join(encode_values(offset, [b"v" * n], 1000) for offset, n in enumerate(sizes))


def _reader(data: bytes, calls: list[tuple[int, int]] | None = None):
    def read(position: int, size: int) -> bytes:
        if calls is not None:
            calls.append((position, size))
        return data[position:position + size]
    return read


def test_chunks_hold_whole_batches_and_grow_for_a_batch_larger_than_a_chunk():
    data = _batches([10, 20, 5000, 30])
    calls: list[tuple[int, int]] = []
    found = list(read_batches(_reader(data, calls), 0, len(data), 256))
    assert [h.base_offset for _, h, _, _ in found] == [0, 1, 2, 3]
    for pos, header, buf, off in found:
        assert buf[off:off + header.size] == data[pos:pos + header.size]
    big = found[2]
    assert (big[0], big[1].size) in calls          # the big batch was read at its own size
    grown: list[tuple[int, int, int]] = []

    def grow(chunk: int, needed: int, position: int) -> int:
        grown.append((chunk, needed, position))
        return needed * 2
    assert len(list(read_batches(_reader(data), 0, len(data), 256, grow=grow))) == 4
    assert grown == [(256, big[1].size, big[0])]


def test_a_torn_tail_ends_a_lenient_walk_and_is_damage_before_a_published_end():
    data = _batches([10, 20, 30])
    cut = data[:-5]
    assert [h.base_offset for _, h, _, _ in read_batches(_reader(cut), 0, None, 64)] == [0, 1]
    assert [h.base_offset for _, h, _, _ in read_batches(_reader(cut), 0, len(data), 64, strict=False)] == [0, 1]
    with pytest.raises(CorruptRecordError) as err:
        list(read_batches(_reader(cut), 0, len(data), 64, path="x.log"))
    third = len(_batches([10, 20]))
    assert err.value.path == "x.log"
    assert err.value.position == third


def test_a_bad_crc_yields_the_batches_before_it_then_names_the_file_and_byte():
    data = bytearray(_batches([10, 20, 30]))
    second = len(_batches([10]))
    data[second + 70] ^= 0xFF                       # a value byte of the second batch
    seen = []
    with pytest.raises(CorruptRecordError) as err:
        for chunk in read_chunks(_reader(bytes(data)), 0, len(data), 1 << 20, path="x.log", verify_crc=True):
            seen += [h.base_offset for _, h in chunk.batches]
    assert seen == [0]
    assert err.value.path == "x.log"
    assert err.value.position == second
    assert "crc" in err.value.detail


def test_a_bad_length_is_damage_even_in_a_lenient_walk():
    data = bytearray(_batches([10, 20]))
    second = len(_batches([10]))
    data[second + 8:second + 12] = (5).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError) as err:
        list(read_batches(_reader(bytes(data)), 0, None, 64, path="x.log", strict=False))
    assert err.value.position == second
    assert "smaller than the minimum" in err.value.detail



def test_the_header_walk_skips_bodies_and_reports_damage_as_the_whole_batch_walk_does():
    data = _batches([10, 5000, 20, 30])
    calls: list[tuple[int, int]] = []
    headers = list(read_headers(_reader(data, calls), 0, len(data), 256))
    assert [(pos, h) for pos, h, _, _ in read_batches(_reader(data), 0, len(data), 256)] == headers
    assert max(size for _, size in calls) <= 256      # the 5000-byte body is skipped, never read
    cut = data[:-5]                                   # a torn last batch
    assert [h.base_offset for _, h in read_headers(_reader(cut), 0, len(cut), 64, strict=False)] == [0, 1, 2]
    # strict: a batch crossing the published end, and fewer bytes than a header before it
    for damaged, end in ((cut, len(cut)), (data + b"\0" * 20, len(data) + 20)):
        with pytest.raises(CorruptRecordError) as by_headers:
            list(read_headers(_reader(damaged), 0, end, 64, path="x.log"))
        with pytest.raises(CorruptRecordError) as by_batches:
            list(read_batches(_reader(damaged), 0, end, 64, path="x.log"))
        assert (by_headers.value.path, by_headers.value.position, by_headers.value.detail) == \
            (by_batches.value.path, by_batches.value.position, by_batches.value.detail)
    bad = bytearray(data)
    second = len(_batches([10]))
    bad[second + 8:second + 12] = (5).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError) as err:
        list(read_headers(_reader(bytes(bad)), 0, len(bad), 64, path="x.log", strict=False))
    assert err.value.position == second
    assert "smaller than the minimum" in err.value.detail

def _damaged_log(tmp_path) -> tuple[Log, int]:
    d = tmp_path / "t-0"
    d.mkdir()
    config = LogConfig.from_props({"cleanup.policy": "compact", "internal.segment.bytes": "100000",
                                   "min.cleanable.dirty.ratio": "0.01"})
    log = Log.load(str(d), config)
    for i in range(20):
        log.append_values([b"value-%d" % i], [b"k%d" % (i % 3)])
    log.roll()
    segment = log.segments.peekitem(0)[1]
    positions = [pos for pos, _ in segment.batches()]
    bad = positions[7]
    with open(segment.log_path, "r+b") as f:        # a value byte, not the framing: only the CRC tells
        f.seek(bad + 75)
        byte = f.read(1)
        f.seek(bad + 75)
        f.write(bytes([byte[0] ^ 0xFF]))
    return log, bad


def test_every_reader_names_the_same_file_and_byte_for_a_damaged_batch(tmp_path):
    log, bad = _damaged_log(tmp_path)
    segment = log.segments.peekitem(0)[1]
    errors: dict[str, CorruptRecordError] = {}

    with pytest.raises(CorruptRecordError) as err:
        list(read_batches(segment.read_bytes, 0, segment.size, 1 << 20, path=segment.log_path, verify_crc=True))
    errors["reader"] = err.value

    view = LogView(log, ViewFormat.TEXT)
    with pytest.raises(CorruptRecordError) as err:
        data = b""
        while True:
            piece = view.read(len(data), 1 << 20)
            if not piece:
                break
            data += piece
    errors["view"] = err.value
    assert data.count(b"\n") == 7                   # the batches before the damage were served

    cleaner = Cleaner(0, OffsetMap(1 << 20, 0.9), 1024, 1 << 20, 0.9, Throttler(float("inf")), log.clock)
    offsets = cleanable_offsets(log, None, log.clock.milliseconds())
    with pytest.raises(CorruptRecordError) as err:
        cleaner.clean(LogToClean(log.topic_partition, log, offsets.first_dirty_offset,
                                 offsets.first_uncleanable_dirty_offset))
    errors["cleaner"] = err.value
    for name, exc in errors.items():
        assert (exc.path, exc.position) == (segment.log_path, bad), name
        assert "crc" in exc.detail, name
    log.close()


def test_segment_recovery_walks_through_the_shared_reader(tmp_path):
    log, bad = _damaged_log(tmp_path)
    segment = log.segments.peekitem(0)[1]
    assert segment.recover(truncate=False) == os.path.getsize(segment.log_path) - bad
    log.close()
