"""Records only in remote storage brought back into local segments (``logfs to-kafka restore``), offline.

Tiered storage's local retention deletes a partition's copied segments, so
its offsets from the log start offset to the local log start offset are held
only by finished copies in the store.  Restoring a partition downloads each
such copy into real local segment files (``.log``, ``.index``, ``.timeindex``:
what the log loader opens; the leader-epoch entries of a copy are in its
batches, and logfs writes no producer snapshot or transaction index), after
which its local log start equals its log start: the local segments hold every
record, as they did before tiering, and ``remote.storage.enable`` can be
turned off.

Safe to kill at any point, and to run again:

* each file of a segment is written under a name the loader never opens
  (``<name>`` + :data:`RESTORE_SUFFIX`), fsynced, then renamed into place,
  the indexes first and the ``.log`` last, and the directory fsynced: the
  loader sees a restored segment whole or not at all (a lone index a kill
  left is an orphan it deletes; a run deletes every leftover temporary file
  of the partition first);
* the copies are restored from the highest offset down, each one directly
  below the first local segment, so at every step the partition is a valid
  tiered log: local segments from some copy's base offset on, the copies
  below it serving the rest, with no hole a reader could fall into.  A run
  that stopped part-way left a partition whose local log start moved down;
  the next run restores what is still only in the store.

The copies in the store and their metadata are not touched here (the caller
may delete them once the partition is whole).  Every failure is a
:class:`RestoreError` naming the store, the partition and the segment; the
segment being restored is then left as it was (its temporary files removed).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from engine.errors import CorruptRecordError, LogfsError
from engine.files import (
    LOG_FILE_SUFFIX,
    TMP_FILE_SUFFIX,
    fsync_dir,
    log_file_path,
    offset_from_file_name,
    offset_index_file_path,
    time_index_file_path,
    unlink_if_exists,
)
from engine.log_dirs import REMOTE_LOG_DIR
from engine.records.reader import read_batches
from engine.remote.storage import LOG_SUFFIX, IndexType, RemoteStorageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.remote.metadata import RemoteLogMetadataManager, RemoteLogSegmentMetadata
    from engine.remote.storage import RemoteStorageManager
    from engine.topic import TopicPartition

logger = logging.getLogger(__name__)

#: what a file being restored is called until it is whole: ``<base>.log.restore.tmp`` (the loader opens only
#: names ending in ``.log``, ``.index`` and ``.timeindex``)
RESTORE_SUFFIX = ".restore" + TMP_FILE_SUFFIX
#: bytes of a copy's ``.log`` fetched per request
DOWNLOAD_CHUNK = 8 << 20


class RestoreError(LogfsError):
    """A partition's remote-only records could not be restored (the message says which and why)."""


def read_remote_log_metadata(log_dirs: Sequence[str]) -> RemoteLogMetadataManager | None:
    """The replayed metadata log of tiered storage in ``log_dirs`` (read-only); None when there is none."""
    from engine.log import Log
    from engine.remote.metadata import RemoteLogMetadataManager
    from engine.remote.remote_log_manager import _METADATA_LOG_CONFIG, METADATA_LOG_DIR

    for log_dir in log_dirs:
        metadata_dir = os.path.join(log_dir, REMOTE_LOG_DIR, METADATA_LOG_DIR)
        if os.path.isdir(metadata_dir):
            log = Log.load(metadata_dir, _METADATA_LOG_CONFIG, read_only=True)
            try:
                return RemoteLogMetadataManager(log)
            finally:
                log.close()
    return None


def first_local_base_offset(partition_dir: str) -> int | None:
    """The base offset of the first ``.log`` in ``partition_dir`` (the local log start, as the loader finds it)."""
    bases = []
    for name in os.listdir(partition_dir):
        if name.endswith(LOG_FILE_SUFFIX):
            try:
                bases.append(offset_from_file_name(name))
            except ValueError:
                continue
    return min(bases, default=None)


def copies_to_restore(copies: Sequence[RemoteLogSegmentMetadata], topic_partition: TopicPartition,
                      log_start_offset: int, local_log_start_offset: int) -> list[RemoteLogSegmentMetadata]:
    """The finished copies that hold ``[log_start_offset, local_log_start_offset)``, by offset.

    RestoreError when they do not hold every one of those offsets exactly (a
    hole, or a copy reaching into the first local segment): restoring them
    would leave records behind or overlap the local log.
    """
    wanted = sorted((m for m in copies
                     if m.end_offset >= log_start_offset and m.start_offset < local_log_start_offset),
                    key=lambda m: m.start_offset)
    expected = log_start_offset
    for m in wanted:
        if m.start_offset > expected or (m is not wanted[0] and m.start_offset != expected):
            raise RestoreError(f"Offsets {expected} to {m.start_offset - 1} of {topic_partition} are in no "
                               f"finished remote log segment (the next one starts at {m.start_offset}): "
                               "`logfs check` with the store's settings says what the metadata holds")
        if m.end_offset >= local_log_start_offset:
            raise RestoreError(f"Remote log segment {m.start_offset}..{m.end_offset} of {topic_partition} "
                               f"reaches into the first local segment ({local_log_start_offset}): it cannot be "
                               "restored as a whole segment")
        expected = m.end_offset + 1
    if expected < local_log_start_offset:
        raise RestoreError(f"Offsets {expected} to {local_log_start_offset - 1} of {topic_partition} are in no "
                           "finished remote log segment: `logfs check` with the store's settings says what the "
                           "metadata holds")
    return wanted


