"""The on-disk names of a log directory and the few file operations every writer needs.

One home for what Kafka's ``LogFileUtils`` and ``Utils`` hold: the segment file
suffixes, the 20-digit base-offset file names, the suffixes of files in flight
(asynchronous deletion, the cleaner's swap) and of a partition directory
renamed for deletion, and the helpers that make a rename durable
(:func:`fsync_dir`), write a small file atomically (:func:`atomic_write`) and
remove a file that may already be gone (:func:`unlink_if_exists`; a
segment's ``.viewindex`` unless a live ``.log`` owns it:
:func:`remove_view_index_file`).  The engine, its tools and the mount
(``logfs.namespace``, ``logfs.spark``, ``logfs.to_kafka``) all take them from
here.
"""

from __future__ import annotations

import os

__all__ = [
    "LOG_FILE_SUFFIX", "INDEX_FILE_SUFFIX", "TIME_INDEX_FILE_SUFFIX", "TXN_INDEX_FILE_SUFFIX",
    "DELETED_FILE_SUFFIX", "CLEANED_FILE_SUFFIX", "SWAP_FILE_SUFFIX", "TMP_FILE_SUFFIX", "DELETE_DIR_SUFFIX",
    "SEGMENT_FILE_SUFFIXES", "IN_FLIGHT_SUFFIXES", "filename_prefix_from_offset", "segment_file_name",
    "log_file_path", "offset_index_file_path", "time_index_file_path", "parse_segment_file_name",
    "offset_from_file_name",
    "fsync_dir", "atomic_write", "unlink_if_exists", "VIEW_INDEX_FILE_SUFFIX", "view_index_file_path",
    "write_cache_file", "remove_view_index_file",
]

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"
TXN_INDEX_FILE_SUFFIX = ".txnindex"
#: A segment renamed for asynchronous deletion (``file.delete.delay.ms`` later it goes).
DELETED_FILE_SUFFIX = ".deleted"
#: The cleaner's output while it is being written.
CLEANED_FILE_SUFFIX = ".cleaned"
#: The cleaner's output once complete, before it replaces the segments it cleaned.
SWAP_FILE_SUFFIX = ".swap"
#: The temporary name of a file written by :func:`atomic_write`.
TMP_FILE_SUFFIX = ".tmp"
#: Suffix of a partition directory renamed for asynchronous deletion, as Kafka's
#: ``LocalLog.DeleteDirSuffix``.  Kafka also inserts a unique id before it so a
#: topic of the same name can be created (and deleted) again at once.
DELETE_DIR_SUFFIX = "-delete"

#: logfs's own sidecar of a sealed segment: where each record starts in the mount's
#: renderings (engine.views.persisted).  A validated cache, not part of a Kafka log:
#: Kafka's loader ignores it and ``logfs to-kafka adopt`` removes it.
VIEW_INDEX_FILE_SUFFIX = ".viewindex"

#: The files of one segment, in the order a segment listing shows them.
SEGMENT_FILE_SUFFIXES = (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)
#: Suffixes of files in flight (asynchronous deletion, the cleaner's swap): the
#: next startup finishes or rolls them back.
IN_FLIGHT_SUFFIXES = (DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)


def filename_prefix_from_offset(offset: int) -> str:
    """Kafka's 20-digit zero-padded base offset that names a segment's files."""
    return f"{offset:020d}"


def segment_file_name(offset: int, suffix: str) -> str:
    """``<20-digit base offset><suffix>``, e.g. ``00000000000000000042.index``."""
    return f"{offset:020d}{suffix}"


def log_file_path(dir: str, offset: int, suffix: str = "") -> str:
    return os.path.join(dir, filename_prefix_from_offset(offset) + LOG_FILE_SUFFIX + suffix)


def offset_index_file_path(dir: str, offset: int, suffix: str = "") -> str:
    return os.path.join(dir, filename_prefix_from_offset(offset) + INDEX_FILE_SUFFIX + suffix)


def time_index_file_path(dir: str, offset: int, suffix: str = "") -> str:
    return os.path.join(dir, filename_prefix_from_offset(offset) + TIME_INDEX_FILE_SUFFIX + suffix)


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """``00000000000000000042.index.swap`` -> ``(42, ".index.swap")``; None if no base offset starts it.

    The one reading of segment file names (Kafka's ``LogFileUtils.offsetFromFileName``):
    the base offset is the ASCII digits before the first dot of the base name,
    the suffix everything from that dot on.  Kafka writes 20 digits
    (:func:`filename_prefix_from_offset`) and reads any count, so does the
    loader; a name shown to users is the 20-digit spelling, which
    ``segment_file_name(*parsed) == name`` checks.
    """
    stem, dot, rest = os.path.basename(name).partition(".")
    if not (stem.isascii() and stem.isdigit()):
        return None
    return int(stem), dot + rest


def view_index_file_path(dir: str, offset: int) -> str:
    return os.path.join(dir, filename_prefix_from_offset(offset) + VIEW_INDEX_FILE_SUFFIX)


def offset_from_file_name(name: str) -> int:
    """The base offset a segment file name starts with; ValueError if it has none."""
    parsed = parse_segment_file_name(name)
    if parsed is None:
        raise ValueError(f"{name!r} does not start with a base offset")
    return parsed[0]


def fsync_dir(path: str, *, missing_ok: bool = False) -> None:
    """Make renames, creations and unlinks in ``path`` durable.

    A directory entry is only on disk once its directory is synced.
    ``O_DIRECTORY`` makes a path that is not a directory an error rather than a
    sync of some file.  ``missing_ok`` is for a log directory that may have been
    renamed for deletion meanwhile: nothing is left there to make durable.
    """
    try:
        fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, mode: int = 0o666) -> None:
    """Replace ``path`` by ``data``: ``path.tmp``, fsync, rename, fsync of the directory.

    A crash leaves the old file or the new one, never a mix.  The temporary file
    is opened with ``O_NOFOLLOW`` (never written through a link planted under its
    name) and removed when anything fails.  Raises OSError.
    """
    tmp = path + TMP_FILE_SUFFIX
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))
    except OSError:
        unlink_if_exists(tmp, ignore_errors=True)
        raise


def write_cache_file(path: str, data: bytes, mode: int = 0o666) -> None:
    """Replace ``path`` by ``data`` atomically but without fsync: for a cache that is validated when read.

    ``path.tmp`` then a rename, so a reader sees the old file or the new one;
    after a power loss the file may be missing, empty or zero-filled, so its
    reader must check it (a checksum) and rebuild it rather than trust it.
    Costs no disk flush, so it can run where a flush would stall appends.
    Raises OSError (the temporary file removed).
    """
    tmp = path + TMP_FILE_SUFFIX
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        unlink_if_exists(tmp, ignore_errors=True)
        raise


def unlink_if_exists(path: str, *, ignore_errors: bool = False) -> bool:
    """Remove ``path``; False when it was already gone.

    Other errors raise, unless ``ignore_errors`` (clean-up of a temporary file
    after another error, which is the one worth reporting).
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError:
        if ignore_errors:
            return False
        raise
    return True


def remove_view_index_file(dir: str, base_offset: int) -> None:
    """Unlink ``<base>.viewindex`` (the mount's sidecar, engine.views.persisted) of a segment that is going,
    unless a live ``<base>.log`` (the cleaner's replacement of the same base offset) still owns it."""
    if not os.path.lexists(log_file_path(dir, base_offset)):
        unlink_if_exists(view_index_file_path(dir, base_offset), ignore_errors=True)
