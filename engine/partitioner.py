"""Kafka's default partitioner for keyed records: ``Utils.murmur2`` and ``toPositive``.

A keyed line written to ``<topic>/append`` must land in the partition a Kafka
producer would pick for the same key, so that a data directory moved to real
brokers (or read next to one) keeps every key in one partition.  Kafka's
``BuiltInPartitioner.partitionForKey`` is ``toPositive(murmur2(key)) % n`` where
murmur2 is the 32-bit MurmurHash2 with seed 0x9747b28c, computed with Java's
wrapping int arithmetic; this module reproduces it bit for bit.
"""

from __future__ import annotations

import struct

from engine.errors import InvalidPartitionError

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the signed 32-bit MurmurHash2 of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    m = _M
    mask = _MASK
    whole = length & ~3
    # Java reads the 4-byte blocks little-endian; unpacking them all at once
    # keeps the loop to arithmetic only.
    for k in struct.unpack_from(f"<{length >> 2}I", data):
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``, which overflows)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null ``key``."""
    if num_partitions <= 0:
        raise InvalidPartitionError(f"Number of partitions must be positive, got {num_partitions}")
    return to_positive(murmur2(key)) % num_partitions
