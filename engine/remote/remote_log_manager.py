"""Kafka's ``RemoteLogManager``: copies a log's closed segments to the store and serves them back.

For each log whose topic has ``remote.storage.enable=true`` (the caller says
which: :meth:`RemoteLogManager.copy_log_segments` is given the log and its
:class:`~engine.remote.storage.TopicIdPartition`):

* **copy** (Kafka's ``RLMCopyTask``): every closed segment above the highest
  offset already copied and at or below the recovery point (flushed: a copy
  never holds bytes a crash could still take back), in offset order, never
  the active one.  Each copy is
  recorded COPY_SEGMENT_STARTED before its first object is written and
  COPY_SEGMENT_FINISHED after its last (``engine.remote.metadata``); a copy
  that fails part-way (the store down, the segment deleted under it) is
  abandoned at once (DELETE_SEGMENT_STARTED, its objects deleted, FINISHED)
  and tried again at the next round.  Each copy carries Kafka's transaction
  index of the segment and the producer snapshot at its end, built by one walk
  of its transactional batches from the producers at its start (the previous
  copy's, kept in memory or read back from its snapshot:
  :meth:`RemoteLogManager._producers_at`); its metadata records how many
  aborted transactions the index lists.
* **unfinished copies** (a crash): :meth:`RemoteLogManager.clean_up_unfinished`
  finishes what the metadata says was under way: a copy without FINISHED is
  deleted, a deletion without FINISHED is deleted again; objects of the
  partition that the metadata does not know at all (a copy whose STARTED was
  the last event written before a power loss that the store kept) are
  deleted too.  Then the store holds exactly the finished copies.
* **remote retention**: :meth:`RemoteLogManager.delete_remote_segments_below`
  deletes every copy wholly below an offset (the log start moved by retention
  or DeleteRecords), ``file.delete.delay.ms`` after a round first found it
  there, as a local segment's files stay that long once renamed ``.deleted``:
  a view that opened the copy reads on meanwhile (a read of a deleted copy
  fails with ENOENT); :meth:`RemoteLogManager.delete_partition` every copy of a
  partition whose topic was deleted; :meth:`RemoteLogManager.delete_superseded_segments`,
  with the same delay, a copy that a longer copy of its base offset superseded
  (a segment that grew again after a power loss took its roll:
  ``engine.remote.metadata.serving_copies``).
* **fetch**: :meth:`RemoteLogManager.read` returns the bytes of the copied
  batches from an offset on (the copy's offset index from the store, then its
  ``.log`` through the chunk cache); :meth:`RemoteLogManager.transaction_index`
  and :meth:`RemoteLogManager.producer_snapshot` what the read_committed walk
  takes instead of the copy's batches (engine.transactions).

* **the round** (:meth:`RemoteLogManager.run_once`, the mount's background
  task ``kafka-remote-log-manager``): for every partition, the clean-up of
  what a crash left (once, at the first round that reaches the store), the
  copies of remote-enabled partitions, and the deletion of copies below the
  log start offset and of every copy of a partition that is gone.  While the
  store fails, rounds back off (doubling from the task's interval to
  :data:`MAX_BACKOFF_MS`) and the failure is logged once, and once more when
  the store answers again.

A copy reads the segment's files by name while the log goes on; nothing here
takes the log's lock.  Calls of one partition must not run concurrently (the
caller's background task runs them one partition at a time); reads may run
at any time.

On disk, beside the partition dirs of the first log dir: ``remote-log/``
(:data:`REMOTE_LOG_DIR`, skipped by the scan for partitions), holding the
metadata log ``__remote_log_metadata-0`` and the chunk cache ``chunk-cache``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from crc32c import crc32c

from engine.clock import SYSTEM_CLOCK, Clock
from engine.config import LogConfig
from engine.errors import CorruptRecordError, StorageError
from engine.files import fsync_dir, view_index_file_path
from engine.log_dirs import REMOTE_LOG_DIR
from engine.remote.metadata import RemoteLogMetadataManager, RemoteLogSegmentMetadata, RemoteLogSegmentState
from engine.remote.storage import IndexType, LogSegmentData, RemoteLogSegmentId, RemoteStorageError
from engine.transactions import (
    PRODUCER_ID_EXPIRATION_MS,
    ProducerEntry,
    ProducerStateWalk,
    TxnIndexEntry,
    decode_producer_snapshot,
    decode_txn_index,
    encode_producer_snapshot,
    encode_txn_index,
    producer_state_at,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.remote.chunk_cache import RemoteChunkCache
    from engine.remote.storage import RemoteStorageManager, TopicIdPartition
    from engine.segment import LogSegment

from engine.log import Log

logger = logging.getLogger(__name__)

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

_OFFSET_ENTRY = struct.Struct(">ii")     # relative offset, position: the offset index's entries
#: offset indexes of copies kept in memory for reads (each at most segment.index.bytes)
_INDEX_CACHE_ENTRIES = 64
#: the longest wait between two rounds while the store fails
MAX_BACKOFF_MS = 30_000

#: the metadata log (Kafka's ``__remote_log_metadata`` topic, here a log of logfs's own), in REMOTE_LOG_DIR
METADATA_LOG_DIR = "__remote_log_metadata-0"
#: the chunk cache's directory, in REMOTE_LOG_DIR
CHUNK_CACHE_DIR = "chunk-cache"
#: the persisted view indexes of copies (engine.views.persisted), in REMOTE_LOG_DIR
VIEW_INDEX_DIR = "view-index"
#: the metadata log's segments: a few hundred bytes per event, four events per copy
_METADATA_LOG_CONFIG = LogConfig(segment_bytes=16 << 20, segment_index_bytes=1 << 20, retention_ms=-1,
                                 compression_type="uncompressed")


@dataclass(frozen=True)
class TieredPartition:
    """A live partition as one round sees it: its log, its ``TopicIdPartition``, whether it copies."""

    log: Log
    tip: TopicIdPartition
    remote_storage_enable: bool


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
        self._indexes: OrderedDict[tuple[RemoteLogSegmentId, IndexType], bytes] = OrderedDict()
        self._indexes_lock = threading.Lock()
        #: counters for ``.logfs/metrics``
        self.copied_segments = 0
        self.copied_bytes = 0
        self.copy_errors = 0
        self.deleted_segments = 0
        #: failures of the store in the rounds (copies, deletions, listings)
        self.errors = 0
        #: why the store failed the last round (None: it answered)
        self.unavailable: str | None = None
        #: the store failed and has not answered a whole round since (logged once, at its start)
        self.outage = False
        self._backoff_ms = 0
        self._retry_at_ms = 0
        #: partitions whose crash leftovers were cleaned up (once per mount, before their first copy)
        self._cleaned: set[TopicIdPartition] = set()
        #: copies a round found wholly below their partition's log start, or superseded, and when (the clock's
        #: ms): deleted ``file.delete.delay.ms`` later (in memory: a new mount waits the delay again)
        self._deletable_since: dict[RemoteLogSegmentId, int] = {}
        #: the metadata log, when this manager opened it (closed with it)
        self._metadata_log: Log | None = None
        #: where the view indexes of copies are kept (engine.views.persisted); None: not kept
        self.view_index_root: str | None = None
        #: per partition, the producers after its last copy (its next offset, the producers): the start of the
        #: next copy's producer snapshot (engine.transactions.ProducerStateWalk)
        self._producer_states: dict[TopicIdPartition, tuple[int, list[ProducerEntry]]] = {}

    # ------------------------------------------------------------------ copy
    def copy_log_segments(self, log: Log, tip: TopicIdPartition) -> int:
        """Copy every closed segment above the highest copied offset; returns how many were copied.

        Stops at the first copy that fails (RemoteStorageError is logged and
        counted, not raised: the next round tries again from there).
        """
        copied = 0
        for segment in self.segments_to_copy(log, tip):
            try:
                self._copy(log, segment, tip, segment.next_offset - 1)
            except (RemoteStorageError, OSError) as exc:
                self.copy_errors += 1
                self._store_failed(f"copying log segment {segment.base_offset} of {tip}", exc)
                break
            copied += 1
        return copied

    def segments_to_copy(self, log: Log, tip: TopicIdPartition) -> list[LogSegment]:
        """The closed, flushed, non-empty segments above the highest offset copied (Kafka's copy candidates)."""
        highest = self.metadata.highest_copied_offset(tip)
        recovery_point = log.recovery_point
        return [s for s in list(log.segments.values())[:-1]        # never the active segment
                if s.next_offset - 1 > highest and s.next_offset <= recovery_point and s.size > 0]

    def copy_lag(self, log: Log, tip: TopicIdPartition) -> tuple[int, int]:
        """(segments, bytes) waiting to be copied (Kafka's ``RemoteCopyLagSegments`` and ``...LagBytes``)."""
        waiting = self.segments_to_copy(log, tip)
        return len(waiting), sum(s.size for s in waiting)

    def _store_failed(self, what: str, exc: BaseException) -> None:
        """Log the first failure of an outage as a WARNING; the rest of it at DEBUG (one line, not thousands)."""
        self.errors += 1
        if not self.outage:
            self.outage = True
            logger.warning("Remote storage %s failed %s: %s; tiered storage backs off and tries again (the log "
                           "says when it answers)", self.storage.uri, what, exc)
        else:
            logger.debug("Remote storage %s still failing (%s): %s", self.storage.uri, what, exc)
        self.unavailable = str(exc)

    def _copy(self, log: Log, segment: LogSegment, tip: TopicIdPartition, end_offset: int) -> None:
        epochs = leader_epoch_entries(segment)
        # Kafka's transaction index of the segment and its producer snapshot at the segment's end
        aborted: list[TxnIndexEntry] = []
        walk = ProducerStateWalk(self._producers_at(log, tip, segment.base_offset), segment.base_offset,
                                 on_aborted=aborted.append)
        walk.walk(segment)
        walk.skip_to(segment.next_offset)
        walk.expire(segment.largest_timestamp - PRODUCER_ID_EXPIRATION_MS)
        producers = list(walk.producers.values())
        segment_id = RemoteLogSegmentId.generate(tip, segment.base_offset)
        # the index objects are the closed segment's index files (trimmed at its roll): their sizes and the
        # offset index's CRC let ``segments/`` size the copy's files, and a kept view index be bound to the
        # copy, without a request to the store
        with open(segment.offset_index.path, "rb") as f:
            offset_index = f.read()
        metadata = RemoteLogSegmentMetadata(segment_id, segment.base_offset, end_offset,
                                            segment.largest_timestamp, segment.size, self.clock.milliseconds(),
                                            STARTED, epochs, len(aborted), len(offset_index),
                                            os.path.getsize(segment.time_index.path), crc32c(offset_index))
        self.metadata.add(metadata)
        data = LogSegmentData(segment.log_path, segment.offset_index.path, segment.time_index.path,
                              encode_txn_index(aborted), encode_producer_snapshot(producers),
                              leader_epoch_checkpoint(epochs))
        try:
            self.storage.copy_log_segment_data(segment_id, data)
        except BaseException:
            self._abandon(segment_id)
            raise
        self.metadata.update_state(segment_id, FINISHED, self.clock.milliseconds())
        self._producer_states[tip] = (segment.next_offset, producers)
        self._keep_view_index(segment, segment_id)
        self.copied_segments += 1
        self.copied_bytes += segment.size
        logger.info("Copied log segment %d..%d of %s to remote storage %s as %s (%d bytes)", segment.base_offset,
                    end_offset, tip, self.storage.uri, segment_id.id, segment.size)

    def _producers_at(self, log: Log, tip: TopicIdPartition, offset: int) -> list[ProducerEntry]:
        """The producers at ``offset``, the base offset of the segment to copy: those after the last copy when
        it ended there, else the snapshot of the finished copy that ends there (one GET), else a walk of the
        log below it (from the last copy with a snapshot: engine.transactions.producer_state_at)."""
        kept = self._producer_states.get(tip)
        if kept is not None and kept[0] == offset:
            return kept[1]
        for metadata in reversed(self.metadata.copied_segments(tip)):
            if metadata.end_offset + 1 == offset and metadata.has_transaction_index:
                try:
                    return self.producer_snapshot(metadata)
                except CorruptRecordError as exc:
                    logger.warning("%s; the producers at offset %d of %s are found by a walk of the log instead",
                                   exc, offset, tip)
                break
        try:
            return list(producer_state_at(log.reader_segments(), offset).producers.values())
        except StorageError as exc:     # a read of a copy below the local log start (RemoteReadError): the store
            raise RemoteStorageError(str(exc), exc.errno) from exc

    def _keep_view_index(self, segment: LogSegment, segment_id: RemoteLogSegmentId) -> None:
        """The local segment's ``.viewindex`` (written at its roll), kept for the copy: the first view of it
        once the local segment is gone is then sized without fetching it (engine.views.persisted validates
        the file against the copy as against a local segment).  Best effort: without it, one scan."""
        directory = self.view_index_dir(segment_id)
        if directory is None:
            return
        source = view_index_file_path(os.path.dirname(segment.log_path), segment.base_offset)
        try:
            shutil.copyfile(source, view_index_file_path(directory, segment.base_offset))
        except OSError:
            pass            # not written (yet): the first view of the copy scans it

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
        self._deletable_since.pop(segment_id, None)
        self.cache.forget(lambda s: s == segment_id)
        with self._indexes_lock:
            for index_type in IndexType:
                self._indexes.pop((segment_id, index_type), None)
        if self.view_index_root is not None:
            from engine.views import persisted  # the views' file, kept here for the copy
            partition = os.path.join(self.view_index_root, segment_id.partition_dir.replace("/", "-"))
            persisted.remove(os.path.join(partition, segment_id.id), segment_id.base_offset)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(partition, segment_id.id))
                os.rmdir(partition)             # the partition's last one (a deleted topic): its dir goes too
        if state is not None:
            self.metadata.update_state(segment_id, DELETE_FINISHED, self.clock.milliseconds())
        self.deleted_segments += 1

    def finish_unfinished(self, tip: TopicIdPartition) -> int:
        """Delete the copies the metadata says are unfinished (a crash, or a copy abandoned while the store
        failed and whose objects could not be deleted then); returns how many."""
        done = 0
        for metadata in self.metadata.unfinished(tip):
            self._delete(metadata.segment_id)
            logger.info("Deleted the %s copy %s of %s (left by a crash or a failed copy)", metadata.state.value,
                        metadata.segment_id.id, tip)
            done += 1
        return done

    def clean_up_unfinished(self, tip: TopicIdPartition) -> int:
        """Delete the copies a crash left unfinished and the objects no metadata knows; returns how many."""
        done = self.finish_unfinished(tip)
        known = self.metadata.known_ids(tip)
        for orphan in sorted(self.storage.list_segment_ids(tip) - known):
            self._delete(orphan)
            logger.info("Deleted orphaned remote log segment %s of %s (no metadata names it)", orphan.id, tip)
            done += 1
        return done

    def delete_remote_segments_below(self, tip: TopicIdPartition, offset: int, delay_ms: int = 0) -> int:
        """Delete every finished copy whose last offset is below ``offset`` (remote retention), ``delay_ms``
        after a call first found it there (``file.delete.delay.ms``: views that opened it read on meanwhile);
        returns how many were deleted."""
        return self._delete_after(
            [m for m in self.metadata.copied_segments(tip) if m.end_offset < offset], delay_ms)

    def delete_superseded_segments(self, tip: TopicIdPartition, delay_ms: int = 0) -> int:
        """Delete the finished copies a longer copy of their base offset superseded (``metadata.serving_copies``),
        ``delay_ms`` after a call first found them (views that opened one read on meanwhile); returns how many
        were deleted."""
        superseded = self.metadata.superseded_segments(tip)
        for metadata in superseded:
            if metadata.segment_id not in self._deletable_since:
                logger.info("Remote log segment %s (%d..%d) of %s is superseded by a longer copy of its base "
                            "offset (the segment grew again after a power loss took its roll); it is deleted in "
                            "%d ms (file.delete.delay.ms)", metadata.segment_id.id, metadata.start_offset,
                            metadata.end_offset, tip, delay_ms)
        return self._delete_after(superseded, delay_ms)

    def _delete_after(self, copies: Sequence[RemoteLogSegmentMetadata], delay_ms: int) -> int:
        done = 0
        now = self.clock.milliseconds()
        for metadata in copies:
            since = self._deletable_since.setdefault(metadata.segment_id, now)
            if now - since < delay_ms:
                continue
            self._delete(metadata.segment_id)
            done += 1
        return done

    def delete_partition(self, tip: TopicIdPartition) -> int:
        """Delete every copy of the partition (its topic was deleted)."""
        done = self.clean_up_unfinished(tip)
        self._producer_states.pop(tip, None)
        for metadata in self.metadata.copied_segments(tip) + self.metadata.superseded_segments(tip):
            self._delete(metadata.segment_id)
            done += 1
        return done

    # ----------------------------------------------------------------- round
    def run_once(self, partitions: Sequence[TieredPartition], interval_ms: int,
                 keep_topics: frozenset[str] = frozenset()) -> int:
        """One round over the live ``partitions``; returns the copies made and deleted.

        Skipped (0) while backing off after a failure of the store.  Copies of a
        partition that is not among ``partitions`` (its topic was deleted, or
        created again under a new topic id) are deleted, except for topics in
        ``keep_topics`` (on disk but not served: never touched).
        """
        if self.clock.milliseconds() < self._retry_at_ms:
            return 0
        self.unavailable = None
        done = 0
        try:
            done = self._round(partitions, keep_topics)
        except (RemoteStorageError, OSError) as exc:
            self._store_failed("a round of tiered storage", exc)
        if self.unavailable is not None:
            self._backoff_ms = min(max(interval_ms, 2 * self._backoff_ms), MAX_BACKOFF_MS)
            self._retry_at_ms = self.clock.milliseconds() + self._backoff_ms
        else:
            if self.outage:
                logger.info("Remote storage %s answers again: tiered storage resumes", self.storage.uri)
            self.outage = False
            self._backoff_ms = 0
        return done

    def _round(self, partitions: Sequence[TieredPartition], keep_topics: frozenset[str]) -> int:
        done = 0
        live = {p.tip for p in partitions}
        for tip in self.metadata.partitions():
            if tip not in live and tip.topic not in keep_topics:
                deleted = self.delete_partition(tip)
                if deleted:
                    logger.info("Deleted %d remote log segments of %s, whose topic was deleted", deleted, tip)
                self._cleaned.discard(tip)
                done += deleted
        for p in partitions:
            if p.tip not in self._cleaned and (p.remote_storage_enable or p.tip in self.metadata.partitions()):
                done += self.clean_up_unfinished(p.tip)       # once per mount: it lists the store
                self._cleaned.add(p.tip)
            else:
                # between two rounds no copy of the partition is under way: what is unfinished was abandoned
                done += self.finish_unfinished(p.tip)
            deleted = self.delete_remote_segments_below(p.tip, p.log.log_start_offset,
                                                        p.log.config.file_delete_delay_ms)
            done += self.delete_superseded_segments(p.tip, p.log.config.file_delete_delay_ms)
            if deleted:
                logger.info("Deleted %d remote log segments of %s below its log start offset %d", deleted,
                            p.tip, p.log.log_start_offset)
            done += deleted
            if p.remote_storage_enable:
                done += self.copy_log_segments(p.log, p.tip)
                if self.unavailable is not None:
                    break           # the store failed a copy: back off instead of failing every partition
        return done

    def remote_log_size(self, tip: TopicIdPartition) -> tuple[int, int, int]:
        """(copies, bytes, highest offset copied or -1) of the partition's finished copies."""
        copies = self.metadata.copied_segments(tip)
        return (len(copies), sum(m.segment_size_bytes for m in copies),
                max((m.end_offset for m in copies), default=-1))

    def close(self) -> None:
        """Stop the read-ahead, close the metadata log this manager opened and the store."""
        self.cache.close()
        if self._metadata_log is not None:
            self._metadata_log.close()
        self.storage.close()

    # ----------------------------------------------------------------- fetch
    def _index(self, segment_id: RemoteLogSegmentId, index_type: IndexType) -> bytes:
        key = (segment_id, index_type)
        with self._indexes_lock:
            index = self._indexes.get(key)
            if index is not None:
                self._indexes.move_to_end(key)
                return index
        index = self.storage.fetch_index(segment_id, index_type)
        with self._indexes_lock:
            self._indexes[key] = index
            while len(self._indexes) > _INDEX_CACHE_ENTRIES:
                self._indexes.popitem(last=False)
        return index

    def _offset_index(self, segment_id: RemoteLogSegmentId) -> bytes:
        return self._index(segment_id, IndexType.OFFSET)

    def offset_index(self, segment_id: RemoteLogSegmentId) -> bytes:
        """The copy's offset index (kept in memory for the last few indexes read)."""
        return self._index(segment_id, IndexType.OFFSET)

    def time_index(self, segment_id: RemoteLogSegmentId) -> bytes:
        """The copy's time index (kept in memory for the last few indexes read, as the offset indexes)."""
        return self._index(segment_id, IndexType.TIMESTAMP)

    def transaction_index(self, metadata: RemoteLogSegmentMetadata) -> list[TxnIndexEntry]:
        """The aborted transactions of the copy's ``.txnindex`` (kept in memory as the offset index is; an
        empty one is not fetched).  RemoteStorageError when the store fails, CorruptRecordError when the
        object is not a transaction index."""
        if metadata.transaction_index_entries <= 0:
            return []
        sid = metadata.segment_id
        return decode_txn_index(self._index(sid, IndexType.TRANSACTION),
                                f"{self.storage.uri}/{sid.object_name(IndexType.TRANSACTION.value)}")

    def producer_snapshot(self, metadata: RemoteLogSegmentMetadata) -> list[ProducerEntry]:
        """The producers of the copy's snapshot (at its end offset + 1), kept in memory as the offset index is."""
        sid = metadata.segment_id
        return decode_producer_snapshot(self._index(sid, IndexType.PRODUCER_SNAPSHOT),
                                        f"{self.storage.uri}/{sid.object_name(IndexType.PRODUCER_SNAPSHOT.value)}")

    def view_index_dir(self, segment_id: RemoteLogSegmentId) -> str | None:
        """The directory of the copy's persisted view index (one per copy, in one per partition: the file is
        bound to the copy by its id, and a copy never changes); None when none is kept."""
        if self.view_index_root is None:
            return None
        directory = os.path.join(self.view_index_root, segment_id.partition_dir.replace("/", "-"), segment_id.id)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            logger.warning("Cannot keep the view indexes of remote log segments in %s: %s", directory, exc.strerror)
            return None
        return directory

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


