"""Kafka's ``OffsetCheckpointFile``: the per-log-dir ``topic partition offset`` text files.

Three of them live in every log dir -- the recovery point (up to where each log
is known to be flushed, so recovery after a crash starts there), the log start
offset (DeleteRecords and retention survive a restart) and the cleaner's
position -- all in Kafka's format::

    0                   <- version
    2                   <- number of entries
    orders 0 1234       <- topic, partition, offset
    orders 1 987

A checkpoint is replaced atomically and keeps its previous generation beside
it, by :func:`write_keeping_previous`: the new content is written over
``<file>.prev`` (which holds the generation before the current one), fsynced,
then the two names are exchanged in one step (``renameat2(RENAME_EXCHANGE)``)
and the directory fsynced.  A crash leaves either the old or the new file,
never a torn one, and ``<file>.prev`` is one generation older.

Why in place rather than a fresh ``.tmp`` (Kafka's way): the blocks of
``.prev`` are already allocated, so a write no longer than them needs no new
space, and a checkpoint can still be written on a full disk.  That matters
because deleting data (retention, DeleteRecords, topic deletion) writes a
checkpoint or the topic configs *before* it deletes anything, so a full disk
would otherwise make it impossible to free space.  A crash during the in-place
write tears only ``.prev``, which nothing reads while the current file is
sound.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import logging
import os
import re
import stat
import threading
from typing import TYPE_CHECKING

from engine.errors import CorruptCheckpointError, InvalidRequestError, LogDirFullError, StorageError
from engine.files import TMP_FILE_SUFFIX, fsync_dir
from engine.topic import TopicPartition

if TYPE_CHECKING:
    from collections.abc import Mapping

logger = logging.getLogger(__name__)

__all__ = ["RECOVERY_POINT_CHECKPOINT", "LOG_START_OFFSET_CHECKPOINT", "CLEANER_OFFSET_CHECKPOINT",
           "CLEAN_SHUTDOWN_FILE", "CHECKPOINT_VERSION", "PREVIOUS_SUFFIX", "OffsetCheckpointFile",
           "read_no_follow", "write_keeping_previous"]

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
#: Written by a clean shutdown, removed at startup: its absence means "recover".
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"

CHECKPOINT_VERSION = 0
#: Suffix of the previous generation kept beside a checkpoint or ``topic-configs.json``.
PREVIOUS_SUFFIX = ".prev"

# Java's Integer.parseInt / Long.parseLong accept an optional sign and ASCII digits only.
_JAVA_INT = re.compile(r"[+-]?[0-9]+\Z")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_WHITESPACE = re.compile(r"\s")


class OffsetCheckpointFile:
    """One checkpoint file: read it as a dict, replace it atomically."""

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        #: the previous generation, overwritten in place by the next write (see the module docstring)
        self.previous_path = self.path + PREVIOUS_SUFFIX
        #: the temporary file of earlier versions (and Kafka): removed by the next write
        self.temp_path = self.path + TMP_FILE_SUFFIX
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OffsetCheckpointFile({self.path!r})"

    def read(self) -> dict[TopicPartition, int]:
        """The checkpointed offsets; ``{}`` when the file does not exist.

        Raises :class:`CorruptCheckpointError` naming the file and line for an
        unknown version, a malformed line or a wrong entry count; the caller then
        treats every log as unflushed (Kafka's behaviour on an unreadable checkpoint).
        """
        with self._lock:
            try:
                raw = read_no_follow(self.path)
            except FileNotFoundError:
                return {}
            except OSError as exc:
                raise StorageError(f"Error while reading checkpoint file {self.path}: {exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptCheckpointError(
                f"Malformed checkpoint file [{self.path}]: not UTF-8 at byte {exc.start}") from exc
        return self._parse(text)

    def read_generations(self) -> list[dict[TopicPartition, int]]:
        """The current checkpoint and its previous generation (``.prev``), those that exist, read while no
        write of this file is under way in this process: a write overwrites ``.prev`` in place before
        swapping it in (write_keeping_previous), so a read of ``.prev`` beside it could see it half written
        and take it for corrupt.  Raises as :meth:`read`.
        """
        with _path_lock(self.path):     # fresh readers: this object's _lock is taken before _path_lock by write
            # a missing one is not opened: that needs no descriptor (an open does, even of no file)
            return [OffsetCheckpointFile(path).read() for path in (self.path, self.previous_path)
                    if os.path.lexists(path)]

    def _current_is_sound(self) -> bool:
        """False when the current file exists but does not parse while ``.prev`` does (see write)."""
        try:
            self._parse(read_no_follow(self.path).decode("utf-8"))
            return True
        except FileNotFoundError:
            return True
        except (OSError, UnicodeDecodeError, CorruptCheckpointError):
            try:
                self._parse(read_no_follow(self.previous_path).decode("utf-8"))
            except (OSError, UnicodeDecodeError, CorruptCheckpointError):
                return True         # no good copy to protect: the usual way
            return False

    def _malformed(self, number: int, line: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"Malformed line in checkpoint file [{self.path}] line {number}: {line!r}")

    def _parse(self, text: str) -> dict[TopicPartition, int]:
        lines = _LINE_BREAK.split(text)
        if lines and lines[-1] == "":
            lines.pop()            # the newline ending the last line
        if not lines:
            return {}              # Kafka reads an empty file as an empty checkpoint
        if not _JAVA_INT.match(lines[0]):
            raise self._malformed(1, lines[0])
        version = int(lines[0])
        if version != CHECKPOINT_VERSION:
            raise CorruptCheckpointError(
                f"Unrecognised version:{version}, expected version: {CHECKPOINT_VERSION} "
                f"in checkpoint file at: {self.path} (line 1)")
        if len(lines) == 1:
            return {}
        if not _JAVA_INT.match(lines[1]) or int(lines[1]) < 0:
            raise self._malformed(2, lines[1])
        expected = int(lines[1])
        offsets: dict[TopicPartition, int] = {}
        for number, line in enumerate(lines[2:], start=3):
            parts = line.split()
            if (len(parts) != 3 or line[:1].isspace() or not _JAVA_INT.match(parts[1])
                    or not _JAVA_INT.match(parts[2]) or int(parts[1]) < 0):
                raise self._malformed(number, line)
            offsets[TopicPartition(parts[0], int(parts[1]))] = int(parts[2])
        found = len(lines) - 2
        if found != expected:
            raise CorruptCheckpointError(
                f"Expected [{expected}] entries in checkpoint file [{self.path}], but found only [{found}]")
        return offsets

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the file with ``offsets``: all of them or, after a crash, the old file.

        Entries are sorted by topic and partition so that the file is stable and
        easy to diff.  ENOSPC raises :class:`LogDirFullError`, any other I/O error
        :class:`StorageError`; in both cases the previous checkpoint is intact.
        """
        lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
        for tp in sorted(offsets):
            topic, partition = tp
            if not topic or _WHITESPACE.search(topic):
                raise InvalidRequestError(f"Cannot checkpoint topic {topic!r}: empty or contains whitespace")
            lines.append(f"{topic} {int(partition)} {int(offsets[tp])}")
        data = ("\n".join(lines) + "\n").encode("utf-8")
        with self._lock:
            try:
                write_keeping_previous(self.path, data, current_is_sound=self._current_is_sound())
            except OSError as exc:
                if exc.errno == _errno.ENOSPC:
                    raise LogDirFullError(f"No space left to write checkpoint file {self.path}") from exc
                raise StorageError(f"Error while writing to checkpoint file {self.path}: {exc}") from exc
            try:
                os.unlink(self.temp_path)
            except OSError:
                pass
        logger.debug("Wrote %d entries to checkpoint file %s", len(offsets), self.path)


_RENAME_EXCHANGE = 2        # linux/fs.h
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
#: False once the file system of some path refused RENAME_EXCHANGE (then: plain rename, no .prev kept)
_exchange_supported = _renameat2 is not None


def _exchange(a: str, b: str) -> bool:
    """Atomically swap the names ``a`` and ``b`` (both exist); False where the kernel or fs cannot."""
    global _exchange_supported
    if _renameat2 is None or not _exchange_supported:
        return False
    result = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (_errno.EINVAL, _errno.ENOSYS, _errno.EOPNOTSUPP):
        logger.warning("renameat2(RENAME_EXCHANGE) is not supported for %s (%s): files are replaced "
                       "without keeping their previous generation", b, os.strerror(err))
        _exchange_supported = False
        return False
    raise OSError(err, os.strerror(err), b)


def write_keeping_previous(path: str, data: bytes, previous: str | None = None, mode: int = 0o666,
                           current_is_sound: bool = True) -> None:
    """Replace ``path`` by ``data`` atomically, keeping the replaced content as ``previous``.

    ``previous`` (default ``path + ".prev"``) is overwritten in place, fsynced,
    and swapped with ``path`` by one ``renameat2(RENAME_EXCHANGE)``; the
    directory is then fsynced.  Needs no new disk blocks when ``data`` fits in
    the blocks ``previous`` already has, so it works on a full disk for files
    whose size barely changes.  Links are never followed (``O_NOFOLLOW``).
    ``mode`` is filtered by the process umask, like every file in a data dir.

    ``current_is_sound=False`` says ``path`` is corrupt (its reader fell back
    to ``previous``): then ``previous`` is the only good copy and must not be
    written over, so the new content goes in place over ``path`` instead (a
    crash in the middle leaves ``path`` as corrupt as it was, ``previous`` intact).
    Raises OSError (ENOSPC included); ``path`` is intact whenever it raises.
    """
    previous = path + PREVIOUS_SUFFIX if previous is None else previous
    with _path_lock(path):
        if current_is_sound:
            _write_keeping_previous(path, data, previous, mode)
        else:
            _write_in_place(path, data, mode)
            fsync_dir(os.path.dirname(path))


_path_locks: dict[str, threading.Lock] = {}
_path_locks_guard = threading.Lock()


def _path_lock(path: str) -> threading.Lock:
    """One writer at a time per file in this process: two interleaved in-place writes of ``.prev``
    followed by two exchanges could leave the older content current."""
    key = os.path.abspath(path)
    with _path_locks_guard:
        return _path_locks.setdefault(key, threading.Lock())


def _write_in_place(path: str, data: bytes, mode: int) -> None:
    """Overwrite ``path`` from its start (reusing its blocks), trim it to ``data`` and fsync it."""
    _remove_planted_link(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        position = 0
        while position < len(data):
            position += os.pwrite(fd, view[position:], position)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_keeping_previous(path: str, data: bytes, previous: str, mode: int) -> None:
    _write_in_place(previous, data, mode)
    if not os.path.lexists(path) or not _exchange(previous, path):
        os.replace(previous, path)
    fsync_dir(os.path.dirname(path))


def read_no_follow(path: str) -> bytes:
    """The bytes of the regular file ``path``; a link or other non-regular file is an OSError (ELOOP, ...)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(_errno.EINVAL, "not a regular file", path)
        return read_to_end(fd)
    finally:
        os.close(fd)


def read_to_end(fd: int) -> bytes:
    """Every byte left in the open file ``fd``, read in chunks of 1 MiB until EOF."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _remove_planted_link(path: str) -> None:
    """A symlink (fifo, socket, device, hard-linked file) where the previous generation goes is removed.

    Only the entry in our own directory goes; whatever it points at is not
    touched.  A directory there is left alone, and the write then fails.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
        return
    # A hard link (a data dir copied with `cp -al`) would make the in-place write
    # change the other directory's file too: only the name here goes.
    what = (f"has {st.st_nlink} hard links" if stat.S_ISREG(st.st_mode)
            else f"is not a regular file (mode {st.st_mode:o})")
    logger.error("Removing %s, which %s and is in the way of a checkpoint write; what it points at is not "
                 "touched", path, what)
    os.unlink(path)
