"""Kafka's ``RemoteLogManager``: copies a log's closed segments to the store and serves them back.

For each log whose topic has ``remote.storage.enable=true`` (the caller says
which: :meth:`RemoteLogManager.copy_log_segments` is given the log and its
:class:`~engine.remote.storage.TopicIdPartition`):

* **copy** (Kafka's ``RLMCopyTask``): every closed segment above the highest
  offset already copied, in offset order, never the active one.  Each copy is
  recorded COPY_SEGMENT_STARTED before its first object is written and
  COPY_SEGMENT_FINISHED after its last (``engine.remote.metadata``); a copy
  that fails part-way (the store down, the segment deleted under it) is
  abandoned at once (DELETE_SEGMENT_STARTED, its objects deleted, FINISHED)
  and tried again at the next round.
* **unfinished copies** (a crash): :meth:`RemoteLogManager.clean_up_unfinished`
  finishes what the metadata says was under way: a copy without FINISHED is
  deleted, a deletion without FINISHED is deleted again; objects of the
  partition that the metadata does not know at all (a copy whose STARTED was
  the last event written before a power loss that the store kept) are
  deleted too.  Then the store holds exactly the finished copies.
* **remote retention**: :meth:`RemoteLogManager.delete_remote_segments_below`
  deletes every copy wholly below an offset (the log start moved by retention
  or DeleteRecords), :meth:`RemoteLogManager.delete_partition` every copy of a
  partition whose topic was deleted.
* **fetch**: :meth:`RemoteLogManager.read` returns the bytes of the copied
  batches from an offset on (the copy's offset index from the store, then its
  ``.log`` through the chunk cache).

A copy reads the segment's files by name while the log goes on; nothing here
takes the log's lock.  Calls of one partition must not run concurrently (the
caller's background task runs them one partition at a time); reads may run
at any time.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from engine.clock import SYSTEM_CLOCK, Clock
from engine.remote.metadata import RemoteLogMetadataManager, RemoteLogSegmentMetadata, RemoteLogSegmentState
from engine.remote.storage import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteStorageError,
    RemoteStorageManager,
    TopicIdPartition,
)

if TYPE_CHECKING:
    from engine.log import Log
    from engine.remote.chunk_cache import RemoteChunkCache
    from engine.segment import LogSegment

logger = logging.getLogger(__name__)

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

_OFFSET_ENTRY = struct.Struct(">ii")     # relative offset, position: the offset index's entries
#: offset indexes of copies kept in memory for reads (each at most segment.index.bytes)
_INDEX_CACHE_ENTRIES = 64


def leader_epoch_entries(segment: LogSegment) -> dict[int, int]:
    """Each leader epoch of the segment's batches and the first offset it starts at (Kafka's
    ``leader-epoch-checkpoint`` entries of the segment)."""
    entries: dict[int, int] = {}
    last_epoch = None
    for _, header in segment.batches():
        if header.partition_leader_epoch != last_epoch:
            last_epoch = header.partition_leader_epoch
            entries.setdefault(last_epoch, header.base_offset)
    return entries


def leader_epoch_checkpoint(entries: dict[int, int]) -> bytes:
    """The entries in Kafka's ``leader-epoch-checkpoint`` format (version 0, count, ``epoch offset`` lines)."""
    lines = ["0", str(len(entries))] + [f"{epoch} {offset}" for epoch, offset in sorted(entries.items())]
    return ("\n".join(lines) + "\n").encode()