def open_remote_log_manager(storage: RemoteStorageManager, log_dirs: Sequence[str], *, cache_max_bytes: int,
                            chunk_bytes: int, clock: Clock = SYSTEM_CLOCK) -> RemoteLogManager:
    """The RemoteLogManager of a data dir: its metadata log and chunk cache in ``REMOTE_LOG_DIR``.

    The first log dir that already holds a ``REMOTE_LOG_DIR`` keeps it (the
    metadata of every copy made so far); otherwise it is made in the first.
    The metadata log's directory and ``REMOTE_LOG_DIR`` are fsynced into their
    parents before any event is recorded (a power loss keeps them, or the
    next mount would take every copy for an orphan).  The store is closed if
    anything here fails.
    """
    from engine.remote.chunk_cache import RemoteChunkCache
    from engine.remote.metadata import RemoteLogMetadataManager

    try:
        home = next((d for d in log_dirs if os.path.isdir(os.path.join(d, REMOTE_LOG_DIR))), log_dirs[0])
        root = os.path.join(home, REMOTE_LOG_DIR)
        metadata_log = Log.load(os.path.join(root, METADATA_LOG_DIR), _METADATA_LOG_CONFIG, clock=clock)
        try:
            # at every open, not only when made: a crash may have come between the mkdir and its fsync
            fsync_dir(root)
            fsync_dir(home)
        except OSError as exc:
            metadata_log.close()
            raise StorageError(f"Could not make the remote log metadata directory {root} durable: "
                               f"{exc.strerror}") from exc
    except BaseException:
        storage.close()
        raise
    try:
        metadata = RemoteLogMetadataManager(metadata_log)
        cache = RemoteChunkCache(storage, os.path.join(root, CHUNK_CACHE_DIR), max_bytes=cache_max_bytes,
                                 chunk_bytes=chunk_bytes)
    except BaseException:
        metadata_log.close()
        storage.close()
        raise
    manager = RemoteLogManager(storage, metadata, cache, clock=clock)
    manager._metadata_log = metadata_log
    manager.view_index_root = os.path.join(root, VIEW_INDEX_DIR)
    return manager


