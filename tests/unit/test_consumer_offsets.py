"""The __consumer_offsets store: Kafka's placement, Kafka's schemas, and loading a log written by others.

The schemas are written here independently of engine.consumer_offsets, field
by field from Kafka's OffsetCommitKey/OffsetCommitValue/GroupMetadataKey JSON
definitions, and batches come from kafka-python's record builder, so the
loader is checked against bytes our encoder never produced.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from engine.config import BrokerConfig
from engine.consumer_offsets import (
    GROUP_METADATA_TOPIC_NAME,
    GroupMetadataManager,
    OffsetAndMetadata,
    OffsetCommitKey,
    decode_key,
    decode_offset_commit_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    java_string_hash,
    partition_for,
)
from engine.manager import LogManager
from engine.topic import TopicPartition
from tests.helpers import log_of

if TYPE_CHECKING:
    from pathlib import Path

# ---------------------------------------------------------------- an independent writer of Kafka's schemas


def kstr(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def key_bytes(version: int, group: str, topic: str, partition: int) -> bytes:
    """OffsetCommitKey (versions 0 and 1 share the schema)."""
    return struct.pack(">h", version) + kstr(group) + kstr(topic) + struct.pack(">i", partition)


def group_metadata_key(group: str) -> bytes:
    return struct.pack(">h", 2) + kstr(group)


def value_bytes(version: int, offset: int, metadata: str = "", commit_ts: int = 1000, epoch: int = 7,
                expire_ts: int = 2000) -> bytes:
    v = struct.pack(">hq", version, offset)
    if version == 0 or version == 2:
        return v + kstr(metadata) + struct.pack(">q", commit_ts)
    if version == 1:
        return v + kstr(metadata) + struct.pack(">qq", commit_ts, expire_ts)
    if version == 3:
        return v + struct.pack(">i", epoch) + kstr(metadata) + struct.pack(">q", commit_ts)
    if version == 4:   # flexible: compact string (uvarint length + 1), then an empty tagged-field section
        meta = metadata.encode()
        assert len(meta) + 1 < 128
        return v + struct.pack(">i", epoch) + bytes([len(meta) + 1]) + meta + struct.pack(">q", commit_ts) + b"\x00"
    raise AssertionError(version)


def batch(base_offset: int, records: list[tuple[bytes | None, bytes | None]], *, producer_id: int = -1,
          transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, transactional, producer_id, 0 if producer_id >= 0 else -1, -1, 1 << 20)
    for i, (k, v) in enumerate(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=k, value=v, headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    return bytes(data)


def control_batch(base_offset: int, producer_id: int, commit: bool) -> bytes:
    """A transaction marker: kafka-python cannot build one, so set the control bit and re-sign the batch."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    data = bytearray(batch(base_offset, [(key, value)], producer_id=producer_id, transactional=True))
    attributes = struct.unpack_from(">h", data, 21)[0] | 0x20
    struct.pack_into(">h", data, 21, attributes)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


# ---------------------------------------------------------------- placement


@pytest.mark.parametrize(("text", "expected"), [
    ("", 0), ("hello", 99162322), ("Aa", 2112), ("BB", 2112),
    ("polygenelubricants", -2**31),              # Java's famous Integer.MIN_VALUE hash
    ("\U0001F600", 0xD83D * 31 + 0xDE00),          # a surrogate pair: two UTF-16 code units
])
def test_java_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_partition_for_is_kafkas() -> None:
    assert partition_for("polygenelubricants", 50) == 0          # Utils.abs(MIN_VALUE) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    negative = next(g for g in (f"group-{i}" for i in range(1000)) if java_string_hash(g) < 0)
    assert partition_for(negative, 50) == (-java_string_hash(negative)) % 50


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_java_string_hash_matches_the_definition(text: str) -> None:
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i:i + 2], "big")) % 2**32
    assert java_string_hash(text) == (h - 2**32 if h >= 2**31 else h)


# ---------------------------------------------------------------- serde


def test_we_write_key_v1_and_value_v3_as_kafka_does() -> None:
    assert encode_offset_commit_key(OffsetCommitKey("billing", "orders", 3)) == key_bytes(1, "billing", "orders", 3)
    assert encode_offset_commit_value(OffsetAndMetadata(42, -1, "m", 1234)) == value_bytes(3, 42, "m", 1234, -1)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_every_value_version_decodes(version: int) -> None:
    got = decode_offset_commit_value(value_bytes(version, 99, "meta", 5555))
    assert (got.offset, got.metadata, got.commit_timestamp) == (99, "meta", 5555)
    assert got.leader_epoch == (7 if version >= 3 else -1)
    assert got.expire_timestamp == (2000 if version == 1 else -1)


def test_keys_of_every_kind() -> None:
    assert decode_key(key_bytes(0, "g", "t", 1)) == (0, OffsetCommitKey("g", "t", 1))
    assert decode_key(key_bytes(1, "g", "t", 1)) == (1, OffsetCommitKey("g", "t", 1))
    assert decode_key(group_metadata_key("g")) == (2, "g")
    assert decode_key(struct.pack(">h", 3) + b"anything")[1] is None
    with pytest.raises(ValueError, match="needs 4 bytes"):
        decode_key(key_bytes(1, "g", "t", 1)[:-2])
    with pytest.raises(ValueError, match="unknown OffsetCommitValue version 9"):
        decode_offset_commit_value(struct.pack(">hq", 9, 1))


