"""``logfs to-kafka``: hand a logfs data directory to an Apache Kafka broker (KRaft).

A logfs data directory is already a Kafka ``log.dirs`` entry, byte for byte:
segments, indexes and the ``recovery-point-offset-checkpoint`` /
``log-start-offset-checkpoint`` / ``cleaner-offset-checkpoint`` files.  What a
KRaft broker needs beyond that lives in its metadata quorum, not in the data:

* every topic must exist in the KRaft metadata, with the same partition count,
  its partitions assigned to the broker that will serve the data;
* every partition directory must carry ``partition.metadata`` with the topic ID
  the controller assigned -- a log whose topic ID is missing or unknown is a
  *stray* to a KRaft broker, which renames it ``-stray`` and serves nothing
  from it (``LogManager.isStrayKraftReplica``);
* the log dir itself must be formatted (``meta.properties``: cluster.id,
  node.id, directory.id) and hold the broker's checkpoints, including the high
  watermark (``replication-offset-checkpoint``).

Topic IDs cannot be chosen by a client (CreateTopics has no topic ID), so the
procedure lets the broker create the topics first and adopts its IDs:

1. ``logfs to-kafka plan DATA_DIR`` prints a shell script of
   ``kafka-topics.sh --create`` commands: the same topics and partition counts,
   every partition assigned to the target broker (``--replica-assignment``),
   and the topic configuration overrides carried over (Kafka's topic config
   names; logfs's line-parsing settings ``parse.key``, ``key.separator`` and
   ``null.marker`` are not Kafka topic configs and are left out).  Run it
   against the running broker, which creates empty partition directories with
   their ``partition.metadata``.
2. Stop the broker cleanly.
3. ``logfs to-kafka adopt DATA_DIR --broker-log-dir LOG_DIR`` moves (or with
   ``--copy`` copies) each logfs partition directory over the broker's empty
   one, after writing into it the ``partition.metadata`` the broker created
   and removing the mount's ``.viewindex`` sidecars (Kafka would keep them
   forever: its retention deletes only its own files),
   and merges the partitions' log start offsets, recovery points, cleaner
   offsets and high watermarks (= log end offsets: everything logfs stored is
   committed) into the broker log dir's checkpoint files.
4. Start the broker: it loads the logs (clean shutdown, no recovery), and
   serves every record at its offset from the same log start offsets.

Everything is checked before anything is written: the logfs dirs must have been
shut down cleanly (a mount unmounted, not killed), the broker must be stopped
(its ``.kafka_cleanshutdown`` present and its ``.lock`` free), and each
partition must exist in the broker's log dir with no record in it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import shutil
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpointFile,
)
from engine.errors import LogfsError
from engine.files import LOG_FILE_SUFFIX, TMP_FILE_SUFFIX, VIEW_INDEX_FILE_SUFFIX, atomic_write, fsync_dir
from engine.partition_metadata import PARTITION_METADATA_FILE
from engine.remote.storage import TopicIdPartition
from engine.topic import TopicPartition

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Mapping, Sequence

    from engine.remote.metadata import RemoteLogSegmentMetadata
    from engine.topic_configs import TopicConfigStore

logger = logging.getLogger(__name__)

#: Kafka's high watermark checkpoint (ReplicaManager), which logfs has no use for.
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
META_PROPERTIES = "meta.properties"
LOCK_FILE = ".lock"

#: The topic-level overrides logfs shares with Kafka, by name.
KAFKA_TOPIC_CONFIGS = frozenset({
    "cleanup.policy", "retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "segment.index.bytes",
    "index.interval.bytes", "flush.messages", "flush.ms", "delete.retention.ms", "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms", "max.message.bytes", "file.delete.delay.ms", "compression.type",
})
#: Where both Kafka and logfs keep consumer groups' committed offsets, in Kafka's record format.
GROUP_METADATA_TOPIC = "__consumer_offsets"
#: Kafka 4 refuses ``segment.bytes`` below 1 MiB (KIP-1030); so does logfs, whose tests use ``internal.segment.bytes``.
KAFKA4_MIN_SEGMENT_BYTES = 1024 * 1024


class MigrationError(LogfsError):
    """The data or the broker is not in a state the procedure can proceed from; nothing was changed."""


@dataclass
class PartitionState:
    """What Kafka must know of one logfs partition."""

    topic_partition: TopicPartition
    dir: str
    log_start_offset: int
    log_end_offset: int
    recovery_point: int
    cleaner_offset: int | None


@dataclass
class TopicState:
    name: str
    partitions: int
    #: the overrides Kafka gets, Kafka's names
    configs: dict[str, str] = field(default_factory=dict)
    #: what the plan says about configs it left out or changed
    notes: list[str] = field(default_factory=list)
    #: tiered storage: the topic's remote.storage.enable
    remote_storage_enable: bool = False


@dataclass
class RemotePartition:
    """A partition with copies in the mount's remote storage (tiered storage, docs/tiering.md)."""

    topic_partition: TopicPartition
    dir: str
    tip: TopicIdPartition
    log_start_offset: int
    local_log_start_offset: int
    #: its finished copies (COPY_SEGMENT_FINISHED), by offset
    copies: list[RemoteLogSegmentMetadata]

    @property
    def only_remote(self) -> list[RemoteLogSegmentMetadata]:
        """The copies holding offsets below the local log start: records in no local segment."""
        return [m for m in self.copies
                if m.end_offset >= self.log_start_offset and m.start_offset < self.local_log_start_offset]

    def describe(self) -> str:
        """What of it is only in the store, for the plan's refusal."""
        only = self.only_remote
        return (f"{self.topic_partition}: offsets {self.log_start_offset} to {self.local_log_start_offset - 1} "
                f"only in remote storage ({len(only)} remote log segments, "
                f"{sum(m.segment_size_bytes for m in only)} bytes; local log start {self.local_log_start_offset})")


