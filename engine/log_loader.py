"""LogLoader: bring a partition directory back to a consistent set of segments (Kafka's LogLoader).

:meth:`engine.log.Log.load` runs one LogLoader over the directory and builds
the Log from the :class:`LoadedLog` it returns.  The loader owns crash
recovery: everything after the recovery point is validated batch by batch,
interrupted swaps and deletions are completed, and broken indexes rebuilt.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, NamedTuple

from sortedcontainers import SortedDict

from engine.errors import (
    CorruptIndexError,
    CorruptRecordError,
    LogfsError,
    ReadOnlyError,
    StorageError,
    UnsafeFileError,
    storage_error,
)
from engine.files import (
    CLEANED_FILE_SUFFIX,
    DELETE_DIR_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TMP_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    VIEW_INDEX_FILE_SUFFIX,
    filename_prefix_from_offset,
    log_file_path,
    offset_from_file_name,
    offset_index_file_path,
    parse_segment_file_name,
    remove_view_index_file,
    time_index_file_path,
    unlink_if_exists,
)
from engine.records import validate_batch
from engine.segment import LogSegment
from engine.segment_checks import check_index_against_log, validate_tail

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.clock import Clock
    from engine.config import LogConfig
    from engine.topic import TopicPartition

logger = logging.getLogger("engine.log")        # the Log's logger: recovery is part of what a log says


class DeletedSegmentFiles:
    """A segment renamed ``.deleted``, waiting for ``file.delete.delay.ms``, holding one descriptor.

    As Kafka keeps a deleted segment's channel open until the delayed delete
    (a fetch that took the segment reads on), the ``.log`` descriptor stays:
    views that opened the segment before the deletion read on through it.
    Its index maps (a descriptor each) are released at once: nothing reads a
    deleted segment's indexes.  A roll per record with retention or the
    cleaner behind it would otherwise keep three descriptors per segment for
    the delay, and appends would fail with EMFILE until it passed (issue 18).
    """

    __slots__ = ("paths", "size", "segment", "_repr")

    def __init__(self, segment: LogSegment) -> None:
        self.paths = [segment.log_path, segment.offset_index.path, segment.time_index.path]
        self.size = segment.size
        self._repr = repr(segment)
        self.segment = segment
        for index in (segment.offset_index, segment.time_index):
            index.close_handler()

    def update_parent_dir(self, dir: str) -> None:
        self.paths = [os.path.join(dir, os.path.basename(p)) for p in self.paths]
        self.segment.update_parent_dir(dir)

    def close_handlers(self) -> None:
        self.segment.close_handlers()

    def delete_if_exists(self) -> None:
        """Unlink the three files (a view still holding the segment reads on: Unix semantics)."""
        deleted = []
        for kind, path in zip(("log", "offset index", "time index"), self.paths, strict=True):
            try:
                os.unlink(path)
                deleted.append(kind)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageError(f"Delete of {kind} {path} failed: {exc.strerror}") from exc
        # renamed .deleted, the segment lost its sidecar then; this catches one a view wrote meanwhile
        remove_view_index_file(os.path.dirname(self.paths[0]), self.segment.base_offset)
        if deleted:
            logging.getLogger("engine.segment").info("Deleted %s of segment %s.", ", ".join(deleted), self.paths[0])

    def __repr__(self) -> str:
        return self._repr


class PendingDeletion(NamedTuple):
    """A segment renamed ``.deleted`` whose files are unlinked once ``due_ms`` passed (file.delete.delay.ms)."""

    due_ms: int
    segment: DeletedSegmentFiles


class LoadedLog(NamedTuple):
    """What :meth:`LogLoader.load` hands to :class:`~engine.log.Log` (Kafka's LoadedLogOffsets + segments)."""

    segments: SortedDict
    log_start_offset: int
    recovery_point: int
    log_end_offset: int
    pending_deletions: list[PendingDeletion]


#: Suffixes of the files a LogLoader opens, renames or deletes; each must be a
#: regular file (not a link), else the partition is not loaded (UnsafeFileError).
_SEGMENT_FILE_SUFFIXES = tuple(
    kind + extra for kind in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX)
    for extra in ("", DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX))


