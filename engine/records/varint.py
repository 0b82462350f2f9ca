"""Zig-zag varints, and the precomputed tables the encode and decode fast paths index.

Hot path: the tables are module-level lists and their bound ``__getitem__``
methods, so that the encoders and the fast-path decoders can ``map`` C builtins
over whole batches instead of calling a Python function per record.  Import
time matters for the command line, hence the per-width list comprehensions.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import repeat
from operator import add
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.records.format import RecordBuffer


def _zigzag_varint(n: int) -> bytes:
    """Kafka's ``ByteUtils.writeVarlong``: zig-zag, then 7 bits per byte, low first."""
    v = (n << 1) if n >= 0 else ((-n << 1) - 1)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


#: Table bound: lengths and offset deltas below it come from the tables.
_TABLE_SIZE = 1 << 16
#: _VARINT[n]: the zig-zag varint of n (n >= 0), i.e. 2n in 1, 2 or 3 bytes;
#: spelled out per width because import time matters for the command line.
_VARINT: list[bytes] = (
    [bytes((n << 1,)) for n in range(64)]
    + [bytes((((n << 1) & 0x7F) | 0x80, n >> 6)) for n in range(64, 8192)]
    + [bytes((((n << 1) & 0x7F) | 0x80, ((n >> 6) & 0x7F) | 0x80, n >> 13)) for n in range(8192, _TABLE_SIZE)]
)
#: _VARINT_LEN[n] == len(_VARINT[n]).
_VARINT_LEN: list[int] = [1] * 64 + [2] * (8192 - 64) + [3] * (_TABLE_SIZE - 8192)
#: The previous record's empty header count (0) followed by this record's length:
#: lets one table piece end one record and start the next.
_HC0_VARINT: list[bytes] = list(map(add, repeat(b"\x00"), _VARINT))
#: attributes 0, timestamp delta 0, offset delta k: front of record k when keyed.
_PREFIX_KEYED: list[bytes] = list(map(add, repeat(b"\x00\x00"), _VARINT))
#: attributes 0, timestamp delta 0, offset delta k, null key: the constant
#: front of record k in a batch written by encode_values without keys.
_PREFIX_NULL_KEY: list[bytes] = list(map(add, _PREFIX_KEYED, repeat(b"\x01")))
#: len(_PREFIX_KEYED[k]) + 1 (the record's trailing header count).
_PREFIX_KEYED_LEN1: list[int] = [3 + n for n in _VARINT_LEN]


def _length_piece_table(prefix_len: int) -> list[bytes | None]:
    """Value length L -> the length piece of an unkeyed record with that value.

    A record's length depends only on its value's length and on how many bytes
    its offset delta takes (1 below 64, 2 below 8192, 3 below 65536), so three
    tables indexed by L replace the per-record arithmetic.  None marks lengths
    beyond _VARINT, which makes the join fail and the general path take over.
    """
    bodies = list(map(add, _VARINT_LEN, range(prefix_len + 1, prefix_len + 1 + _TABLE_SIZE)))
    in_range = bisect_left(bodies, _TABLE_SIZE)     # bodies only grow with the length
    table: list[bytes | None] = list(map(_HC0_VARINT.__getitem__, bodies[:in_range]))
    return table + [None] * (_TABLE_SIZE - in_range)


_LENGTH_1 = _length_piece_table(4).__getitem__      # offset delta < 64
_LENGTH_2 = _length_piece_table(5).__getitem__      # offset delta < 8192
_LENGTH_3 = _length_piece_table(6).__getitem__      # offset delta < 65536
_varint_piece = _VARINT.__getitem__
_varint_len = _VARINT_LEN.__getitem__
_hc0_varint_piece = _HC0_VARINT.__getitem__
_NULL = b"\x01"     # zig-zag varint of -1: a null key or value


def _varint(n: int) -> bytes:
    return _VARINT[n] if 0 <= n < _TABLE_SIZE else _zigzag_varint(n)


def _read_varint(buf: RecordBuffer, pos: int) -> tuple[int, int]:
    """Decode the zig-zag varint at ``pos``; returns (value, position after it)."""
    shift = 0
    raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint is longer than 10 bytes")