@dataclass
class DataDirState:
    topics: dict[str, TopicState]
    partitions: list[PartitionState]
    #: the partitions with copies in remote storage, or records only there
    remote: list[RemotePartition] = field(default_factory=list)

    def remote_only(self) -> list[RemotePartition]:
        """The partitions holding records only in remote storage."""
        return [r for r in self.remote if r.log_start_offset < r.local_log_start_offset]


# ------------------------------------------------------------------------------ reading logfs's data

def _check_unlocked(log_dir: str, owner: str, stack: ExitStack) -> None:
    """Hold ``log_dir/.lock`` for the duration (if the file exists): refuse a dir a process serves."""
    path = os.path.join(log_dir, LOCK_FILE)
    if not os.path.exists(path):
        return
    fd = os.open(path, os.O_RDWR)
    stack.callback(os.close, fd)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise MigrationError(f"{log_dir} is in use (its {LOCK_FILE} is locked by a running process): "
                             f"stop the {owner} first") from None


def inspect(data_dirs: Sequence[str]) -> DataDirState:
    """Topics, partitions, offsets and overrides of logfs data dirs that were shut down cleanly.

    The logs are loaded read-only (nothing is written): the figures are
    exactly what a mount of these dirs would serve.  Tiered storage's metadata
    log (when there is one) says which partitions have copies in the store,
    and :meth:`DataDirState.remote_only` which hold records only there.
    """
    from engine.config import BrokerConfig
    from engine.manager import LogManager
    from engine.partition_metadata import read_topic_id as read_partition_topic_id
    from engine.remote.restore import read_remote_log_metadata

    dirs = [os.path.abspath(d) for d in data_dirs]
    for d in dirs:
        if not os.path.isdir(d):
            raise MigrationError(f"{d} is not a directory")
        with ExitStack() as stack:     # a live mount removed the marker at its start: say what is wrong
            _check_unlocked(d, "logfs mount (`logfs umount MOUNTPOINT`) or Kafka broker using it", stack)
        if not os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE)):
            raise MigrationError(f"{d} was not shut down cleanly (no {CLEAN_SHUTDOWN_FILE}): mount it with "
                                 f"`logfs mount` and unmount it, so that it is recovered and checkpointed, first")
    config = BrokerConfig.from_props({"log.dirs": ",".join(dirs), "log.cleaner.enable": "false"})
    metadata = read_remote_log_metadata(dirs)
    manager = LogManager(config, read_only=True, remote_only_records_ok=True)
    manager.startup()
    try:
        topics: dict[str, TopicState] = {}
        partitions: list[PartitionState] = []
        remote: list[RemotePartition] = []
        cleaner_offsets: dict[TopicPartition, int] = {}
        for d in dirs:
            path = os.path.join(d, CLEANER_OFFSET_CHECKPOINT)
            if os.path.exists(path):
                cleaner_offsets.update(OffsetCheckpointFile(path).read())
        for topic in sorted(manager.topics()):
            numbers = sorted(manager.partitions(topic))
            if numbers != list(range(len(numbers))):
                raise MigrationError(f"Topic {topic} has partitions {numbers}: Kafka needs 0..n-1")
            state = TopicState(topic, len(numbers))
            for name, value in sorted(manager.topic_overrides(topic).items()):
                if name == "internal.segment.bytes":
                    state.configs.setdefault("segment.bytes", str(KAFKA4_MIN_SEGMENT_BYTES))
                    state.notes.append(f"{name}={value} is below Kafka 4's minimum segment.bytes (a setting for "
                                       f"tests): segment.bytes set to {KAFKA4_MIN_SEGMENT_BYTES} unless the topic "
                                       "sets it (existing segments keep their size)")
                elif name in ("remote.storage.enable", "local.retention.ms", "local.retention.bytes"):
                    if name == "remote.storage.enable":
                        state.remote_storage_enable = value.strip().lower() == "true"
                    state.notes.append(f"{name}={value}: tiered storage of the mount, left out (every record is "
                                       "in the local segments adopted; the copies in the mount's remote storage "
                                       "are not Kafka's, see docs/tiering.md)")
                elif name not in KAFKA_TOPIC_CONFIGS:
                    state.notes.append(f"{name}={value} is a logfs mount setting, not a Kafka topic config: "
                                       f"left out")
                elif name == "segment.bytes" and int(value) < KAFKA4_MIN_SEGMENT_BYTES:
                    state.configs[name] = str(KAFKA4_MIN_SEGMENT_BYTES)
                    state.notes.append(f"segment.bytes={value} is below Kafka 4's minimum: set to "
                                       f"{KAFKA4_MIN_SEGMENT_BYTES} (existing segments keep their size)")
                else:
                    state.configs[name] = value
            if topic == GROUP_METADATA_TOPIC:
                state.notes.append(f"consumer group offsets: the broker's offsets.topic.num.partitions must be "
                                   f"{len(numbers)}, so that each group maps to the partition holding its commits")
            topics[topic] = state
            for number in numbers:
                tp = TopicPartition(topic, number)
                log = manager.get_log(tp)
                assert log is not None, tp      # listed by manager.partitions() above; a read-only manager deletes none
                partitions.append(PartitionState(tp, os.path.abspath(log.dir), log.log_start_offset,
                                                 log.log_end_offset, min(log.recovery_point, log.log_end_offset),
                                                 cleaner_offsets.get(tp)))
                topic_id = read_partition_topic_id(log.dir)
                tip = TopicIdPartition(topic, topic_id or "", number)
                copies = metadata.copied_segments(tip) if metadata is not None and topic_id else []
                if copies or log.has_remote_only_records:
                    remote.append(RemotePartition(tp, os.path.abspath(log.dir), tip, log.log_start_offset,
                                                  log.local_log_start_offset, copies))
        for r in remote:
            if r.copies and r.log_start_offset >= r.local_log_start_offset:
                end = max(m.end_offset for m in r.copies)
                topics[r.topic_partition.topic].notes.append(
                    f"partition {r.topic_partition.partition}: {len(r.copies)} remote log segments "
                    f"({sum(m.segment_size_bytes for m in r.copies)} bytes, offsets up to {end}) stay in the "
                    "mount's remote storage, every record of them is in the local segments handed over "
                    f"(`logfs to-kafka restore DATA_DIR --config FILE --topic {r.topic_partition.topic} "
                    "--delete-remote-copies` deletes them)")
        return DataDirState(topics, partitions, remote)
    finally:
        manager.shutdown()


