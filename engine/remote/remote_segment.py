"""A remote log segment as readers see a local one: the read-only :class:`RemoteLogSegment`.

The views (engine.views) read a log's :class:`~engine.segment.LogSegment`
objects through a handful of members; a :class:`RemoteLogSegment` has those
members over a finished copy, its bytes read through the RemoteLogManager's
chunk cache (engine.remote.chunk_cache), so the same rendering code serves
records that are only in the store.  :class:`RemoteLogReader` is a log's view
of its copies (``Log.remote_log_reader``): ``Log.reader_segments`` puts the
copies below the local log start in front of the local segments for every
reader.  The raw files of a copy (its ``.log``, ``.index`` and ``.timeindex``,
which ``segments/`` lists beside the local segments' and the Spark source
reads) are served by :meth:`RemoteLogSegment.read_file`, byte for byte what
was copied, or an error: never fewer bytes than the copy holds.

A copy never changes once COPY_SEGMENT_FINISHED (a copy is of a closed
segment, and a deletion removes it whole), so every size here is final.  A
read of a copy deleted meanwhile fails with the store's ENOENT, as a read of
a local segment deleted under a released view does.
"""

from __future__ import annotations

import bisect
import errno
import threading
from typing import TYPE_CHECKING, TypeVar

from crc32c import crc32c
from sortedcontainers import SortedDict

from engine import records as _records
from engine.errors import CorruptRecordError, StorageError
from engine.files import INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX
from engine.index import OFFSET_INDEX_ENTRY
from engine.index import TIME_INDEX_ENTRY as _TIME_ENTRY
from engine.records.reader import read_batches, read_headers
from engine.remote.storage import LOG_SUFFIX, RemoteStorageError, TopicIdPartition
from engine.segment import LogOffsetPosition, SegmentAttachment
from engine.store_waits import StoreWaitDeferred

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from engine.records import BatchHeader, Record
    from engine.records.format import RecordBuffer
    from engine.remote.metadata import RemoteLogSegmentMetadata
    from engine.remote.remote_log_manager import RemoteLogManager
    from engine.segment import LogSegment
    from engine.topic import TopicPartition
    from engine.transactions import ProducerEntry, TxnIndexEntry

_T = TypeVar("_T")

_OFFSET_ENTRY_SIZE = OFFSET_INDEX_ENTRY.size
#: bytes read per request while walking a copy (a chunk of the cache holds several)
_SCAN_CHUNK = 256 * 1024


