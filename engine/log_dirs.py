"""The log dirs themselves (Kafka's ``LogManager``: ``createAndValidateLogDirs``, ``lockLogDirs``, ``nextLogDirs``).

What the :class:`~engine.manager.LogManager` needs of a ``log.dirs`` entry
before and besides the logs in it:

* validation: no duplicates, created when missing, readable (and writable
  unless read-only) directories;
* ownership: the ``.lock`` file (``lockf``, what Kafka's ``FileChannel.tryLock``
  takes on Linux) and an ``flock`` of the dir itself, held from startup to the
  end of shutdown;
* scanning: which entries are ``<topic>-<partition>`` dirs to load, which are
  ``-delete`` dirs waiting for removal, which are links that are never followed;
* placement of a new partition in the dir holding the fewest.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from typing import TYPE_CHECKING, NamedTuple

from engine.errors import InvalidConfigError, InvalidTopicError, StorageError
from engine.files import DELETE_DIR_SUFFIX
from engine.topic import TopicPartition, parse_topic_partition_dir

if TYPE_CHECKING:
    from collections.abc import Iterable

logger = logging.getLogger(__name__)

#: Kafka's KRaft metadata log directory (``__cluster_metadata-0``): skipped like Kafka's LogManager does
KRAFT_METADATA_DIR = "__cluster_metadata-0"
#: tiered storage's local state (its metadata log and chunk cache: engine.remote.remote_log_manager)
REMOTE_LOG_DIR = "remote-log"
#: Kafka's ``LogManager.LockFileName``: held locked by the process that owns the log dir.
LOCK_FILE = ".lock"

#: Log dirs locked by this process (canonical paths).  POSIX record locks do not
#: exclude two owners in one process (and closing any descriptor of the file
#: drops them), so a second LogManager in the same process is refused here.
_locked_in_process: set[str] = set()
_locked_in_process_guard = threading.Lock()


class LogDirLock(NamedTuple):
    """The descriptors holding one log dir's locks (closing them releases the locks)."""

    log_dir: str
    fds: list[int]


class PartitionDirScan(NamedTuple):
    """What :func:`scan_partition_dirs` found in one log dir, in name order."""

    #: ``(path, topic partition)`` of each ``<topic>-<partition>`` directory
    partitions: list[tuple[str, TopicPartition]]
    #: paths of ``<topic>-<partition>.<uuid>-delete`` directories
    pending_deletion: list[str]
    #: topics with a partition directory that is a symbolic link (logged; never followed)
    linked_topics: list[str]


def create_and_validate_log_dirs(log_dirs: list[str], read_only: bool) -> None:
    """Kafka's ``createAndValidateLogDirs``; raises InvalidConfigError or StorageError naming the dir."""
    canonical = [os.path.realpath(d) for d in log_dirs]
    if len(set(canonical)) < len(canonical):
        seen: set[str] = set()
        duplicates = []
        for d, c in zip(log_dirs, canonical):
            if c in seen:
                duplicates.append(d)
            seen.add(c)
        raise InvalidConfigError(
            f"Duplicate log directory found: {', '.join(duplicates)} (log.dirs={','.join(log_dirs)})")
    mode = os.R_OK | os.X_OK if read_only else os.R_OK | os.W_OK | os.X_OK
    for log_dir in log_dirs:
        if not os.path.exists(log_dir):
            if read_only:
                raise StorageError(f"Log directory {log_dir} does not exist (mounted read-only)")
            logger.info("Log directory %s not found, creating it.", log_dir)
            try:
                os.makedirs(log_dir, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"Failed to create data directory {log_dir}: {exc.strerror}") from exc
        if not os.path.isdir(log_dir):
            raise StorageError(f"{log_dir} is not a readable log directory (not a directory)")
        if not os.access(log_dir, mode):
            kind = "readable" if read_only else "readable and writable"
            raise StorageError(f"{log_dir} is not a {kind} log directory")


def lock_log_dirs(log_dirs: list[str], read_only: bool) -> list[LogDirLock]:
    """Own every log dir before reading or writing anything in it (Kafka's ``lockLogDirs``).

    Read-write: ``.lock`` is created and locked exclusively with a POSIX
    record lock (``fcntl.lockf``), which is what Java's
    ``FileChannel.tryLock`` takes on Linux, so a Kafka broker and logfs
    exclude each other as two brokers do; the dir itself is also
    ``flock``-ed exclusively (see below).  Read-only, nothing may be
    created: an existing ``.lock`` is opened read-only and locked shared
    (a writer's exclusive lock makes that fail), and the dir is
    ``flock``-ed shared, so a logfs writer starting later fails on its
    exclusive ``flock`` even when no ``.lock`` existed.  A Kafka broker
    knows nothing of the ``flock``: it can start on a dir whose ``.lock``
    did not exist when a read-only mount took it.

    Raises StorageError naming the dir when another process (or another
    LogManager of this process) holds it; nothing has been touched then.
    """
    locks: list[LogDirLock] = []
    try:
        for log_dir in log_dirs:
            # a loop, not extend(): each lock is in `locks` the moment it is taken, for the release below
            locks.append(LogDirLock(log_dir, lock_log_dir(log_dir, read_only)))  # noqa: PERF401
    except BaseException:
        unlock_log_dirs(locks)
        raise
    return locks


