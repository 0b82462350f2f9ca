"""Sparse in-memory index of a segment's positions in the mount's renderings.

The mount serves ``records`` (one value per line) and ``records.jsonl`` (one
JSON object per line) as byte-addressable files.  A read at byte position P
must not decode the log from its start, so every segment keeps a ViewIndex:
for a sparse set of batches (the segment's first batch, then one after every
``VIEW_INDEX_INTERVAL_BYTES`` of log, at least ``index.interval.bytes``) it
records where the batch starts in the ``.log`` and where its first record
starts in each rendering.  A read bisects the column of its rendering, then
decodes forward from the batch found; the cost is bounded by that interval of
log, as a fetch is bounded by ``index.interval.bytes`` in Kafka.  A sealed
segment's index is persisted in ``<base>.viewindex`` (engine.views.persisted)
and loaded from there after a remount instead of a scan.

Concurrency: there is one writer (appends happen under ``Log.lock``) and any
number of lock-free readers.  Each column is an ``array('q')`` that only grows;
``entries`` is bumped after all four columns have their new value, and readers
never look past it.  The running totals are published as one tuple
(:attr:`totals`) so that a reader sees the sizes and the end offset of the
same batch, never a mix of two.

The index of a segment is the segment's ``attachment`` (a :class:`SegmentViews`,
the view layer's ``engine.segment.SegmentAttachment``), which the segment drops
whenever bytes it already holds change; :func:`view_index` then rebuilds it by
one scan.  The read_committed index of the segment (:func:`committed_view_index`)
is kept there too, for the log's transaction state it was built with.  While a log has
a :class:`ViewsObserver` (:func:`attach`), appends keep the index of the active
segment exact without any scan, from sizes computed off the appended values.
"""

from __future__ import annotations

import threading
import weakref
from array import array
from bisect import bisect_right
from typing import TYPE_CHECKING, NamedTuple

from engine.errors import CorruptRecordError
from engine.segment import SegmentAttachment
from engine.views import persisted
from engine.views.render import appended_lines_view_sizes, appended_view_sizes
from engine.views.walk import batch_view_sizes

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from engine.log import Log
    from engine.segment import LogSegment
    from engine.topic import TopicPartition
    from engine.transactions import TransactionState


class ViewTotals(NamedTuple):
    """Running totals of a segment's renderings, as of one batch boundary."""

    next_offset: int        # offset after the last record covered
    log_size: int           # bytes of .log covered (the position after the last batch)
    text_size: int          # bytes of the text rendering
    json_size: int          # bytes of the JSON-lines rendering
    record_count: int       # records rendered (control records render nothing)


