"""The compiled record kernels (engine/records/_kernels.c) against the Python paths they stand in for.

Each kernel must give byte for byte what its Python path gives, on random
input and on damaged input (where it must refuse, leaving the Python loop to
name the damage).  The last tests run the engine with the kernels switched off
(``compiled.KERNELS = None``, what a checkout without the built extension
runs) and compare what it writes, reads and cleans with the compiled run.
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.clock import ManualClock
from engine.records import HEADER_SIZE, TRANSACTIONAL_FLAG_MASK, compiled, encode_values, iter_batches
from engine.records.decode import _records_section, _values_of, decode_text
from tests.helpers import make_config, text_view

if TYPE_CHECKING:
    from types import ModuleType

TS = 1_700_000_000_000
_NOT_BUILT = ("engine/records/_kernels.c is not built: scripts/setup.sh, "
              "or .venv/bin/python setup.py build_ext --inplace")


def _kernels() -> ModuleType:
    """``compiled.KERNELS``, which the tests of a kernel call: where it is not built, each fails saying so."""
    assert compiled.KERNELS is not None, _NOT_BUILT
    return compiled.KERNELS


def test_the_extension_is_built_and_loaded_with_the_package():
    """setup.py builds engine/records/_kernels.c (scripts/setup.sh; tests/conftest.py's checkout): no test below
    would prove anything on the Python paths alone."""
    kernels = _kernels()
    assert compiled.state() == "loaded", _NOT_BUILT
    assert kernels._kernels.__file__.endswith(".so")


# --- a block of text lines (cat file >> append) --------------------------------------------------------

_LINE = st.one_of(st.binary(max_size=200), st.text(max_size=60).map(str.encode),     # non-ASCII too
                  st.just(b""), st.binary(min_size=5000, max_size=70_000)).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=150, deadline=None)
@given(st.lists(_LINE, max_size=60), st.booleans())
def test_lines_layout_and_encode_lines_write_the_records_encode_values_writes(lines, last_whole):
    kernels = _kernels()
    block = b"".join(line + b"\n" for line in lines)
    if not last_whole:
        block += b"tail without newline"
        assert kernels.lines_layout(block) is None
        with pytest.raises(ValueError, match="no newline"):
            kernels.encode_lines(block, bytearray(len(block) * 2 + 64), 0)
        return
    layout = kernels.lines_layout(block)
    assert layout == (len(lines), layout.size, max(map(len, lines), default=0))
    out = bytearray(3 + layout.size)
    assert kernels.encode_lines(block, out, 3) == len(out)
    if lines:
        assert bytes(out[3:]) == encode_values(0, lines, TS)[HEADER_SIZE:]
    else:
        assert layout.size == 0
    if layout.size:
        with pytest.raises(ValueError, match="too small"):          # never past the buffer
            kernels.encode_lines(block, bytearray(2 + layout.size), 3)


_PLAIN_OR_NOT = st.one_of(
    st.binary(max_size=300),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7F), max_size=300).map(str.encode),
    st.text(max_size=60).map(str.encode))


@settings(max_examples=300, deadline=None)
@given(st.lists(_PLAIN_OR_NOT.map(lambda b: b.replace(b"\n", b"")), max_size=40), st.integers(0, 9000),
       st.sampled_from([None, 0x00, 0x09, 0x1F, 0x20, 0x22, 0x5C, 0x7F, 0x80, 0xC3, 0xFF]))
def test_json_plain_is_orjsons_answer_for_a_block_of_lines(lines, padding, extra):
    """The JSON view's size check of an appended block (engine.views.render): the kernel against the dump
    it replaces, with one byte that may need escaping put anywhere in a long block (past the 4 KiB steps)."""
    kernels = _kernels()
    import orjson
    block = b"x" * padding + b"\n" + b"".join(line + b"\n" for line in lines)
    if extra is not None:
        at = (padding * 7919) % len(block)
        block = block[:at] + bytes([extra]) + block[at:]
    try:
        expected = len(orjson.dumps(block.decode("ascii"))) == len(block) + 2 + block.count(b"\n")
    except UnicodeDecodeError:
        expected = False
    assert kernels.json_plain(block) is expected


# --- the text view of a batch of mixed value sizes -----------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=80), st.data())
def test_records_text_is_the_general_loops_text_or_refuses(values, data):
    """Intact: the values, each with a newline.  One byte changed anywhere: None, or exactly what the
    general loop (``_values_of``) reads from the damaged bytes."""
    kernels = _kernels()
    _, section = _records_section(encode_values(0, values, TS), 0, None)
    assert section is not None                # a batch of values is no control batch
    assert kernels.records_text(section, len(values)) == b"".join(v + b"\n" for v in values)
    at = data.draw(st.integers(0, len(section) - 1))
    damaged = bytearray(section)
    damaged[at] = data.draw(st.integers(0, 255))
    got = kernels.records_text(bytes(damaged), len(values))
    if got is not None:
        general = _values_of(bytes(damaged), len(values))
        assert got == text_view(general)
    assert kernels.records_text(section[:data.draw(st.integers(0, len(section) - 1))], len(values)) is None


# --- the cleaner's key digests ---------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=130), st.binary(min_size=50, max_size=70),   # MD5's block edges
                          st.binary(min_size=1000, max_size=5000)), max_size=40))
def test_key_digests_are_hashlib_md5(keys):
    kernels = _kernels()
    buf = b"pad" + b"".join(keys)
    lengths = np.array([len(k) for k in keys], dtype=np.int64)
    starts = 3 + np.cumsum(lengths) - lengths
    digests = kernels.key_digests(buf, starts, lengths)
    assert digests.shape == (len(keys), 16)
    assert [bytes(d) for d in digests] == [hashlib.md5(k).digest() for k in keys]


def test_key_digests_refuse_a_key_outside_the_buffer():
    kernels = _kernels()
    with pytest.raises(ValueError, match="outside the buffer"):
        kernels.key_digests(b"abc", np.array([2], dtype=np.int64), np.array([2], dtype=np.int64))


# --- the walk for transaction markers --------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.binary(max_size=40), min_size=1, max_size=5), st.booleans()), max_size=12),
       st.data())
def test_transactional_batches_is_the_header_walk_of_iter_batches(batches, data):
    """On real batches (some transactional) cut anywhere or with a length damaged: the transactional batches,
    the last whole batch and where the walk stops are iter_batches' (lenient, as the caller then walks on)."""
    kernels = _kernels()
    buf = bytearray()
    for values, transactional in batches:
        batch = bytearray(encode_values(len(buf), values, TS))
        if transactional:
            struct.pack_into(">h", batch, 21, struct.unpack_from(">h", batch, 21)[0] | TRANSACTIONAL_FLAG_MASK)
        buf += batch
    if buf and data.draw(st.booleans()):
        buf = buf[:data.draw(st.integers(0, len(buf)))]
    elif buf:
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    expected = [(pos, header) for pos, header in iter_batches(bytes(buf), lenient=True)]
    found, last, end = kernels.transactional_batches(bytes(buf))
    assert found == [pos for pos, header in expected if header.attributes & TRANSACTIONAL_FLAG_MASK]
    assert last == (expected[-1][0] if expected else -1)
    assert end == (expected[-1][0] + expected[-1][1].size if expected else 0)


# --- the engine without the kernels: the same bytes ----------------------------------------------------

def _log_bytes(log) -> list[bytes]:
    out = []
    for segment in log.segments.values():
        with open(segment.log_path, "rb") as f:
            out.append(f.read())
    return out


def test_without_the_kernels_the_engine_writes_reads_and_cleans_the_same_bytes(tmp_path, monkeypatch):
    """A checkout whose extension is not built (``KERNELS`` None) takes the Python paths: appends of blocks
    of lines, the text view of mixed sizes and a clean of a compacted log give what the compiled run gives."""
    from engine.cleaner import LogCleaner
    from tests.unit.test_cleaner import all_records, broker_config, log_config, new_log

    lines = [b"line %05d " % i + "é".encode() * (i % 7) + b"z" * (i * 37 % 300) for i in range(4000)]
    block = b"".join(line + b"\n" for line in lines)
    keyed = [(b"k%d" % (i % 40), b"v%d" % i) for i in range(3000)]

    def run(name: str) -> tuple[list[bytes], bytes, list[bytes], list[tuple[int, bytes | None, bytes | None]]]:
        data = tmp_path / name
        log = new_log(data, log_config(**{"internal.segment.bytes": "60000"}), clock=ManualClock())
        plain = new_log(data, make_config(internal_segment_bytes=400_000), ManualClock(), name="plain-0")
        plain.append_text_lines(block)
        text = b"".join(decode_text(s.read_bytes(0, s.size), pos)
                        for s in plain.segments.values() for pos, _ in iter_batches(s.read_bytes(0, s.size)))
        for i in range(0, len(keyed), 30):
            log.append_values([v for _, v in keyed[i:i + 30]], [k for k, _ in keyed[i:i + 30]])
        log.roll()
        cleaner = LogCleaner(broker_config(data), [str(data)], lambda: [log], clock=ManualClock())
        assert cleaner.clean_once() is not None
        result = (_log_bytes(plain), text, _log_bytes(log), [(r.offset, r.key, r.value) for r in all_records(log)])
        plain.close()
        log.close()
        return result

    compiled_run = run("c")
    monkeypatch.setattr(compiled, "KERNELS", None)
    python_run = run("p")
    assert compiled_run[1] == block
    assert python_run == compiled_run
    assert len(compiled_run[3]) == 40


def test_put_digests_stops_at_a_full_map_whatever_limit_it_is_given():
    """A limit above the map's slots is the slots: the third new key into two slots is not put (it used to
    probe for an empty slot forever)."""
    kernels = _kernels()
    import mmap

    table = mmap.mmap(-1, 2 * 24, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    digests = np.frombuffer(b"".join(hashlib.md5(b"k%d" % i).digest() for i in range(3)), np.uint8).reshape(-1, 16)
    done, entries, _ = kernels.put_digests(table, 2, digests, np.arange(3, dtype=np.int64), 10, 0)
    assert (done, entries) == (2, 2)
