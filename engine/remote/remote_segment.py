"""A remote log segment as readers see a local one: the read-only :class:`RemoteLogSegment`.

NOT WIRED INTO THE MOUNT YET (issue 37, reads below the local log start): the
views (engine.views) read a log's :class:`~engine.segment.LogSegment` objects
through a handful of members; a :class:`RemoteLogSegment` has those members
over a finished copy, its bytes read through the RemoteLogManager's chunk cache
(engine.remote.chunk_cache), so the same rendering code serves records that are
only in the store.  What is missing is the log's side: segments below the
local log start offered to the views (``LogView`` takes ``log.segments``), the
offset and time lookups (``offset/N``, ``since/T``) over copies, and local
retention.

A copy never changes once COPY_SEGMENT_FINISHED (a copy is of a closed
segment, and a deletion removes it whole), so every size here is final.  A
read of a copy deleted meanwhile fails with the store's ENOENT, as a read of
a local segment deleted under a released view does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from engine.errors import StorageError
from engine.records.reader import read_batches, read_headers
from engine.remote.storage import LOG_SUFFIX, RemoteStorageError

if TYPE_CHECKING:
    from engine.records import BatchHeader
    from engine.remote.metadata import RemoteLogSegmentMetadata
    from engine.remote.remote_log_manager import RemoteLogManager
    from engine.topic import TopicPartition

#: bytes read per request while walking a copy (a chunk of the cache holds several)
_SCAN_CHUNK = 256 * 1024


class RemoteReadError(StorageError):
    """A read of a remote log segment failed (the store's errno: ETIMEDOUT, EACCES, ENOENT, EIO)."""

    def __init__(self, message: str, errno: int) -> None:
        super().__init__(message)
        self.errno = errno


class RemoteLogSegment:
    """The members of :class:`~engine.segment.LogSegment` that views read, over a finished copy."""

    #: never written, never persisted to (engine.views.persisted skips read-only segments)
    read_only = True

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
        #: no local directory holds it; a persisted view index is never looked up there
        self.dir = rlm.cache.directory
        #: the views' slot (engine.views.index.SegmentViews), as on a local segment
        self.sidecar: Any = None

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
            raise RemoteReadError(f"Reading remote log segment {self.base_offset} of {self.topic_partition} "
                                  f"from {self._rlm.storage.uri} failed: {exc}", exc.errno) from exc

    def batches(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch from ``start_position``."""
        return read_headers(self.read_bytes, start_position, self.size, _SCAN_CHUNK, path=self.log_path)

    def batches_with_bytes(self, start_position: int = 0,
                           end_position: int | None = None) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        """Whole batches for decoding: (position, header, buffer, offset of the batch in buffer)."""
        end = self.size if end_position is None else min(end_position, self.size)
        return read_batches(self.read_bytes, start_position, end, _SCAN_CHUNK, path=self.log_path)

    def position_of(self, offset: int) -> int:
        """The position of the indexed batch at or below ``offset`` (the copy's offset index)."""
        try:
            return self._rlm.position_of(self.metadata, offset)
        except RemoteStorageError as exc:
            raise RemoteReadError(f"Reading the offset index of remote log segment {self.base_offset} of "
                                  f"{self.topic_partition} failed: {exc}", exc.errno) from exc

    def first_batch_at_or_after(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset is >= ``offset`` (Kafka's translateOffset)."""
        for position, header in self.batches(self.position_of(offset)):
            if header.last_offset >= offset:
                return position, header
        return None