class ViewIndex:
    """Columns ``offset, log_position, text_position, json_position`` plus totals.

    ``offset`` is the base offset of the indexed batch: the rendering of that
    batch's records starts at ``text_position`` / ``json_position``.  A batch
    whose first records were compacted away still starts its rendering with its
    first surviving record, so the columns stay exact after cleaning.
    """

    __slots__ = ("base_offset", "_offsets", "_log_positions", "_text_positions",
                 "_json_positions", "entries", "totals", "_bytes_since_last_entry",
                 "index_interval_bytes", "last_position")

    def __init__(self, base_offset: int, index_interval_bytes: int = 4096) -> None:
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self._offsets = array("q")
        self._log_positions = array("q")
        self._text_positions = array("q")
        self._json_positions = array("q")
        self.entries = 0
        self.totals = ViewTotals(base_offset, 0, 0, 0, 0)
        # Only used when the index decides spacing itself (a rebuild by scan).
        self._bytes_since_last_entry = 0
        #: .log position of the last batch covered (-1: none)
        self.last_position = -1

    # -- running totals (each read is one attribute load of an immutable tuple) --
    @property
    def text_size(self) -> int:
        return self.totals.text_size

    @property
    def json_size(self) -> int:
        return self.totals.json_size

    @property
    def record_count(self) -> int:
        return self.totals.record_count

    @property
    def next_offset(self) -> int:
        return self.totals.next_offset

    @property
    def log_size(self) -> int:
        return self.totals.log_size

    @property
    def bytes_since_last_entry(self) -> int:
        """Log bytes appended by scans since the last entry (kept by ``<base>.viewindex``)."""
        return self._bytes_since_last_entry

    def append(self, first_offset: int, log_position: int, text_size: int, json_size: int,
               next_offset: int, indexed: bool, *, batch_size: int = 0,
               records: int | None = None) -> None:
        """Account for one appended batch of the segment.

        ``indexed`` says the offset index got an entry for this batch; the
        segment's first batch always gets one here, so a read at position 0 of
        a rendering needs no special case.  ``batch_size`` (bytes of the batch
        in the .log) keeps ``log_size`` exact; ``records`` defaults to the
        offset span, which is exact for every batch the log writes itself.
        """
        totals = self.totals
        if indexed or self.entries == 0:
            self._offsets.append(first_offset)
            self._log_positions.append(log_position)
            self._text_positions.append(totals.text_size)
            self._json_positions.append(totals.json_size)
            self.entries += 1          # published last: readers never see a half entry
        count = (next_offset - first_offset) if records is None else records
        end = log_position + batch_size if batch_size else max(totals.log_size, log_position)
        self.last_position = log_position
        self.totals = ViewTotals(next_offset, end, totals.text_size + text_size,
                                 totals.json_size + json_size, totals.record_count + count)

    def append_scanned(self, first_offset: int, log_position: int, batch_size: int,
                       text_size: int, json_size: int, next_offset: int, records: int) -> None:
        """Append a batch found by a scan, choosing sparse points as the offset index does.

        The rule is LogSegment.append's: an entry once more than
        ``index.interval.bytes`` of log went by since the previous one.
        """
        indexed = self._bytes_since_last_entry > self.index_interval_bytes
        if indexed or self.entries == 0:
            self._bytes_since_last_entry = 0
        self._bytes_since_last_entry += batch_size
        self.append(first_offset, log_position, text_size, json_size, next_offset, indexed,
                    batch_size=batch_size, records=records)

    def columns(self) -> tuple[array[int], array[int], array[int], array[int]]:
        """The four columns (offset, log, text and JSON positions); only the first ``entries`` are valid."""
        return self._offsets, self._log_positions, self._text_positions, self._json_positions

    def load_columns(self, columns: Sequence[array[int]], entries: int, totals: tuple[int, int, int, int, int],
                     last_position: int, bytes_since_last_entry: int) -> None:
        """Fill an empty index from a persisted one (engine.views.persisted); appends may follow.

        ``totals`` are the fields of :class:`ViewTotals` in order (the persisted module does
        not import this one: it is imported by it).
        """
        self._offsets, self._log_positions, self._text_positions, self._json_positions = columns
        self.last_position = last_position
        self._bytes_since_last_entry = bytes_since_last_entry
        self.totals = ViewTotals(*totals)
        self.entries = entries

    def _entry(self, n: int) -> tuple[int, int, int, int]:
        return (self._offsets[n], self._log_positions[n], self._text_positions[n],
                self._json_positions[n])

    def _floor(self, column: array[int], key: int) -> tuple[int, int, int, int]:
        n = self.entries
        i = bisect_right(column, key, 0, n) - 1
        if i < 0:
            return (self.base_offset, 0, 0, 0)
        return self._entry(i)

    def floor_by_text(self, text_position: int) -> tuple[int, int, int, int]:
        """The last entry whose text rendering starts at or before ``text_position``."""
        return self._floor(self._text_positions, text_position)

    def floor_by_json(self, json_position: int) -> tuple[int, int, int, int]:
        """The last entry whose JSON rendering starts at or before ``json_position``."""
        return self._floor(self._json_positions, json_position)

    def floor_by_offset(self, offset: int) -> tuple[int, int, int, int]:
        """The last entry whose batch starts at or before ``offset``."""
        return self._floor(self._offsets, offset)

    def __len__(self) -> int:
        return self.entries

    def __repr__(self) -> str:
        t = self.totals
        return (f"ViewIndex(baseOffset={self.base_offset}, entries={self.entries}, "
                f"nextOffset={t.next_offset}, textSize={t.text_size}, jsonSize={t.json_size})")


#: Log bytes between two view index entries at least: a random read decodes at
#: most this much before the position it wants (it reads 256 KiB anyway), and
#: the index costs 32 bytes per entry in memory and in ``<base>.viewindex``
#: (0.5 MB per GB stored instead of 8 MB at Kafka's 4 KiB index interval).
VIEW_INDEX_INTERVAL_BYTES = 64 * 1024


def _interval(segment: LogSegment) -> int:
    return max(segment.index_interval_bytes, VIEW_INDEX_INTERVAL_BYTES)


