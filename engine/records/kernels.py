"""Compiled loops of the records codec (numba), for what no column trick in C can do.

Two walks that Python cannot speed up with column tricks, because each
record's position depends on the previous record's length varint:

* ``uniform_text``: the text view of a batch of values of mixed sizes;
* ``key_columns``: the log cleaner's offset-map pass, the offset, key and
  tombstone flag of every record of a read chunk's batches;
* ``transactional_batches``: the walk for transaction markers
  (engine.transactions), which must see every batch header of a log;
* ``lines_layout``/``encode_lines``: the records section of a block of text
  lines, each line a value (the hot path of ``cat file >> append``);
* ``key_digests``/``put_digests``: the cleaner's offset map, the MD5 of each
  key and Kafka's ``SkimpyOffsetMap.put`` of each (digest, offset) pair.

A records section of values of mixed sizes must be walked record by record:
each record's position depends on the previous record's length varint.  In
Python that walk costs about 0.6 us per record (``_sized_walk``); compiled by
numba it costs 0.07 us, which takes the text view of mixed 40-200 byte values
from 3.7x the CPU per byte of uniform 100-byte values to about 1.2x
(docs/performance.md, "Mixed value sizes").  numba compiles each kernel on its first call and keeps
the machine code in ``__pycache__`` (``cache=True``): the first process pays
about 2 s once, every later one about 0.1 s to load it.

Kernels check every byte they rely on and answer -1 when anything differs from
what they expect; the caller then runs the general Python loop, which decodes
exactly as before and names what is wrong.
"""

from __future__ import annotations

import math
import mmap
from typing import Any, NamedTuple

import llvmlite.ir as llvm_ir
import numba
import numpy as np
import numpy.typing as npt
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["KeyColumns", "LinesLayout", "encode_lines", "key_columns", "key_digests", "lines_layout", "load",
           "put_digests", "transactional_batches", "uniform_text"]


# Two libc calls numba has no spelling for, emitted as LLVM code (so they are
# cached like the kernels, where a ctypes function pointer would not be).
# Measured on 1 MiB of 100-byte lines: copying each value with a numba slice
# assignment costs 0.60 ms, with _memcpy 0.12 ms; finding the newlines with
# np.flatnonzero costs 0.37 ms, with _memchr per line 0.08 ms.

def _memcpy_intrinsic(typingctx: Any, dst: Any, dst_pos: Any, src: Any, src_pos: Any,
                      n: Any) -> tuple[Any, Any]:  # pragma: no cover - compiled
    """``_memcpy(dst, dst_pos, src, src_pos, n)``: ``dst[dst_pos:dst_pos + n] = src[src_pos:src_pos + n]``
    as one ``memcpy`` (no bounds check)."""
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memcpy(builder, builder.gep(d.data, [args[1]]), builder.gep(s.data, [args[3]]), args[4], 1)
        return context.get_dummy_value()
    return sig, codegen


