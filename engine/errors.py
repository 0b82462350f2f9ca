"""The engine's exceptions, each carrying the errno the mount reports for it.

The engine knows nothing of FUSE, but every failure a user can cause has exactly
one errno in the contract (SPEC.md section 7).  Attaching it here keeps that
mapping in one place: the filesystem layer raises ``FUSEError(exc.errno)`` and
never has to guess.
"""

from __future__ import annotations

import errno as _errno


class LogfsError(Exception):
    """Base class: a failure with a user-facing errno."""

    errno: int = _errno.EIO


class InvalidConfigError(LogfsError):
    """A configuration name is unknown or its value is not valid for it."""

    errno = _errno.EINVAL


class InvalidTopicError(LogfsError):
    """A topic name breaks Kafka's rules (characters, length, '.' or '..')."""

    errno = _errno.EINVAL


class InvalidPartitionError(LogfsError):
    """A partition number is not the next one, or not a number at all."""

    errno = _errno.EINVAL


class InvalidRequestError(LogfsError):
    """A marker or request is malformed (e.g. a bad ``delete`` marker)."""

    errno = _errno.EINVAL


class InvalidRecordError(LogfsError):
    """A record the log refuses, e.g. one without a key on a compacted topic."""

    errno = _errno.EINVAL


class InternalTopicError(LogfsError):
    """A request an internal topic (``__consumer_offsets``) refuses: produce, DeleteRecords, DeleteTopics,
    CreatePartitions, or a config that would break the store (Kafka's InvalidTopicException "Cannot append
    to internal topic", "Cannot delete records of internal topic"...)."""

    errno = _errno.EPERM


class TopicExistsError(LogfsError):
    errno = _errno.EEXIST


class UnknownTopicOrPartitionError(LogfsError):
    errno = _errno.ENOENT


class OffsetOutOfRangeError(LogfsError):
    """Kafka's OffsetOutOfRangeException: the offset is outside [start, end)."""

    errno = _errno.ENOENT

    def __init__(self, message: str, *, offset: int = -1, log_start_offset: int = -1,
                 log_end_offset: int = -1) -> None:
        super().__init__(message)
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class RecordTooLargeError(LogfsError):
    """A record (or batch) is larger than ``max.message.bytes``."""

    errno = _errno.EMSGSIZE


class CorruptRecordError(LogfsError):
    """Stored data failed validation (CRC, framing); names file and position."""

    errno = _errno.EIO

    def __init__(self, message: str, *, path: str | None = None, position: int = -1) -> None:
        #: what is wrong, without where (``path``/``position`` say where)
        self.detail = message
        if path is not None:
            message = f"{message} (file {path}, position {position})"
        super().__init__(message)
        self.path = path
        self.position = position

    def at(self, path: str, position: int, context: str = "") -> CorruptRecordError:
        """The same damage located in ``path`` at byte ``position`` (for a caller that knows the file)."""
        return CorruptRecordError(self.detail + context, path=path, position=position)


class CorruptIndexError(LogfsError):
    """An index file fails its sanity check; the segment rebuilds it from the log."""

    errno = _errno.EIO


class CorruptCheckpointError(LogfsError):
    """A checkpoint file cannot be parsed; the caller falls back to full recovery."""

    errno = _errno.EIO


class LogDirFullError(LogfsError):
    """The data directory has no room: the append is rolled back, nothing partial."""

    errno = _errno.ENOSPC


class ReadOnlyError(LogfsError):
    """The log manager was opened read-only."""

    errno = _errno.EROFS


class StorageError(LogfsError):
    """Kafka's KafkaStorageException: an I/O error on a log directory."""

    errno = _errno.EIO


class OutOfDescriptorsError(StorageError):
    """The process (EMFILE) or the system (ENFILE) has no file descriptor left for a log dir's file.

    Nothing was changed; the request succeeds once descriptors are free again
    (files closed, a higher ``ulimit -n``), so the caller gets that errno, not
    EIO, which would say the disk failed.
    """

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.errno = code


def storage_error(message: str, exc: OSError) -> LogfsError:
    """The error for an ``OSError`` while creating or opening a log dir's files, by its errno: ENOSPC a
    LogDirFullError, EMFILE and ENFILE an OutOfDescriptorsError, anything else a StorageError (EIO)."""
    if exc.errno == _errno.ENOSPC:
        return LogDirFullError(message)
    if exc.errno in (_errno.EMFILE, _errno.ENFILE):
        return OutOfDescriptorsError(message, exc.errno)
    return StorageError(message)


class UnsafeFileError(StorageError):
    """A file or directory in a log dir is a symbolic link or not a regular file.

    logfs never follows a link or writes through one: a data directory copied
    from someone else may hold links to anything, and the mount may run as
    root.  ``paths`` names every offending entry; the partition holding them is
    not loaded and nothing in it is touched.
    """

    def __init__(self, message: str, *, paths: list[str]) -> None:
        super().__init__(message)
        self.paths = list(paths)