class SegmentViews(SegmentAttachment):
    """A segment's ``attachment``: its view indexes and the topic partition they were sized for.

    JSON lines name the topic, so an index sized under another name (a topic
    directory renamed for deletion) is stale, and the segment gets a new
    ``SegmentViews``.  ``index`` is guarded by ``lock``, which serialises
    catch-up scans; an append never waits for it (see
    :meth:`ViewsObserver.on_append`).  ``committed`` is guarded by the lock of
    ``committed_txn`` (``TransactionState.lock``), see :func:`committed_view_index`.
    """

    __slots__ = ("index", "topic_partition", "lock", "loaded", "persisted", "committed", "committed_txn")

    def __init__(self, segment: LogSegment) -> None:
        self.index = ViewIndex(segment.base_offset, _interval(segment))
        self.topic_partition: TopicPartition = segment.topic_partition
        self.lock = threading.Lock()
        self.loaded = False         # the persisted file was looked for (sealed segments)
        self.persisted = False      # the complete index is on disk (or cannot be written)
        #: the read_committed view index, as the transaction state ``committed_txn`` hides batches
        self.committed: ViewIndex | None = None
        self.committed_txn: weakref.ref[TransactionState] | None = None


def _views_of(segment: LogSegment) -> SegmentViews:
    views = segment.attachment
    if not isinstance(views, SegmentViews) or views.topic_partition != segment.topic_partition:
        views = SegmentViews(segment)
        segment.attachment = views
    return views


def view_index(segment: LogSegment, sealed: bool = False) -> ViewIndex:
    """The segment's view index, caught up to the current size (one scan when loaded from disk).

    ``sealed`` says the segment is no longer the log's active one: its index
    is then loaded from ``<base>.viewindex`` when that file is valid, and
    written there after a scan (engine.views.persisted).
    CorruptRecordError (file, position) if the segment is damaged before
    its size: a view never ends silently at damage.
    """
    vi, damage = view_index_and_damage(segment, sealed)
    if damage is not None:
        raise damage
    return vi


def _index_in_memory(segment: LogSegment, sealed: bool) -> ViewIndex | None:
    """The segment's view index in memory when it covers the segment (and, ``sealed``, was loaded from or
    written to its file), else None."""
    views = segment.attachment
    if (isinstance(views, SegmentViews) and views.index.log_size >= segment.size
            and views.topic_partition == segment.topic_partition and (views.persisted or not sealed)):
        return views.index
    return None


def remote_view_indexes_missing(log: Log) -> list[LogSegment]:
    """The remote log segments of ``log`` (tiered storage) whose view index is not in memory yet: sizing a
    view over them reads the store (their offset index, or the copies themselves)."""
    if not log.has_remote_only_records:
        return []                       # every record is in a local segment
    missing = []
    for segment in log.reader_segments().values():
        if not segment.remote:
            break                       # the remote segments come first: below the local log start
        if _index_in_memory(segment, sealed=True) is None:
            missing.append(segment)
    return missing


def load_remote_view_indexes(log: Log) -> None:
    """Bring the view index of every remote log segment of ``log`` into memory (may wait on the store:
    never on the mount's event loop; RemoteReadError when the store fails)."""
    for segment in remote_view_indexes_missing(log):
        view_index(segment, sealed=True)


def view_index_and_damage(segment: LogSegment,
                          sealed: bool = False) -> tuple[ViewIndex, CorruptRecordError | None]:
    """The view index caught up as far as the log is whole, and the damage that stopped it (or None).

    For a reader that serves the good bytes before damage and then fails
    (the index covers exactly the whole batches before the damage).  The
    partial index is kept, so asking again costs one header read, not a
    rescan of the segment.
    """
    in_memory = _index_in_memory(segment, sealed)
    if in_memory is not None:
        return in_memory, None
    views = _views_of(segment)
    with views.lock:
        vi = views.index
        if not views.loaded:
            # First use since the segment was opened: its persisted index, if valid,
            # instead of a scan (a sealed segment's covers it all; an active one's
            # what it held at the last clean shutdown, caught up below).
            views.loaded = True
            if vi.log_size == 0 and segment.size > 0:
                loaded = persisted.load(segment, ViewIndex)
                if loaded is not None:
                    views.index = vi = loaded
                    views.persisted = loaded.log_size == segment.size
        damage = None
        if vi.log_size < segment.size:
            try:
                _catch_up(segment, vi, segment.size)
            except CorruptRecordError as exc:
                damage = exc
        if sealed and damage is None and not views.persisted:
            views.persisted = True          # once, written or not (the failure is logged)
            persisted.persist(segment, vi)
        return vi, damage


def _catch_up(segment: LogSegment, vi: ViewIndex, end: int) -> None:
    # Sizes come from one compiled walk of each batch (walk.batch_view_sizes:
    # no object per record, nothing rendered), whatever producer wrote it.
    tp = segment.topic_partition
    topic, partition = tp.topic, tp.partition
    for pos, header, buf, off in segment.batches_with_bytes(vi.log_size, end):
        try:
            text_size, json_size, count = batch_view_sizes(buf, off, header, topic, partition)
        except CorruptRecordError as exc:
            raise exc.at(segment.log_path, pos) from None
        vi.append_scanned(header.base_offset, pos, header.size, text_size, json_size, header.next_offset, count)