def _memchr_intrinsic(typingctx: Any, src: Any, start: Any, end: Any,
                      byte: Any) -> tuple[Any, Any]:  # pragma: no cover - compiled
    """``_memchr(src, start, end, byte)``: the position of the first ``byte`` in ``src[start:end]`` (libc
    ``memchr``), or -1."""
    sig = types.intp(src, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        s = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = llvm_ir.IntType(8).as_pointer()
        i64 = llvm_ir.IntType(64)
        fnty = llvm_ir.FunctionType(i8p, [i8p, llvm_ir.IntType(32), i64])
        memchr = cgutils.get_or_insert_function(builder.module, fnty, "memchr")
        base = builder.bitcast(s.data, i8p)
        found = builder.call(memchr, [builder.gep(base, [args[1]]), builder.trunc(args[3], llvm_ir.IntType(32)),
                                      builder.sub(args[2], args[1])])
        position = builder.sub(builder.ptrtoint(found, i64), builder.ptrtoint(base, i64))
        return builder.select(cgutils.is_null(builder, found), llvm_ir.Constant(i64, -1), position)
    return sig, codegen


_memcpy: Any = intrinsic(_memcpy_intrinsic)
_memchr: Any = intrinsic(_memchr_intrinsic)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _varint(data: npt.NDArray[np.uint8], p: int, end: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """Kafka's zigzag varint at ``p``: (value, next position), or (0, -1) past ``end`` or beyond 5 bytes."""
    shift = 0
    raw = 0
    while True:
        if p >= end or shift > 28:
            return 0, -1
        b = data[p]
        p += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    return (raw >> 1) ^ -(raw & 1), p


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _uniform_text(data: npt.NDArray[np.uint8], count: int,
                  out: npt.NDArray[np.uint8]) -> int:  # pragma: no cover - compiled
    n = data.shape[0]
    p = 0
    o = 0
    for i in range(count):
        length, p = _varint(data, p, n)
        if p < 0 or length < 6 or p + length > n:
            return -1
        end = p + length
        if data[p] != 0 or data[p + 1] != 0:          # attributes, timestamp delta
            return -1
        delta, p = _varint(data, p + 2, end)
        if p < 0 or delta != i or p >= end or data[p] != 1:     # offset delta i, null key (varint -1)
            return -1
        vlen, p = _varint(data, p + 1, end)
        if p < 0 or vlen < 0 or p + vlen + 1 != end or data[end - 1] != 0:     # value, no headers
            return -1
        out[o:o + vlen] = data[p:p + vlen]
        o += vlen
        out[o] = 10
        o += 1
        p = end
    if p != n:
        return -1
    return o


def uniform_text(data: bytes, count: int) -> bytearray | None:
    """The text view (each value and ``\\n``) of ``count`` records in the layout ``encode_values`` writes
    without keys (any value sizes), or None when ``data`` is anything else.

    Every field is checked as the general decoder reads it: the record length
    (the record must end exactly there), attributes 0, timestamp delta 0, offset
    delta ``i``, a null key, a non-null value, no headers, and nothing after the
    last record.  The output is never longer than ``data`` (each record has at
    least five frame bytes and gains one newline).
    """
    out = bytearray(len(data))
    view = np.frombuffer(out, dtype=np.uint8)
    size = _uniform_text(np.frombuffer(data, dtype=np.uint8), count, view)
    del view                    # the bytearray can be resized once no array exports it
    if size < 0:
        return None
    del out[size:]
    return out


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _key_columns(buf: npt.NDArray[np.uint8], batches: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64],
                 key_starts: npt.NDArray[np.int64], key_lengths: npt.NDArray[np.int64],
                 null_values: npt.NDArray[np.bool_]) -> int:  # pragma: no cover - compiled
    r = 0
    for b in range(batches.shape[0]):
        p = batches[b, 0] + 61                  # past the batch header
        base = batches[b, 1]
        stop = batches[b, 0] + batches[b, 2] + 12
        if stop > buf.shape[0]:
            return -1 - b
        for _ in range(batches[b, 3]):
            length, p = _varint(buf, p, stop)
            if p < 0 or length < 0 or p + length > stop:
                return -1 - b
            end = p + length
            p += 1                              # attributes
            while p < end and buf[p] >= 0x80:   # timestamp delta (a varlong): not needed
                p += 1
            delta, p = _varint(buf, p + 1, end)
            if p < 0:
                return -1 - b
            offsets[r] = base + delta
            key_length, p = _varint(buf, p, end)
            if p < 0 or key_length < -1 or p + max(key_length, 0) >= end:
                return -1 - b
            key_starts[r] = p
            key_lengths[r] = key_length
            if key_length > 0:
                p += key_length
            null_values[r] = buf[p] == 1        # value length -1: a tombstone
            p = end
            r += 1
        if p != stop:
            return -1 - b
    return r


class KeyColumns(NamedTuple):
    """The cleaner's view of the records of some batches: parallel arrays, one entry per record."""

    offsets: npt.NDArray[np.int64]
    key_starts: npt.NDArray[np.int64]      # position of the key in the buffer
    key_lengths: npt.NDArray[np.int64]     # -1: a null key
    null_values: npt.NDArray[np.bool_]     # tombstones


def key_columns(buf: bytes, batches: npt.NDArray[np.int64], records: int) -> KeyColumns | None:
    """Offsets, key positions and tombstones of every record of uncompressed data batches, in one call.

    ``batches`` holds one row per batch: (position in ``buf``, base offset,
    batch length, record count); ``records`` is the sum of the counts.  Each
    record is read as ``engine.records.decode.decode_key_columns`` reads it
    (its length must hold its fields and the batch must end with its last
    record); None when any batch is malformed: the caller's Python loop then
    says which and why.
    """
    offsets = np.empty(records, dtype=np.int64)
    key_starts = np.empty(records, dtype=np.int64)
    key_lengths = np.empty(records, dtype=np.int64)
    null_values = np.empty(records, dtype=np.bool_)
    done = _key_columns(np.frombuffer(buf, dtype=np.uint8), batches, offsets, key_starts, key_lengths,
                        null_values)
    if done != records:
        return None
    return KeyColumns(offsets, key_starts, key_lengths, null_values)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _transactional_batches(buf: npt.NDArray[np.uint8],
                           found: npt.NDArray[np.int64]) -> tuple[int, int, int]:  # pragma: no cover - compiled
    n = buf.shape[0]
    p = 0
    last = -1
    count = 0
    while p + 61 <= n:
        length = int((np.int64(buf[p + 8]) << 24) | (np.int64(buf[p + 9]) << 16) | (np.int64(buf[p + 10]) << 8)
                     | np.int64(buf[p + 11]))
        if length < 49 or p + 12 + length > n:          # shorter than a v2 header, or not whole here
            break
        if buf[p + 22] & 0x10:                           # attributes (int16 at 21): transactional
            found[count] = p
            count += 1
        last = p
        p += 12 + length
    return count, last, p


def transactional_batches(buf: bytes) -> tuple[list[int], int, int]:
    """A header-only walk of the whole batches at the front of ``buf``, as ``iter_batches`` frames them.

    Returns (positions of transactional batches, position of the last whole
    batch or -1, position after it).  What is left after it (a batch that does
    not fit, a torn or damaged length) is for the caller's own walk.
    """
    found = np.empty(len(buf) // 61 + 1, dtype=np.int64)
    count, last, end = _transactional_batches(np.frombuffer(buf, dtype=np.uint8), found)
    return found[:count].tolist(), last, end


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _varint_size(zigzagged: int) -> int:  # pragma: no cover - compiled
    n = 1
    while zigzagged >= 0x80:
        zigzagged >>= 7
        n += 1
    return n


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _put_varint(out: npt.NDArray[np.uint8], o: int, zigzagged: int) -> int:  # pragma: no cover - compiled
    while zigzagged >= 0x80:
        out[o] = (zigzagged & 0x7F) | 0x80
        zigzagged >>= 7
        o += 1
    out[o] = zigzagged
    return o + 1


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _lines_layout(data: npt.NDArray[np.uint8]) -> tuple[int, int, int]:  # pragma: no cover - compiled
    end = data.shape[0]
    p = 0
    i = 0
    size = 0
    longest = 0
    while p < end:
        q = _memchr(data, p, end, 10)
        if q < 0:
            return -1, 0, 0
        length = q - p
        body = 4 + _varint_size(i << 1) + _varint_size(length << 1) + length
        size += _varint_size(body << 1) + body
        longest = max(longest, length)
        i += 1
        p = q + 1
    return i, size, longest


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _encode_lines(data: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8],
                  o: int) -> int:  # pragma: no cover - compiled
    end = data.shape[0]
    p = 0
    i = 0
    while p < end:
        q = _memchr(data, p, end, 10)
        length = q - p
        body = 4 + _varint_size(i << 1) + _varint_size(length << 1) + length
        o = _put_varint(out, o, body << 1)
        out[o] = 0                              # attributes
        out[o + 1] = 0                          # timestamp delta
        o = _put_varint(out, o + 2, i << 1)     # offset delta
        out[o] = 1                              # null key (varint -1)
        o = _put_varint(out, o + 1, length << 1)
        _memcpy(out, o, data, p, length)
        o += length
        out[o] = 0                              # no headers
        o += 1
        i += 1
        p = q + 1
    return o


class LinesLayout(NamedTuple):
    """What ``encode_lines`` will write for a block of lines."""

    lines: int          # lines (records)
    size: int           # bytes of the records section
    longest: int        # bytes of the longest line, its newline not counted


def lines_layout(block: bytes) -> LinesLayout | None:
    """The layout of the records section of ``block``'s lines (each ending in ``\n``); None when ``block``
    does not end with a newline."""
    count, size, longest = _lines_layout(np.frombuffer(block, dtype=np.uint8))
    if count < 0:
        return None
    return LinesLayout(count, size, longest)


def encode_lines(block: bytes, out: bytearray, position: int) -> int:
    """Write the records section of ``block``'s lines into ``out`` from ``position``; returns the end.

    Each line is a record: attributes 0, timestamp delta 0, offset delta its
    index, a null key, the line without its newline as the value, no headers;
    byte for byte what ``encode_values`` writes for the same values.  ``out``
    must hold ``lines_layout(block).size`` bytes from ``position``.
    """
    view = np.frombuffer(out, dtype=np.uint8)
    try:
        return int(_encode_lines(np.frombuffer(block, dtype=np.uint8), view, position))
    finally:
        del view                # the bytearray can be resized once no array exports it


# -- the log cleaner's offset map: MD5 of each key and Kafka's SkimpyOffsetMap put, compiled ---------------

_MASK32 = np.uint64(0xFFFFFFFF)
#: MD5's per-step left rotations (RFC 1321), and 32 minus each
_MD5_SHIFT = np.array([7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4 + [6, 10, 15, 21] * 4,
                      dtype=np.uint64)
_MD5_UNSHIFT = np.uint64(32) - _MD5_SHIFT
#: MD5's per-step constants, floor(abs(sin(i + 1)) * 2**32)
_MD5_K = np.array([int(abs(math.sin(i + 1)) * 2 ** 32) & 0xFFFFFFFF for i in range(64)], dtype=np.uint64)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _md5_compress(data: npt.NDArray[np.uint8], p: int, state: npt.NDArray[np.uint64],
                  words: npt.NDArray[np.uint64]) -> None:  # pragma: no cover - compiled
    for i in range(16):
        q = p + 4 * i
        words[i] = (np.uint64(data[q]) | (np.uint64(data[q + 1]) << np.uint64(8))
                    | (np.uint64(data[q + 2]) << np.uint64(16)) | (np.uint64(data[q + 3]) << np.uint64(24)))
    a = state[0]
    b = state[1]
    c = state[2]
    d = state[3]
    for i in range(64):
        if i < 16:
            f = (b & c) | (~b & d)
            g = i
        elif i < 32:
            f = (d & b) | (~d & c)
            g = (5 * i + 1) & 15
        elif i < 48:
            f = b ^ c ^ d
            g = (3 * i + 5) & 15
        else:
            f = c ^ (b | ~d)
            g = (7 * i) & 15
        f = (f + a + _MD5_K[i] + words[g]) & _MASK32
        a = d
        d = c
        c = b
        b = (b + ((f << _MD5_SHIFT[i]) | (f >> _MD5_UNSHIFT[i]))) & _MASK32
    state[0] = (state[0] + a) & _MASK32
    state[1] = (state[1] + b) & _MASK32
    state[2] = (state[2] + c) & _MASK32
    state[3] = (state[3] + d) & _MASK32


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _md5(data: npt.NDArray[np.uint8], start: int, length: int, out: npt.NDArray[np.uint8], o: int,
         state: npt.NDArray[np.uint64], words: npt.NDArray[np.uint64],
         tail: npt.NDArray[np.uint8]) -> None:  # pragma: no cover - compiled
    """The MD5 digest (RFC 1321) of ``data[start:start + length]`` into ``out[o:o + 16]``."""
    state[0] = np.uint64(0x67452301)
    state[1] = np.uint64(0xEFCDAB89)
    state[2] = np.uint64(0x98BADCFE)
    state[3] = np.uint64(0x10325476)
    p = start
    end = start + length
    while p + 64 <= end:
        _md5_compress(data, p, state, words)
        p += 64
    rest = end - p
    tail[:] = 0
    for i in range(rest):
        tail[i] = data[p + i]
    tail[rest] = 0x80
    blocks = 1 if rest < 56 else 2
    bits = np.uint64(length) << np.uint64(3)
    for i in range(8):
        tail[blocks * 64 - 8 + i] = (bits >> np.uint64(8 * i)) & np.uint64(0xFF)
    for b in range(blocks):
        _md5_compress(tail, b * 64, state, words)
    for i in range(4):
        for j in range(4):
            out[o + 4 * i + j] = (state[i] >> np.uint64(8 * j)) & np.uint64(0xFF)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _key_digests(buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
                 out: npt.NDArray[np.uint8]) -> None:  # pragma: no cover - compiled
    state = np.empty(4, dtype=np.uint64)
    words = np.empty(16, dtype=np.uint64)
    tail = np.empty(128, dtype=np.uint8)
    for i in range(starts.shape[0]):
        _md5(buf, starts[i], lengths[i], out, 16 * i, state, words, tail)


def key_digests(buf: bytes, starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """The MD5 digests of the keys ``buf[s:s + n]`` for each start ``s`` and length ``n`` (all >= 0), as
    one ``(count, 16)`` array: what ``hashlib.md5(key).digest()`` gives, without a bytes object per key."""
    out = np.empty((len(starts), 16), dtype=np.uint8)
    _key_digests(np.frombuffer(buf, dtype=np.uint8), starts, lengths, out.reshape(-1))
    return out


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _probe_position(digest: npt.NDArray[np.uint8], d: int, attempt: int, slots: int) -> int:  # pragma: no cover
    at = min(attempt, 12)
    probe = ((np.int64(digest[d + at]) << 24) | (np.int64(digest[d + at + 1]) << 16)
             | (np.int64(digest[d + at + 2]) << 8) | np.int64(digest[d + at + 3]))
    if probe >= 1 << 31:
        probe -= 1 << 32                        # a Java int
    if attempt > 12:
        probe = ((probe + attempt - 12 + (1 << 31)) % (1 << 32)) - (1 << 31)     # Java's wrapping add
    if probe == -(1 << 31):
        return 0                                # Utils.abs(Integer.MIN_VALUE)
    return int(abs(probe) % slots)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _put_digests(table: npt.NDArray[np.uint64], slots: int, digests: npt.NDArray[np.uint8],
                 words: npt.NDArray[np.uint64], offsets: npt.NDArray[np.uint64], limit: int,
                 entries: int) -> tuple[int, int, int]:  # pragma: no cover - compiled
    # A slot is three 64-bit words (the 24-byte slots start 8-aligned): the digest's two, then the
    # offset as stored (big-endian), so a probe compares two words where byte loops compared 16.
    probes = 0
    for i in range(offsets.shape[0]):
        if entries >= limit:
            return i, entries, probes
        w0 = words[2 * i]
        w1 = words[2 * i + 1]
        attempt = 0
        while True:
            slot = 3 * _probe_position(digests, 16 * i, attempt, slots)
            probes += 1
            t0 = table[slot]
            t1 = table[slot + 1]
            if t0 == w0 and t1 == w1:
                break                           # the key's slot: overwrite its offset
            if t0 == 0 and t1 == 0 and table[slot + 2] == 0:
                table[slot] = w0                # an empty slot: the key is new
                table[slot + 1] = w1
                entries += 1
                break
            attempt += 1
        table[slot + 2] = offsets[i]
    return offsets.shape[0], entries, probes


def put_digests(table: mmap.mmap, slots: int, digests: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64],
                limit: int, entries: int) -> tuple[int, int, int]:
    """``OffsetMap.put`` of each (digest, offset) pair in order, into the map's table, compiled.

    Stops before the first pair at which the map holds ``limit`` keys, as
    ``OffsetMap.put_many`` does.  Returns (pairs put, entries after, probes).
    """
    view = np.frombuffer(table, dtype=np.uint64)
    flat = np.ascontiguousarray(digests).reshape(-1)
    try:
        done, entries, probes = _put_digests(view, slots, flat, flat.view(np.uint64),
                                             offsets.astype(">i8").view(np.uint64), limit, entries)
    finally:
        del view
    return int(done), int(entries), int(probes)


def load() -> None:
    """Compile (the first time) or load from ``__pycache__`` every kernel of this module, on empty input:
    ``scripts/setup.sh`` does it at install, the benchmarks before they time anything."""
    uniform_text(b"", 0)
    key_columns(b"", np.zeros((0, 5), dtype=np.int64), 0)
    transactional_batches(b"")
    encode_lines(b"", bytearray(), 0)
    lines_layout(b"")
    empty = np.zeros(0, dtype=np.int64)
    key_digests(b"", empty, empty)
    put_digests(mmap.mmap(-1, 24), 1, np.zeros((0, 16), dtype=np.uint8), empty, 1, 0)
