"""``logfs check`` of tiered storage: the remote log segments' metadata against the store, offline.

The metadata log of the data dir (``remote-log/__remote_log_metadata-0``) is
replayed read-only, and for every partition it names, and every local
partition with a topic id, the store is listed.  One line per problem:

* a finished copy (COPY_SEGMENT_FINISHED) whose ``.log`` object is missing or
  shorter than recorded: records only there are lost;
* a finished copy missing one of its other objects (offset, time and
  transaction indexes, producer snapshot, leader-epoch entries), or whose
  transaction index or producer snapshot is unreadable (not Kafka's format, a
  CRC that does not hold), lists another count of aborted transactions than
  recorded, or names offsets outside the copy;
* a copy or deletion a crash left unfinished (the next mount finishes it);
* an object of the partition that no metadata names, an orphan (the next
  mount deletes it).

Without the store's settings only the metadata is read, and a line says that
the store was not checked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TextIO, TypeVar

from engine.errors import CorruptRecordError, InvalidTopicError
from engine.log import Log
from engine.log_dirs import REMOTE_LOG_DIR
from engine.partition_metadata import read_topic_id
from engine.remote.metadata import RemoteLogMetadataManager
from engine.remote.remote_log_manager import _METADATA_LOG_CONFIG, METADATA_LOG_DIR
from engine.remote.storage import (
    LOG_SUFFIX,
    IndexType,
    RemoteStorageError,
    RemoteStorageManager,
    TopicIdPartition,
    open_remote_storage,
)
from engine.topic import parse_topic_partition_dir
from engine.transactions import decode_producer_snapshot, decode_txn_index

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from engine.remote.metadata import RemoteLogSegmentMetadata
    from engine.remote.storage import RemoteLogSegmentId
    from engine.transactions import ProducerEntry, TxnIndexEntry

_T = TypeVar("_T")


def _local_partitions(log_dirs: Sequence[str]) -> set[TopicIdPartition]:
    found = set()
    for log_dir in log_dirs:
        try:
            names = os.listdir(log_dir)
        except OSError:
            continue
        for name in names:
            path = os.path.join(log_dir, name)
            if name == REMOTE_LOG_DIR or not os.path.isdir(path):
                continue
            try:
                tp = parse_topic_partition_dir(name)
            except InvalidTopicError:       # not a partition dir: logfs check's own walk reports it
                continue
            topic_id = read_topic_id(path)
            if topic_id is not None:
                found.add(TopicIdPartition(tp.topic, topic_id, tp.partition))
    return found


_NAMES = {IndexType.OFFSET: "offset index", IndexType.TIMESTAMP: "time index",
          IndexType.TRANSACTION: "transaction index", IndexType.PRODUCER_SNAPSHOT: "producer snapshot",
          IndexType.LEADER_EPOCH: "leader-epoch checkpoint"}


def _check_indexes(storage: RemoteStorageManager, m: RemoteLogSegmentMetadata,
                   suffixes: set[str]) -> Iterator[tuple[str, str]]:
    """(object, problem) of each object of a finished copy besides its ``.log`` that is missing or wrong."""
    sid = m.segment_id
    expected = [IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.LEADER_EPOCH]
    if m.has_transaction_index:
        expected += [IndexType.TRANSACTION, IndexType.PRODUCER_SNAPSHOT]
    missing = False
    for index_type in expected:
        if index_type.value not in suffixes:
            missing = True
            yield (f"{storage.uri}/{sid.object_name(index_type.value)}",
                   f"the {_NAMES[index_type]} of the copy of offsets "
                   f"{m.start_offset} to {m.end_offset} is missing from the store")
    if missing or not m.has_transaction_index:
        return
    yield from _check_decoded(storage, sid, IndexType.TRANSACTION, decode_txn_index,
                              lambda entries: _txn_index_problems(m, entries))
    yield from _check_decoded(storage, sid, IndexType.PRODUCER_SNAPSHOT, decode_producer_snapshot,
                              lambda producers: _snapshot_problems(m, producers))


def _check_decoded(storage: RemoteStorageManager, sid: RemoteLogSegmentId, index_type: IndexType,
                   decode: Callable[[bytes, str], _T], problems: Callable[[_T], Iterator[str]],
                   ) -> Iterator[tuple[str, str]]:
    """(object, problem) of the copy's ``index_type`` object: it cannot be read (the store fails, or it is
    not Kafka's format, or a CRC does not hold), or the ``problems`` of what ``decode`` made of it."""
    where = f"{storage.uri}/{sid.object_name(index_type.value)}"
    try:
        decoded = decode(storage.fetch_index(sid, index_type), where)
    except (RemoteStorageError, CorruptRecordError) as exc:
        yield where, f"cannot be read: {exc}"
        return
    for problem in problems(decoded):
        yield where, problem


