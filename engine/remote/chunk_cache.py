"""A bounded on-disk cache of remote segment bytes, read by range, with read-ahead for sequential readers.

A read of a remote segment (:class:`engine.remote.storage.RemoteStorageManager`)
is served in chunks of ``chunk_bytes`` aligned on the segment's byte
positions: each chunk is fetched once (one ranged GET), written to a file of
its own under the cache directory, and read from there until it is evicted.
The files' total stays within ``max_bytes``: the least recently used chunks
go first (Kafka's ``RemoteIndexCache`` bounds the indexes the same way; the
data itself Kafka reads through the broker's page cache, which a FUSE mount
cannot count on).

Read-ahead: a read that starts where the previous read of the same segment
ended is sequential; the cache then fetches the next ``read_ahead`` chunks in
the background, each in a thread of its own (the store serves them at once),
and a read near a segment's end the first chunks of the next one
(``read_ahead_start``), so a ``cat`` of old segments waits for the store
about once, not at every chunk.  A read-ahead that fails is forgotten: the read
that needs the chunk fetches it again and reports the error.

Invariants: a chunk file exists only complete (written to a temporary name
and renamed); a chunk is in ``_chunks`` iff its file is there and counted in
``_bytes``; ``_bytes <= max_bytes`` after every insertion, except for the one
chunk being read when a single chunk is larger than the bound.

Locking: ``_lock`` guards the index and the in-flight fetches; the store is
never called under it.  Concurrent reads of one missing chunk fetch it once
(the second waits for the first's result).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from engine import store_waits
from engine.remote.storage import RemoteLogSegmentId, RemoteStorageError, RemoteStorageManager

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

ChunkKey = tuple[RemoteLogSegmentId, int]


class RemoteChunkCache:
    """Chunks of remote segments on local disk, within ``max_bytes``."""

    def __init__(self, storage: RemoteStorageManager, directory: str, *, max_bytes: int,
                 chunk_bytes: int = 4 << 20, read_ahead: int = 4) -> None:
        if chunk_bytes <= 0 or max_bytes < chunk_bytes:
            raise ValueError(f"the remote chunk cache needs max_bytes ({max_bytes}) >= chunk_bytes ({chunk_bytes}) > 0")
        self.storage = storage
        self.directory = os.path.abspath(directory)
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        # never more ahead than the bound holds beside the chunk being read and the one before it: a
        # read-ahead would evict the chunks it fetched before the reader gets to them
        self.read_ahead = min(read_ahead, max(0, max_bytes // chunk_bytes - 2))
        # a cache left by an earlier run may hold chunks of copies since deleted: start empty
        shutil.rmtree(self.directory, ignore_errors=True)
        os.makedirs(self.directory)
        self._lock = threading.Lock()
        self._chunks: OrderedDict[ChunkKey, int] = OrderedDict()    # key -> size, least recently used first
        self._bytes = 0
        self._fetching: dict[ChunkKey, Future[bytes]] = {}
        #: segment -> the position its last read ended at (a read starting there is sequential)
        self._cursors: dict[RemoteLogSegmentId, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.read_ahead), thread_name_prefix="remote-read-ahead")
        #: counters for ``.logfs/metrics``: chunks fetched from the store, reads served from local files
        self.fetched_chunks = 0
        self.fetched_bytes = 0
        self.hits = 0

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def _path(self, key: ChunkKey) -> str:
        segment_id, index = key
        flat = segment_id.partition_dir.replace("/", "-")
        return os.path.join(self.directory, f"{flat}-{segment_id.id}-{index}.chunk")

    def read(self, segment_id: RemoteLogSegmentId, position: int, size: int, segment_size: int) -> bytes:
        """Bytes ``[position, position + size)`` of the segment's ``.log`` (fewer at its end, ``segment_size``).

        RemoteStorageError when a chunk it needs cannot be fetched (the store's errno and words).
        """
        end = min(position + size, segment_size)
        if position >= end:
            return b""
        first, last = position // self.chunk_bytes, (end - 1) // self.chunk_bytes
        with self._lock:
            sequential = self._cursors.get(segment_id) == position
            self._cursors[segment_id] = end
        if sequential:      # before the read's own chunks: a read that waits for them has its next ones coming
            self._read_ahead_from(segment_id, last + 1, segment_size)
        pieces = []
        for index in range(first, last + 1):
            start = position - index * self.chunk_bytes if index == first else 0
            stop = end - index * self.chunk_bytes if index == last else self.chunk_bytes
            pieces.append(self._chunk((segment_id, index), segment_size, start, stop))
        return b"".join(pieces)

    def read_ahead_start(self, segment_id: RemoteLogSegmentId, segment_size: int) -> None:
        """Fetch the first chunks of a segment in the background: a sequential reader of the segment before
        it is about to get there (its first read, at 0, is then sequential)."""
        with self._lock:
            if segment_id in self._cursors:
                return              # read already (or started ahead already)
            self._cursors[segment_id] = 0
        self._read_ahead_from(segment_id, 0, segment_size)

    def _read_ahead_from(self, segment_id: RemoteLogSegmentId, first: int, segment_size: int) -> None:
        for index in range(first, first + self.read_ahead):
            if index * self.chunk_bytes < segment_size:
                self._prefetch((segment_id, index), segment_size)

    def _chunk(self, key: ChunkKey, segment_size: int, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the chunk: from its file when cached (only those bytes read), else
        fetched (whole, and kept); inside ``engine.store_waits``'s deferral, StoreWaitDeferred instead of a
        fetch."""
        pinned = store_waits.held(key)
        if pinned is not None:
            return pinned[start:stop]
        with self._lock:
            if key in self._chunks:
                self._chunks.move_to_end(key)
                self.hits += 1
                path: str | None = self._path(key)
            else:
                path = None
            future = None if path is not None else self._fetching.get(key)
        if path is not None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                pass                # evicted between the lookup and the open: fetch it again
            else:
                try:
                    return os.pread(fd, max(0, stop - start), start)
                finally:
                    os.close(fd)
        if store_waits.deferring():
            def fetch() -> None:
                store_waits.hold(key, self._wait_for(key, segment_size, future))

            raise store_waits.StoreWaitDeferred(fetch, f"chunk {key[1]} of {key[0]} must be fetched")
        return self._wait_for(key, segment_size, future)[start:stop]

    def _wait_for(self, key: ChunkKey, segment_size: int, future: Future[bytes] | None) -> bytes:
        """The whole chunk: the result of its fetch in flight (``future``), or fetched now."""
        if future is not None:
            try:
                return future.result()
            except RemoteStorageError as exc:
                if exc.errno == errno.ETIMEDOUT:
                    raise           # the store does not answer: a second try would double the reader's wait
                # another failure of a read-ahead is not this read's: try once more below
        return self._fetch(key, segment_size)

    def _fetch(self, key: ChunkKey, segment_size: int) -> bytes:
        with self._lock:
            future = self._fetching.get(key)
            owner = future is None
            if owner:
                future = self._fetching[key] = Future()
        assert future is not None
        if not owner:
            return future.result()
        try:
            segment_id, index = key
            start = index * self.chunk_bytes
            data = self.storage.fetch_log_segment(segment_id, start, min(start + self.chunk_bytes, segment_size))
            self._insert(key, data)
        except BaseException as exc:
            with self._lock:
                self._fetching.pop(key, None)
            future.set_exception(exc)
            raise
        with self._lock:
            self._fetching.pop(key, None)
            self.fetched_chunks += 1
            self.fetched_bytes += len(data)
        future.set_result(data)
        return data

    def _prefetch(self, key: ChunkKey, segment_size: int) -> None:
        with self._lock:
            if key in self._chunks or key in self._fetching:
                return

        def fetch() -> None:
            try:
                self._fetch(key, segment_size)
            except RemoteStorageError as exc:
                logger.debug("Read-ahead of %s chunk %d failed: %s", key[0], key[1], exc)

        try:
            self._pool.submit(fetch)
        except RuntimeError:
            pass                    # closed: no read-ahead after close()

    def _insert(self, key: ChunkKey, data: bytes) -> None:
        path = self._path(key)
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            # the bytes were fetched: serve them even if the cache cannot keep them (a full disk)
            logger.warning("Could not keep a remote chunk in %s: %s", self.directory, exc.strerror)
            return
        evicted: list[str] = []
        with self._lock:
            self._chunks[key] = len(data)
            self._bytes += len(data)
            # the least recently used first; never the chunk just fetched (the last, most recent one)
            while self._bytes > self.max_bytes and len(self._chunks) > 1:
                old, size = self._chunks.popitem(last=False)
                self._bytes -= size
                evicted.append(self._path(old))
        for old_path in evicted:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old_path)

    def forget(self, predicate: Callable[[RemoteLogSegmentId], bool]) -> None:
        """Drop the chunks of the segments ``predicate`` names (deleted copies)."""
        with self._lock:
            gone = [k for k in self._chunks if predicate(k[0])]
            for key in gone:
                self._bytes -= self._chunks.pop(key)
            for segment_id in [s for s in self._cursors if predicate(s)]:
                del self._cursors[segment_id]
        for key in gone:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
