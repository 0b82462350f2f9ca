"""Consumer groups' committed offsets, stored in ``__consumer_offsets`` as Kafka stores them.

Kafka's group coordinator keeps every committed offset as a record of the
internal, compacted topic ``__consumer_offsets``; this module is that store for
logfs (the offset part of Kafka's ``GroupMetadataManager``):

* **Placement.** A group's records all go to partition
  ``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`` (default 50, engine.config),
  with Java's ``String.hashCode`` over UTF-16 code units and Kafka's ``abs``
  that maps ``Integer.MIN_VALUE`` to 0 (:func:`partition_for`).
* **Record format** (Kafka's coordinator record serde: a big-endian int16
  version or record type, then the schema's fields; strings are int16 length +
  UTF-8; flexible versions use compact strings and a tagged-field section):

  - key ``OffsetCommitKey``, written with version 1 (Kafka 3.x/4.x; version 0
    is the same schema, the old ``LegacyOffsetCommitKey``):
    ``group`` string, ``topic`` string, ``partition`` int32;
  - key version 2 is ``GroupMetadataKey`` (the group's membership, not an
    offset): skipped, as are the newer consumer-protocol record types (3+);
  - value ``OffsetCommitValue``, written with version 3: ``offset`` int64,
    ``leaderEpoch`` int32, ``metadata`` string, ``commitTimestamp`` int64.
    Read: v0 (offset, metadata, commitTimestamp), v1 (+ ``expireTimestamp``),
    v2 (as v0), v3, and v4 (v3's fields, flexible);
  - a null value (tombstone) deletes the commit; the log cleaner then drops
    the key after ``delete.retention.ms``.
* **Loading** (:meth:`GroupMetadataManager.load`) replays every partition from
  its log start at mount start, the latest record per key winning, so commits a
  Kafka broker made (a copied ``log.dirs``) show up.  As in Kafka's loader,
  commits in a transaction (``sendOffsetsToTransaction``) count only once its
  COMMIT marker is read, and an ABORT marker drops them.
* **Writing** (:meth:`GroupMetadataManager.commit`, :meth:`delete_group_offsets`):
  one batch per call to the group's partition (so a multi-partition commit is
  all or nothing), created lazily with ``offsets.topic.num.partitions``
  partitions, ``cleanup.policy=compact`` and ``segment.bytes`` from
  ``offsets.topic.segment.bytes``, as Kafka creates it.  The in-memory cache is
  updated only after the append succeeded, under one lock, so it always equals
  what replaying the log would give.
* **Durability** (:meth:`GroupMetadataManager.flush`): a commit is
  acknowledged when it is in the log, as Kafka's coordinator acknowledges it
  (a crash of the process keeps it); a power loss keeps it once its partition
  is flushed, by ``flush.messages``/``flush.ms`` or by an explicit flush (the
  mount's ``fsync()`` of ``groups/<group>`` and ``consume/<group>``).

Not implemented: Kafka's offsets retention (``offsets.retention.minutes``),
which expires the commits of groups that stay empty; a commit here lives until
it is overwritten or deleted.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from engine import records as _records
from engine.errors import CorruptRecordError, InvalidRequestError, LogfsError, TopicExistsError
from engine.topic import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable, Mapping

    from engine.log import Log
    from engine.manager import LogManager

logger = logging.getLogger(__name__)

__all__ = [
    "GROUP_METADATA_TOPIC_NAME", "OffsetCommitKey", "OffsetAndMetadata", "GroupMetadataManager",
    "java_string_hash", "partition_for", "encode_offset_commit_key", "encode_offset_commit_value",
    "decode_key", "decode_offset_commit_value", "GroupLag",
]

#: Kafka's Topic.GROUP_METADATA_TOPIC_NAME
GROUP_METADATA_TOPIC_NAME = "__consumer_offsets"

#: key versions (record types) of the coordinator's records
LEGACY_OFFSET_COMMIT_KEY_VERSION = 0
OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
#: the value version Kafka writes when no expire timestamp is given
OFFSET_COMMIT_VALUE_VERSION = 3
#: RecordBatch.NO_PARTITION_LEADER_EPOCH
NO_PARTITION_LEADER_EPOCH = -1

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
#: control record types of transaction markers (ControlRecordType)
_ABORT, _COMMIT = 0, 1


class OffsetCommitKey(NamedTuple):
    group: str
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset (Kafka's OffsetAndMetadata)."""

    offset: int
    leader_epoch: int = NO_PARTITION_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1