class RemoteLogManager:
    """Copies, deletes and reads the remote segments of tiered logs; see the module docstring."""

    def __init__(self, storage: RemoteStorageManager, metadata: RemoteLogMetadataManager,
                 cache: RemoteChunkCache, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.storage = storage
        self.metadata = metadata
        self.cache = cache
        self.clock = clock
        self._indexes: OrderedDict[RemoteLogSegmentId, bytes] = OrderedDict()
        self._indexes_lock = threading.Lock()
        #: counters for ``.logfs/metrics``
        self.copied_segments = 0
        self.copied_bytes = 0
        self.copy_errors = 0
        self.deleted_segments = 0

    # ------------------------------------------------------------------ copy
    def copy_log_segments(self, log: Log, tip: TopicIdPartition) -> int:
        """Copy every closed segment above the highest copied offset; returns how many were copied.

        Stops at the first copy that fails (RemoteStorageError is logged and
        counted, not raised: the next round tries again from there).
        """
        highest = self.metadata.highest_copied_offset(tip)
        segments = list(log.segments.values())[:-1]       # never the active segment
        copied = 0
        for segment in segments:
            end_offset = segment.next_offset - 1
            if end_offset <= highest or segment.size == 0:
                continue
            try:
                self._copy(segment, tip, end_offset)
            except (RemoteStorageError, OSError) as exc:
                self.copy_errors += 1
                logger.warning("Copying log segment %s of %s to remote storage %s failed (tried again at the next "
                               "round): %s", segment.base_offset, tip, self.storage.uri, exc)
                break
            copied += 1
        return copied

    def _copy(self, segment: LogSegment, tip: TopicIdPartition, end_offset: int) -> None:
        epochs = leader_epoch_entries(segment)
        segment_id = RemoteLogSegmentId.generate(tip, segment.base_offset)
        metadata = RemoteLogSegmentMetadata(segment_id, segment.base_offset, end_offset,
                                            segment.largest_timestamp, segment.size, self.clock.milliseconds(),
                                            STARTED, epochs)
        self.metadata.add(metadata)
        data = LogSegmentData(segment.log_path, segment.offset_index.path, segment.time_index.path, None, None,
                              leader_epoch_checkpoint(epochs))
        try:
            self.storage.copy_log_segment_data(segment_id, data)
        except BaseException:
            self._abandon(segment_id)
            raise
        self.metadata.update_state(segment_id, FINISHED, self.clock.milliseconds())
        self.copied_segments += 1
        self.copied_bytes += segment.size
        logger.info("Copied log segment %d..%d of %s to remote storage %s as %s (%d bytes)", segment.base_offset,
                    end_offset, tip, self.storage.uri, segment_id.id, segment.size)

    def _abandon(self, segment_id: RemoteLogSegmentId) -> None:
        """A copy that failed part-way: recorded as deleted once its objects are (best effort now; the
        next :meth:`clean_up_unfinished` finishes it if the store is down)."""
        try:
            self._delete(segment_id)
        except (RemoteStorageError, OSError) as exc:
            logger.debug("Could not remove the objects of the abandoned copy %s yet: %s", segment_id, exc)

    # ---------------------------------------------------------------- delete
    def _delete(self, segment_id: RemoteLogSegmentId) -> None:
        """DELETE_SEGMENT_STARTED (unless already), the objects, DELETE_SEGMENT_FINISHED."""
        state = self.metadata.state_of(segment_id)
        if state is not None and state is not DELETE_STARTED:
            self.metadata.update_state(segment_id, DELETE_STARTED, self.clock.milliseconds())
        self.storage.delete_log_segment_data(segment_id)
        self.cache.forget(lambda s: s == segment_id)
        with self._indexes_lock:
            self._indexes.pop(segment_id, None)
        if state is not None:
            self.metadata.update_state(segment_id, DELETE_FINISHED, self.clock.milliseconds())
        self.deleted_segments += 1

    def clean_up_unfinished(self, tip: TopicIdPartition) -> int:
        """Delete the copies a crash left unfinished and the objects no metadata knows; returns how many."""
        done = 0
        for metadata in self.metadata.unfinished(tip):
            self._delete(metadata.segment_id)
            logger.info("Deleted the %s copy %s of %s left by a crash", metadata.state.value, metadata.segment_id.id,
                        tip)
            done += 1
        known = self.metadata.known_ids(tip)
        for orphan in sorted(self.storage.list_segment_ids(tip) - known):
            self._delete(orphan)
            logger.info("Deleted orphaned remote log segment %s of %s (no metadata names it)", orphan.id, tip)
            done += 1
        return done

    def delete_remote_segments_below(self, tip: TopicIdPartition, offset: int) -> int:
        """Delete every finished copy whose last offset is below ``offset`` (remote retention)."""
        done = 0
        for metadata in self.metadata.copied_segments(tip):
            if metadata.end_offset < offset:
                self._delete(metadata.segment_id)
                done += 1
        return done

    def delete_partition(self, tip: TopicIdPartition) -> int:
        """Delete every copy of the partition (its topic was deleted)."""
        done = self.clean_up_unfinished(tip)
        for metadata in self.metadata.copied_segments(tip):
            self._delete(metadata.segment_id)
            done += 1
        return done

    # ----------------------------------------------------------------- fetch
    def _offset_index(self, segment_id: RemoteLogSegmentId) -> bytes:
        with self._indexes_lock:
            index = self._indexes.get(segment_id)
            if index is not None:
                self._indexes.move_to_end(segment_id)
                return index
        index = self.storage.fetch_index(segment_id, IndexType.OFFSET)
        with self._indexes_lock:
            self._indexes[segment_id] = index
            while len(self._indexes) > _INDEX_CACHE_ENTRIES:
                self._indexes.popitem(last=False)
        return index

    def position_of(self, metadata: RemoteLogSegmentMetadata, offset: int) -> int:
        """The position in the copy's ``.log`` of the largest indexed offset at or below ``offset``."""
        index = self._offset_index(metadata.segment_id)
        relative = offset - metadata.start_offset
        lo, hi, position = 0, len(index) // _OFFSET_ENTRY.size - 1, 0
        while lo <= hi:
            mid = (lo + hi) // 2
            entry_offset, entry_position = _OFFSET_ENTRY.unpack_from(index, mid * _OFFSET_ENTRY.size)
            if entry_offset <= relative:
                position, lo = entry_position, mid + 1
            else:
                hi = mid - 1
        return int(position)

    def read(self, tip: TopicIdPartition, offset: int, max_bytes: int) -> tuple[RemoteLogSegmentMetadata, int, bytes]:
        """(the copy holding ``offset``, the position read from, up to ``max_bytes`` of its ``.log`` from the
        indexed batch at or below ``offset``).

        RemoteStorageError (ENOENT) when no finished copy holds ``offset``, or the store's error.
        """
        metadata = self.metadata.segment_for_offset(tip, offset)
        if metadata is None:
            raise RemoteStorageError(f"No remote log segment of {tip} holds offset {offset}")
        position = self.position_of(metadata, offset)
        data = self.cache.read(metadata.segment_id, position, max_bytes, metadata.segment_size_bytes)
        return metadata, position, data