def _txn_index_problems(m: RemoteLogSegmentMetadata, entries: list[TxnIndexEntry]) -> Iterator[str]:
    if len(entries) != m.transaction_index_entries:
        yield (f"lists {len(entries)} aborted transactions where the metadata recorded "
               f"{m.transaction_index_entries}")
    outside = [e for e in entries if not m.start_offset <= e.last_offset <= m.end_offset]
    if outside:
        yield (f"lists an aborted transaction ending at offset {outside[0].last_offset}, outside the "
               f"copy's offsets {m.start_offset} to {m.end_offset}")


def _snapshot_problems(m: RemoteLogSegmentMetadata, producers: list[ProducerEntry]) -> Iterator[str]:
    late = [p for p in producers if max(p.last_offset, p.current_txn_first_offset) > m.end_offset]
    if late:
        yield (f"holds producer {late[0].producer_id} at offset {late[0].last_offset}, after the "
               f"copy's last offset {m.end_offset}")


def check_remote_storage(log_dirs: Sequence[str], settings: Mapping[str, str], out: TextIO) -> int:
    """Check the tiered storage of ``log_dirs`` (see the module docstring); returns the problems found."""
    home = next((d for d in log_dirs if os.path.isdir(os.path.join(d, REMOTE_LOG_DIR))), None)
    if home is None:
        return 0
    metadata_dir = os.path.join(home, REMOTE_LOG_DIR, METADATA_LOG_DIR)
    problems = 0

    def problem(where: str, message: str) -> None:
        nonlocal problems
        out.write(f"{where}: {message}\n")
        problems += 1

    log = Log.load(metadata_dir, _METADATA_LOG_CONFIG, read_only=True)
    try:
        metadata = RemoteLogMetadataManager(log)
    finally:
        log.close()
    partitions = set(metadata.partitions())
    for tip in sorted(partitions):
        for m in metadata.unfinished(tip):
            problem(metadata_dir, f"copy {m.segment_id.id} of {tip} (offsets {m.start_offset} to {m.end_offset}) "
                                  f"was left {m.state.value} by a crash; the next mount deletes it")
    if not settings.get("rsm.config.uri"):
        out.write(f"{metadata_dir}: {sum(len(metadata.copied_segments(t)) for t in partitions)} remote log "
                  "segments not checked against the store (give its rsm.config.* settings with -o or --config)\n")
        return problems
    storage = open_remote_storage(settings)
    try:
        for tip in sorted(partitions | _local_partitions(log_dirs)):
            try:
                objects = storage.list_objects(tip)
            except RemoteStorageError as exc:
                problem(storage.uri, f"cannot list {tip.directory}: {exc}")
                continue
            in_store = {sid for sid, suffixes in objects.items() if LOG_SUFFIX in suffixes}
            for m in metadata.copied_segments(tip):
                name = f"{storage.uri}/{m.segment_id.object_name(LOG_SUFFIX)}"
                if m.segment_id not in in_store:
                    problem(name, f"the finished copy of offsets {m.start_offset} to {m.end_offset} of {tip} is "
                                  "missing from the store: its records are lost unless a local segment holds them")
                    continue
                try:
                    last = storage.fetch_log_segment(m.segment_id, m.segment_size_bytes - 1, m.segment_size_bytes)
                except RemoteStorageError as exc:
                    problem(name, f"cannot be read: {exc}")
                    continue
                if len(last) != 1:
                    problem(name, f"holds fewer than the {m.segment_size_bytes} bytes recorded for it")
                for where, message in _check_indexes(storage, m, objects.get(m.segment_id, set())):
                    problem(where, message)
            for orphan in sorted(in_store - metadata.known_ids(tip)):
                problem(f"{storage.uri}/{orphan.object_name(LOG_SUFFIX)}",
                        f"no metadata names this copy of {tip}: an orphan the next mount deletes")
    finally:
        storage.close()
    return problems
