"""The view index of a sealed segment on disk: ``<base>.viewindex`` beside the segment's files.

Kafka persists a segment's ``.index`` and ``.timeindex`` when it rolls, so a
restarted broker serves a fetch without reading the ``.log``.  The mount's
renderings need more: the size of every segment's rendering (a view's size is
their sum) and where each indexed batch starts in it.  Without a file, the
first read of a view after a remount decodes the whole partition (4-5 s per GB).
So when a segment is sealed (rolled, or first sized after a load or a clean)
its :class:`~engine.views.index.ViewIndex` is written to ``<base>.viewindex``
in the partition directory (and the active segment's at a clean shutdown),
and loaded instead of a scan.

It is a cache, validated before it is used, never trusted blindly:

* a checksum (CRC32C) over the whole file: a torn, truncated, zero-filled or
  damaged file (a crash, a power loss: it is written with
  :func:`engine.files.write_cache_file`, atomically but without fsync) is
  rejected;
* a header binding it to its segment: base offset, the ``.log``'s size, the
  topic partition (JSON lines name the topic) and a CRC32C of the segment's
  offset index entries (positions of batches in the ``.log``): a file left
  from another segment of the same base offset (the cleaner's swap, a
  truncation, a recovery) is rejected;
* the index's own shape: its entries lie inside the segment.

A sealed segment's file covers it exactly (the ``.log`` size is equal) and
loading it reads no ``.log`` byte.  The active segment's file is written at a
clean shutdown; when the segment grew since, the file covers a prefix, the
stored CRC of the batch it ends with must be the one in the ``.log`` (one
61-byte read), and the appended tail is scanned.

A rejected or missing file costs what it always did: one scan, after which the
file is written again; one log line names the file and the reason.  No
``.log`` byte is read to load a valid file.

A remote log segment's (tiered storage, engine.remote.remote_segment) is kept
in the data dir's ``remote-log/view-index/<topic>-<topic id>-<partition>/<copy id>/``,
bound to the copy by its id (a copy never changes), so a new mount sizes a
view of the store's range without a request to the store.

Kafka never reads it: its loader ignores files of unknown suffixes, and
``logfs to-kafka adopt`` removes ``.viewindex`` files from the partitions it
hands over, so the broker's log dir holds only Kafka's files.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import sys
from array import array
from typing import TYPE_CHECKING, Protocol, TypeVar

from crc32c import crc32c

from engine.files import LOG_FILE_SUFFIX, view_index_file_path, write_cache_file
from engine.index import OFFSET_INDEX_ENTRY
from engine.records import HEADER_SIZE

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.segment import LogSegment

logger = logging.getLogger(__name__)


class _Totals(Protocol):
    @property
    def next_offset(self) -> int: ...
    @property
    def log_size(self) -> int: ...
    @property
    def text_size(self) -> int: ...
    @property
    def json_size(self) -> int: ...
    @property
    def record_count(self) -> int: ...


class StoredViewIndex(Protocol):
    """What this module reads of and loads into a view index (:class:`engine.views.index.ViewIndex`).

    A protocol, so that the file format does not import the index that
    uses it: ``engine.views.index`` imports this module.
    """

    base_offset: int
    index_interval_bytes: int
    entries: int
    last_position: int

    @property
    def totals(self) -> _Totals: ...
    @property
    def log_size(self) -> int: ...
    @property
    def bytes_since_last_entry(self) -> int: ...
    def columns(self) -> tuple[array[int], array[int], array[int], array[int]]: ...
    def load_columns(self, columns: Sequence[array[int]], entries: int, totals: tuple[int, int, int, int, int],
                     last_position: int, bytes_since_last_entry: int) -> None: ...


_V = TypeVar("_V", bound=StoredViewIndex)

_MAGIC = b"LVIX"
#: 2: the JSON sizes are of rows with every member (keyEncoding, valueEncoding and headers always there);
#: a file of an older version is out of date, not damaged.
_VERSION = 2
#: magic, version, flags, base offset, .log size, next offset, record count, text size, JSON size,
#: index interval, bytes since the last entry, entries, position of the last batch, its stored CRC,
#: offset index entries covered, CRC32C of those entries, partition, topic length
_HEADER = struct.Struct("<4sHHqqqqqqqqqqIIIiH")
_CRC = struct.Struct("<I")
_BATCH_CRC = struct.Struct(">I")         # a batch header's CRC field (big-endian, at byte 17)
_BATCH_CRC_AT = 17
_COLUMNS = 4
_LITTLE = sys.byteorder == "little"

#: What a load found (for stats and tests): loaded, missing, rejected, written.
counters = {"loaded": 0, "missing": 0, "rejected": 0, "written": 0}


def _offset_index_crc(segment: LogSegment, entries: int) -> int | None:
    """CRC32C of the first ``entries`` offset index entries (None if the index has fewer)."""
    if _remote(segment):
        # a remote log segment knows its whole index's CRC from the metadata: no request to the store
        remote_crc: Callable[[int], int | None] = segment.offset_index_crc    # type: ignore[attr-defined]
        return remote_crc(entries)
    index = segment.offset_index
    if index.entries < entries:
        return None
    return crc32c(index.entries_bytes()[:entries * OFFSET_INDEX_ENTRY.size])


def _batch_crc(segment: LogSegment, position: int) -> int | None:
    """The stored CRC of the batch at ``position`` (one header read of the .log)."""
    data = segment.read_bytes(position, HEADER_SIZE)
    if len(data) < HEADER_SIZE:
        return None
    return int(_BATCH_CRC.unpack_from(data, _BATCH_CRC_AT)[0])


def _remote(segment: LogSegment) -> bool:
    """A remote log segment (engine.remote.remote_segment): immutable, its file kept in tiered storage's dir."""
    return getattr(segment, "remote", False) is True