def _is_segment_file_name(name: str) -> bool:
    """A name the loader would open, rename or delete (a base offset, then one of ``_SEGMENT_FILE_SUFFIXES``)."""
    parsed = parse_segment_file_name(name)
    return parsed is not None and parsed[1] in _SEGMENT_FILE_SUFFIXES


#: The files of a segment logfs writes itself (and so may delete when a .swap replaces it);
#: Kafka's .txnindex and .snapshot files are never deleted.
_OWN_SEGMENT_FILE_SUFFIXES = tuple(
    kind + extra for kind in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)
    for extra in ("", DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX))


class LogLoader:
    """Kafka's LogLoader: bring a partition directory back to a consistent set of segments.

    Order of work, as in Kafka: refuse links and non-regular segment files,
    delete ``.deleted`` and stray ``.cleaned`` files, complete interrupted
    ``.swap`` operations (after validating each ``.swap``), delete orphaned
    indexes, open every segment (rebuilding a missing index, or one that fails
    the sanity check or disagrees with its log), recover the segments at or
    after the recovery point when the shutdown was not clean, validate the tail
    of the active segment when it was, and make sure an active segment exists.

    Read-only (``read_only=True``) the same work is done in memory: nothing is
    deleted, renamed, truncated or rebuilt on disk.  Recovery leaves torn tails
    out of the segments' sizes, indexes are rebuilt in anonymous maps, a valid
    ``.swap`` replaces its segments in the map only, and segments Kafka's
    recovery would delete are only left out of the map.  The result is what a
    Kafka broker would serve after recovering the same directory.

    Files the loader does not know (Kafka's ``partition.metadata``,
    ``leader-epoch-checkpoint``, ``*.snapshot``) are never opened, rewritten or
    deleted.

    Invariants of the :class:`LoadedLog` it returns:

    * ``segments`` is not empty, ordered by base offset, and the last one is the
      active segment; no two segments overlap in offsets.
    * ``log_start_offset <= log_end_offset`` and the log start lies in (or at
      the end of) the first segment, or below it for a topic with
      ``remote.storage.enable`` (tiered storage deleted local segments whose
      copies serve the offsets below); ``recovery_point <= log_end_offset``.
    * Every segment at or after the recovery point was recovered (validated
      batch by batch, torn tail dropped, indexes rebuilt) unless the shutdown
      was clean, in which case only the active segment's tail is validated.
    * No ``.swap``, ``.cleaned`` or orphaned index file remains in effect: an
      interrupted replacement is completed or rolled back.
    * A loader is used once: ``load()`` is called once per instance.
    """

    def __init__(self, dir: str, topic_partition: TopicPartition, config: LogConfig, clock: Clock,
                 had_clean_shutdown: bool, log_start_offset_checkpoint: int,
                 recovery_point_checkpoint: int, read_only: bool = False) -> None:
        self.dir = dir
        self.read_only = read_only
        self.topic_partition = topic_partition
        self.config = config
        self.clock = clock
        self.had_clean_shutdown = had_clean_shutdown
        self.log_start_offset_checkpoint = log_start_offset_checkpoint
        self.recovery_point_checkpoint = recovery_point_checkpoint
        self.segments = SortedDict()
        self.pending: list[PendingDeletion] = []
        #: bases of segments installed from a ``.swap`` here: a missing index of theirs is expected
        self._installed_from_swap: set[int] = set()
        #: read-only: valid .swap segments by base offset, with their next offset (installed in memory)
        self._swapped_in_memory: dict[int, tuple[LogSegment, int]] = {}
        self._prefix = f"[LogLoader partition={topic_partition}, dir={os.path.dirname(dir)}] "

    def _files(self) -> list[str]:
        """Names of the regular files of the dir; UnsafeFileError if a segment file is a link or special."""
        names: list[str] = []
        unsafe: list[str] = []
        try:
            with os.scandir(self.dir) as entries:
                for entry in entries:
                    if entry.is_file(follow_symlinks=False):
                        names.append(entry.name)
                    elif _is_segment_file_name(entry.name):
                        unsafe.append(entry.path)
        except OSError as exc:
            raise storage_error(f"Could not list log directory {self.dir}: {exc.strerror}", exc) from exc
        if unsafe:
            unsafe.sort()
            raise UnsafeFileError(
                f"Log directory {self.dir} of partition {self.topic_partition} holds "
                f"{'a symbolic link or special file' if len(unsafe) == 1 else 'symbolic links or special files'} "
                f"where segment files belong: {', '.join(unsafe)}. logfs never follows links; the partition is "
                "not loaded and nothing in it is touched. Replace the link by the file it points to (or remove "
                "it) and mount again.", paths=unsafe)
        return sorted(names)

    def _open(self, base_offset: int, suffix: str = "", exists: bool = True,
              read_only: bool | None = None) -> LogSegment:
        return LogSegment.open(self.dir, base_offset, self.config, self.clock, file_suffix=suffix,
                               file_already_exists=exists, topic_partition=self.topic_partition,
                               read_only=self.read_only if read_only is None else read_only)

    def _next_offset_of(self, base_offset: int) -> int:
        """The next offset of the segment at ``base_offset``, opened read-only (looking creates nothing)."""
        segment = self._open(base_offset, read_only=True)
        try:
            return segment.next_offset
        finally:
            segment.close_handlers()

    def _needs_recovery(self, reason: str) -> ReadOnlyError:
        """The error of a read-only load that cannot go on without writing to ``self.dir``."""
        return ReadOnlyError(
            f"Log directory {self.dir} of partition {self.topic_partition} cannot be opened read-only: {reason}. "
            f"Mount it read-write once to recover it (or run `logfs check {os.path.dirname(self.dir)}`).")

    def load(self) -> LoadedLog:
        try:
            files = self._files()
            swap_files = self._remove_temp_files_and_collect_swap_files(files)
            self._complete_swap_operations(swap_files)
            self._load_segment_files()
            if self.dir.rstrip(os.sep).endswith(DELETE_DIR_SUFFIX):
                # A partition waiting for deletion: nothing to recover, it is going away.
                if not self.segments:
                    if self.read_only:
                        raise self._needs_recovery("it has no log segment")
                    self.segments[0] = self._open(0, exists=False)
                recovery_point, log_end = 0, self.segments.peekitem(-1)[1].next_offset
            else:
                recovery_point, log_end = self._recover_log()
                if not self.read_only:
                    active = self.segments.peekitem(-1)[1]
                    active.resize_indexes(active.max_index_size)
        except BaseException:
            if self.read_only:
                for segment in self.segments.values():
                    segment.close_handlers()
            raise
        if not self.read_only:
            self._remove_orphaned_view_index_files(files)
        log_start = max(self.log_start_offset_checkpoint, self.segments.peekitem(0)[0])
        if self.config.remote_storage_enable and self.log_start_offset_checkpoint < log_start:
            # tiered storage: local retention deleted copied segments, the log starts in remote storage
            log_start = self.log_start_offset_checkpoint
        logger.info(self._prefix + "Loading producer state till offset %d with message format version 2",
                    log_end)
        return LoadedLog(self.segments, log_start, recovery_point, log_end, self.pending)

    def _remove_orphaned_view_index_files(self, files: list[str]) -> None:
        """Unlink the ``<base>.viewindex`` files (the mount's sidecars) of segments the log no longer holds:
        left by a deletion that an older version or a crash did not finish.  One line per partition."""
        orphans = []
        for name in files:
            if not name.endswith(VIEW_INDEX_FILE_SUFFIX):
                continue
            try:
                base = offset_from_file_name(name)
            except ValueError:
                continue
            if base not in self.segments:
                orphans.append(name)
                unlink_if_exists(os.path.join(self.dir, name), ignore_errors=True)
        if orphans:
            logger.info(self._prefix + "Removed %d view index files of deleted segments: %s", len(orphans),
                        ", ".join(orphans))

    # ------------------------------------------------------------ temp files and swaps
    def _remove_temp_files_and_collect_swap_files(self, files: list[str]) -> list[str]:
        swap_files: list[str] = []
        cleaned_files: list[str] = []
        min_cleaned_offset = None
        for name in files:
            path = os.path.join(self.dir, name)
            if name.endswith((DELETED_FILE_SUFFIX, VIEW_INDEX_FILE_SUFFIX + TMP_FILE_SUFFIX)):
                if not self.read_only:
                    logger.debug(self._prefix + "Deleting stray temporary file %s", path)
                    unlink_if_exists(path)
            elif name.endswith(CLEANED_FILE_SUFFIX):
                try:
                    offset = offset_from_file_name(name)
                    min_cleaned_offset = offset if min_cleaned_offset is None else min(offset, min_cleaned_offset)
                except ValueError:
                    pass
                cleaned_files.append(path)
            elif name.endswith(SWAP_FILE_SUFFIX):
                swap_files.append(path)
        valid: list[str] = []
        for path in swap_files:
            # KAFKA-6264: a .swap at or above the lowest .cleaned offset belongs to an
            # operation that never finished renaming: roll it back.
            try:
                offset = offset_from_file_name(path)
            except ValueError:
                continue
            if min_cleaned_offset is not None and offset >= min_cleaned_offset:
                if not self.read_only:
                    logger.debug(self._prefix + "Deleting invalid swap file %s minCleanedFileOffset: %d",
                                 path, min_cleaned_offset)
                    unlink_if_exists(path)
            else:
                valid.append(path)
        if not self.read_only:
            for path in cleaned_files:
                logger.debug(self._prefix + "Deleting stray .clean file %s", path)
                unlink_if_exists(path)
        return valid

    def _segment_bases(self) -> list[int]:
        bases = []
        for name in self._files():
            if name.endswith(LOG_FILE_SUFFIX):
                try:
                    bases.append(offset_from_file_name(name))
                except ValueError:
                    pass
        return sorted(bases)

    def _validate_swap(self, segment: LogSegment, bases: list[int],
                       accepted: list[tuple[int, int]]) -> tuple[int, int]:
        """(first offset, next offset) of a ``.swap`` segment fit to replace its range, else CorruptRecordError.

        A ``.swap`` is the log cleaner's output for a group of consecutive
        segments, named after the first of them: every batch valid (CRC,
        framing, no torn tail), offsets increasing and at or above its name's
        base offset, nothing below the end of the segment kept before it,
        nothing beyond the end of the segments it replaces, and no overlap with
        another ``.swap``.  Anything else (random bytes, another segment's copy)
        would lose or duplicate records if installed.
        """
        base = segment.base_offset
        first: int | None = None
        next_offset = base
        size = segment.file_size()
        for pos, header, buf, off in segment._batches_with_bytes(0, size):
            try:
                validate_batch(buf, off)
            except CorruptRecordError as exc:
                raise exc.at(segment.log_path, pos) from None
            if header.base_offset < next_offset:
                raise CorruptRecordError(f"batch base offset {header.base_offset} is below "
                                         f"{'its name' if first is None else 'the previous batch'}'s "
                                         f"offset {next_offset}", path=segment.log_path, position=pos)
            if header.base_offset + header.last_offset_delta - base > 0x7FFFFFFF:
                raise CorruptRecordError(f"batch offset {header.base_offset} does not fit in a segment based at "
                                         f"{base}", path=segment.log_path, position=pos)
            if first is None:
                first = header.base_offset
            next_offset = header.next_offset
        first = base if first is None else first
        before = [b for b in bases if b < base]
        if before:
            previous_end = self._next_offset_of(before[-1])
            if previous_end > first:
                raise CorruptRecordError(f"its first offset {first} is below the end {previous_end} of the segment "
                                         f"{before[-1]} it does not replace", path=segment.log_path, position=0)
        replaced = [b for b in bases if base <= b < next_offset]
        if replaced:
            replaced_end = self._next_offset_of(replaced[-1])
            if next_offset > replaced_end:
                raise CorruptRecordError(f"it holds offsets up to {next_offset - 1}, beyond the last offset "
                                         f"{replaced_end - 1} of the segments it replaces",
                                         path=segment.log_path, position=0)
        for lo, hi in accepted:
            if first < hi and lo < next_offset:
                raise CorruptRecordError(f"its offsets {first}..{next_offset - 1} overlap another .swap file's "
                                         f"{lo}..{hi - 1}", path=segment.log_path, position=0)
        return first, next_offset

    def _complete_swap_operations(self, swap_files: list[str]) -> None:
        """Kafka's swap completion, with each ``.swap`` validated before it replaces anything.

        A ``.swap`` that fails validation is not installed and its range keeps
        its segments; it is left on disk untouched for the operator (ERROR).
        """
        bases = self._segment_bases()
        accepted: list[tuple[int, int]] = []
        installed: list[tuple[str, int, int]] = []
        for path in sorted(swap_files):
            if not path[:-len(SWAP_FILE_SUFFIX)].endswith(LOG_FILE_SUFFIX):
                continue
            base = offset_from_file_name(path)
            # Opened read-only to validate: a missing .index.swap is not created empty
            # (the loader rebuilds it after the rename, or in memory when read-only).
            segment = self._open(base, SWAP_FILE_SUFFIX, read_only=True)
            try:
                first, next_offset = self._validate_swap(segment, bases, accepted)
            except (CorruptRecordError, StorageError) as exc:
                segment.close_handlers()
                logger.error(self._prefix + "Not installing %s left by an interrupted log cleaner swap: %s. "
                             "The segments it would replace are kept; remove the file once you have checked it.",
                             path, exc)
                continue
            logger.info(self._prefix + "Found log file %s from interrupted swap operation, which is "
                        "recoverable from %s files by renaming.", path, SWAP_FILE_SUFFIX)
            accepted.append((first, next_offset))
            installed.append((path, base, next_offset))
            if self.read_only:
                self._swapped_in_memory[base] = (segment, next_offset)
            else:
                segment.close_handlers()
        if self.read_only:
            return              # _load_segment_files puts them in place of their range
        for _path, base, next_offset in installed:
            # The segments the swap replaces were cleaned but not yet renamed .deleted.
            for name in self._files():
                if name.endswith(SWAP_FILE_SUFFIX):
                    continue
                try:
                    offset = offset_from_file_name(name)
                except ValueError:
                    continue
                if base <= offset < next_offset and name.endswith(_OWN_SEGMENT_FILE_SUFFIXES):
                    logger.info(self._prefix + "Deleting segment files %s that is compacted but has not "
                                "been deleted yet.", name)
                    unlink_if_exists(os.path.join(self.dir, name))
        self._installed_from_swap.update(base for _, base, _ in installed)
        installed_logs = {os.path.basename(path)[:-len(SWAP_FILE_SUFFIX)] for path, _, _ in installed}
        for name in self._files():
            if name.endswith(SWAP_FILE_SUFFIX):
                stem = name[:-len(SWAP_FILE_SUFFIX)]
                try:
                    log_name = filename_prefix_from_offset(offset_from_file_name(stem)) + LOG_FILE_SUFFIX
                except ValueError:
                    continue
                if log_name not in installed_logs:
                    continue
                logger.info(self._prefix + "Recovering file %s by renaming from %s files.", name, SWAP_FILE_SUFFIX)
                path = os.path.join(self.dir, name)
                os.replace(path, path[:-len(SWAP_FILE_SUFFIX)])

    # ------------------------------------------------------------ segments
    def _load_segment_files(self) -> None:
        files = self._files()
        bases = self._segment_bases()
        swapped = self._swapped_in_memory
        # Segments a read-only load sees replaced by a valid .swap (in memory only).
        hidden = {b for b in bases for base, (_, nxt) in swapped.items() if base <= b < nxt}
        # Without a clean shutdown, _recover_log rebuilds the indexes of every segment from
        # the one holding the recovery point: checking them first would only warn about
        # the preallocated index a crash leaves behind (a normal state) and rebuild twice.
        recover_from = None
        if not self.had_clean_shutdown and bases:
            below = [b for b in bases if b <= self.recovery_point_checkpoint]
            recover_from = below[-1] if below else bases[0]
        last_base = max([b for b in bases if b not in hidden] + list(swapped), default=None)
        for name in files:
            path = os.path.join(self.dir, name)
            # Kafka's .txnindex and .snapshot files are left alone, orphaned or not (they
            # are Kafka's, logfs writes neither); only our own orphaned indexes go.
            if name.endswith((INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)):
                try:
                    offset = offset_from_file_name(name)
                except ValueError:
                    continue
                if not os.path.lexists(log_file_path(self.dir, offset)) and not self.read_only:
                    logger.warning(self._prefix + "Found an orphaned index file %s, with no corresponding "
                                   "log file.", path)
                    unlink_if_exists(path)
            elif name.endswith(LOG_FILE_SUFFIX):
                try:
                    base = offset_from_file_name(name)
                except ValueError:
                    continue
                if base in hidden:
                    continue
                # Before opening: a read-write open creates a missing index (empty).
                missing = [p for p in (offset_index_file_path(self.dir, base), time_index_file_path(self.dir, base))
                           if not os.path.lexists(p)]
                segment = self._open(base)
                self.segments[base] = segment
                self._check_segment(segment, recover_from, base == last_base, missing)
        for base, (segment, _) in swapped.items():
            self.segments[base] = segment
            missing = [segment.offset_index.path] if segment.indexes_missing else []
            self._check_segment(segment, recover_from, base == last_base, missing)

    def _check_segment(self, segment: LogSegment, recover_from: int | None, is_last: bool,
                       missing: list[str]) -> None:
        """Rebuild a missing index, or one that fails its sanity check or disagrees with the log."""
        base = segment.base_offset
        if recover_from is not None and base >= recover_from:
            return                        # recovered (indexes rebuilt) by _recover_log
        if missing:
            # A crash inside the cleaner's swap (between the renames of a segment's .log and
            # its indexes) leaves exactly this: a normal recovery, not damage (issue 18).
            expected = base in self._installed_from_swap or base in self._swapped_in_memory
            logger.log(logging.INFO if expected else logging.ERROR,
                       self._prefix + "Could not find index file %s corresponding to log file %s%s, "
                       "recovering segment and rebuilding index files%s...", missing[0], segment.log_path,
                       " (installed from an interrupted log cleaner swap)" if expected else "",
                       " in memory (read-only)" if self.read_only else "")
            self._recover_segment(segment, truncate=is_last)
            return
        try:
            segment.sanity_check()
            check_index_against_log(segment)
        except CorruptIndexError as exc:
            logger.warning(self._prefix + "Found a corrupted index file corresponding to log file %s due to %s, "
                           "recovering segment and rebuilding index files%s...", segment.log_path, exc,
                           " in memory (read-only)" if self.read_only else "")
            self._recover_segment(segment, truncate=is_last)

    def _recover_segment(self, segment: LogSegment, truncate: bool = True, report: bool = True) -> int:
        try:
            truncated = segment.recover(truncate=truncate, in_memory=self.read_only, report=report)
            if not self.read_only:
                # The rebuilt indexes and a truncated tail are durable before the recovery
                # point can move past them: a power loss must not bring the damage back.
                segment.flush()
            return truncated
        except (LogfsError, OSError) as exc:
            if self.read_only:
                raise self._needs_recovery(f"recovering {segment.log_path} failed ({exc})") from exc
            # Kafka: InvalidOffsetException/IOException while rebuilding -> start the segment over.
            logger.warning(self._prefix + "Found invalid offset during recovery. Deleting the corrupt segment "
                           "and creating an empty one with starting offset %d (%s)", segment.base_offset, exc)
            return segment.truncate_to(segment.base_offset)

    def _recover_log(self) -> tuple[int, int]:
        if not self.had_clean_shutdown:
            segments = list(self.segments.values())
            first = max(self.segments.bisect_right(self.recovery_point_checkpoint) - 1, 0)
            unflushed = segments[first:]
            for i, segment in enumerate(unflushed):
                logger.info(self._prefix + "Recovering unflushed segment %d. %d/%d recovered for %s.",
                            segment.base_offset, i, len(unflushed), self.topic_partition)
                truncated = self._recover_segment(segment)
                if truncated > 0:
                    logger.warning(self._prefix + "Corruption found in segment %d, truncating to offset %d%s",
                                   segment.base_offset, segment.next_offset,
                                   " (in memory: read-only)" if self.read_only else "")
                    self._remove_and_delete_segments(unflushed[i + 1:])
                    break
        elif self.segments:
            self._validate_active_segment_tail()
        log_end = self._delete_segments_if_log_start_greater_than_log_end()
        if not self.segments:
            if self.read_only:
                raise self._needs_recovery("it has no log segment")
            start = self.log_start_offset_checkpoint
            self.segments[start] = self._open(start, exists=False)
        if self.had_clean_shutdown and log_end is not None:
            return log_end, log_end
        if log_end is None:
            log_end = self.segments.peekitem(-1)[1].next_offset
        return min(self.recovery_point_checkpoint, log_end), log_end

    def _validate_active_segment_tail(self) -> None:
        """After a clean shutdown, check where the next append goes before trusting the marker.

        The marker says every segment was flushed and closed; a segment damaged
        or cut short afterwards (a partial copy, a disk fault) would take
        appends behind a torn batch that no reader gets past, and a later
        recovery would drop them and hand their offsets out again.  The active
        segment's tail is CRC-checked; if it fails, the segment is recovered as
        after a crash (truncated at the first invalid batch; in memory when
        read-only).
        """
        segment = self.segments.peekitem(-1)[1]
        try:
            validate_tail(segment)
        except CorruptRecordError as exc:
            truncated = self._recover_segment(segment, report=False)
            logger.warning(self._prefix + "The active segment %s is damaged despite the clean shutdown marker "
                           "(%s at byte %d): recovered it as after a crash, %d invalid bytes %s, log end offset %d",
                           segment.log_path, exc.detail, exc.position, truncated,
                           "left out in memory (read-only)" if self.read_only else "truncated",
                           segment.next_offset)

    def _delete_segments_if_log_start_greater_than_log_end(self) -> int | None:
        if not self.segments:
            return None
        log_end: int = self.segments.peekitem(-1)[1].next_offset
        if log_end >= self.log_start_offset_checkpoint:
            return log_end
        # Kafka deletes every segment here (a follower refetches them from the
        # leader).  On a single node there is no leader: a start beyond the end
        # can only be damage (a corrupt checkpoint, lost segment files), and
        # deleting would lose every record.  Keep the data, start at the log's own start.
        first_base = self.segments.peekitem(0)[0]
        logger.error(self._prefix + "The checkpointed log start offset %d is beyond the log end offset %d: "
                     "the log-start-offset-checkpoint or the segment files are damaged. Keeping every segment "
                     "and starting the log at its first segment's base offset %d.",
                     self.log_start_offset_checkpoint, log_end, first_base)
        self.log_start_offset_checkpoint = first_base
        return log_end

    def _remove_and_delete_segments(self, segments: Sequence[LogSegment]) -> None:
        if not segments:
            return
        if self.read_only:
            logger.info(self._prefix + "Leaving out segments as part of log recovery (read-only, in memory): %s",
                        ", ".join(map(repr, segments)))
            for segment in segments:
                del self.segments[segment.base_offset]
                segment.close_handlers()
            return
        logger.info(self._prefix + "Deleting segments as part of log recovery: %s",
                    ", ".join(map(repr, segments)))
        due = self.clock.milliseconds() + self.config.file_delete_delay_ms
        for segment in segments:
            del self.segments[segment.base_offset]
            segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
            self.pending.append(PendingDeletion(due, DeletedSegmentFiles(segment)))
