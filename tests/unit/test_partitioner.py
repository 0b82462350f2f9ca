"""murmur2 and key -> partition against Kafka's Java values and kafka-python's port."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from engine.errors import InvalidPartitionError
from engine.partitioner import murmur2, partition_for_key, to_positive

# The expected values of Kafka's own UtilsTest.testMurmur2 (Java's signed ints).
JAVA_CASES = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), sorted(JAVA_CASES.items()))
def test_murmur2_matches_kafka_utils_test(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=80))
def test_murmur2_matches_kafka_python(key: bytes) -> None:
    ours = murmur2(key)
    assert -(2 ** 31) <= ours < 2 ** 31
    assert ours & 0xFFFFFFFF == kafka_python_murmur2(key)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40), st.integers(min_value=1, max_value=1000))
def test_partition_for_key_matches_default_partitioner(key: bytes, partitions: int) -> None:
    # kafka-python's DefaultPartitioner: (murmur2(key) & 0x7fffffff) % len(partitions)
    expected = (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions
    assert partition_for_key(key, partitions) == expected


def test_to_positive_clears_sign_bit_instead_of_abs() -> None:
    # Integer.MIN_VALUE has no positive abs in Java; toPositive maps it to 0.
    assert to_positive(-(2 ** 31)) == 0
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(5) == 5


def test_keys_spread_over_partitions() -> None:
    seen = {partition_for_key(f"key-{i}".encode(), 8) for i in range(200)}
    assert seen == set(range(8))


def test_zero_partitions_refused() -> None:
    with pytest.raises(InvalidPartitionError):
        partition_for_key(b"k", 0)