def refuse_remote_only(state: DataDirState, data_dirs: Sequence[str]) -> None:
    """MigrationError naming every partition whose records are partly only in remote storage, and what to do:
    Kafka would get the local segments only, and the rest would be left behind without a word."""
    only = state.remote_only()
    if not only:
        return
    topics = sorted({r.topic_partition.topic for r in only})
    lines = [f"{len(only)} partitions hold records only in the remote storage of tiered storage (local "
             "retention deleted their local copies); Kafka would get their local segments only:"]
    lines += [f"  {r.describe()}" for r in only]
    lines.append("Bring them back into local segments first, with the store's rsm.config.* settings of the mount "
                 "(its --config file or -o), then run this again:")
    lines.append("  logfs to-kafka restore " + " ".join(shlex.quote(d) for d in data_dirs)
                 + " --config FILE " + " ".join(f"--topic {shlex.quote(t)}" for t in topics))
    lines.append("(or give them up: write 'before N' to TOPIC/PARTITION/delete in the mount, N the local log start)")
    raise MigrationError("\n".join(lines))


# ------------------------------------------------------------------------------ step 1: the plan

def plan_script(state: DataDirState, *, node_id: int, bootstrap_server: str,
                kafka_topics: str = "kafka-topics.sh") -> str:
    """A shell script creating every topic of ``state`` on broker ``node_id``, one kafka-topics command each."""
    lines = ["#!/bin/sh",
             "# logfs to-kafka, step 1 of 3: create the topics of the logfs data dir on the broker.",
             f"# Every partition is assigned to node.id {node_id}, the broker that will serve the data;",
             "# add replicas later with kafka-reassign-partitions.sh.",
             "set -e"]
    # the group commits first: a broker that has hosted a consumer group has the topic already, and
    # then the script stops before creating anything, saying why
    ordered = sorted(state.topics.values(), key=lambda topic: topic.name != GROUP_METADATA_TOPIC)
    for topic in ordered:
        lines.extend(f"# {topic.name}: {note}" for note in topic.notes)
        cmd = [*shlex.split(kafka_topics), "--bootstrap-server", bootstrap_server, "--create", "--topic", topic.name,
               "--replica-assignment", ",".join([str(node_id)] * topic.partitions)]
        for name, value in topic.configs.items():
            cmd += ["--config", f"{name}={value}"]
        line = " ".join(shlex.quote(part) for part in cmd)
        if topic.name == GROUP_METADATA_TOPIC:
            message = ("create-topics.sh: the broker could not create __consumer_offsets; if it exists, the broker "
                       "has hosted consumer groups and cannot take logfs's commits: use a broker that never did, or "
                       "remove the __consumer_offsets-* directories from the logfs data dir (the groups' commits are "
                       "left behind) and run to-kafka plan again")
            line += f" || {{ echo {shlex.quote(message)} >&2; exit 1; }}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def plan_json(state: DataDirState, *, node_id: int) -> str:
    """The same plan as JSON: for admin clients (CreateTopics with replica assignments and configs)."""
    doc = {"node_id": node_id,
           "topics": [{"name": t.name, "partitions": t.partitions,
                       "replica_assignment": {str(p): [node_id] for p in range(t.partitions)},
                       "configs": t.configs, "notes": t.notes} for t in state.topics.values()],
           "partitions": [{"topic": p.topic_partition.topic, "partition": p.topic_partition.partition,
                           "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset}
                          for p in state.partitions]}
    return json.dumps(doc, indent=2) + "\n"


# ------------------------------------------------------------------------------ step 3: adoption

def read_topic_id(partition_dir: str) -> str:
    """The ``topic_id`` of a ``partition.metadata`` file (``version: 0`` / ``topic_id: <base64 uuid>``)."""
    path = os.path.join(partition_dir, PARTITION_METADATA_FILE)
    fields = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, sep, value = line.partition(":")
            if sep:
                fields[name.strip()] = value.strip()
    if fields.get("version") != "0" or not fields.get("topic_id"):
        raise MigrationError(f"{path} is not a version 0 partition.metadata file")
    return fields["topic_id"]


def _has_records(partition_dir: str) -> bool:
    return any(name.endswith(LOG_FILE_SUFFIX) and os.path.getsize(os.path.join(partition_dir, name)) > 0
               for name in os.listdir(partition_dir))


@dataclass
class Adoption:
    """What ``adopt`` did, per partition: (topic-partition, topic ID, log start, log end)."""

    broker_log_dir: str
    partitions: list[tuple[TopicPartition, str, int, int]]


def adopt(data_dirs: Sequence[str], broker_log_dir: str, *, copy: bool = False) -> Adoption:
    """Put the logfs partitions into a stopped broker's log dir (step 3 of the procedure).

    Checks everything first and raises MigrationError naming every problem,
    with nothing changed; then, per partition: ``partition.metadata`` with the
    broker's topic ID into the logfs partition dir (or its copy), the broker's
    empty partition dir removed, the logfs one renamed (or copied) in its
    place; last, the broker dir's checkpoints merged.  A crash in between
    leaves each partition either the broker's empty one or the logfs one with
    its topic ID, and running ``adopt`` again finishes the job.
    """
    broker_dir = os.path.abspath(broker_log_dir)
    # The read-only load refuses a dir a logfs mount holds; the locks taken after it (POSIX
    # record locks, which closing any descriptor of the file in this process would drop)
    # keep a mount or a broker from starting on the dirs while they are being changed.
    state = inspect(data_dirs)
    refuse_remote_only(state, data_dirs)
    with ExitStack() as stack:
        for d in data_dirs:
            _check_unlocked(os.path.abspath(d), "logfs mount", stack)
        problems = []
        if not os.path.exists(os.path.join(broker_dir, META_PROPERTIES)):
            problems.append(f"{broker_dir} has no {META_PROPERTIES}: it is not a formatted Kafka log dir")
        if not os.path.exists(os.path.join(broker_dir, CLEAN_SHUTDOWN_FILE)):
            problems.append(f"{broker_dir} has no {CLEAN_SHUTDOWN_FILE}: stop the broker cleanly first")
        if problems:
            raise MigrationError("; ".join(problems))
        _check_unlocked(broker_dir, "Kafka broker", stack)
        topic_ids: dict[TopicPartition, str] = {}
        for p in state.partitions:
            target = os.path.join(broker_dir, p.topic_partition.dir_name)
            if not os.path.isdir(target):
                problems.append(f"{p.topic_partition} does not exist in {broker_dir}: create its topic with "
                                f"the plan (`logfs to-kafka plan`) and let the broker start it")
                continue
            try:
                topic_ids[p.topic_partition] = read_topic_id(target)
            except (OSError, MigrationError) as exc:
                problems.append(f"{p.topic_partition} in {broker_dir} has no topic ID: {exc}")
                continue
            if _has_records(target):
                problems.append(f"{target} holds records already: refusing to replace it")
            if not copy and os.stat(p.dir).st_dev != os.stat(broker_dir).st_dev:
                problems.append(f"{p.dir} and {broker_dir} are on different filesystems: use --copy")
        if problems:
            raise MigrationError("; ".join(problems))

        # Checkpoints first: a partition moved in is never loaded without its log start offset.
        _merge_checkpoint(broker_dir, RECOVERY_POINT_CHECKPOINT,
                          {p.topic_partition: p.recovery_point for p in state.partitions})
        _merge_checkpoint(broker_dir, LOG_START_OFFSET_CHECKPOINT,
                          {p.topic_partition: p.log_start_offset for p in state.partitions})
        _merge_checkpoint(broker_dir, REPLICATION_OFFSET_CHECKPOINT,
                          {p.topic_partition: p.log_end_offset for p in state.partitions})
        _merge_checkpoint(broker_dir, CLEANER_OFFSET_CHECKPOINT,
                          {p.topic_partition: p.cleaner_offset for p in state.partitions
                           if p.cleaner_offset is not None},
                          drop=[p.topic_partition for p in state.partitions])
        for p in state.partitions:
            tp = p.topic_partition
            target = os.path.join(broker_dir, tp.dir_name)
            metadata = f"version: 0\ntopic_id: {topic_ids[tp]}\n".encode()
            if copy:
                source = os.path.join(broker_dir, f"{tp.dir_name}.logfs-adopt")
                shutil.rmtree(source, ignore_errors=True)
                shutil.copytree(p.dir, source)
            else:
                source = p.dir
            _remove_view_indexes(source)
            # The topic ID goes in before the dir does: Kafka treats a log without one as a stray.
            atomic_write(os.path.join(source, PARTITION_METADATA_FILE), metadata)
            shutil.rmtree(target)
            os.rename(source, target)
            fsync_dir(broker_dir)
            logger.info("Adopted %s into %s with topic ID %s (log start %d, log end %d)", tp, target,
                        topic_ids[tp], p.log_start_offset, p.log_end_offset)
        return Adoption(broker_dir, [(p.topic_partition, topic_ids[p.topic_partition], p.log_start_offset,
                                      p.log_end_offset) for p in state.partitions])


def _remove_view_indexes(partition_dir: str) -> None:
    """Remove the mount's ``.viewindex`` sidecars (engine.views.persisted): Kafka gets only its own files.

    Kafka's loader would ignore them, but nothing would ever delete them (its
    retention and cleaner delete only the files it knows); a mount over the
    dir again rebuilds them by one scan per segment.
    """
    for name in os.listdir(partition_dir):
        if name.endswith((VIEW_INDEX_FILE_SUFFIX, VIEW_INDEX_FILE_SUFFIX + TMP_FILE_SUFFIX)):
            os.unlink(os.path.join(partition_dir, name))


def _merge_checkpoint(log_dir: str, name: str, offsets: dict[TopicPartition, int],
                      drop: Iterable[TopicPartition] = ()) -> None:
    """Replace the entries of ``offsets`` (and remove those of ``drop``) in a checkpoint of ``log_dir``."""
    path = os.path.join(log_dir, name)
    current = OffsetCheckpointFile(path).read() if os.path.exists(path) else {}
    for tp in drop:
        current.pop(tp, None)
    current.update(offsets)
    OffsetCheckpointFile(path).write(current)


# ------------------------------------------------------------------------------ step 0: restore (tiered storage)

@dataclass
class Restoration:
    """What ``restore`` did."""

    #: per partition: (topic-partition, remote log segments restored, their bytes, its local log start now)
    partitions: list[tuple[TopicPartition, int, int, int]]
    #: the topics whose remote.storage.enable was turned off
    disabled: list[str]
    #: the copies deleted from the store (``delete_remote_copies``)
    deleted_copies: int


def restore(data_dirs: Sequence[str], settings: Mapping[str, str], topics: Sequence[str] = (), *,
            delete_remote_copies: bool = False) -> Restoration:
    """Bring the records only in remote storage back into local segments (tiered storage, docs/tiering.md).

    For each partition of ``topics`` (default: every topic with copies in the
    store or ``remote.storage.enable=true``) whose log starts below its local
    log start, every finished copy holding those offsets is downloaded from
    the store ``settings`` names (the ``rsm.config.*`` settings of the mount)
    into local segment files (engine.remote.restore: fsynced, renamed into
    place, from the highest offset down).  Then the topic's
    ``remote.storage.enable`` is turned off (a tiered mount would otherwise
    delete the restored segments again), and with ``delete_remote_copies``
    every copy of its partitions is deleted from the store (recorded in the
    metadata log).  The copies stay otherwise.

    Offline: the data dirs must have been shut down cleanly and are locked
    while files change (a mount started meanwhile is refused, as a second
    broker is).  Everything that can be checked is checked before anything
    changes: the topics, the metadata covering every offset to restore, every
    copy's ``.log`` listed in the store.  Killed at any point, it can be run
    again and goes on; a failure of the store is a MigrationError naming the
    store and the segment, and what is local stays.
    """
    from engine.clock import SYSTEM_CLOCK
    from engine.errors import StorageError
    from engine.log_dirs import lock_log_dirs, unlock_log_dirs
    from engine.remote.remote_log_manager import open_remote_log_manager
    from engine.remote.restore import (
        RestoreError,
        copies_to_restore,
        first_local_base_offset,
        remove_leftovers,
        restore_segment,
    )
    from engine.remote.storage import RSM_URI, RemoteStorageError, chunk_cache_bounds, open_remote_storage
    from engine.topic_configs import TopicConfigStore

    dirs = [os.path.abspath(d) for d in data_dirs]
    state = inspect(dirs)
    unknown = sorted(set(topics) - set(state.topics))
    if unknown:
        raise MigrationError(f"No topic {', '.join(unknown)} in {', '.join(dirs)}")
    chosen = sorted(set(topics) if topics else
                    {r.topic_partition.topic for r in state.remote}
                    | {t.name for t in state.topics.values() if t.remote_storage_enable})
    remote = [r for r in state.remote if r.topic_partition.topic in chosen]
    try:
        plan = {r.topic_partition: copies_to_restore(r.copies, r.topic_partition, r.log_start_offset,
                                                     r.local_log_start_offset)
                for r in remote if r.log_start_offset < r.local_log_start_offset}
    except RestoreError as exc:
        raise MigrationError(str(exc)) from exc
    storage = None
    if plan or (delete_remote_copies and any(r.copies for r in remote)):
        if not settings.get(RSM_URI):
            raise MigrationError("The remote storage's settings are missing: give the mount's rsm.config.* "
                                 "settings with --config FILE (its properties file) or -o rsm.config.uri=...")
        try:
            storage = open_remote_storage(settings)
        except (RemoteStorageError, LogfsError) as exc:
            raise MigrationError(f"Cannot open the remote storage: {exc}") from exc
    restored: list[tuple[TopicPartition, int, int, int]] = []
    deleted = 0
    try:
        try:
            locks = lock_log_dirs(dirs, read_only=False)
        except StorageError as exc:
            raise MigrationError(f"{exc} Stop the logfs mount (`logfs umount MOUNTPOINT`) first.") from exc
        try:
            if storage is not None:         # every copy's .log is there before anything changes
                for r in remote:
                    if r.topic_partition not in plan:
                        continue
                    try:
                        listed = storage.list_segment_ids(r.tip)
                    except RemoteStorageError as exc:
                        raise MigrationError(f"Cannot list the remote log segments of {r.topic_partition}: "
                                             f"{exc}") from exc
                    for m in plan[r.topic_partition]:
                        if m.segment_id not in listed:
                            raise MigrationError(
                                f"Remote log segment {m.start_offset}..{m.end_offset} of {r.topic_partition} is "
                                f"missing from remote storage {storage.uri} "
                                f"({m.segment_id.object_name('log')}): its records are lost unless it is "
                                "found (nothing was changed)")
            for r in remote:
                copies = plan.get(r.topic_partition, [])
                if copies:
                    assert storage is not None
                    remove_leftovers(r.dir)
                    if first_local_base_offset(r.dir) != r.local_log_start_offset:
                        raise MigrationError(f"{r.dir} changed since it was inspected (its first segment is "
                                             "not where it was): run the command again")
                    for m in reversed(copies):
                        try:
                            restore_segment(r.dir, r.topic_partition, storage, m)
                        except RestoreError as exc:
                            raise MigrationError(f"{exc}; nothing local was lost (the segments restored before "
                                                 "it stay, the store serves the rest): run the command again "
                                                 "once the store answers") from exc
                    logger.info("Restored %d remote log segments of %s: its local segments hold every record "
                                "from its log start %d", len(copies), r.topic_partition, r.log_start_offset)
                restored.append((r.topic_partition, len(copies), sum(m.segment_size_bytes for m in copies),
                                 first_local_base_offset(r.dir) or 0))
            # every partition of a chosen topic holds its log from its log start: tiering can go off
            for p in state.partitions:
                if p.topic_partition.topic in chosen:
                    first = first_local_base_offset(p.dir)
                    if first is None or first > p.log_start_offset:
                        raise MigrationError(f"{p.topic_partition} still starts at {first}, above its log start "
                                             f"{p.log_start_offset}: remote.storage.enable stays on")
            disabled = _disable_remote_storage(TopicConfigStore(dirs, SYSTEM_CLOCK), chosen)
            if delete_remote_copies and storage is not None:
                cache_bytes, chunk_bytes = chunk_cache_bounds(settings)
                owned, storage = storage, None      # the RemoteLogManager closes it (or open_... when it fails)
                rlm = open_remote_log_manager(owned, dirs, cache_max_bytes=cache_bytes, chunk_bytes=chunk_bytes)
                try:
                    for r in remote:
                        try:
                            deleted += rlm.delete_partition(r.tip)
                        except RemoteStorageError as exc:
                            raise MigrationError(f"Cannot delete the remote log segments of {r.topic_partition}: "
                                                 f"{exc} (every record is local; run the command again to delete "
                                                 "the rest)") from exc
                        logger.info("Deleted the remote log segments of %s from remote storage", r.topic_partition)
                finally:
                    rlm.close()
        finally:
            unlock_log_dirs(locks)
    finally:
        if storage is not None:
            storage.close()
    return Restoration(restored, disabled, deleted)


def _disable_remote_storage(store: TopicConfigStore, topics: Sequence[str]) -> list[str]:
    """Remove ``remote.storage.enable`` from the overrides of ``topics`` (false, the default); returns the
    topics that had it."""
    newest = store.load()
    if newest is None:
        return []
    overrides = {t: dict(o) for t, o in newest.topics.items()}
    disabled = [t for t in topics if overrides.get(t, {}).pop("remote.storage.enable", None) is not None]
    if disabled:
        store.write(overrides, newest.deleting)
        logger.info("Turned remote.storage.enable off for topics %s: every record is in their local segments",
                    ", ".join(disabled))
    return disabled


# ------------------------------------------------------------------------------ the command line

def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``logfs to-kafka restore|plan|adopt`` on the ``logfs`` command's subparsers."""
    parser = sub.add_parser("to-kafka", help="hand a logfs data directory to an Apache Kafka (KRaft) broker",
                            description="Move a logfs data directory to Kafka: `restore` brings the records "
                                        "only in tiered storage's remote storage back local, `plan` creates the "
                                        "topics, `adopt` moves the data into the stopped broker's log dir.")
    steps = parser.add_subparsers(dest="step", required=True)
    restore_ = steps.add_parser(
        "restore", help="tiered storage: download the records only in remote storage into local segments",
        description="Download every remote log segment below the local log start of the topics' partitions "
                    "into local segment files, then turn the topics' remote.storage.enable off. Offline (the "
                    "data dirs unmounted); safe to stop and run again.")
    restore_.add_argument("data_dirs", nargs="+", metavar="DATA_DIR")
    restore_.add_argument("--topic", dest="topics", action="append", default=[], metavar="TOPIC",
                          help="a topic to restore (repeatable; default: every topic with remote log segments "
                               "or remote.storage.enable=true)")
    restore_.add_argument("--config", metavar="FILE",
                          help="the mount's properties file: its rsm.config.* settings name the store")
    restore_.add_argument("-o", dest="options", action="append", default=[], metavar="NAME=VALUE",
                          help="an rsm.config.* setting of the store, applied after --config; repeatable")
    restore_.add_argument("--delete-remote-copies", action="store_true",
                          help="then delete every remote log segment of the topics from the store (by default "
                               "they stay, unused)")
    plan = steps.add_parser("plan", help="print the kafka-topics.sh commands that create the topics")
    plan.add_argument("data_dirs", nargs="+", metavar="DATA_DIR")
    plan.add_argument("--node-id", type=int, default=1, help="node.id of the broker that will serve the data")
    plan.add_argument("--bootstrap-server", default="localhost:9092")
    plan.add_argument("--kafka-topics", default="kafka-topics.sh",
                      help="the kafka-topics command line to print (split like a shell does)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON instead of a shell script")
    adopt_ = steps.add_parser("adopt", help="move (or copy) the partitions into the stopped broker's log dir")
    adopt_.add_argument("data_dirs", nargs="+", metavar="DATA_DIR")
    adopt_.add_argument("--broker-log-dir", required=True, metavar="DIR",
                        help="the broker's log.dirs entry where the plan's topics were created")
    adopt_.add_argument("--copy", action="store_true", help="copy the partitions, leaving the logfs dir as it was")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # The read-only load of the data dirs is an implementation detail here: only warnings matter; what
    # restore does to the data (engine.remote) is said at the command's level.  The levels are put back
    # afterwards (a caller in the same process keeps its own).
    level = logging.getLogger().getEffectiveLevel()
    quiet = {name: logging.getLogger(name).level for name in ("engine", "engine.remote.restore",
                                                              "engine.remote.remote_log_manager")}
    logging.getLogger("engine").setLevel(max(logging.WARNING, level))
    for name in ("engine.remote.restore", "engine.remote.remote_log_manager"):
        logging.getLogger(name).setLevel(level)
    try:
        return _run(args)
    finally:
        for name, previous in quiet.items():
            logging.getLogger(name).setLevel(previous)


def _run(args: argparse.Namespace) -> int:
    import sys
    try:
        if args.step == "restore":
            from logfs.remote_settings import remote_storage_settings
            done = restore(args.data_dirs, remote_storage_settings(args), args.topics,
                           delete_remote_copies=args.delete_remote_copies)
            for tp, segments, size, local_start in done.partitions:
                print(f"{tp} restored_segments={segments} restored_bytes={size} local_log_start_offset={local_start}")
            if done.disabled:
                print(f"remote.storage.enable turned off for {', '.join(done.disabled)}")
            if done.deleted_copies:
                print(f"Deleted {done.deleted_copies} remote log segments from remote storage")
            print(f"Restored {sum(p[1] for p in done.partitions)} remote log segments of {len(done.partitions)} "
                  "partitions: every record is in local segments.")
            return 0
        if args.step == "plan":
            state = inspect(args.data_dirs)
            refuse_remote_only(state, args.data_dirs)
            if args.json:
                sys.stdout.write(plan_json(state, node_id=args.node_id))
            else:
                sys.stdout.write(plan_script(state, node_id=args.node_id, bootstrap_server=args.bootstrap_server,
                                             kafka_topics=args.kafka_topics))
            return 0
        adoption = adopt(args.data_dirs, args.broker_log_dir, copy=args.copy)
    except (LogfsError, OSError) as exc:
        logger.error("logfs to-kafka %s: %s", args.step, exc)
        return 1
    for tp, topic_id, start, end in adoption.partitions:
        print(f"{tp} topic_id={topic_id} log_start_offset={start} log_end_offset={end}")
    print(f"Adopted {len(adoption.partitions)} partitions into {adoption.broker_log_dir}: start the broker.")
    return 0
