"""Every log of every log dir, loaded at startup (Kafka's ``LogManager.loadLogs`` and ``loadLog``).

Per log dir, as Kafka: take the clean-shutdown marker (deleted before any log
is loaded, so a crash during loading recovers next time), read the
recovery-point and log-start-offset checkpoints (a corrupt one falls back to
its previous generation, ``.prev``), scan the ``<topic>-<partition>`` dirs,
then load them in parallel on ``num.recovery.threads.per.data.dir`` threads
(:class:`engine.log_loader.LogLoader` does the work of one partition).  A
partition dir of a topic whose deletion was interrupted is renamed
``-delete`` instead of loaded; ``-delete`` dirs are handed back for the
deletion queue.

A partition holding a link or special file where a segment file belongs
(UnsafeFileError) is not loaded, and neither is any other partition of its
topic (a topic missing a partition would map keys to the wrong partitions).
Any other failure closes what was loaded and is raised once every thread has
finished.  The LogManager (engine.manager) owns what this returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    PREVIOUS_SUFFIX,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpointFile,
)
from engine.errors import LogfsError, StorageError, UnsafeFileError
from engine.files import fsync_dir
from engine.log import Log
from engine.log_dirs import scan_partition_dirs
from engine.topic import TopicPartition, delete_dir_name, parse_topic_partition_dir

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.clock import Clock
    from engine.config import LogConfig

#: the LogManager's logger: these are its lines, as in Kafka's LogManager
logger = logging.getLogger("engine.manager")

__all__ = ["LoadedLogs", "load_logs"]


@dataclass
class LoadedLogs:
    """What :func:`load_logs` found and loaded."""

    logs: dict[TopicPartition, Log] = field(default_factory=dict)
    #: log dir -> whether it had a clean-shutdown marker
    had_clean_shutdown: dict[str, bool] = field(default_factory=dict)
    #: topics left unloaded and untouched: a link or special file in a partition dir of theirs
    unsafe_topics: set[str] = field(default_factory=set)
    #: ``(path, when found in ms)`` of each ``-delete`` dir, for the deletion queue
    pending_deletion: list[tuple[str, int]] = field(default_factory=list)
    seconds: float = 0.0


def load_logs(log_dirs: list[str], *, threads: int, read_only: bool, clock: Clock,
              config_for: Callable[[str], LogConfig], deleting_topics: set[str],
              before_log_start_offset_moves: Callable[[Log, int], None]) -> LoadedLogs:
    """Load every partition of ``log_dirs`` (Kafka's ``loadLogs``); raises the first failure of a load.

    ``config_for(topic)`` gives a topic's config; partitions of
    ``deleting_topics`` are renamed for deletion instead (not when
    ``read_only``); ``before_log_start_offset_moves`` is installed on every
    loaded Log.
    """
    logger.info("Loading logs from log dirs %s", log_dirs)
    start = time.monotonic()
    result = LoadedLogs()
    pools: list[concurrent.futures.ThreadPoolExecutor] = []
    jobs: list[tuple[str, concurrent.futures.Future[Log]]] = []
    unclean_dirs: list[str] = []
    loaded = result.logs

    def load_log(path: str, tp: TopicPartition, had_clean_shutdown: bool,
                 recovery_point: int, log_start_offset: int) -> Log:
        logger.debug("Loading log %s", path)
        log = Log.load(path, config_for(tp.topic), log_start_offset=log_start_offset,
                       recovery_point=recovery_point, had_clean_shutdown=had_clean_shutdown,
                       clock=clock, topic_partition=tp, read_only=read_only)
        log.before_log_start_offset_moves = before_log_start_offset_moves
        return log

    try:
        for log_dir in log_dirs:
            clean = _take_clean_shutdown_marker(log_dir, read_only)
            result.had_clean_shutdown[log_dir] = clean
            recovery_points = _read_checkpoint(log_dir, RECOVERY_POINT_CHECKPOINT,
                                               "resetting the recovery checkpoint to 0")
            log_start_offsets = _read_checkpoint(
                log_dir, LOG_START_OFFSET_CHECKPOINT,
                "resetting to the base offset of the first segment")
            to_load = _partition_dirs(log_dir, result, deleting_topics, read_only, clock)
            # Read-only without a marker (a copy of a live broker's log.dirs): the
            # LogLoader recovers in memory, writing nothing (engine/log.py).
            if not to_load:
                logger.info("No logs found to be loaded in %s", log_dir)
            elif clean:
                logger.info("Skipping recovery of %d logs from %s since clean shutdown file was found",
                            len(to_load), log_dir)
            else:
                logger.info("Recovering %d logs from %s since no clean shutdown file was found",
                            len(to_load), log_dir)
                unclean_dirs.append(log_dir)
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix=f"log-recovery-{os.path.basename(log_dir)}")
            pools.append(pool)
            for path, tp in to_load:
                jobs.append((path, pool.submit(
                    load_log, path, tp, clean, recovery_points.get(tp, 0), log_start_offsets.get(tp, 0))))
        failure: BaseException | None = None
        for path, future in jobs:
            try:
                log = future.result()
            except UnsafeFileError as exc:
                # A link or special file where a segment belongs: that partition is left
                # alone (not loaded, nothing touched), and so is its topic (see below).
                logger.error("%s", exc)
                result.unsafe_topics.add(parse_topic_partition_dir(os.path.basename(path)).topic)
                continue
            except BaseException as exc:      # keep waiting for the others, then re-raise
                logger.error("There was an error in one of the threads during logs loading: %s", exc)
                failure = failure or exc
                continue
            previous = loaded.get(log.topic_partition)
            if previous is not None and failure is None:
                failure = StorageError(
                    f"Duplicate log directories for {log.topic_partition} are found in both "
                    f"{previous.dir} and {log.dir}. It is likely because log directory failure "
                    "happened while broker was replacing current replica with future replica.")
            loaded.setdefault(log.topic_partition, log)
        if failure is not None:
            for _path, future in jobs:
                if future.done() and future.exception() is None:
                    future.result().close()
            raise failure
    finally:
        for pool in pools:
            pool.shutdown(wait=True)
    # A topic missing a partition would map keys to the wrong partitions: not served at all.
    for tp in [tp for tp in loaded if tp.topic in result.unsafe_topics]:
        loaded.pop(tp).close()
    result.seconds = time.monotonic() - start
    suffix = f" (unclean log dirs = {unclean_dirs})" if unclean_dirs else ""
    logger.info("Loaded %d logs in %d ms%s", len(loaded), round(result.seconds * 1000), suffix)
    return result


def _take_clean_shutdown_marker(log_dir: str, read_only: bool) -> bool:
    """Whether the dir was shut down cleanly; removes the marker before loading.

    As Kafka does since KAFKA-10471: the marker is deleted before the logs
    are loaded, so a crash during loading makes the next start recover.
    Read-only, the marker stays: nothing is written, so the dir is still
    exactly as cleanly shut down as it was.
    """
    marker = os.path.join(log_dir, CLEAN_SHUTDOWN_FILE)
    if not os.path.exists(marker):
        return False
    if not read_only:
        try:
            os.unlink(marker)
            # Durable before any log is touched: a power loss must not bring the marker
            # back, or the next start would skip the recovery of what this run writes.
            fsync_dir(log_dir)
        except OSError as exc:
            raise StorageError(f"Failed to delete clean shutdown file {marker}: {exc.strerror}") from exc
    return True


def _read_checkpoint(log_dir: str, name: str, fallback: str) -> dict[TopicPartition, int]:
    """A dir's checkpoint; a corrupt one is replaced by its previous generation (``.prev``).

    The previous generation holds offsets no newer than the lost ones: a
    recovery point that is lower only means more recovery, and a log start
    offset that is lower is still better than the first segment's base.
    """
    path = os.path.join(log_dir, name)
    try:
        return OffsetCheckpointFile(path).read()
    except (LogfsError, OSError, ValueError) as exc:     # corrupt, unreadable, a planted link
        error = exc
    previous = path + PREVIOUS_SUFFIX
    if os.path.lexists(previous):
        try:
            offsets = OffsetCheckpointFile(previous).read()
            logger.error("Error occurred while reading %s file of directory %s, using its previous "
                         "generation %s: %s", name, log_dir, previous, error)
            return offsets
        except (LogfsError, OSError, ValueError):
            pass
    logger.error("Error occurred while reading %s file of directory %s, %s: %s",
                 name, log_dir, fallback, error)
    return {}


def _partition_dirs(log_dir: str, result: LoadedLogs, deleting_topics: set[str], read_only: bool,
                    clock: Clock) -> list[tuple[str, TopicPartition]]:
    """The ``<topic>-<partition>`` dirs to load; ``-delete`` dirs go to ``result.pending_deletion``."""
    found = []
    now = clock.milliseconds()
    scan = scan_partition_dirs(log_dir)
    result.unsafe_topics.update(scan.linked_topics)
    for path in scan.pending_deletion:
        logger.info("Found partition directory %s pending deletion, scheduling it", path)
        result.pending_deletion.append((path, now))
    for entry_path, tp in scan.partitions:
        if tp.topic in deleting_topics and not read_only:
            # The deletion of this topic was interrupted before this dir was renamed.
            path = os.path.join(log_dir, delete_dir_name(tp.topic, tp.partition, uuid.uuid4().hex))
            try:
                os.rename(entry_path, path)
                fsync_dir(log_dir)
            except OSError as exc:
                raise StorageError(f"Failed to rename {entry_path} of deleted topic {tp.topic} for "
                                   f"deletion: {exc.strerror}") from exc
            logger.info("Log for partition %s of topic %s, whose deletion was interrupted, is renamed "
                        "to %s and is scheduled for deletion", tp, tp.topic, path)
            result.pending_deletion.append((path, now))
            continue
        found.append((entry_path, tp))
    return found
