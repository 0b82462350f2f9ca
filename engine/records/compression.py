"""Compression of a batch's records section (attribute bits 0-2), as Kafka's clients frame it."""

from __future__ import annotations

import struct
import threading

import cramjam
import lz4.frame
import zstandard

from engine.errors import InvalidRecordError
from engine.records.format import Compression

#: xerial snappy-java's stream header (SnappyCodec): marker -126, "SNAPPY", NUL,
#: version 1, minimum compatible version 1.  Kafka's Java client writes snappy
#: through SnappyOutputStream, so that framing is what a broker's logs hold.
_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024
_BLOCK_LEN = struct.Struct(">i")
#: Kafka's default zstd level (ZstdCompression.DEFAULT_LEVEL).
_ZSTD_LEVEL = 3


def _snappy_compress_xerial(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    for start in range(0, len(data), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK_SIZE]))
        parts.append(_BLOCK_LEN.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes) -> bytes:
    """Decode xerial-framed snappy (Java and kafka-python producers) or a raw block."""
    if data[:8] != _XERIAL_HEADER[:8]:
        return bytes(cramjam.snappy.decompress_raw(data))
    # The version fields after the magic are ignored, as kafka-python does: some
    # producers write them little-endian.
    parts = []
    pos = len(_XERIAL_HEADER)
    end = len(data)
    view = memoryview(data)
    while pos < end:
        (block_len,) = _BLOCK_LEN.unpack_from(data, pos)
        pos += 4
        if block_len < 0 or pos + block_len > end:
            raise ValueError(f"xerial snappy block of {block_len} bytes overruns the stream")
        parts.append(bytes(cramjam.snappy.decompress_raw(view[pos:pos + block_len])))
        pos += block_len
    return b"".join(parts)


def _compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        return _snappy_compress_xerial(data)
    if codec == Compression.LZ4:
        # The LZ4 frame as Kafka's Lz4BlockOutputStream writes it: independent
        # 64 KB blocks, no content size.  Kafka's reader refuses linked blocks
        # ("Dependent block stream is unsupported"), which cramjam writes.
        framed: bytes = lz4.frame.compress(data, block_linked=False, store_size=False,
                                           block_size=lz4.frame.BLOCKSIZE_MAX64KB)
        return framed
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL))
    raise InvalidRecordError(f"Unknown compression codec id {codec}")


#: a zstd decompression context per thread (a ZstdDecompressor is not safe for concurrent use)
_ZSTD = threading.local()


def _zstd_decompress(data: bytes | bytearray | memoryview) -> bytes:
    """Every zstd frame of ``data``, one after another; ValueError if one is cut short (or ``data`` is empty).

    Kafka's Java producer (zstd-jni's stream) writes frames without their content size, which a one-shot
    decompression (cramjam) handles by growing its output: a streaming decompression of each frame takes
    half the time (docs/performance.md, "Every producer's batches").  Concatenated frames and trailing
    bytes are read and refused as cramjam does.
    """
    dctx = getattr(_ZSTD, "dctx", None)
    if dctx is None:
        dctx = _ZSTD.dctx = zstandard.ZstdDecompressor()
    parts = []
    while True:
        frame = dctx.decompressobj()
        parts.append(frame.decompress(data))
        if not frame.eof:
            raise ValueError("zstd: incomplete frame")
        data = frame.unused_data
        if not data:
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _lz4_decompress(data: bytes | bytearray | memoryview) -> bytes:
    """Every LZ4 frame of ``data``, one after another (lz4's frame decoder: twice cramjam's speed on the 64 KiB
    blocks Kafka's producers write); RuntimeError if one is cut short or ``data`` is not a frame."""
    view = memoryview(data)
    parts = []
    position = 0
    while True:
        out, used = lz4.frame.decompress(view[position:], return_bytes_read=True)
        if used <= 0:
            raise RuntimeError("lz4: a frame of no bytes")
        parts.append(out)
        position += used
        if position >= len(view):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.decompress(data))
    if codec == Compression.SNAPPY:
        return _snappy_decompress(bytes(data))
    if codec == Compression.LZ4:
        return _lz4_decompress(data)
    if codec == Compression.ZSTD:
        return _zstd_decompress(data)
    raise ValueError(f"unknown compression codec id {codec}")
