"""``logfs check`` of tiered storage: the remote log segments' metadata against the store, offline.

The metadata log of the data dir (``remote-log/__remote_log_metadata-0``) is
replayed read-only, and for every partition it names, and every local
partition with a topic id, the store is listed.  One line per problem:

* a finished copy (COPY_SEGMENT_FINISHED) whose ``.log`` object is missing or
  shorter than recorded: records only there are lost;
* a copy or deletion a crash left unfinished (the next mount finishes it);
* an object of the partition that no metadata names, an orphan (the next
  mount deletes it).

Without the store's settings only the metadata is read, and a line says that
the store was not checked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TextIO

from engine.errors import InvalidTopicError
from engine.log import Log
from engine.log_dirs import REMOTE_LOG_DIR
from engine.partition_metadata import read_topic_id
from engine.remote.metadata import RemoteLogMetadataManager
from engine.remote.remote_log_manager import _METADATA_LOG_CONFIG, METADATA_LOG_DIR
from engine.remote.storage import LOG_SUFFIX, RemoteStorageError, TopicIdPartition, open_remote_storage
from engine.topic import parse_topic_partition_dir

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


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
                in_store = storage.list_segment_ids(tip)
            except RemoteStorageError as exc:
                problem(storage.uri, f"cannot list {tip.directory}: {exc}")
                continue
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
            for orphan in sorted(in_store - metadata.known_ids(tip)):
                problem(f"{storage.uri}/{orphan.object_name(LOG_SUFFIX)}",
                        f"no metadata names this copy of {tip}: an orphan the next mount deletes")
    finally:
        storage.close()
    return problems
