"""LogManager: every partition's Log over all ``log.dirs`` (Kafka's ``kafka.log.LogManager``).

Over 800 lines on purpose: this is one class, as in Kafka, whose jobs (load,
create and delete, checkpoints, retention, shutdown) share one state (the logs
map, the topic overrides and the deletion intent, under one lock) and the
crash-ordering rules below; splitting it further would split those invariants.
What has a job of its own lives apart: :mod:`engine.log_dirs` (validation,
locks, scanning, placement), :mod:`engine.load_logs` (loading every log at
startup, Kafka's ``loadLogs``), :mod:`engine.topic_configs` (the topic-config
store), :mod:`engine.log_deletion` (the ``-delete`` dir queue) and
:mod:`engine.log_checkpoints` (the per-dir checkpoint writers, Kafka's
``checkpointLogRecoveryOffsets``/``checkpointLogStartOffsets``).

Responsibilities, as in Kafka:

* validate ``log.dirs`` (no duplicates, created when missing, readable and
  writable directories);
* load every ``<topic>-<partition>`` directory in parallel, one thread pool of
  ``num.recovery.threads.per.data.dir`` threads per log dir, with the recovery
  point and log start offset from that dir's checkpoints and the dir's
  clean-shutdown marker (:func:`engine.load_logs.load_logs`);
* place new partitions in the log dir holding the fewest partitions
  (``nextLogDirs``);
* asynchronous topic deletion: a partition directory is renamed
  ``<topic>-<partition>.<uuid>-delete`` at once and removed by :meth:`delete_logs`
  once ``file.delete.delay.ms`` has passed (a crash in between is finished at
  the next start);
* crash-safe deletion (see "Deletion and crashes" below);
* the periodic jobs (flusher, recovery-point and log-start-offset checkpoints,
  retention, removal of ``.deleted`` segment files and ``-delete`` dirs) as
  plain methods: the mount schedules them on worker threads, the engine starts
  no thread of its own except the recovery pools during :meth:`startup`;
* a clean :meth:`shutdown`: flush, close, both checkpoints, then the
  ``.kafka_cleanshutdown`` marker in each dir.

Topic configuration overrides are persisted in ``topic-configs.json`` in every
log dir, with its previous generation (:mod:`engine.topic_configs`).

The log cleaner (:class:`engine.cleaner.LogCleaner`) is created by
:meth:`startup` when ``log.cleaner.enable`` is true and ``log.cleaner.threads``
is positive; it lists the logs through :meth:`all_logs` on every round, so
topics created or reconfigured later are seen, and keeps its own
``cleaner-offset-checkpoint`` in each log dir.  As in Kafka the manager
coordinates with it in three places: topic deletion aborts a running clean
before renaming the partition and drops the partition from that checkpoint;
retention pauses cleaning of the logs it works on (compacted logs get their
retention from the cleaner itself); shutdown stops the cleaner first.  The
engine starts no cleaner thread: the mount calls ``LogCleaner.clean_once``.

Deletion and crashes.  Whatever a deletion hides must stay hidden after a
``kill -9`` at any point of it:

* Every move of a log start offset (DeleteRecords, retention, the cleaner's
  retention of compacted logs) first writes the dir's
  ``log-start-offset-checkpoint`` with the new offset, through the Log's
  ``before_log_start_offset_moves`` hook, *before* the first segment is
  renamed ``.deleted`` (under the log's lock, so the offset written is the one
  reached).  A crash between two
  renames then restarts at that log start offset, and the segments left below
  it are deleted by the first retention run; ``.deleted`` files are removed by
  the LogLoader.  Without it a crash would bring back every record between the
  last checkpoint and the segments not yet renamed.
* Topic deletion records its intent first: the topic goes into the
  ``deleting`` list of ``topic-configs.json`` (in the same write that drops
  its overrides), then each partition dir is renamed ``-delete``, then the
  list is cleared.  At startup a topic still listed has its remaining
  partition dirs renamed and queued instead of loaded, so a crash between two
  renames never resurrects a topic with some of its partitions.

A full disk.  Deleting data must work when the disk is full, and every
deletion writes first (the log-start-offset checkpoint, or the topic configs
with the deletion intent).  Deleting first and checkpointing after would not
be safe: a crash between the two would bring back the records between the
first remaining segment's base offset and the new log start (DeleteRecords in
the middle of a segment), and the start observed before the crash would go
back.  So the order stays, and the writes are made so they need no new disk
blocks: ``write_keeping_previous`` (engine.checkpoint) writes the new content
in place over the file's previous generation (``.prev``), fsyncs it, and swaps
the two names with one ``renameat2(RENAME_EXCHANGE)``.  The blocks of ``.prev``
are already allocated and a checkpoint or config file barely changes size, so
this succeeds on a full disk; the crash guarantees are those of a rename (the
current file is intact until the swap, and the swap is atomic).  Startup makes
sure ``topic-configs.json`` and its ``.prev`` exist while there is room; the
checkpoints have a ``.prev`` from their second periodic write on.  When a
write still needs more room than that, it fails with ENOSPC and nothing is
deleted (never EIO).  The space itself comes back when the ``.deleted``
files and ``-delete`` dirs are removed, ``file.delete.delay.ms`` later.

Read-only mode (``--read-only``) writes nothing to the log dirs, not even
recovery: a dir that was not shut down cleanly is recovered in memory by the
LogLoader, the clean-shutdown marker stays in place, logs
are loaded with ``Log.load(read_only=True)``, there is no cleaner, the
periodic jobs do nothing and every other mutator raises ReadOnlyError.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING

from engine.checkpoint import CLEAN_SHUTDOWN_FILE
from engine.cleaner import LogCleaner
from engine.clock import SYSTEM_CLOCK, Clock
from engine.config import (
    MIN_SEGMENT_BYTES,
    TOPIC_CONFIG_NAMES,
    BrokerConfig,
    LogConfig,
    validate_topic_overrides,
)
from engine.errors import (
    InternalTopicError,
    InvalidConfigError,
    InvalidPartitionError,
    InvalidRequestError,
    InvalidTopicError,
    LogfsError,
    ReadOnlyError,
    StorageError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    storage_error,
)
from engine.files import (
    TMP_FILE_SUFFIX,
    atomic_write,
    fsync_dir,
    log_file_path,
    offset_index_file_path,
    time_index_file_path,
    unlink_if_exists,
)
from engine.load_logs import load_logs
from engine.log import CLIENT_RECORD_DELETION, Log
from engine.log_checkpoints import LogDirCheckpoints
from engine.log_deletion import LogDeletionQueue, PendingDeletion
from engine.log_dirs import (
    LogDirLock,
    create_and_validate_log_dirs,
    lock_log_dirs,
    next_log_dir,
    unlock_log_dirs,
)
from engine.log_pool import LogPool
from engine.numbers import parse_canonical_int
from engine.partition_metadata import PARTITION_METADATA_FILE, new_topic_id, read_topic_id, write_partition_metadata
from engine.topic import (
    TopicPartition,
    delete_dir_name,
    is_internal,
    validate_topic_name,
)
from engine.topic_configs import TOPIC_CONFIGS_FILE, TopicConfigStore
from engine.transactions import ReadIsolation

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.remote.remote_log_manager import RemoteLogManager, TieredPartition
    from engine.remote.storage import RemoteStorageManager

logger = logging.getLogger(__name__)


def _remove_new_partition_dir(path: str) -> None:
    """Take back a partition dir whose creation failed, even when no descriptor is left to list it.

    A creation that failed for want of descriptors (EMFILE) leaves none for
    ``shutil.rmtree``'s listing either, and a dir left behind would make the
    next ``mkdir`` of the topic fail with EEXIST and come back as an empty
    partition at the next start.  The files a new log creates are known by
    name, and ``unlink``/``rmdir`` take no descriptor; anything else there is
    removed by a listing.
    """
    metadata = os.path.join(path, PARTITION_METADATA_FILE)
    for name in (log_file_path(path, 0), offset_index_file_path(path, 0), time_index_file_path(path, 0),
                 metadata, metadata + TMP_FILE_SUFFIX):
        unlink_if_exists(name, ignore_errors=True)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        if os.path.lexists(path):
            logger.warning("Could not remove %s after its log failed to be created; remove it before creating "
                           "the topic again", path)


class LogManager:
    """All partitions of all topics over ``config.log_dirs``.

    Thread-safe: ``_lock`` guards the logs map, topic overrides and the
    deletion queue.  Slow work (loading, flushing, deleting files) runs outside
    it on references taken under it, so background jobs never stall lookups.
    """

    def __init__(self, config: BrokerConfig, *, clock: Clock = SYSTEM_CLOCK, read_only: bool = False,
                 stable_offset_bounded: bool = False, remote_storage: RemoteStorageManager | None = None,
                 remote_cache_bytes: int = 256 << 20, remote_chunk_bytes: int = 4 << 20,
                 remote_only_records_ok: bool = False) -> None:
        """``stable_offset_bounded``: the logs are live replicas whose leader finishes their open
        transactions, so read_committed views end at the last stable offset (engine.transactions).

        ``remote_storage``: the store of tiered storage (``remote.log.storage.system.enable``, opened by
        the caller from the ``rsm.config.*`` settings); :meth:`startup` makes the
        :attr:`remote_log_manager` over it, with a chunk cache of ``remote_cache_bytes`` in chunks of
        ``remote_chunk_bytes``, and :meth:`shutdown` closes it (the store too).
        """
        self.config = config
        self.clock = clock
        self.read_only = read_only
        self.log_dirs: list[str] = [os.path.abspath(d) for d in config.log_dirs]
        #: how the views of every log here read it (each log holds it as its ``read_isolation``)
        self.read_isolation = ReadIsolation(config.isolation_level, stable_offset_bounded=stable_offset_bounded)
        self.default_config: LogConfig = config.log_config()
        self._lock = threading.RLock()
        self._logs = LogPool()
        self._overrides: dict[str, dict[str, str]] = {}
        self._topic_configs: dict[str, LogConfig] = {}
        self._topic_config_store = TopicConfigStore(self.log_dirs, clock)
        self._logs_to_be_deleted = LogDeletionQueue()
        #: topics whose partition dirs are being renamed -delete (persisted in topic-configs.json)
        self._deleting_topics: set[str] = set()
        #: the recovery-point and log-start-offset checkpoints of each dir, from the logs live
        #: at each write (dict.copy of the logs map: one atomic step, no lock taken)
        self._checkpoints = LogDirCheckpoints(self.log_dirs, self._logs.snapshot,
                                              lambda: self.cleaner)
        self.had_clean_shutdown: dict[str, bool] = {}
        #: the log cleaner; None when disabled, read-only, or before startup()
        self.cleaner: LogCleaner | None = None
        self.loaded_logs = 0
        self.load_seconds = 0.0
        self._started = False
        self._shut_down = False
        #: topics with a partition dir holding a link or special file: not loaded, never touched
        self._unsafe_topics: set[str] = set()
        #: descriptors holding the log dir locks, released at the end of shutdown()
        self._dir_locks: list[LogDirLock] = []
        self._remote_storage = remote_storage
        self._remote_cache = (remote_cache_bytes, remote_chunk_bytes)
        self._remote_only_records_ok = remote_only_records_ok
        #: tiered storage (Kafka's RemoteLogManager); None unless the mount has remote storage
        self.remote_log_manager: RemoteLogManager | None = None
        #: log -> its topic id, for the TopicIdPartition of tiered storage (its partition.metadata)
        self._topic_ids: weakref.WeakKeyDictionary[Log, str | None] = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ startup

    def startup(self) -> None:
        """Validate the log dirs, read topic configs and load every log."""
        self._create_and_validate_log_dirs()
        self._lock_log_dirs()
        try:
            self._load_topic_configs()
            self._load_logs()
            self._finish_interrupted_topic_deletions()
            self._ensure_topic_configs_generations()
            self._open_remote_log_manager()
        except BaseException:
            self._unlock_log_dirs()
            raise
        # Created after loading, as in Kafka: its first round must see every log.
        if self.config.log_cleaner_enable and not self.read_only and int(self.config.log_cleaner_threads) > 0:
            self.cleaner = LogCleaner(self.config, self.log_dirs, self.all_logs, self.clock)
        self._started = True

    def _open_remote_log_manager(self) -> None:
        """Tiered storage's metadata log and chunk cache (engine.remote.remote_log_manager), over the store."""
        tiered = sorted(t for t, c in self._topic_configs.items() if c.remote_storage_enable)
        storage, self._remote_storage = self._remote_storage, None
        if storage is None:
            remote_only = sorted({str(log.topic_partition) for log in self._logs.values()
                                  if log.has_remote_only_records})
            if remote_only and not self._remote_only_records_ok:
                raise StorageError(
                    f"Partitions {', '.join(remote_only)} hold records only in remote storage (tiered storage "
                    "deleted their local copies): mount with remote.log.storage.system.enable=true and the "
                    "rsm.config.* settings of their store (docs/tiering.md)")
            if tiered:
                logger.warning("Topics %s have remote.storage.enable=true, but the mount has no remote storage "
                               "(remote.log.storage.system.enable): their segments are not copied", ", ".join(tiered))
            return
        from engine.remote.remote_log_manager import open_remote_log_manager
        if self.read_only:
            storage.close()
            raise InvalidConfigError("remote.log.storage.system.enable=true cannot be combined with --read-only yet")
        self.remote_log_manager = open_remote_log_manager(
            storage, self.log_dirs, cache_max_bytes=self._remote_cache[0], chunk_bytes=self._remote_cache[1],
            clock=self.clock)
        for log in self._logs.values():
            self._attach_remote_log_reader(log)
        logger.info("Tiered storage on: remote log segments in %s%s", storage.uri,
                    f", topics {', '.join(tiered)} copied" if tiered else "")

    def _create_and_validate_log_dirs(self) -> None:
        create_and_validate_log_dirs(self.log_dirs, self.read_only)

    def _lock_log_dirs(self) -> None:
        """Own every log dir before reading or writing anything in it (see ``engine.log_dirs``)."""
        self._dir_locks = lock_log_dirs(self.log_dirs, self.read_only)

    def _unlock_log_dirs(self) -> None:
        unlock_log_dirs(self._dir_locks)
        self._dir_locks = []

    def _load_logs(self) -> None:
        """Every partition of every log dir (engine.load_logs, Kafka's ``loadLogs``)."""
        found = load_logs(self.log_dirs, threads=max(1, int(self.config.num_recovery_threads_per_data_dir)),
                          read_only=self.read_only, clock=self.clock, config_for=self._config_for,
                          deleting_topics=self._deleting_topics,
                          before_log_start_offset_moves=self._checkpoint_moving_log_start_offset)
        self.had_clean_shutdown.update(found.had_clean_shutdown)
        self._unsafe_topics.update(found.unsafe_topics)
        for path, found_ms in found.pending_deletion:
            self._logs_to_be_deleted.schedule(PendingDeletion(
                path, None, found_ms, self.default_config.file_delete_delay_ms, None))
        for log in found.logs.values():
            log.read_isolation = self.read_isolation
        with self._lock:
            self._logs.update(found.logs)
            # overrides of topics that no longer have a partition (a deletion that crashed
            # before rewriting the configs) must not leak into a new topic of that name
            for topic in [t for t in self._overrides if not self._logs.has_topic(t)]:
                logger.info("Dropping config overrides of topic %s, which has no partitions", topic)
                del self._overrides[topic]
                self._topic_configs.pop(topic, None)
        self.loaded_logs = len(found.logs)
        self.load_seconds = found.seconds

    def _check_not_unsafe(self, topic: str) -> None:
        """StorageError for a topic left unloaded because of a link or special file in its dirs."""
        if topic in self._unsafe_topics:
            raise StorageError(f"Topic {topic} exists on disk but is not served: a partition directory of it holds "
                               "a symbolic link or special file (see the ERROR at mount)")

    def _finish_interrupted_topic_deletions(self) -> None:
        """Clear the ``deleting`` list once startup renamed what an interrupted deletion left."""
        if not self._deleting_topics or self.read_only:
            return
        logger.info("Completed the interrupted deletion of topics %s", ", ".join(sorted(self._deleting_topics)))
        with self._lock:
            self._deleting_topics.clear()
            self._write_topic_configs(self._overrides)

    # ------------------------------------------------------------------ topic configs

    def _config_for(self, topic: str) -> LogConfig:
        with self._lock:
            config = self._topic_configs.get(topic)
            if config is None:
                overrides = self._overrides.get(topic)
                config = self.default_config.with_overrides(overrides) if overrides else self.default_config
                self._topic_configs[topic] = config
            return config

    def _load_topic_configs(self) -> None:
        """Load the newest readable copy of the topic configs (see ``TopicConfigStore.load``)."""
        newest = self._topic_config_store.load()
        if newest is None:
            return
        configs = {}
        for topic, overrides in newest.topics.items():
            _keep_small_segment_bytes(topic, overrides)
            try:
                configs[topic] = self.default_config.with_overrides(overrides)
            except InvalidConfigError as exc:
                raise InvalidConfigError(
                    f"Invalid config override for topic {topic} in {newest.path}: {exc}") from exc
        with self._lock:
            self._overrides = {topic: dict(o) for topic, o in newest.topics.items()}
            self._topic_configs = configs
            self._deleting_topics = set(newest.deleting)
        logger.info("Loaded config overrides of %d topics from %s (generation %d)",
                    len(newest.topics), newest.path, newest.generation)

    def _ensure_topic_configs_generations(self) -> None:
        """Have ``topic-configs.json`` and its ``.prev`` in every dir from the start.

        A topic deletion on a full disk needs both (``TopicConfigStore.missing_generations``).
        A failure here is not fatal: only a later full disk needs them.
        """
        if self.read_only:
            return
        for _ in range(2):
            if not self._topic_config_store.missing_generations():
                return
            try:
                with self._lock:
                    self._write_topic_configs(self._overrides)
            except LogfsError as exc:
                logger.warning("Could not write %s at startup: %s", TOPIC_CONFIGS_FILE, exc)
                return

    def _write_topic_configs(self, overrides: Mapping[str, Mapping[str, str]]) -> None:
        """Persist ``overrides`` and the deletion intent in every log dir (under ``_lock``).

        Raises LogDirFullError (ENOSPC) or StorageError naming the dir that failed.
        """
        self._topic_config_store.write(overrides, self._deleting_topics)

    def topic_config(self, topic: str) -> LogConfig:
        """The effective LogConfig of ``topic``: broker defaults plus its overrides."""
        with self._lock:
            if not self._logs.has_topic(topic):
                raise UnknownTopicOrPartitionError(f"Topic {topic} does not exist")
            return self._config_for(topic)

    def topic_overrides(self, topic: str) -> dict[str, str]:
        with self._lock:
            if not self._logs.has_topic(topic):
                raise UnknownTopicOrPartitionError(f"Topic {topic} does not exist")
            return dict(self._overrides.get(topic, {}))

    def validate_topic_overrides(self, topic: str, updates: Mapping[str, str | None]) -> None:
        """Each name and value on its own (engine.config), on an internal topic a ``cleanup.policy`` it must
        not take (InternalTopicError), and tiered storage's combined checks (``LogConfig.check_remote_storage``)
        of the overrides with ``updates`` applied: what a ``config`` write can check before its close."""
        validate_topic_overrides(updates)
        policy = updates.get("cleanup.policy")
        if is_internal(topic) and policy is not None:
            _check_internal_topic_config(topic, self.default_config.with_overrides({"cleanup.policy": policy}))
        # tiered storage's checks are of the combined values (a compacted topic, local above total
        # retention): made here too, since a refusal at close() is one a shell never reports
        with self._lock:
            overrides = dict(self._overrides.get(topic, {}))
        for name, value in updates.items():
            if value is None:
                overrides.pop(name, None)
            else:
                overrides[name] = value
        combined = self.default_config.with_overrides(overrides)
        combined.check_remote_storage(self.remote_log_manager is not None)
        if not combined.remote_storage_enable and self._logs.has_topic(topic):
            self._check_no_remote_only_records(topic)

    def _check_no_remote_only_records(self, topic: str) -> None:
        """InvalidConfigError when a partition of ``topic`` holds records only in remote storage: turning
        remote.storage.enable off would drop them (Kafka asks for remote.log.delete.on.disable instead)."""
        for p, log in sorted(self._logs.logs_of(topic).items()):
            if log.has_remote_only_records:
                raise InvalidConfigError(
                    f"Invalid value false for configuration remote.storage.enable: partition {p} of {topic} holds "
                    f"offsets {log.log_start_offset} to {log.local_log_start_offset - 1} only in remote storage; "
                    f"delete them first (write 'before {log.local_log_start_offset}' to {topic}/{p}/delete)")

    def alter_topic_config(self, topic: str, updates: Mapping[str, str | None]) -> LogConfig:
        """Set (value) or remove (None) overrides: all validated before anything changes."""
        self._check_writable("alter the config of topic " + topic)
        with self._lock:
            if not self._logs.has_topic(topic):
                raise UnknownTopicOrPartitionError(f"Topic {topic} does not exist")
            overrides = dict(self._overrides.get(topic, {}))
            for name, value in updates.items():
                if name not in TOPIC_CONFIG_NAMES:
                    raise InvalidConfigError(f"Unknown topic config name: {name}")
                if value is None:
                    overrides.pop(name, None)
                else:
                    overrides[name] = value
            config = self.default_config.with_overrides(overrides)
            _check_internal_topic_config(topic, config)
            config.check_remote_storage(self.remote_log_manager is not None)
            if not config.remote_storage_enable:
                self._check_no_remote_only_records(topic)
            all_overrides = dict(self._overrides)
            all_overrides[topic] = overrides
            self._write_topic_configs(all_overrides)
            if overrides:
                self._overrides[topic] = overrides
            else:
                self._overrides.pop(topic, None)
            self._topic_configs[topic] = config
            logs = list(self._logs.logs_of(topic).values())
        for log in logs:
            log.update_config(config)
        logger.info("Updated config of topic %s: %s", topic,
                    ", ".join(f"{k}={'(default)' if v is None else v}" for k, v in updates.items()))
        return config

    # ------------------------------------------------------------------ topics and partitions

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._logs.topics())

    def partitions(self, topic: str) -> list[int]:
        with self._lock:
            return sorted(self._logs.logs_of(topic))

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def produce_target(self, tp: TopicPartition) -> Log:
        """The log a client's produce appends to (Kafka's ``ReplicaManager.appendToLocalLog`` with
        ``internalTopicsAllowed=false``): an internal topic is written by its coordinator only."""
        log = self._logs.get(tp)
        if log is None:
            raise UnknownTopicOrPartitionError(f"No partition {tp}")
        if is_internal(tp.topic):
            raise InternalTopicError(f"Cannot append to internal topic {tp.topic}")
        return log

    def all_logs(self) -> list[Log]:
        with self._lock:
            return list(self._logs.values())

    def logs_by_dir(self) -> dict[str, list[Log]]:
        """Live logs grouped by the log dir that holds them (every dir present)."""
        with self._lock:
            by_dir: dict[str, list[Log]] = {d: [] for d in self.log_dirs}
            for log in self._logs.values():
                by_dir.setdefault(os.path.dirname(log.dir), []).append(log)
            return by_dir

    def _next_log_dir(self) -> str:
        """Kafka's ``nextLogDirs``: the log dir with the fewest partitions (first on ties)."""
        return next_log_dir(self.log_dirs, (log.dir for log in self._logs.values()))

    def create_topic(self, topic: str, num_partitions: int | None = None,
                     overrides: Mapping[str, str] | None = None) -> list[Log]:
        """Create ``topic`` with ``num_partitions`` (default ``num.partitions``) partitions."""
        self._check_writable(f"create topic {topic}")
        validate_topic_name(topic)
        self._check_not_unsafe(topic)
        count = self.config.num_partitions if num_partitions is None else num_partitions
        if not isinstance(count, int) or count < 1:
            raise InvalidPartitionError(f"Number of partitions must be at least 1, got {count!r}")
        overrides = dict(overrides or {})
        for name in overrides:
            if name not in TOPIC_CONFIG_NAMES:
                raise InvalidConfigError(f"Unknown topic config name: {name}")
        config = self.default_config.with_overrides(overrides)
        _check_internal_topic_config(topic, config)
        config.check_remote_storage(self.remote_log_manager is not None)
        with self._lock:
            existing = self._logs.topics()
            if self._logs.has_topic(topic):
                raise TopicExistsError(f"Topic '{topic}' already exists.")
            # Kafka refuses names that differ only by '.' vs '_' (they collide in metric names)
            collisions = [t for t in existing if t.replace(".", "_") == topic.replace(".", "_")]
            if collisions:
                raise InvalidTopicError(f"Topic '{topic}' collides with existing topics: {', '.join(collisions)}")
            if topic in self._deleting_topics:
                # An earlier deletion of this name could not clear its intent:
                # clear it now, or the next start would delete the new topic.
                self._deleting_topics.discard(topic)
                try:
                    self._write_topic_configs({**self._overrides, **({topic: overrides} if overrides else {})})
                except BaseException:
                    self._deleting_topics.add(topic)
                    raise
                if overrides:
                    self._overrides[topic] = overrides
            elif overrides:
                all_overrides = dict(self._overrides)
                all_overrides[topic] = overrides
                self._write_topic_configs(all_overrides)
                self._overrides[topic] = overrides
            self._topic_configs[topic] = config
            created: list[Log] = []
            topic_id = new_topic_id()
            try:
                for partition in range(count):
                    # a loop, not extend(): each log is in `created` the moment it exists, for the undo below
                    created.append(self._create_log(TopicPartition(topic, partition), config, topic_id))  # noqa: PERF401
            except BaseException:
                self._undo_create(topic, created)
                raise
        logger.info("Created topic %s with %d partitions", topic, count)
        return created

    def add_partition(self, topic: str, partition: int) -> Log:
        """Add partition number ``partition``, which must be the next one.

        Refused on an internal topic: the group coordinator places a group by
        the partition count, so another partition would move groups away from
        their commits (Kafka's documentation warns against it).
        """
        self._check_writable(f"add partition {partition} to topic {topic}")
        if is_internal(topic):
            raise InternalTopicError(f"Cannot add partitions to internal topic {topic}: its coordinator places "
                                     "its keys by the partition count")
        with self._lock:
            current = self.partitions(topic)
            if not current:
                raise UnknownTopicOrPartitionError(f"Topic {topic} does not exist")
            if partition != len(current):
                raise InvalidPartitionError(
                    f"Cannot add partition {partition} to topic {topic}: the next partition is {len(current)}")
            return self._create_log(TopicPartition(topic, partition), self._config_for(topic),
                                    self._topic_id_of(topic))

    def create_missing_partition(self, tp: TopicPartition) -> Log:
        """The log of ``tp``, created if its topic exists without it (a copy of one broker's log.dirs
        holds only the partitions that broker hosted: the group coordinator fills the gaps it writes to)."""
        self._check_writable(f"create partition {tp}")
        with self._lock:
            if not self.partitions(tp.topic):
                raise UnknownTopicOrPartitionError(f"Topic {tp.topic} does not exist")
            existing = self._logs.get(tp)
            if existing is not None:
                return existing
            return self._create_log(tp, self._config_for(tp.topic), self._topic_id_of(tp.topic))

    def get_or_create_log(self, tp: TopicPartition, topic_id: str, *, durable: bool = True) -> Log:
        """Kafka's ``LogManager.getOrCreateLog`` for a follower: the log of ``tp``, created alone (its topic
        need not have other partitions here) with ``topic_id`` in its ``partition.metadata``.

        ``durable=False`` skips the fsyncs that make the new directory survive a power loss, for a replica
        whose leader holds every record it will fetch (a cluster mount's): after a power loss its directory
        or ``partition.metadata`` may be missing, and a replica without its topic ID is dropped and fetched
        again (logfs.cluster.replica_fetcher).  Three fsyncs were most of a cluster mount's first lookup of a
        partition.
        """
        self._check_writable(f"create partition {tp}")
        validate_topic_name(tp.topic)
        with self._lock:
            existing = self._logs.get(tp)
            if existing is not None:
                return existing
            if not self._logs.has_topic(tp.topic):
                self._check_not_unsafe(tp.topic)
            return self._create_log(tp, self._config_for(tp.topic), topic_id, durable=durable)

    def _topic_id_of(self, topic: str) -> str:
        """The topic ID of ``topic``'s existing partitions (a new one when none carries it: older data dirs)."""
        for _, log in sorted(self._logs.logs_of(topic).items()):
            topic_id = read_topic_id(log.dir)
            if topic_id is not None:
                return topic_id
        return new_topic_id()

    def _create_log(self, tp: TopicPartition, config: LogConfig, topic_id: str, *, durable: bool = True) -> Log:
        """Create the partition dir in the emptiest log dir and register the log (under _lock).

        Before the dir exists, every checkpoint entry a deleted partition of
        the same name may have left is dropped durably
        (:meth:`LogDirCheckpoints.drop_stale_entries`); the dir holds its segment
        files and ``partition.metadata`` (Kafka's topic ID), fsynced, and is
        fsynced in its parent before the log can take an append: a power loss
        after the first acknowledged record cannot lose the directory (unless
        not ``durable``: see :meth:`get_or_create_log`).
        """
        self._checkpoints.drop_stale_entries(tp)
        parent = self._next_log_dir()
        path = os.path.join(parent, tp.dir_name)
        try:
            os.mkdir(path)
        except OSError as exc:
            raise storage_error(f"Error while creating log for {tp} in dir {parent}: {exc.strerror}", exc) from exc
        try:
            log = Log.load(path, config, clock=self.clock)
            try:
                write_partition_metadata(path, topic_id, durable=durable)   # fsyncs the partition dir too
                if durable:
                    fsync_dir(parent)
            except BaseException:
                log.close()
                raise
        except OSError as exc:
            _remove_new_partition_dir(path)
            raise storage_error(f"Error while creating log for {tp} in dir {parent}: {exc.strerror}", exc) from exc
        except BaseException:
            _remove_new_partition_dir(path)
            raise
        log.before_log_start_offset_moves = self._checkpoint_moving_log_start_offset
        log.read_isolation = self.read_isolation
        self._attach_remote_log_reader(log)
        self._logs.put(tp, log)
        logger.info("Created log for partition %s in %s with topic ID %s and properties %s", tp, path, topic_id,
                    self._overrides.get(tp.topic, {}))
        return log

    def _undo_create(self, topic: str, created: list[Log]) -> None:
        for log in created:
            self._logs.pop(log.topic_partition)
            try:
                log.close()
            finally:
                shutil.rmtree(log.dir, ignore_errors=True)
        self._topic_configs.pop(topic, None)
        if topic in self._overrides:
            del self._overrides[topic]
            try:
                self._write_topic_configs(self._overrides)
            except LogfsError as exc:
                logger.error("Failed to roll back config overrides of topic %s: %s", topic, exc)

    def delete_topic(self, topic: str) -> None:
        """Kafka's asynchronous deletion: gone from the namespace now, files later.

        With a cleaner, each partition's cleaning is aborted (waiting for a
        running clean to stop, outside ``_lock`` so lookups go on meanwhile)
        and kept paused while the partition leaves the map and its directory
        is renamed, so no cleaner worker writes ``.cleaned`` files into a
        directory being renamed; afterwards the partition is dropped from its
        dir's ``cleaner-offset-checkpoint``.
        """
        self._check_writable(f"delete topic {topic}")
        with self._lock:
            partitions = [TopicPartition(topic, p) for p in sorted(self._logs.logs_of(topic))]
        if not partitions:
            raise UnknownTopicOrPartitionError(f"Topic {topic} does not exist")
        if is_internal(topic):
            raise InternalTopicError(f"Cannot delete internal topic {topic}: it holds its coordinator's state "
                                     "(the committed offsets of every consumer group)")
        cleaner = self.cleaner
        paused: list[TopicPartition] = []
        try:
            if cleaner is not None:
                for tp in partitions:
                    cleaner.abort_and_pause_cleaning(tp)
                    paused.append(tp)
            removed, failures = self._remove_and_rename_topic(topic)
        finally:
            if paused and cleaner is not None:
                cleaner.resume_cleaning(paused)
        if cleaner is not None:
            for tp, log in removed:
                cleaner.update_checkpoints(os.path.dirname(log.dir), partition_to_remove=tp)
        if failures:
            raise StorageError(f"Failed to rename log directories of topic {topic} for deletion: "
                               + "; ".join(failures))

    def _remove_and_rename_topic(self, topic: str) -> tuple[list[tuple[TopicPartition, Log]], list[str]]:
        """Take ``topic``'s logs out of the map, rename their dirs ``-delete`` and queue them.

        Under ``_lock`` as one step, so a topic of the same name cannot be
        created while the old directories still carry its names.  The intent
        is written first (see the module docstring); if it cannot be written
        nothing has changed and the StorageError says why.
        """
        with self._lock:
            removed = [(TopicPartition(topic, p), log) for p, log in sorted(self._logs.logs_of(topic).items())]
            if not removed:
                raise UnknownTopicOrPartitionError(f"Topic {topic} does not exist")
            remaining_overrides = {t: o for t, o in self._overrides.items() if t != topic}
            self._deleting_topics.add(topic)
            try:
                self._write_topic_configs(remaining_overrides)
            except BaseException:
                self._deleting_topics.discard(topic)
                raise
            self._overrides = remaining_overrides
            for tp, _ in removed:
                self._logs.pop(tp)
            self._topic_configs.pop(topic, None)
            failures = []
            now = self.clock.milliseconds()
            # Ascending partition order: an interrupted deletion leaves a suffix of
            # the partitions, which the next start renames from the intent.
            for tp, log in removed:
                try:
                    log.rename_dir(delete_dir_name(tp.topic, tp.partition, uuid.uuid4().hex))
                    logger.info("Log for partition %s is renamed to %s and is scheduled for deletion",
                                tp, log.dir)
                except (OSError, LogfsError) as exc:
                    failures.append(f"{log.dir}: {exc}")
                self._logs_to_be_deleted.schedule(
                    PendingDeletion(log.dir, log, now, log.config.file_delete_delay_ms, tp))
            for parent in sorted({os.path.dirname(log.dir) for _, log in removed}):
                try:
                    fsync_dir(parent)          # the renames survive a power loss, not only kill -9
                except OSError as exc:
                    failures.append(f"fsync of {parent}: {exc.strerror}")
                # As Kafka's asyncDelete: the dir's checkpoints without the deleted partitions.  If
                # this fails, creating a partition of the same name drops the entries first.
                try:
                    self._checkpoints.write_recovery_points(parent)
                    self._checkpoints.write_log_start_offsets(parent)
                except LogfsError as exc:
                    logger.error("Could not rewrite the checkpoints of %s without topic %s: %s", parent, topic, exc)
            if not failures:
                # Every dir carries the suffix now: the intent has done its job.  If
                # clearing it fails it stays, harmless: only dirs of this name that
                # are still live at the next start are renamed, and create_topic
                # of the same name clears it first.
                self._deleting_topics.discard(topic)
                try:
                    self._write_topic_configs(self._overrides)
                except LogfsError as exc:
                    self._deleting_topics.add(topic)
                    logger.error("Failed to clear the deletion intent of topic %s: %s", topic, exc)
        return removed, failures

    # ------------------------------------------------------------------ periodic jobs

    def flush_dirty_logs(self) -> None:
        """Flush each log whose last flush is at least ``flush.ms`` ago (kafka-log-flusher)."""
        if self.read_only:
            return
        now = self.clock.milliseconds()
        failures: list[str] = []
        for log in self.all_logs():
            try:
                since = now - log.last_flush_time
                if since >= log.config.flush_ms:
                    logger.debug("Checking if flush is needed on %s flush interval %d last flushed %d "
                                 "time since last flush: %d", log.name, log.config.flush_ms,
                                 log.last_flush_time, since)
                    log.flush()
            except Exception as exc:
                logger.exception("Error flushing topic %s", log.topic_partition.topic)
                failures.append(f"{log.topic_partition}: {exc}")
        _raise_failures("flush", failures)

    def checkpoint_recovery_points(self) -> None:
        """Write each dir's ``recovery-point-offset-checkpoint`` (kafka-recovery-point-checkpoint)."""
        if self.read_only:
            return
        failures = []
        for log_dir in self.log_dirs:
            try:
                self._checkpoints.write_recovery_points(log_dir)
            except LogfsError as exc:
                failures.append(str(exc))
        _raise_failures("recovery point checkpoint", failures)

    def checkpoint_log_start_offsets(self) -> None:
        """Write each dir's ``log-start-offset-checkpoint``.

        As in Kafka, only logs whose start offset moved past their first
        segment's base offset are written; the others start at that base anyway.
        """
        if self.read_only:
            return
        failures = []
        for log_dir in self.log_dirs:
            try:
                self._checkpoints.write_log_start_offsets(log_dir)
            except LogfsError as exc:
                logger.error("%s", exc)
                failures.append(str(exc))
        _raise_failures("log start offset checkpoint", failures)

    def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """Kafka's DeleteRecords: records below ``offset`` are gone for every reader; returns the log start.

        The log start offset moves at once (views opened from now on start
        there; views already open read on), the segments wholly below it leave
        the segment map and are renamed ``.deleted`` for the deletion task,
        and the dir's ``log-start-offset-checkpoint`` holds the new offset
        before any of that happens, so once this returns no crash brings the
        records back.  ``offset`` beyond the log end raises InvalidRequestError.
        """
        self._check_writable(f"delete records of {tp}")
        log = self.get_log(tp)
        if log is None:
            raise UnknownTopicOrPartitionError(f"No partition {tp}")
        if is_internal(tp.topic):
            raise InternalTopicError(f"Cannot delete records of internal topic {tp.topic}")
        if not isinstance(offset, int) or offset < 0:
            raise InvalidRequestError(f"Cannot delete records of {tp} before offset {offset!r}: "
                                      "not a non-negative offset")
        with log.lock:        # reentrant: the Log takes it again; no append moves the log end meanwhile
            if offset > log.log_end_offset:
                raise InvalidRequestError(
                    f"Cannot delete records of {tp} before offset {offset}: it is beyond the log end offset "
                    f"{log.log_end_offset} (log start offset {log.log_start_offset})")
            # The Log calls _checkpoint_moving_log_start_offset before the start moves.
            log.maybe_increment_log_start_offset(offset, CLIENT_RECORD_DELETION)
            return log.log_start_offset

    def cleanup_logs(self) -> int:
        """Retention (kafka-log-retention); returns the number of segments deleted.

        As Kafka's ``cleanupLogs``: with a cleaner, the non-compacted logs are
        paused for cleaning while their old segments are deleted, so a topic
        switched to ``compact`` meanwhile is never cleaned and retained at
        once; compacted logs (``compact,delete`` included) get their retention
        from ``LogCleaner.clean_once``, which cannot race a clean of the same
        log.  Without a cleaner nothing else would run the retention of
        ``compact,delete`` logs, so every log with ``delete`` in its policy is
        handled here.
        """
        if self.read_only:
            return 0
        started = time.monotonic()
        cleaner = self.cleaner
        if cleaner is not None:
            deletable = cleaner.pause_cleaning_for_non_compacted_partitions()
        else:
            deletable = [(log.topic_partition, log) for log in self.all_logs() if log.config.delete]
        total = 0
        failures: list[str] = []
        try:
            for tp, log in deletable:
                try:
                    total += log.delete_old_segments()
                except LogfsError as exc:
                    logger.error("Error during retention of %s: %s", tp, exc)
                    failures.append(f"{tp}: {exc}")
                except Exception as exc:
                    logger.exception("Error during retention of %s", tp)
                    failures.append(f"{tp}: {exc}")
        finally:
            if cleaner is not None:
                cleaner.resume_cleaning([tp for tp, _ in deletable])
        _raise_failures("retention", failures, done=f"{total} segments deleted")
        logger.debug("Log cleanup completed. %d files deleted in %.3f seconds", total, time.monotonic() - started)
        return total

    def _attach_remote_log_reader(self, log: Log) -> None:
        """Give the log its RemoteLogReader (its copies, read below the local log start) when tiered."""
        rlm = self.remote_log_manager
        tiered = self.tiered_partition(log) if rlm is not None else None
        if rlm is None or tiered is None:
            return
        from engine.remote.remote_segment import RemoteLogReader
        log.remote_log_reader = RemoteLogReader(rlm, tiered.tip, log.topic_partition)

    def tiered_partition(self, log: Log) -> TieredPartition | None:
        """The log as tiered storage sees it (its TopicIdPartition); None without a readable topic id."""
        from engine.remote.remote_log_manager import TieredPartition
        from engine.remote.storage import TopicIdPartition

        if log not in self._topic_ids:
            self._topic_ids[log] = read_topic_id(log.dir)
        topic_id = self._topic_ids[log]
        if topic_id is None:
            return None
        tp = log.topic_partition
        return TieredPartition(log, TopicIdPartition(tp.topic, topic_id, tp.partition),
                               log.config.remote_storage_enable)

    def copy_to_remote_storage(self) -> int:
        """One round of tiered storage (kafka-remote-log-manager): copies, and deletes of the copies that
        retention, DeleteRecords and topic deletion dropped (``RemoteLogManager.run_once``); returns how many."""
        rlm = self.remote_log_manager
        if rlm is None or self.read_only:
            return 0
        partitions = []
        keep = set(self._unsafe_topics)
        for log in self.all_logs():
            tiered = self.tiered_partition(log)
            if tiered is None:
                keep.add(log.topic_partition.topic)     # no topic id to match its copies by: never touch them
                if log.config.remote_storage_enable:
                    logger.debug("Not copying %s: its partition.metadata has no topic id", log.topic_partition)
            else:
                partitions.append(tiered)
        return rlm.run_once(partitions, int(self.config.remote_log_manager_task_interval_ms), frozenset(keep))

    def _checkpoint_moving_log_start_offset(self, log: Log, new_start: int) -> None:
        """Every Log's ``before_log_start_offset_moves``: checkpoint ``new_start`` before it takes effect.

        Retention, DeleteRecords and the cleaner's retention of compacted logs
        all move the log start offset through ``Log._increment_log_start_offset``
        and only then rename segments ``.deleted``; writing the checkpoint here
        means a crash between two renames (or right after a DeleteRecords
        returns) never brings deleted records back.  A failed write raises
        StorageError and the log start offset does not move.
        """
        # Callers hold the Log's lock: this takes neither ``_lock`` (topic deletion holds it while it
        # takes Log locks to rename) nor any Log's lock.
        self._checkpoints.write_log_start_offsets(os.path.dirname(log.dir), (log, new_start))

    def delete_expired_segment_files(self) -> int:
        """Remove ``.deleted`` segment files whose ``file.delete.delay.ms`` has passed."""
        if self.read_only:
            return 0
        now = self.clock.milliseconds()
        total = 0
        failures = []
        for log in self.all_logs():
            try:
                total += log.delete_expired_segment_files(now)
            except Exception as exc:
                logger.exception("Error deleting segment files of %s", log.topic_partition)
                failures.append(f"{log.topic_partition}: {exc}")
        _raise_failures("deletion of segment files", failures, done=f"{total} segments deleted")
        return total

    def delete_logs(self) -> int:
        """Remove queued ``-delete`` partition dirs whose delay has passed (kafka-delete-logs).

        A failure leaves the dir queued, to be retried at the next run.
        """
        if self.read_only:
            return 0
        deleted, failures = self._logs_to_be_deleted.delete_due(self.clock.milliseconds())
        _raise_failures("deletion of log directories", failures, done=f"{deleted} deleted")
        return deleted

    def pending_deletions(self) -> list[str]:
        """Paths of ``-delete`` dirs waiting for removal."""
        return self._logs_to_be_deleted.paths()

    # ------------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Flush and close every log, write both checkpoints, then the clean-shutdown marker.

        The marker is written only for a dir whose logs all flushed and closed
        and whose checkpoints were written, so a failed shutdown recovers.
        """
        if self._shut_down:
            return
        self._shut_down = True
        logger.info("Shutting down LogManager.")
        if self.cleaner is not None:
            # First, as in Kafka: a clean in progress aborts at its next check
            # instead of writing into logs that are being closed.
            self.cleaner.shutdown()
        by_dir = self.logs_by_dir()
        for log_dir, logs in by_dir.items():
            ok = True
            for log in logs:
                try:
                    if not self.read_only:
                        log.flush()
                    log.close()
                except Exception:
                    ok = False
                    logger.exception("Error closing log %s during shutdown", log.dir)
            if self.read_only:
                continue
            try:
                self._checkpoints.write_at_shutdown(log_dir, logs)
            except (OSError, LogfsError) as exc:
                ok = False
                logger.error("Error writing checkpoints in %s during shutdown: %s", log_dir, exc)
            if ok:
                marker = os.path.join(log_dir, CLEAN_SHUTDOWN_FILE)
                try:
                    atomic_write(marker, b"")
                except OSError as exc:
                    logger.error("Error while writing %s: %s", marker, exc.strerror or exc)
        if self.remote_log_manager is not None:
            try:
                self.remote_log_manager.close()
            except Exception:
                logger.exception("Error closing tiered storage during shutdown")
        self._unlock_log_dirs()
        logger.info("Shutdown complete.")

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"Cannot {what}: the log manager is read-only")
        if self._shut_down:
            raise StorageError(f"Cannot {what}: the log manager is shut down")


class TaskFailedError(StorageError):
    """Some items of a periodic job failed (each was logged); the job counts as failed."""


def _keep_small_segment_bytes(topic: str, overrides: dict[str, str]) -> None:
    """A ``segment.bytes`` override below Kafka 4's 1 MiB minimum, stored by an older logfs (which took
    Kafka 3's minimum): kept working as ``internal.segment.bytes``, with one warning, so the topic's data
    and settings load unchanged.  Setting ``segment.bytes`` again (1 MiB or more) is the way out."""
    value = overrides.get("segment.bytes")
    number = parse_canonical_int(value.strip()) if value is not None else None
    if number is None or number >= MIN_SEGMENT_BYTES or "internal.segment.bytes" in overrides:
        return
    del overrides["segment.bytes"]
    overrides["internal.segment.bytes"] = str(number)
    logger.warning("Topic %s has segment.bytes=%d, below Kafka 4's minimum of %d: kept as internal.segment.bytes=%d "
                   "(a setting for tests); set segment.bytes to %d or more in %s/config", topic, number,
                   MIN_SEGMENT_BYTES, number, MIN_SEGMENT_BYTES, topic)


def _check_internal_topic_config(topic: str, config: LogConfig) -> None:
    """An internal topic keeps ``cleanup.policy=compact`` alone, as its coordinator creates it: ``delete``
    (alone or with ``compact``) would let retention remove the newest commit of a group that commits rarely."""
    if is_internal(topic) and tuple(config.cleanup_policy) != ("compact",):
        raise InternalTopicError(
            f"Cannot set cleanup.policy={','.join(config.cleanup_policy)} on internal topic {topic}: it must stay "
            "compact, or retention would delete the committed offsets it holds")


def _raise_failures(job: str, failures: list[str], done: str = "") -> None:
    """Make a periodic job that failed for some logs fail as a whole, after it did what it could.

    Each failure was logged where it happened; this only makes the run count
    as an error in ``stats.json`` and the metrics.  ``done`` says what the run
    achieved anyway.
    """
    if not failures:
        return
    more = f" and {len(failures) - 3} more" if len(failures) > 3 else ""
    achieved = f" ({done})" if done else ""
    raise TaskFailedError(f"{job} failed for {len(failures)} item(s){achieved}: {'; '.join(failures[:3])}{more}")