class ViewsObserver:
    """The log's append observer (``Log.append_observer``): keeps view indexes exact as the log grows.

    Called under ``Log.lock`` right after a batch the log encoded itself was
    written, with the values it holds, so the sizes of the two renderings come
    from the values by arithmetic, without decoding the batch.
    """

    __slots__ = ()

    def on_append(self, segment: LogSegment, position: int, batch_size: int,
                  values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                  first: int, timestamp: int) -> None:
        self._appended(segment, position, batch_size, first, len(values),
                       lambda tp: appended_view_sizes(values, keys, first, timestamp, tp.topic, tp.partition))

    def on_append_lines(self, segment: LogSegment, position: int, batch_size: int, block: bytes, count: int,
                        first: int, timestamp: int) -> None:
        self._appended(segment, position, batch_size, first, count,
                       lambda tp: appended_lines_view_sizes(block, count, first, timestamp, tp.topic,
                                                            tp.partition))

    @staticmethod
    def _appended(segment: LogSegment, position: int, batch_size: int, first: int, count: int,
                  view_sizes: Callable[[TopicPartition], tuple[int, int]]) -> None:
        views = segment.attachment
        if views is None:
            if position != 0:
                return                  # built by a scan on first use
            views = _views_of(segment)  # a new segment: exact from its first batch
        elif not isinstance(views, SegmentViews):
            return
        # Never wait for a reader's catch-up scan (it may be long on a big loaded
        # segment): if one is running, it or the next access picks this batch up.
        if not views.lock.acquire(blocking=False):
            return
        try:
            vi = views.index
            tp = views.topic_partition
            if vi.log_size == position and tp == segment.topic_partition:
                text_size, json_size = view_sizes(tp)
                vi.append_scanned(first, position, batch_size, text_size, json_size, first + count, count)
        finally:
            views.lock.release()

    def on_roll(self, segment: LogSegment) -> None:
        """``segment`` was sealed, or the log is closing (under ``Log.lock``): persist its view index if exact.

        The index kept exact by appends is written as it is (no scan, no
        flush: engine.views.persisted); a sealed segment's that is not is
        written after the scan of its first use.
        """
        views = segment.attachment
        if not isinstance(views, SegmentViews) or not views.lock.acquire(blocking=False):
            return
        try:
            if views.index.log_size == segment.size and views.topic_partition == segment.topic_partition:
                views.persisted = True
                views.loaded = True
                persisted.persist(segment, views.index)
        finally:
            views.lock.release()


_OBSERVER = ViewsObserver()


def attach(log: Log) -> None:
    """Have ``log``'s appends keep its segments' view indexes exact (idempotent)."""
    if log.append_observer is not _OBSERVER:
        log.append_observer = _OBSERVER


def committed_view_index(txn: TransactionState, segment: LogSegment) -> ViewIndex:
    """The segment's view index with the batches of aborted transactions rendering nothing.

    Built like :func:`view_index` (one scan, then caught up as the segment
    grows), from the same column sizes; kept in the segment's ``SegmentViews``
    for the transaction state ``txn`` (the log's, replaced when the log is
    truncated: an index built with another state is built again), under
    ``txn.lock``, so the walk answers every batch from one state.  Stable
    offset bounded (a live replica: engine.transactions), it covers only the
    batches below the last stable offset and catches up as that moves, so its
    ``log_size`` stays below the segment's size while a transaction is open.
    """
    views = _views_of(segment)
    with txn.lock:
        vi = views.committed
        if vi is None or views.committed_txn is None or views.committed_txn() is not txn:
            vi = ViewIndex(segment.base_offset, _interval(segment))
            views.committed, views.committed_txn = vi, weakref.ref(txn)
        size = segment.size
        if vi.log_size >= size:
            return vi
        tp = segment.topic_partition
        stable = txn.last_stable_offset() if txn.stable_offset_bounded else None
        if stable is not None and vi.next_offset >= stable:
            return vi           # covers every batch below the last stable offset: nothing to read
        for pos, header, buf, off in segment.batches_with_bytes(vi.log_size, size):
            if stable is not None and header.base_offset >= stable:
                break           # held back until its transaction's marker arrives
            if txn.hides(header):
                text_size = json_size = count = 0
            else:
                try:
                    text_size, json_size, count = batch_view_sizes(buf, off, header, tp.topic, tp.partition)
                except CorruptRecordError as exc:
                    raise exc.at(segment.log_path, pos) from None
            vi.append_scanned(header.base_offset, pos, header.size, text_size, json_size,
                              header.next_offset, count)
        return vi