def remove_leftovers(partition_dir: str) -> list[str]:
    """Delete the temporary files of a restore that was stopped (kill -9, power loss); returns their names."""
    gone = [name for name in sorted(os.listdir(partition_dir)) if name.endswith(RESTORE_SUFFIX)]
    for name in gone:
        unlink_if_exists(os.path.join(partition_dir, name))
    if gone:
        fsync_dir(partition_dir)
        logger.info("Removed %d files of a restore that was stopped in %s: %s", len(gone), partition_dir,
                    ", ".join(gone))
    return gone


def _write_file(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a new ``path`` (replacing a leftover), fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def restore_segment(partition_dir: str, topic_partition: TopicPartition, storage: RemoteStorageManager,
                    metadata: RemoteLogSegmentMetadata) -> None:
    """Download one finished copy into the segment files of ``partition_dir`` (see the module docstring).

    The copy must lie directly below the first local segment (the caller
    restores from the top down).  Its ``.log`` is checked before it goes in
    place: the size recorded for it, every batch's CRC and its last offset.
    RestoreError names the store, partition and segment; nothing of the
    segment is then left in ``partition_dir``.
    """
    base, end = metadata.start_offset, metadata.end_offset
    segment_id = metadata.segment_id
    where = (f"remote log segment {base}..{end} of {topic_partition} "
             f"({storage.uri}/{segment_id.object_name(LOG_SUFFIX)})")
    final_log = log_file_path(partition_dir, base)
    if os.path.lexists(final_log):
        raise RestoreError(f"Cannot restore {where}: {final_log} exists already")
    first_local = first_local_base_offset(partition_dir)
    if first_local is not None and first_local != end + 1:
        raise RestoreError(f"Cannot restore {where}: the first local segment starts at {first_local}, not "
                           f"directly above it ({end + 1})")
    # the restored files get the mode of the partition's own segment files
    mode = os.stat(log_file_path(partition_dir, first_local)).st_mode & 0o777 if first_local is not None else 0o600
    finals = [offset_index_file_path(partition_dir, base), time_index_file_path(partition_dir, base), final_log]
    temps = [path + RESTORE_SUFFIX for path in finals]
    size = metadata.segment_size_bytes
    try:
        try:
            # the .log streamed to its temporary file, a chunk at a time (a segment may be a GiB)
            fd = os.open(temps[2], os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            with os.fdopen(fd, "r+b") as f:
                written = 0
                for position in range(0, size, DOWNLOAD_CHUNK):
                    chunk = storage.fetch_log_segment(segment_id, position, min(position + DOWNLOAD_CHUNK, size))
                    f.write(chunk)
                    written += len(chunk)
                    if len(chunk) < min(DOWNLOAD_CHUNK, size - position):
                        break       # the object ends here
                f.flush()
                os.fsync(f.fileno())
                if written != size:
                    raise RestoreError(f"Cannot restore {where}: the store holds {written} bytes of it, its "
                                       f"metadata says {size}")
                last = None
                try:
                    for _, header, _, _ in read_batches(lambda position, n: os.pread(f.fileno(), n, position), 0,
                                                        size, DOWNLOAD_CHUNK, path=where, verify_crc=True):
                        last = header.last_offset
                except CorruptRecordError as exc:
                    raise RestoreError(f"Cannot restore {where}: it is damaged in the store: {exc}") from exc
            if last != end:
                raise RestoreError(f"Cannot restore {where}: its last offset is {last}, its metadata says {end}")
            for index_type, path in zip((IndexType.OFFSET, IndexType.TIMESTAMP), temps[:2], strict=True):
                _write_file(path, storage.fetch_index(segment_id, index_type), mode)
        except RemoteStorageError as exc:
            raise RestoreError(f"Cannot restore {where}: {exc}") from exc
        # the indexes first, the .log last: a kill in between leaves orphaned indexes the loader deletes
        for temp, final in zip(temps, finals, strict=True):
            os.replace(temp, final)
        fsync_dir(partition_dir)
    except BaseException:
        for temp in temps:
            unlink_if_exists(temp, ignore_errors=True)
        raise
    logger.info("Restored %s into %s (%d bytes)", where, final_log, size)