def _persistable(segment: LogSegment) -> bool:
    # Only a segment under its own name: a .cleaned/.swap/.deleted one is in flight.
    if _remote(segment):
        return segment.dir is not None
    return not segment.read_only and segment.log_path.endswith(LOG_FILE_SUFFIX)


def encode(segment: LogSegment, vi: StoredViewIndex) -> bytes:
    """The file's bytes for ``vi``, the view index of ``segment`` up to its current size."""
    tp = segment.topic_partition
    topic = tp.topic.encode()
    n = vi.entries
    totals = vi.totals
    index_entries = segment.offset_index.entries
    index_crc = _offset_index_crc(segment, index_entries) or 0
    batch_crc = _batch_crc(segment, vi.last_position) or 0
    parts = [_HEADER.pack(_MAGIC, _VERSION, 0, vi.base_offset, totals.log_size, totals.next_offset,
                          totals.record_count, totals.text_size, totals.json_size, vi.index_interval_bytes,
                          vi.bytes_since_last_entry, n, vi.last_position, batch_crc, index_entries, index_crc,
                          tp.partition, len(topic)), topic]
    for column in vi.columns():
        col = column[:n]
        if not _LITTLE:  # pragma: no cover - big-endian hosts
            col.byteswap()
        parts.append(col.tobytes())
    body = b"".join(parts)
    return body + _CRC.pack(crc32c(body))


def persist(segment: LogSegment, vi: StoredViewIndex) -> bool:
    """Write ``<base>.viewindex`` for sealed ``segment``; False (one log line) if it cannot be written."""
    if not _persistable(segment) or vi.log_size != segment.size or segment.size == 0:
        return False
    path = view_index_file_path(segment.dir, segment.base_offset)
    if not _remote(segment) and not os.path.exists(segment.log_path):
        return False                        # deleted meanwhile
    try:
        write_cache_file(path, encode(segment, vi))
    except OSError as exc:
        logger.warning("Could not write view index file %s: %s; the next load of the segment rebuilds it "
                       "by a scan", path, exc.strerror or exc)
        return False
    counters["written"] += 1
    return True


def remove(dir: str, base_offset: int) -> None:
    """Remove the file of a segment that is gone (best effort: a stale file is rejected anyway)."""
    try:
        os.unlink(view_index_file_path(dir, base_offset))
    except OSError:
        pass


