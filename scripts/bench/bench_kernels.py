#!/usr/bin/env python3
"""The record kernels' alternatives side by side (issue 26): the C extension, numpy, pure Python.

For the hottest kernels, CPU time of one call (best of --repeat), on the same
input, each checked to give the C kernel's bytes first:

* encoding 1 MiB of 100-byte text lines as a records section (``cat >> append``):
  C ``lines_layout`` + ``encode_lines``; numpy, vectorised; Python
  ``bytes.split`` + ``encode_values`` (the path the mount takes without the C);
* the text view of 10,000 values of 40-200 bytes: C ``records_text``; Python
  ``_sized_walk``;
* MD5 of 100,000 12-byte keys: C ``key_digests``; ``hashlib`` per key.

``--numba-from CHECKOUT`` adds the numba kernels of an older checkout (its
``engine/records/kernels.py``, before the C extension), when numba is installed.

    .venv/bin/python scripts/bench/bench_kernels.py [--repeat 5] [--numba-from /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.records import HEADER_SIZE, compiled, encode_values  # noqa: E402
from engine.records.fastpath import _sized_walk  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType


def _best_ms(call: Callable[[], object], repeat: int, inner: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(inner):
            call()
        best = min(best, (time.process_time() - start) / inner)
    return best * 1e3


def _varint_sizes(z: np.ndarray) -> np.ndarray:
    return 1 + (z >= 1 << 7) + (z >= 1 << 14) + (z >= 1 << 21) + (z >= 1 << 28)


def _put_varints(out: np.ndarray, pos: np.ndarray, z: np.ndarray) -> np.ndarray:
    size = _varint_sizes(z)
    for b in range(5):
        sel = size > b
        out[pos[sel] + b] = (((z[sel] >> (7 * b)) & 0x7F) | ((size[sel] > b + 1) * 0x80)).astype(np.uint8)
    return pos + size


def numpy_encode_lines(block: bytes) -> bytes:
    """The records section of ``block``'s lines, vectorised with numpy (no loop per line)."""
    arr = np.frombuffer(block, np.uint8)
    newlines = np.flatnonzero(arr == 10)
    starts = np.empty(len(newlines), np.int64)
    starts[0] = 0
    starts[1:] = newlines[:-1] + 1
    lengths = newlines - starts
    deltas = np.arange(len(newlines), dtype=np.int64) << 1
    body = 4 + _varint_sizes(deltas) + _varint_sizes(lengths << 1) + lengths
    record = _varint_sizes(body << 1) + body
    ends = np.cumsum(record)
    out = np.zeros(int(ends[-1]), np.uint8)
    pos = _put_varints(out, ends - record, body << 1) + 2          # attributes, timestamp delta: zeros
    pos = _put_varints(out, pos, deltas)
    out[pos] = 1                                                    # null key
    pos = _put_varints(out, pos + 1, lengths << 1)
    keep = np.ones(len(arr), bool)
    keep[newlines] = False
    out[np.repeat(pos - (np.cumsum(lengths) - lengths), lengths) + np.arange(len(arr) - len(newlines))] = arr[keep]
    return out.tobytes()


def _numba_kernels(checkout: Path) -> ModuleType | None:
    path = checkout / "engine/records/kernels.py"
    try:
        import numba  # noqa: F401
    except ImportError:
        print("numba is not installed: its row is left out")
        return None
    spec = importlib.util.spec_from_file_location("numba_kernels", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "load"):
        print(f"{path} holds no numba kernels: its row is left out")
        return None
    start = time.perf_counter()
    module.load()
    print(f"numba kernels of {checkout} loaded in {time.perf_counter() - start:.2f} s")
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--numba-from", type=Path, help="a checkout whose engine/records/kernels.py is numba's")
    args = parser.parse_args()
    c = compiled.KERNELS
    if c is None:
        raise SystemExit("the compiled record kernels are not built: run scripts/setup.sh")
    nb = _numba_kernels(args.numba_from) if args.numba_from else None
    rows: list[tuple[str, str, float]] = []

    block = b"".join(b"%011d " % i + b"x" * 87 + b"\n" for i in range(10_486))        # 1 MiB of 100-byte lines
    lines = block.split(b"\n")[:-1]
    section = encode_values(0, lines, 0)[HEADER_SIZE:]

    def encode_with(kernels: ModuleType) -> bytes:
        layout = kernels.lines_layout(block)
        out = bytearray(layout.size)
        kernels.encode_lines(block, out, 0)
        return bytes(out)

    assert encode_with(c) == numpy_encode_lines(block) == section
    what = "encode 1 MiB of 100-byte lines"
    rows.append((what, "C extension", _best_ms(lambda: encode_with(c), args.repeat, 50)))
    if nb is not None:
        assert encode_with(nb) == section
        rows.append((what, "numba", _best_ms(lambda: encode_with(nb), args.repeat, 50)))
    rows.append((what, "numpy, vectorised", _best_ms(lambda: numpy_encode_lines(block), args.repeat, 5)))
    rows.append((what, "Python: split + encode_values",
                 _best_ms(lambda: encode_values(0, block.split(b"\n")[:-1], 0), args.repeat, 5)))

    values = [b"v" * (40 + i * 37 % 161) for i in range(10_000)]
    mixed = bytes(encode_values(0, values, 0)[HEADER_SIZE:])
    text = b"".join(v + b"\n" for v in values)
    assert c.records_text(mixed, len(values)) == text
    what = "text view of 10,000 values of 40-200 B"
    rows.append((what, "C extension", _best_ms(lambda: c.records_text(mixed, len(values)), args.repeat, 50)))
    if nb is not None:
        assert nb.uniform_text(mixed, len(values)) == text
        rows.append((what, "numba", _best_ms(lambda: nb.uniform_text(mixed, len(values)), args.repeat, 50)))
    rows.append((what, "Python: _sized_walk",
                 _best_ms(lambda: b"\n".join([*_sized_walk(mixed, len(values)), b""]), args.repeat, 5)))

    keys = b"".join(b"key-%08d" % i for i in range(100_000))
    starts = np.arange(0, len(keys), 12, dtype=np.int64)
    lengths = np.full(len(starts), 12, dtype=np.int64)
    assert bytes(c.key_digests(keys, starts, lengths)[7]) == hashlib.md5(keys[84:96]).digest()
    what = "MD5 of 100,000 12-byte keys"
    rows.append((what, "C extension", _best_ms(lambda: c.key_digests(keys, starts, lengths), args.repeat, 5)))
    if nb is not None:
        rows.append((what, "numba", _best_ms(lambda: nb.key_digests(keys, starts, lengths), args.repeat, 5)))
    rows.append((what, "Python: hashlib per key",
                 _best_ms(lambda: [hashlib.md5(keys[s:s + 12]).digest() for s in range(0, len(keys), 12)],
                          args.repeat, 2)))

    print(f"{'kernel':40} {'implementation':32} {'ms':>9} {'x C':>7}")
    base = 0.0
    for what, how, ms in rows:
        base = ms if how == "C extension" else base
        print(f"{what:40} {how:32} {ms:9.3f} {ms / base:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