class RemoteReadError(StorageError):
    """A read of a remote log segment failed (the store's errno: ETIMEDOUT, EACCES, ENOENT, EIO)."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


class RemoteLogSegment:
    """The members of :class:`~engine.segment.LogSegment` that views read, over a finished copy."""

    #: never written
    read_only = True
    #: engine.views.persisted keeps its view index in ``dir`` (when the RemoteLogManager has one)
    remote = True

    def __init__(self, rlm: RemoteLogManager, metadata: RemoteLogSegmentMetadata, topic_partition: TopicPartition,
                 index_interval_bytes: int = 4096) -> None:
        self._rlm = rlm
        self.metadata = metadata
        self.topic_partition = topic_partition
        self.base_offset = metadata.start_offset
        self.next_offset = metadata.end_offset + 1
        self.size = metadata.segment_size_bytes
        self.largest_timestamp = metadata.max_timestamp
        self.max_timestamp_so_far = metadata.max_timestamp
        self.index_interval_bytes = index_interval_bytes
        #: where a reader names the segment (errors): the object's address in the store
        self.log_path = f"{rlm.storage.uri}/{metadata.segment_id.object_name(LOG_SUFFIX)}"
        #: where its view index is kept (engine.views.persisted); None: nowhere
        self.dir: str | None = rlm.view_index_dir(metadata.segment_id)
        self._offset_index: _RemoteOffsetIndex | None = None
        self._time_index: tuple[list[int], list[int]] | None = None
        #: what the views derive from its bytes (engine.views.index.SegmentViews), as on a local segment
        self.attachment: SegmentAttachment | None = None
        #: the copy has its ``.txnindex`` and producer snapshot: the transaction walk takes them instead of
        #: fetching its batches (engine.transactions.TransactionIndexed)
        self.has_transaction_index = metadata.has_transaction_index

    def __repr__(self) -> str:
        return (f"RemoteLogSegment(baseOffset={self.base_offset}, size={self.size}, "
                f"id={self.metadata.segment_id.id})")

    def read_bytes(self, position: int, size: int) -> bytes:
        """Raw bytes of the copy's ``.log``, through the chunk cache (RemoteReadError when the store fails)."""
        if size <= 0 or position >= self.size:
            return b""
        try:
            return self._rlm.cache.read(self.metadata.segment_id, position, size, self.size)
        except RemoteStorageError as exc:
            raise self._read_error(exc) from exc
        except StoreWaitDeferred as deferred:      # the caller waits outside its lock: errors named as here
            def wait(fetch: Callable[[], object] = deferred.wait) -> None:
                try:
                    fetch()
                except RemoteStorageError as exc:
                    raise self._read_error(exc) from exc

            raise StoreWaitDeferred(wait, str(deferred)) from None

    def _read_error(self, exc: RemoteStorageError) -> RemoteReadError:
        return RemoteReadError(f"Reading remote log segment {self.base_offset} of {self.topic_partition} "
                               f"from {self._rlm.storage.uri} failed: {exc}", exc.errno)

    def _index_read_error(self, what: str, exc: RemoteStorageError) -> RemoteReadError:
        """The store failed to serve the copy's ``what`` (its "offset index", "time index", ...)."""
        return RemoteReadError(f"Reading the {what} of remote log segment {self.base_offset} of "
                               f"{self.topic_partition} failed: {exc}", exc.errno)

    @property
    def last_modified(self) -> int:
        """What stands for the ``.log``'s mtime (ms): its largest timestamp, else when the copy was recorded."""
        return self.metadata.max_timestamp if self.metadata.max_timestamp > 0 else self.metadata.event_timestamp

    def file_size(self, suffix: str) -> int:
        """Bytes of the copy's ``.log``, ``.index`` or ``.timeindex`` (``suffix``), as the local files were.

        The metadata's sizes, without a request; an index copied before the
        metadata recorded its size is fetched (once) to size it.
        """
        if suffix == LOG_FILE_SUFFIX:
            return self.size
        recorded = self.metadata.offset_index_size_bytes if suffix == INDEX_FILE_SUFFIX \
            else self.metadata.time_index_size_bytes
        return recorded if recorded is not None else len(self._index_file(suffix))

    def read_file(self, suffix: str, position: int, size: int) -> bytes:
        """Bytes ``[position, position + size)`` of the copy's ``.log``, ``.index`` or ``.timeindex``
        (fewer only at its end), the ``.log`` through the chunk cache.

        RemoteReadError with the store's errno when it fails, and EIO when the
        store holds fewer bytes than the copy's metadata says: never a short read.
        """
        total = self.file_size(suffix)
        want = max(0, min(size, total - position))
        if want == 0:
            return b""
        if suffix == LOG_FILE_SUFFIX:
            data = self.read_bytes(position, want)
        else:
            data = self._index_file(suffix)[position:position + want]
        if len(data) != want:
            raise RemoteReadError(f"Remote log segment {self.base_offset} of {self.topic_partition}: "
                                  f"{self.metadata.segment_id.object_name(suffix.lstrip('.'))} in "
                                  f"{self._rlm.storage.uri} holds {position + len(data)} bytes or fewer, "
                                  f"not the {total} its metadata says", errno.EIO)
        return data

    def _index_file(self, suffix: str) -> bytes:
        """The copy's ``.index`` or ``.timeindex`` (the RemoteLogManager keeps the last few read in memory)."""
        if suffix == INDEX_FILE_SUFFIX:
            return self.offset_index.entries_bytes_raw
        if suffix != TIME_INDEX_FILE_SUFFIX:
            raise ValueError(f"A remote log segment has no {suffix} file")
        try:
            return self._rlm.time_index(self.metadata.segment_id)
        except RemoteStorageError as exc:
            raise self._index_read_error("time index", exc) from exc

    def read_ahead(self) -> None:
        """A sequential reader (a view) gets to this copy next: its first chunks are fetched in the background."""
        self._rlm.cache.read_ahead_start(self.metadata.segment_id, self.size)

    def batches(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch from ``start_position``."""
        return read_headers(self.read_bytes, start_position, self.size, _SCAN_CHUNK, path=self.log_path)

    def batches_with_bytes(self, start_position: int = 0,
                           end_position: int | None = None) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        """Whole batches for decoding: (position, header, buffer, offset of the batch in buffer)."""
        end = self.size if end_position is None else min(end_position, self.size)
        return read_batches(self.read_bytes, start_position, end, _SCAN_CHUNK, path=self.log_path)

    @property
    def offset_index(self) -> _RemoteOffsetIndex:
        """The copy's offset index entries (one GET, then the RemoteLogManager's memory): what a persisted
        view index is bound to."""
        if self._offset_index is None:
            try:
                self._offset_index = _RemoteOffsetIndex(self._rlm.offset_index(self.metadata.segment_id))
            except RemoteStorageError as exc:
                raise self._index_read_error("offset index", exc) from exc
        return self._offset_index

    def offset_index_crc(self, entries: int) -> int | None:
        """CRC32C of the first ``entries`` offset index entries (None if it has fewer): what binds a kept view
        index to the copy (engine.views.persisted).  The whole index's is in the metadata (no request)."""
        recorded = self.metadata.offset_index_crc32c
        if recorded is not None and entries * _OFFSET_ENTRY_SIZE == self.metadata.offset_index_size_bytes:
            return recorded
        index = self.offset_index
        if index.entries < entries:
            return None
        return crc32c(index.entries_bytes()[:entries * _OFFSET_ENTRY_SIZE])

    def position_of(self, offset: int) -> int:
        """The position of the indexed batch at or below ``offset`` (the copy's offset index)."""
        try:
            return self._rlm.position_of(self.metadata, offset)
        except RemoteStorageError as exc:
            raise self._index_read_error("offset index", exc) from exc

    def first_batch_at_or_after(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset is >= ``offset`` (Kafka's translateOffset)."""
        for position, header in self.batches(self.position_of(offset)):
            if header.last_offset >= offset:
                return position, header
        return None

    def translate_offset(self, offset: int, starting_position: int = 0) -> LogOffsetPosition | None:
        """LogSegment.translate_offset over the copy: its offset index, then a walk of headers."""
        found = self.first_batch_at_or_after(offset)
        if found is None:
            return None
        position, header = found
        return LogOffsetPosition(header.last_offset, position, header.size)

    def validate_and_decode(self, buf: RecordBuffer, off: int, header: BatchHeader, position: int) -> list[Record]:
        """CRC-check then decode one batch; CorruptRecordError names the object and position."""
        try:
            _records.validate_batch(buf, off)
            return _records.decode_batch(buf, off, header)
        except CorruptRecordError as exc:
            raise exc.at(self.log_path, position) from None

    def transaction_index(self) -> list[TxnIndexEntry] | None:
        """The aborted transactions whose ABORT marker the copy holds (its ``.txnindex``, fetched once, none when
        its metadata says it is empty); None for a copy without one."""
        return self._transaction_file("transaction index", self._rlm.transaction_index)

    def producer_snapshot(self) -> list[ProducerEntry] | None:
        """The producers at the copy's end (its producer snapshot, fetched once); None for a copy without one."""
        return self._transaction_file("producer snapshot", self._rlm.producer_snapshot)

    def _transaction_file(self, what: str, fetch: Callable[[RemoteLogSegmentMetadata], _T]) -> _T | None:
        """The copy's ``what`` read by ``fetch``; None for a copy made without the transaction index and producer
        snapshot (``has_transaction_index``: the metadata says whether it has both)."""
        if not self.has_transaction_index:
            return None
        try:
            return fetch(self.metadata)
        except RemoteStorageError as exc:
            raise self._index_read_error(what, exc) from exc

    def _time_index_offset(self, timestamp: int) -> int:
        """Kafka's ``TimeIndex.lookup`` over the copy's time index (fetched once): the offset of the entry
        with the largest timestamp <= ``timestamp``, else the base offset."""
        if self._time_index is None:
            data = self._index_file(TIME_INDEX_FILE_SUFFIX)
            timestamps: list[int] = []
            offsets: list[int] = []
            for ts, relative in _TIME_ENTRY.iter_unpack(data[:len(data) - len(data) % _TIME_ENTRY.size]):
                if timestamps and ts < timestamps[-1]:
                    break           # the zeros of a preallocated file: the entries end here
                timestamps.append(ts)
                offsets.append(self.base_offset + relative)
            self._time_index = (timestamps, offsets)
        timestamps, offsets = self._time_index
        i = bisect.bisect_right(timestamps, timestamp)
        return offsets[i - 1] if i else self.base_offset

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with timestamp >= ``timestamp`` and offset >= start.

        As LogSegment.find_offset_by_timestamp: the copy's time index, then its
        offset index, then a walk of its batches from there.
        """
        from_offset = max(self._time_index_offset(timestamp), starting_offset, self.base_offset)
        start = self.position_of(from_offset)
        for pos, header, buf, off in self.batches_with_bytes(start):
            if header.max_timestamp >= timestamp and header.next_offset > starting_offset:
                for record in self.validate_and_decode(buf, off, header, pos):
                    if record.timestamp >= timestamp and record.offset >= starting_offset:
                        return record.timestamp, record.offset
        return None


class _RemoteOffsetIndex:
    """The members of engine.index.OffsetIndex that engine.views.persisted reads."""

    def __init__(self, data: bytes) -> None:
        self.entries = len(data) // 8
        self._data = data[:self.entries * 8]
        #: the object as the store holds it (``segments/<base>.index`` of the copy)
        self.entries_bytes_raw = data

    def entries_bytes(self) -> bytes:
        return self._data


class RemoteLogReader:
    """The remote log segments of one partition as readers see them (``Log.remote_log_reader``).

    ``segments_map`` merges the finished copies below the local log start
    with the log's local segments into one map of base offset -> segment, the
    same object while neither side changed (views compare maps by identity),
    and one :class:`RemoteLogSegment` per copy, so the view index a view built
    over it is kept for the next view.
    """

    def __init__(self, rlm: RemoteLogManager, tip: TopicIdPartition, topic_partition: TopicPartition) -> None:
        self.rlm = rlm
        self.tip = tip
        self.topic_partition = topic_partition
        self._lock = threading.Lock()
        self._segments: dict[str, RemoteLogSegment] = {}
        self._merged: tuple[object, int, int, SortedDict] | None = None
        #: base offset -> (size, attachment) of local segments deleted once copied, for their copies
        self._handed_over: dict[int, tuple[int, SegmentAttachment]] = {}

    def highest_copied_offset(self) -> int:
        return self.rlm.metadata.highest_copied_offset(self.tip)

    def remote_segments(self, log_start: int, local_start: int) -> list[RemoteLogSegment]:
        """The finished copies holding offsets in [log_start, local_start), by offset."""
        with self._lock:
            wanted = [m for m in self.rlm.metadata.copied_segments(self.tip)
                      if m.end_offset >= log_start and m.end_offset < local_start]
            live = {m.segment_id.id for m in wanted}
            for gone in [i for i in self._segments if i not in live]:
                del self._segments[gone]
            out = []
            for metadata in wanted:
                segment = self._segments.get(metadata.segment_id.id)
                if segment is None:
                    segment = self._segments[metadata.segment_id.id] = RemoteLogSegment(
                        self.rlm, metadata, self.topic_partition)
                    handed = self._handed_over.pop(metadata.start_offset, None)
                    if handed is not None and handed[0] == segment.size:
                        segment.attachment = handed[1]      # the same bytes: what was derived of them holds
                out.append(segment)
            for base in [b for b in self._handed_over if b < log_start]:
                del self._handed_over[base]                 # below the log start: no copy will want it
            return out

    def local_segments_deleted(self, segments: Sequence[LogSegment]) -> None:
        """See engine.log.RemoteSegments.local_segments_deleted."""
        with self._lock:
            for segment in segments:
                if segment.attachment is not None:
                    self._handed_over[segment.base_offset] = (segment.size, segment.attachment)

    def forget_segments_map(self) -> None:
        """Drop the merged map kept for the views: it holds the local segments it listed, and a deleted one
        pins its descriptor (its disk space) for as long as it is held."""
        self._merged = None

    def segments_map(self, local: SortedDict, log_start: int) -> SortedDict:
        """The remote segments below the first local one, then ``local`` (``local`` itself when none)."""
        local_start = local.peekitem(0)[0] if local else log_start
        if log_start >= local_start:
            return local
        generation = self.rlm.metadata.generation
        merged = self._merged
        if merged is not None and merged[0] is local and merged[1] == generation and merged[2] == log_start:
            return merged[3]
        result = SortedDict({s.base_offset: s for s in self.remote_segments(log_start, local_start)})
        result.update(local)
        self._merged = (local, generation, log_start, result)
        return result