class GroupLag(NamedTuple):
    """One partition of a group's position: what ``groups/<group>`` prints."""

    partition: int
    committed: int            # -1: no commit
    log_end_offset: int
    lag: int


# ---------------------------------------------------------------------------- placement


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: ``h = 31*h + c`` over UTF-16 code units, as an int32."""
    data = text.encode("utf-16-be")
    h = 0
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group: str, num_partitions: int) -> int:
    """The ``__consumer_offsets`` partition of ``group`` (Kafka's ``partitionFor``)."""
    h = java_string_hash(group)
    # Utils.abs: Integer.MIN_VALUE has no positive counterpart and maps to 0
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


# ---------------------------------------------------------------------------- serde


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0x7FFF:
        raise InvalidRequestError(f"String of {len(data)} bytes is too long for the offset commit schema")
    return _INT16.pack(len(data)) + data


def encode_offset_commit_key(key: OffsetCommitKey) -> bytes:
    """OffsetCommitKey, version 1 (what Kafka's coordinator writes)."""
    return (_INT16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(key.group) + _string(key.topic)
            + _INT32.pack(key.partition))


def encode_offset_commit_value(value: OffsetAndMetadata) -> bytes:
    """OffsetCommitValue, version 3 (what Kafka writes without an expire timestamp)."""
    return (_INT16.pack(OFFSET_COMMIT_VALUE_VERSION) + _INT64.pack(value.offset)
            + _INT32.pack(value.leader_epoch) + _string(value.metadata) + _INT64.pack(value.commit_timestamp))


class _Reader:
    """Sequential reads of the coordinator schemas' primitive types."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise ValueError(f"needs {n} bytes at position {self.pos} of {len(self.buf)}")
        piece = self.buf[self.pos:end]
        self.pos = end
        return piece

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack(self._take(8))[0]
        return value

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise ValueError("null string in a non-nullable field")
        return self._take(n).decode("utf-8")

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            byte = self._take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise ValueError("unsigned varint longer than 5 bytes")

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise ValueError("null compact string in a non-nullable field")
        return self._take(n).decode("utf-8")

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()                    # tag
            self._take(self.uvarint())        # size, data


def decode_key(data: bytes) -> tuple[int, OffsetCommitKey | str | None]:
    """(key version, OffsetCommitKey for versions 0/1, the group id for 2, None otherwise).

    ValueError for a key too short for its version's schema.
    """
    reader = _Reader(data)
    version = reader.int16()
    if version in (LEGACY_OFFSET_COMMIT_KEY_VERSION, OFFSET_COMMIT_KEY_VERSION):
        return version, OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return version, reader.string()
    return version, None


def decode_offset_commit_value(data: bytes) -> OffsetAndMetadata:
    """OffsetCommitValue of any version 0-4; ValueError for an unknown version or short data."""
    reader = _Reader(data)
    version = reader.int16()
    if version in (0, 2):
        offset = reader.int64()
        return OffsetAndMetadata(offset, NO_PARTITION_LEADER_EPOCH, reader.string(), reader.int64())
    if version == 1:
        offset = reader.int64()
        metadata = reader.string()
        return OffsetAndMetadata(offset, NO_PARTITION_LEADER_EPOCH, metadata, reader.int64(), reader.int64())
    if version == 3:
        offset = reader.int64()
        epoch = reader.int32()
        return OffsetAndMetadata(offset, epoch, reader.string(), reader.int64())
    if version == 4:
        offset = reader.int64()
        epoch = reader.int32()
        metadata = reader.compact_string()
        commit_timestamp = reader.int64()
        reader.skip_tagged_fields()
        return OffsetAndMetadata(offset, epoch, metadata, commit_timestamp)
    raise ValueError(f"unknown OffsetCommitValue version {version}")


# ---------------------------------------------------------------------------- the store


class GroupMetadataManager:
    """The committed offsets of every group, cached from and written to ``__consumer_offsets``.

    Thread-safe: ``_lock`` orders appends and cache updates, so the cache is
    always what replaying the topic gives.
    """

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager
        self.num_partitions = manager.config.offsets_topic_num_partitions
        self.segment_bytes = manager.config.offsets_topic_segment_bytes
        self._lock = threading.RLock()
        self._offsets: dict[OffsetCommitKey, OffsetAndMetadata] = {}
        #: topic -> group -> partition -> committed offset (the lookups of the mount)
        self._by_topic: dict[str, dict[str, dict[int, int]]] = {}
        self.loaded_commits = 0
        self.load_ms = 0.0

    # ------------------------------------------------------------------ loading

    def load(self) -> GroupMetadataManager:
        """Replay every partition of ``__consumer_offsets`` (Kafka's loadGroupsAndOffsets)."""
        started = time.monotonic()
        partitions = self.manager.partitions(GROUP_METADATA_TOPIC_NAME)
        if partitions and not self.manager.read_only \
                and not self.manager.topic_config(GROUP_METADATA_TOPIC_NAME).compact:
            # a copy of a broker's log.dirs carries no topic config (it lives in the cluster metadata)
            self.manager.alter_topic_config(GROUP_METADATA_TOPIC_NAME, {"cleanup.policy": "compact"})
            logger.info("Set cleanup.policy=compact on %s, as Kafka creates it", GROUP_METADATA_TOPIC_NAME)
        with self._lock:
            self._offsets.clear()
            self._by_topic.clear()
            for p in sorted(partitions):
                target = self.manager.get_log(TopicPartition(GROUP_METADATA_TOPIC_NAME, p))
                if target is not None:
                    self._load_partition(target)
            self.loaded_commits = len(self._offsets)
        self.load_ms = (time.monotonic() - started) * 1000
        if partitions:
            logger.info("Loaded %d committed offsets of %d groups from %d partitions of %s in %d ms",
                        self.loaded_commits, len({k.group for k in self._offsets}), len(partitions),
                        GROUP_METADATA_TOPIC_NAME, round(self.load_ms))
        return self

    def _load_partition(self, target: Log) -> None:
        tp = target.topic_partition
        start = target.log_start_offset
        end = target.log_end_offset
        pending: dict[int, list[tuple[OffsetCommitKey, OffsetAndMetadata | None]]] = {}
        skipped = 0
        for segment in list(target.segments.values()):
            if segment.base_offset >= end:
                break
            for pos, header, buf, off in segment.batches_with_bytes():
                if header.next_offset <= start:
                    continue
                if header.base_offset >= end:
                    break
                if header.is_control:
                    for marker in _records.decode_batch(buf, off, header, include_control=True):
                        kind = _control_type(marker.key)
                        entries = pending.pop(header.producer_id, [])
                        if kind == _COMMIT:
                            for key, value in entries:
                                self._apply(key, value)
                    continue
                try:
                    records = segment.validate_and_decode(buf, off, header, pos)
                except CorruptRecordError as exc:
                    # one bad batch must not keep the mount (or the other groups) from starting:
                    # its commits are lost, as Kafka's loader would fail only that partition
                    logger.error("Skipping a corrupt batch of %s while loading committed offsets: %s", tp, exc)
                    continue
                for record in records:
                    if record.offset < start or record.offset >= end or record.key is None:
                        continue
                    try:
                        _, decoded = decode_key(record.key)
                        if not isinstance(decoded, OffsetCommitKey):
                            continue       # group metadata and the newer consumer-protocol records
                        key = decoded
                        value = None if record.value is None else decode_offset_commit_value(record.value)
                    except (ValueError, UnicodeDecodeError) as exc:
                        skipped += 1
                        if skipped == 1:
                            logger.warning("Skipping an undecodable record at offset %d of %s: %s",
                                           record.offset, tp, exc)
                        continue
                    if header.is_transactional:
                        pending.setdefault(header.producer_id, []).append((key, value))
                    else:
                        self._apply(key, value)
        if skipped > 1:
            logger.warning("Skipped %d undecodable records of %s", skipped, tp)

    # ------------------------------------------------------------------ cache

    def _apply(self, key: OffsetCommitKey, value: OffsetAndMetadata | None) -> None:
        groups = self._by_topic.setdefault(key.topic, {})
        if value is None:
            self._offsets.pop(key, None)
            partitions = groups.get(key.group)
            if partitions is not None:
                partitions.pop(key.partition, None)
                if not partitions:
                    del groups[key.group]
            if not groups:
                self._by_topic.pop(key.topic, None)
            return
        self._offsets[key] = value
        groups.setdefault(key.group, {})[key.partition] = value.offset

    def groups(self, topic: str) -> list[str]:
        """The groups with a committed offset on ``topic``, sorted."""
        with self._lock:
            return sorted(self._by_topic.get(topic, {}))

    def all_groups(self) -> dict[str, dict[str, dict[int, int]]]:
        """topic -> group -> partition -> committed offset (a copy)."""
        with self._lock:
            return {topic: {group: dict(parts) for group, parts in groups.items()}
                    for topic, groups in self._by_topic.items()}

    def committed(self, group: str, tp: TopicPartition) -> int | None:
        with self._lock:
            return self._by_topic.get(tp.topic, {}).get(group, {}).get(tp.partition)

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self._by_topic.get(topic, {}).get(group, {}))

    def offset_and_metadata(self, group: str, tp: TopicPartition) -> OffsetAndMetadata | None:
        with self._lock:
            return self._offsets.get(OffsetCommitKey(group, tp.topic, tp.partition))

    def lag(self, group: str, topic: str) -> list[GroupLag]:
        """Every partition of ``topic``: committed (-1 if none), log end, lag (from the log start if none)."""
        return group_lag(self.manager, topic, self.committed_offsets(group, topic))

    # ------------------------------------------------------------------ writing

    def _offsets_log(self, group: str) -> Log:
        """The group's partition of ``__consumer_offsets``, creating the topic on first use."""
        topic = GROUP_METADATA_TOPIC_NAME
        if not self.manager.partitions(topic):
            try:
                self.manager.create_topic(topic, self.num_partitions, {
                    "cleanup.policy": "compact", "segment.bytes": str(self.segment_bytes),
                    "compression.type": "producer"})
                logger.info("Created %s with %d partitions for the group coordinator", topic,
                            self.num_partitions)
            except TopicExistsError:
                pass
        # A broker's copy may hold only the partitions that broker hosted: the partition count is
        # the configured one (or more, if the topic has more), and a missing partition is created.
        count = max(self.num_partitions, max(self.manager.partitions(topic)) + 1)
        tp = TopicPartition(topic, partition_for(group, count))
        target = self.manager.get_log(tp)
        return target if target is not None else self.manager.create_missing_partition(tp)

    def commit(self, group: str, offsets: Mapping[TopicPartition, int], *, metadata: str = "") -> None:
        """Commit ``offsets`` for ``group``: one batch of OffsetCommit records, all or nothing."""
        if not offsets:
            return
        if not group:
            raise InvalidRequestError("A consumer group id must not be empty")
        now = int(time.time() * 1000)
        items = sorted(offsets.items())
        keys = [encode_offset_commit_key(OffsetCommitKey(group, tp.topic, tp.partition)) for tp, _ in items]
        values = [encode_offset_commit_value(OffsetAndMetadata(offset, NO_PARTITION_LEADER_EPOCH, metadata, now))
                  for _, offset in items]
        with self._lock:
            target = self._offsets_log(group)
            target.append_values(values, keys)
            for tp, offset in items:
                self._apply(OffsetCommitKey(group, tp.topic, tp.partition),
                            OffsetAndMetadata(offset, NO_PARTITION_LEADER_EPOCH, metadata, now))
        logger.info("[GroupCoordinator] Group %s committed offsets %s", group,
                    ", ".join(f"{tp}={offset}" for tp, offset in items))

    def flush(self, groups: Iterable[str]) -> None:
        """Make the commits of ``groups`` durable: fsync their partitions of ``__consumer_offsets``.

        A commit is acknowledged once it is appended (it survives a crash of
        the process, as Kafka's coordinator acknowledges it once it is in the
        log); it survives a power loss once flushed, by the topic's flush
        policy (``flush.messages``, ``flush.ms``) or by this.  ``Log.flush``
        fsyncs the directory of a segment created since the last flush, and a
        partition's directory was made durable in its parent when it was created.
        """
        topic = GROUP_METADATA_TOPIC_NAME
        partitions = self.manager.partitions(topic)
        if not partitions:
            return
        count = max(self.num_partitions, max(partitions) + 1)
        for p in sorted({partition_for(group, count) for group in groups}):
            target = self.manager.get_log(TopicPartition(topic, p))
            if target is not None:
                target.flush()

    def delete_group_offsets(self, group: str, topic: str) -> int:
        """Tombstones for every commit of ``group`` on ``topic`` (Kafka's OffsetDelete); returns their count."""
        with self._lock:
            partitions = sorted(self._by_topic.get(topic, {}).get(group, {}))
            if not partitions:
                return 0
            self._tombstone(group, [OffsetCommitKey(group, topic, p) for p in partitions])
        logger.info("[GroupCoordinator] Deleted the committed offsets of group %s on topic %s (partitions %s)",
                    group, topic, ",".join(map(str, partitions)))
        return len(partitions)

    def on_topic_deleted(self, topic: str) -> None:
        """Kafka's coordinator deletes the commits of a deleted topic's partitions (tombstones)."""
        if topic == GROUP_METADATA_TOPIC_NAME:
            with self._lock:
                self._offsets.clear()
                self._by_topic.clear()
            return
        with self._lock:
            by_group = {g: sorted(parts) for g, parts in self._by_topic.get(topic, {}).items()}
            for group, partitions in by_group.items():
                try:
                    self._tombstone(group, [OffsetCommitKey(group, topic, p) for p in partitions])
                except LogfsError as exc:   # the topic is gone already: say so, do not fail its deletion
                    logger.error("[GroupCoordinator] Failed to remove the committed offsets of group %s on deleted "
                                 "topic %s: %s", group, topic, exc)
        if by_group:
            logger.info("[GroupCoordinator] Removed the committed offsets of %d groups on deleted topic %s",
                        len(by_group), topic)

    def _tombstone(self, group: str, keys: Iterable[OffsetCommitKey]) -> None:
        keys = list(keys)
        target = self._offsets_log(group)
        target.append_values([None] * len(keys), [encode_offset_commit_key(k) for k in keys])
        for key in keys:
            self._apply(key, None)


def _control_type(key: bytes | None) -> int:
    """The ControlRecordType of a transaction marker's key (int16 version, int16 type); -1 if unreadable."""
    if key is None or len(key) < 4:
        return -1
    kind: int = _INT16.unpack_from(key, 2)[0]
    return kind


def group_lag(manager: LogManager, topic: str, committed: Mapping[int, int]) -> list[GroupLag]:
    """Every partition of ``topic``: committed (-1 if none), log end, lag (from the log start if none).

    Kafka's ``kafka-consumer-groups.sh --describe`` columns, counted against the
    local logs (an embedded mount's, or a cluster mount's replicas).
    """
    out = []
    for p in sorted(manager.partitions(topic)):
        target = manager.get_log(TopicPartition(topic, p))
        if target is None:
            continue
        end = target.log_end_offset
        offset = committed.get(p)
        if offset is None:
            out.append(GroupLag(p, -1, end, end - target.log_start_offset))
        else:
            out.append(GroupLag(p, offset, end, max(end - max(offset, target.log_start_offset), 0)))
    return out