def lock_log_dir(log_dir: str, read_only: bool) -> list[int]:
    """Lock one log dir (see :func:`lock_log_dirs`); returns the descriptors holding the locks."""
    canonical = os.path.realpath(log_dir)
    busy = (f"Failed to acquire lock on file {LOCK_FILE} in {log_dir}. A Kafka instance or logfs mount "
            "in another process or thread is using this directory.")
    with _locked_in_process_guard:
        if canonical in _locked_in_process:
            raise StorageError(busy)
        _locked_in_process.add(canonical)
    fds: list[int] = []
    try:
        dir_fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds.append(dir_fd)
        lock_path = os.path.join(log_dir, LOCK_FILE)
        fd: int | None
        try:
            if read_only:
                fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            else:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except FileNotFoundError:
            fd = None                 # read-only and no .lock: only the flock below
        except OSError as exc:        # a link planted as .lock (ELOOP), no permission, ...
            raise StorageError(f"Failed to open the lock file {lock_path} of log directory {log_dir}: "
                               f"{exc.strerror or exc}") from exc
        if fd is not None:
            fds.append(fd)
        try:
            if fd is not None:
                fcntl.lockf(fd, (fcntl.LOCK_SH if read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            fcntl.flock(dir_fd, (fcntl.LOCK_SH if read_only else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise StorageError(busy) from exc
            raise StorageError(f"Failed to lock log directory {log_dir} ({lock_path}): "
                               f"{exc.strerror or exc}") from exc
    except BaseException:
        for fd in fds:
            os.close(fd)
        with _locked_in_process_guard:
            _locked_in_process.discard(canonical)
        raise
    logger.debug("Locked log directory %s%s", log_dir, " (shared, read-only)" if read_only else "")
    return fds


def unlock_log_dirs(locks: Iterable[LogDirLock]) -> None:
    """Release the locks taken by :func:`lock_log_dirs`."""
    for log_dir, fds in locks:
        for fd in fds:
            try:
                os.close(fd)          # closing drops both the record lock and the flock
            except OSError:
                pass
        with _locked_in_process_guard:
            _locked_in_process.discard(os.path.realpath(log_dir))


def scan_partition_dirs(log_dir: str) -> PartitionDirScan:
    """Sort the entries of ``log_dir``: partition dirs, ``-delete`` dirs, links (never followed).

    Files (checkpoints, markers, topic configs), the KRaft metadata log and
    directories whose names are not ``<topic>-<partition>`` are left alone.
    """
    partitions: list[tuple[str, TopicPartition]] = []
    pending_deletion: list[str] = []
    linked_topics: list[str] = []
    with os.scandir(log_dir) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name == KRAFT_METADATA_DIR:
                continue      # Kafka's KRaft metadata log: not a topic, never touched (as Kafka's LogManager)
            if entry.name == REMOTE_LOG_DIR and not entry.is_symlink():
                continue      # tiered storage's metadata log and chunk cache: not a topic
            if entry.is_symlink() and entry.is_dir():
                name = entry.name
                if name.endswith(DELETE_DIR_SUFFIX) and "." in name:
                    name = name[:name.rindex(".")]
                try:
                    tp = parse_topic_partition_dir(name)
                except InvalidTopicError:
                    continue
                logger.error("Partition directory %s is a symbolic link: logfs never follows links in a log "
                             "dir; topic %s is not served and nothing in it is touched. Replace the link by "
                             "the directory it points to and mount again.", entry.path, tp.topic)
                linked_topics.append(tp.topic)
                continue
            if not entry.is_dir(follow_symlinks=False):
                continue                      # checkpoints, markers, topic configs, stray files
            if entry.name.endswith(DELETE_DIR_SUFFIX):
                pending_deletion.append(entry.path)
                continue
            try:
                tp = parse_topic_partition_dir(entry.name)
            except InvalidTopicError as exc:
                logger.warning("Ignoring directory %s in log dir %s: %s", entry.name, log_dir, exc)
                continue
            partitions.append((entry.path, tp))
    return PartitionDirScan(partitions, pending_deletion, linked_topics)


def next_log_dir(log_dirs: list[str], partition_dirs: Iterable[str]) -> str:
    """Kafka's ``nextLogDirs``: the log dir holding the fewest of ``partition_dirs`` (first on ties)."""
    counts = dict.fromkeys(log_dirs, 0)
    for path in partition_dirs:
        parent = os.path.dirname(path)
        if parent in counts:
            counts[parent] += 1
    return min(log_dirs, key=lambda d: counts[d])
