"""Compression of a batch's records section (attribute bits 0-2), as Kafka's clients frame it."""

from __future__ import annotations

import struct

import cramjam
import lz4.frame

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
        return lz4.frame.compress(data, block_linked=False, store_size=False,
                                  block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=_ZSTD_LEVEL))
    raise InvalidRecordError(f"Unknown compression codec id {codec}")


def _decompress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.decompress(data))
    if codec == Compression.SNAPPY:
        return _snappy_decompress(bytes(data))
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"unknown compression codec id {codec}")