@given(st.text(min_size=1, max_size=50), st.text(max_size=50), st.integers(0, 2**31 - 1),
       st.integers(0, 2**63 - 1), st.text(max_size=100), st.integers(0, 2**63 - 1))
@settings(max_examples=100, deadline=None)
def test_serde_round_trip(group, topic, partition, offset, metadata, ts) -> None:
    key = OffsetCommitKey(group, topic, partition)
    assert decode_key(encode_offset_commit_key(key)) == (1, key)
    value = OffsetAndMetadata(offset, -1, metadata, ts)
    assert decode_offset_commit_value(encode_offset_commit_value(value)) == value


# ---------------------------------------------------------------- loading and writing through a real LogManager


def _manager(tmp_path: Path, partitions: int = 3) -> LogManager:
    config = BrokerConfig.from_props({"log.dirs": str(tmp_path / "data"),
                                      "offsets.topic.num.partitions": str(partitions),
                                      "log.cleaner.enable": "false"})
    manager = LogManager(config)
    manager.startup()
    return manager


def test_load_replays_versions_tombstones_group_metadata_and_transactions(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.create_topic(GROUP_METADATA_TOPIC_NAME, 3, {"cleanup.policy": "compact"})
    log = log_of(manager, TopicPartition(GROUP_METADATA_TOPIC_NAME, 1))
    log.append_batch(batch(0, [
        (key_bytes(0, "old", "t", 0), value_bytes(0, 5)),         # legacy key v0, value v0
        (key_bytes(1, "old", "t", 1), value_bytes(1, 6)),         # value v1 with an expire timestamp
        (group_metadata_key("old"), b"\x00\x03group-metadata"),   # skipped
        (key_bytes(1, "new", "t", 0), value_bytes(2, 7)),
        (key_bytes(1, "new", "t", 0), value_bytes(4, 8)),         # later commit of the same key wins
        (key_bytes(1, "gone", "t", 0), value_bytes(3, 9)),
        (key_bytes(1, "gone", "t", 0), None),                     # tombstone
        (struct.pack(">h", 5) + b"a newer record type", b"whatever"),
    ]))
    log.append_batch(batch(8, [(key_bytes(1, "tx", "t", 0), value_bytes(3, 11))], producer_id=42, transactional=True))
    log.append_batch(batch(9, [(key_bytes(1, "aborted", "t", 0), value_bytes(3, 12))], producer_id=43,
                           transactional=True))
    log.append_batch(control_batch(10, 42, commit=True))
    log.append_batch(control_batch(11, 43, commit=False))
    log.append_batch(batch(12, [(key_bytes(1, "pending", "t", 0), value_bytes(3, 13))], producer_id=44,
                           transactional=True))          # never committed: not visible
    manager.create_topic("t", 2)

    store = GroupMetadataManager(manager).load()
    assert store.groups("t") == ["new", "old", "tx"]
    assert store.committed_offsets("old", "t") == {0: 5, 1: 6}
    assert store.committed("new", TopicPartition("t", 0)) == 8
    assert store.committed("tx", TopicPartition("t", 0)) == 11
    old = store.offset_and_metadata("old", TopicPartition("t", 1))
    assert old is not None
    assert old.expire_timestamp == 2000
    manager.shutdown()


def test_commit_goes_to_the_groups_partition_and_survives_a_restart(tmp_path: Path) -> None:
    manager = _manager(tmp_path, partitions=7)
    manager.create_topic("orders", 2)
    store = GroupMetadataManager(manager).load()
    store.commit("billing", {TopicPartition("orders", 0): 3, TopicPartition("orders", 1): 4})
    assert manager.partitions(GROUP_METADATA_TOPIC_NAME) == list(range(7))
    assert manager.topic_config(GROUP_METADATA_TOPIC_NAME).compact
    p = partition_for("billing", 7)
    records = log_of(manager, TopicPartition(GROUP_METADATA_TOPIC_NAME, p)).read_records(0)
    assert [(r.key, None if r.value is None else r.value[:10]) for r in records] == [
        (key_bytes(1, "billing", "orders", 0), value_bytes(3, 3, epoch=-1)[:10]),
        (key_bytes(1, "billing", "orders", 1), value_bytes(3, 4, epoch=-1)[:10])]
    store.delete_group_offsets("billing", "orders")
    store.commit("audit", {TopicPartition("orders", 1): 2})
    manager.shutdown()

    manager = _manager(tmp_path, partitions=7)
    store = GroupMetadataManager(manager).load()
    assert store.groups("orders") == ["audit"]
    assert store.committed("audit", TopicPartition("orders", 1)) == 2
    assert [(r.partition, r.committed, r.log_end_offset, r.lag) for r in store.lag("audit", "orders")] == \
        [(0, -1, 0, 0), (1, 2, 0, 0)]
    manager.shutdown()