class _Rejected(Exception):
    """Why a file is not used; ``stale`` when it is only out of date (logged at INFO, not WARNING)."""

    def __init__(self, why: str, stale: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.stale = stale


def load(segment: LogSegment, new_index: Callable[[int, int], _V]) -> _V | None:
    """The persisted view index of sealed ``segment`` if its file is there and valid, else None.

    ``new_index(base_offset, index_interval_bytes)`` makes the empty ViewIndex
    the columns are loaded into.
    """
    if not segment.log_path.endswith(LOG_FILE_SUFFIX) or segment.size == 0 or segment.dir is None:
        return None
    path = view_index_file_path(segment.dir, segment.base_offset)
    try:
        return _load(segment, path, new_index)
    except _Rejected as rejected:
        counters["rejected"] += 1
        (logger.info if rejected.stale else logger.warning)(
            "View index file %s is not used: %s; rebuilding the segment's view index from its log", path,
            rejected.why)
        return None


def _load(segment: LogSegment, path: str, new_index: Callable[[int, int], _V]) -> _V | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        counters["missing"] += 1
        return None
    except OSError as exc:
        raise _Rejected(f"it cannot be opened ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Rejected("it is not a regular file")
        data = os.pread(fd, st.st_size, 0)
    except OSError as exc:
        raise _Rejected(f"it cannot be read ({exc.strerror})") from exc
    finally:
        os.close(fd)
    if len(data) < _HEADER.size + _CRC.size:
        raise _Rejected(f"it holds {len(data)} bytes, fewer than a header")
    body = memoryview(data)[:-_CRC.size]
    if crc32c(body) != _CRC.unpack_from(data, len(data) - _CRC.size)[0]:
        raise _Rejected("its checksum does not match (torn or damaged)")
    (magic, version, _flags, base, log_size, next_offset, records, text_size, json_size, interval, since_entry, n,
     last_position, batch_crc, index_entries, index_crc, partition, topic_len) = _HEADER.unpack_from(data, 0)
    if magic == _MAGIC and version < _VERSION:
        raise _Rejected(f"it is a version {version} view index file (the JSON view's rows have changed since)",
                        stale=True)
    if magic != _MAGIC or version != _VERSION:
        raise _Rejected(f"it is not a version {_VERSION} view index file")
    columns_at = _HEADER.size + topic_len
    if len(body) != columns_at + _COLUMNS * 8 * n or n < 1:
        raise _Rejected("its length does not match its entries")
    tp = segment.topic_partition
    topic = bytes(data[_HEADER.size:columns_at])
    size = segment.size
    if base != segment.base_offset or log_size > size:
        raise _Rejected(f"it describes a segment of {log_size} bytes at base offset {base}, "
                        f"not this one ({size} bytes at {segment.base_offset})", stale=True)
    if topic != tp.topic.encode() or partition != tp.partition:
        raise _Rejected(f"it was written for another partition ({topic!r}-{partition})", stale=True)
    # a remote log segment's file is in a directory of the copy's own (its id): bound to bytes that never
    # change, it is used without fetching the copy's offset index
    if not _remote(segment) and _offset_index_crc(segment, index_entries) != index_crc:
        raise _Rejected("it does not match the segment's offset index", stale=True)
    if not 0 <= last_position < log_size:
        raise _Rejected("its last batch lies outside the segment")
    if log_size < size and _batch_crc(segment, last_position) != batch_crc:
        # the segment grew since (an active segment after a clean shutdown): the batch
        # it ends with must still be there, or the bytes before it may have changed
        raise _Rejected(f"the batch at byte {last_position} of the log is not the one it ends with",
                        stale=True)
    vi = new_index(base, interval)
    cols = []
    at = columns_at
    for _ in range(_COLUMNS):
        col = array("q")
        col.frombytes(body[at:at + 8 * n])
        if not _LITTLE:  # pragma: no cover - big-endian hosts
            col.byteswap()
        cols.append(col)
        at += 8 * n
    offsets, log_positions, text_positions, json_positions = cols
    if (log_positions[0] != 0 or log_positions[-1] > last_position or text_positions[-1] > text_size
            or json_positions[-1] > json_size or offsets[0] < base or offsets[-1] >= next_offset):
        raise _Rejected("its entries lie outside the segment")
    vi.load_columns(cols, n, (next_offset, log_size, text_size, json_size, records), last_position,
                    since_entry)
    counters["loaded"] += 1
    return vi

