"""Byte-addressable text and JSON-lines renderings of a log (the mount's view files).

A :class:`LogView` is one *anchored* rendering: position 0 is the first record
at or after ``start_offset`` (the log start when None) at the moment the view is
created, and the bytes at a position never change afterwards.  That is what
lets ``cat``, ``tail -f`` and Spark treat a view as an ordinary file that only
grows, while retention, DeleteRecords and compaction rewrite the log beneath it.

How positions map to records:

* The view holds the :class:`~engine.segment.LogSegment` objects it covers
  ("slots"), a snapshot of ``log.segments`` from its first segment on, extended
  with newly rolled segments once the last one it holds stops being the active
  segment.  Reading goes through the segment objects, never through the log, so
  a view opened before a deletion or a cleaner swap reads on from what it
  opened: a segment's ``.log`` file descriptor outlives its unlink (Unix
  semantics).
* Every segment keeps a sparse :class:`~engine.views.index.ViewIndex` (batch
  start -> log position, text position, JSON position) and running totals, so a
  random read bisects the slots' start positions, takes the index floor, preads
  from that log position and renders only a few batches.
* Sequential reads continue from a cursor (the last rendered chunk and the log
  position after it) without any lookup.
* A view follows the log across compaction and retention by *offset*: once
  its last segment stops being active, it continues at that segment's next
  offset in whatever segment of the log holds it now.  The cleaner may have
  merged that segment with later ones into a cleaned segment starting at or
  below that offset (even at the same base offset); the new slot then skips
  the records below it, so a reader sees every record the log still holds
  after what it read, in offset order, none twice and never part of one.  If
  retention deleted the segments that followed, the view continues at the next
  record that still exists.
* Once the view has read past a slot its strong reference is dropped (a weak
  one is kept), so a long-running reader does not keep deleted data on disk;
  a backward read into a segment that still exists is served through the weak
  reference, one into a released segment that is gone fails with
  OffsetOutOfRangeError.  The sequential cursor never needs a released
  segment: resting at the end of one, it moves on by the slot's final size.

Sizes come from the view index totals, which count only complete batches, so a
view never exposes part of a record that is still being appended.

Every batch is CRC32C-checked as it is rendered (SPEC section 7): a stored bit
flip fails that read with CorruptRecordError naming the ``.log`` and the
batch's position (EIO at the mount), while the bytes before it stay readable.
"""

from __future__ import annotations

import bisect
import functools
import logging
import threading
import weakref
from enum import Enum
from typing import TYPE_CHECKING, cast

from engine import records as _records
from engine import transactions
from engine.errors import CorruptRecordError, InvalidRequestError, OffsetOutOfRangeError, StorageError
from engine.records.reader import read_chunks
from engine.store_waits import StoreWaitDeferred, forget_held, holding, outside_store_waits
from engine.views import render, walk
from engine.views.index import committed_view_index, view_index

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator

    from engine.log import Log
    from engine.records import BatchColumns, BatchHeader, Record
    from engine.segment import LogSegment
    from engine.transactions import TransactionState
    from engine.views.index import ViewIndex

logger = logging.getLogger(__name__)

#: Minimum bytes of ``.log`` read per pread while rendering: large enough that a
#: sequential ``cat`` costs one system call per many batches.
_MIN_LOG_CHUNK = 256 * 1024
#: What a hidden batch (an aborted transaction's, under read_committed) renders from.
_NO_COLUMNS = _records.BatchColumns([], [], None, [], None)


class ViewFormat(Enum):
    TEXT = "text"
    JSONL = "jsonl"


#: how close to the end of a remote log segment a sequential reader has the next one fetched ahead
_STORE_READ_AHEAD_BYTES = 8 << 20


class _Slot:
    """One segment covered by a view, and where its rendering starts in the view."""

    __slots__ = ("base_offset", "start", "skip", "final_size", "strong", "weak")

    def __init__(self, segment: LogSegment, start: int, skip: int) -> None:
        self.base_offset = segment.base_offset
        self.start = start              # view position of this slot's first byte
        # rendering bytes of the segment before the view's anchor, or before the
        # record the view continues at when it resumes inside a cleaned segment
        self.skip = skip
        self.final_size: int | None = None   # segment rendering size once it is inactive
        self.strong: LogSegment | None = segment
        try:
            self.weak: Callable[[], LogSegment | None] = weakref.ref(segment)
        except TypeError:               # an object without weakref support stays strongly held
            self.weak = lambda: segment

    def segment(self) -> LogSegment | None:
        return self.strong if self.strong is not None else self.weak()


class LogView:
    """An anchored, growing, byte-addressable rendering of a :class:`~engine.log.Log`.

    ``segment`` restricts the view to that one segment (``segments/<base>.jsonl``);
    such a view grows only while the segment is active.  Thread-safe: the mount
    may serve reads of one open file from several worker threads.
    """

    def __init__(self, log: Log, fmt: ViewFormat, start_offset: int | None = None,
                 segment: LogSegment | None = None) -> None:
        self.log = log
        self.format = fmt
        self.topic = log.topic_partition.topic
        self.partition = log.topic_partition.partition
        self._text = fmt is ViewFormat.TEXT
        self._single = segment is not None
        self._lock = threading.Lock()
        self._closed = False
        #: base offsets whose copy did not match the deleted local segment of their slot (said once)
        self._copies_refused: set[int] = set()
        # cursor: the last rendered chunk (view positions [_buf_start, _buf_start+len(_buf)))
        # and where decoding continues after it (slot, log position, segment render position)
        self._buf: bytes | bytearray = b""
        self._buf_start = 0
        self._next: tuple[int, int, int] | None = None
        # isolation.level=read_committed: batches of aborted transactions render nothing
        self._txn = transactions.read_committed_state(log)

        if segment is not None:
            # segments/<base>.jsonl starts at the log start when DeleteRecords or
            # retention moved it inside this segment: what is deleted is not shown.
            start = segment.base_offset if start_offset is None else max(start_offset, segment.base_offset)
            self.start_offset = start
            self._slots = [_Slot(segment, 0, 0)]
            self._slots[0].skip = self._size_before(segment, start)
            return
        segments = log.reader_segments()     # remote log segments below the local log start too
        log_start = log.log_start_offset
        if start_offset is None:
            start_offset = log_start
        elif start_offset < log_start or start_offset > transactions.visible_end_offset(log):
            stable = self._txn is not None and self._txn.stable_offset_bounded
            end = transactions.visible_end_offset(log)
            raise OffsetOutOfRangeError(
                f"Offset {start_offset} is out of range for partition {log.topic_partition}: "
                f"log start offset {log_start}, {'last stable' if stable else 'log end'} offset {end}",
                offset=start_offset, log_start_offset=log_start, log_end_offset=end)
        self.start_offset = start_offset
        bases = list(segments.keys())
        first = max(bisect.bisect_right(bases, start_offset) - 1, 0)
        covered = [segments[base] for base in bases[first:]]
        if not covered:
            raise StorageError(f"Log {log.dir} has no segments")
        self._slots = [_Slot(covered[0], 0, self._size_before(covered[0], start_offset))]
        for seg in covered[1:]:
            if not self._rendered_whole(self._slots[-1]):
                break                   # the rest is behind the last stable offset: _refresh adds it later
            self._append_slot(seg)

    # ------------------------------------------------------------------ sizes

    def _view_index(self, segment: LogSegment) -> ViewIndex:
        if self._txn is not None:
            return committed_view_index(self._txn, segment)
        # a sealed segment's index is loaded from (or written to) its .viewindex file
        return view_index(segment, segment is not self.log.segments.peekitem(-1)[1])

    def _segment_size(self, segment: LogSegment) -> int:
        index = self._view_index(segment)
        return index.text_size if self._text else index.json_size

    def _size_before(self, segment: LogSegment, start_offset: int) -> int:
        """Rendering bytes of the records of ``segment`` below ``start_offset``.

        The index floor gives the rendering position of the batch that holds (or
        precedes) the anchor; only batches from there are decoded.
        """
        if start_offset <= segment.base_offset:
            return 0
        index = self._view_index(segment)
        _offset, log_pos, text_pos, json_pos = index.floor_by_offset(start_offset)
        size = text_pos if self._text else json_pos
        limit = self._segment_size(segment)
        for header, item, _ in self._batches(segment, log_pos, full=True):
            columns = cast("BatchColumns", item)        # full=True: columns, never rendered text
            if header.base_offset >= start_offset:
                break
            below = bisect.bisect_left(columns.offsets, start_offset)
            if below:
                text_size, json_size = render.columns_view_sizes(
                    _prefix_of(columns, below), self.topic, self.partition, int(header.timestamp_type))
                size += text_size if self._text else json_size
            if header.last_offset >= start_offset:
                break
        return min(size, limit)

    def _rendered_whole(self, slot: _Slot) -> bool:
        """Whether the view index of the slot's (inactive) segment covers all of it.

        Always, but for a stable offset bounded view (engine.transactions) whose
        last stable offset is inside the segment: its size is not final yet.
        """
        if self._txn is None or not self._txn.stable_offset_bounded or slot.final_size is not None:
            return True
        segment = slot.segment()
        return segment is None or self._view_index(segment).log_size >= segment.size

    def _append_slot(self, segment: LogSegment, skip: int = 0) -> None:
        last = self._slots[-1]
        if last.final_size is None:
            last.final_size = self._segment_size(self._segment_of(last))
        self._slots.append(_Slot(segment, last.start + last.final_size - last.skip, skip))

    def _refresh(self) -> None:
        """Take in what the log holds after the view's last segment once that stopped being active.

        The continuation is found by offset, not by base offset: the first
        record the view has not rendered is the last segment's next offset,
        and the view goes on with whatever segment of the log *now* holds it.
        After a compaction that is a cleaned segment which may start at or
        below that offset (the cleaner merges the view's old active segment
        with later ones into one segment with the first one's base offset),
        so the new slot skips the records below it: no record twice, and no
        survivor of the merged segments missed.  When retention deleted the
        segments that followed, the view continues at the log's first
        segment, the next record that still exists.
        """
        if self._txn is not None and self._txn.truncations != self.log.truncations:
            self._txn = transactions.read_committed_state(self.log)     # walked again after a truncation
        if self._single:
            return
        last = self._slots[-1]
        last_segment = last.segment()
        log = self.log
        segments = log.reader_segments()
        active = segments.peekitem(-1)[1]
        if last_segment is None or last_segment is active or not self._rendered_whole(last):
            return
        if last.final_size is None:
            last.final_size = self._segment_size(last_segment)
        # An inactive segment never changes again (the cleaner writes new segment
        # objects), so its next offset is final.
        next_offset = last_segment.next_offset
        values = segments.values()
        first = max(segments.bisect_right(next_offset) - 1, 0)
        for segment in values[first:]:
            if segment is last_segment:
                continue
            if not self._rendered_whole(self._slots[-1]):
                return              # the rest is behind the last stable offset: a later refresh adds it
            if segment.base_offset < next_offset:
                if segment is not active and segment.next_offset <= next_offset:
                    continue                # wholly rendered already
                self._append_slot(segment, self._size_before(segment, next_offset))
            else:
                self._append_slot(segment)

    def _slot_size(self, slot: _Slot) -> int:
        if slot.final_size is not None:
            return slot.final_size
        segment = slot.segment()
        return self._segment_size(segment) if segment is not None else 0

    def _end(self) -> int:
        last = self._slots[-1]
        return max(last.start + self._slot_size(last) - last.skip, last.start)

    def size(self) -> int:
        """Bytes of the rendering from the anchor to the last complete record (only grows)."""
        return outside_store_waits(self._lock, self._size_locked)

    def _size_locked(self) -> int:
        self._refresh()
        return self._end()

    # ------------------------------------------------------------------ reading

    def read(self, position: int, size: int) -> bytes:
        """Up to ``size`` bytes of the rendering at ``position`` (b"" at or past the end)."""
        data = self.read_buffer(position, size)
        return data if type(data) is bytes else bytes(data)

    def read_buffer(self, position: int, size: int) -> bytes | memoryview:
        """What ``read`` returns, without its copy when the bytes are part of one rendered chunk.

        A memoryview of the chunk then (FUSE replies from any buffer): a
        sequential reader costs one copy of its bytes fewer.  The chunk is
        never changed once rendered, so the view stays valid.
        """
        if position < 0 or size < 0:
            raise InvalidRequestError(f"Invalid read of {size} bytes at position {position}")
        # a wait on tiered storage's store is taken without the lock (engine.store_waits): the bytes rendered
        # before it are kept, and the read goes on after it
        out: list[bytes | memoryview] = []
        with holding():
            while True:
                data, deferred = outside_store_waits(self._lock, functools.partial(self._read_locked, position, size))
                if data:
                    out.append(data)
                    position += len(data)
                    size -= len(data)
                if deferred is None or size <= 0:
                    break
                forget_held()       # the bytes read are rendered: only what comes next is held
                deferred.wait()
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    def _read_locked(self, position: int, size: int) -> tuple[bytes | memoryview, StoreWaitDeferred | None]:
        """What ``read_buffer`` reads under the lock, and the wait on the store that stopped it after some
        bytes (None: it read to ``size`` or the end); a wait before any byte is raised."""
        if self._closed:
            raise StorageError(f"Read from a closed view of {self.log.topic_partition}")
        self._refresh()
        end = self._end()
        if position >= end or size == 0:
            # A reader resting at the end (tail -f) must still let go of the
            # segments it read past, or a deleted one keeps its disk space
            # until the next append.
            self._release_read_past(min(position, end))
            return b"", None
        stop = min(position + size, end)
        out: list[bytes | memoryview] = []
        deferred = None
        while position < stop:
            try:
                piece = self._read_from_cursor(position, stop)
                if not piece:
                    piece = self._render_at(position, stop)
            except CorruptRecordError:
                if out:          # the good bytes first; the next read at the bad batch fails
                    break
                raise
            except StoreWaitDeferred as wait:
                if not out:
                    raise
                deferred = wait     # the bytes rendered so far, then the wait without the lock
                break
            if not piece:
                break
            out.append(piece)
            position += len(piece)
        self._release_read_past(position)
        return (out[0] if len(out) == 1 else b"".join(out)), deferred

    def continues_at(self, position: int) -> bool:
        """Whether a read at ``position`` is served by the cursor: from the last chunk or right after it.

        Such a read looks nothing up (no index, no bisect): it decodes only the
        batches that follow (its cost: docs/performance.md, "Figures behind the
        code"), so the FUSE layer serves it inline.  Read without the lock: a stale answer only changes which
        thread serves the read.
        """
        start, buf, following = self._buf_start, self._buf, self._next
        return start <= position < start + len(buf) or (position == start + len(buf) and following is not None)

    def may_wait_on_store(self, position: int, size: int) -> bool:
        """Whether a read of ``size`` bytes at ``position`` may wait on remote storage (tiered storage).

        True when the bytes are not all in the last rendered chunk and the read
        starts in a remote log segment's slot: those slots come first (a
        remote segment is below the local log start), so the FUSE layer serves
        such a read from a worker thread, never its event loop, which a store
        that does not answer would stop for the request timeout.  Read without
        the lock: a stale answer only changes which thread serves the read.
        """
        if not self.log.has_remote_only_records:
            return False                # every record is in a local segment
        start, buf = self._buf_start, self._buf
        if start <= position and position + size <= start + len(buf):
            return False
        for slot in self._slots:
            segment = slot.segment()
            if segment is not None and not segment.remote:
                return position < slot.start        # the first local slot: the remote ones end there
        return True

    def _read_from_cursor(self, position: int, stop: int) -> bytes | memoryview:
        """Serve from the last rendered chunk, or continue decoding right after it."""
        buf_end = self._buf_start + len(self._buf)
        if self._buf_start <= position < buf_end:
            return memoryview(self._buf)[position - self._buf_start:stop - self._buf_start]
        if position == buf_end and self._next is not None:
            slot_index, log_pos, render_pos = self._next
            return self._render_chunk(slot_index, log_pos, render_pos, position, stop)
        return b""

    def _render_at(self, position: int, stop: int) -> bytes | memoryview:
        """Random access: bisect the slots, then the segment's view index."""
        starts = [slot.start for slot in self._slots]
        # the last slot starting at or before position (empty slots share their start
        # with the next one, and the last of them is the one that holds position)
        slot_index = bisect.bisect_right(starts, position) - 1
        slot = self._slots[slot_index]
        segment = self._segment_of(slot)
        target = position - slot.start + slot.skip
        index = self._view_index(segment)
        if self._text:
            _, log_pos, render_pos, _ = index.floor_by_text(target)
        else:
            _, log_pos, _, render_pos = index.floor_by_json(target)
        return self._render_chunk(slot_index, log_pos, render_pos, position, stop)

    def _segment_of(self, slot: _Slot) -> LogSegment:
        segment = slot.segment()
        if segment is None:
            segment = self._copy_serving(slot)
        if segment is None:
            raise OffsetOutOfRangeError(
                f"Segment {slot.base_offset} of {self.log.topic_partition} was deleted after this "
                "view read past it", offset=slot.base_offset)
        return segment

    def _copy_serving(self, slot: _Slot) -> LogSegment | None:
        """The remote log segment that holds a slot's records once local retention deleted its local
        segment (tiered storage), bound to the slot from then on; None when none does.

        Local retention deletes only a copied segment: the copy is of the closed segment, byte for byte, so
        the view reads on from it (a reader that the kernel's out-of-order reads took back into a slot the
        view had let go of, or one slower than ``file.delete.delay.ms``).  Log retention and DeleteRecords
        are another matter: below the log start no copy serves, and the read fails as before.
        """
        if not self.log.has_remote_only_records or slot.base_offset in self._copies_refused:
            return None
        copy: LogSegment | None = self.log.reader_segments().get(slot.base_offset)
        if copy is None or not copy.remote:
            return None
        rendered = self._segment_size(copy) if slot.final_size is not None else None
        if rendered != slot.final_size:
            # never expected (a copy is of the closed segment): the read fails rather than render other bytes
            self._copies_refused.add(slot.base_offset)
            logger.warning("The remote log segment %d of %s renders %d bytes, not the %d its deleted local "
                           "segment rendered in this view: the view does not read on from it",
                           slot.base_offset, self.log.topic_partition, rendered, slot.final_size)
            return None
        slot.weak = weakref.ref(copy)
        return copy

    def _render_chunk(self, slot_index: int, log_pos: int, render_pos: int, position: int,
                      stop: int) -> bytes | memoryview:
        """Render batches of one slot from (log_pos, render_pos) until ``stop`` is covered.

        ``render_pos`` is a batch boundary in the segment's rendering; the
        result is the part of the rendered chunk from ``position`` on, and the
        chunk becomes the cursor for the next sequential read.
        """
        slot = self._slots[slot_index]
        slot_end = self._slot_size(slot)                    # complete batches only
        if render_pos >= slot_end:
            # The cursor may rest at the end of a slot it has released (and whose
            # segment is gone): moving on needs only the slot's final size.
            if slot_index + 1 < len(self._slots):
                self._next = (slot_index + 1, 0, 0)
                self._buf, self._buf_start = b"", position
                return self._render_chunk(slot_index + 1, 0, 0, position, stop)
            return b""
        segment = self._segment_of(slot)
        if render_pos < slot.skip:
            # entering a slot that starts inside its segment: go to the index floor of its first byte
            index = self._view_index(segment)
            if self._text:
                _, floor_log_pos, floor_pos, _ = index.floor_by_text(slot.skip)
            else:
                _, floor_log_pos, _, floor_pos = index.floor_by_json(slot.skip)
            if floor_pos > render_pos:
                log_pos, render_pos = floor_log_pos, floor_pos
        seg_stop = min(stop - slot.start + slot.skip, slot_end)
        rendered: list[bytes | bytearray] = []
        chunk_start = render_pos
        pos = render_pos
        next_log_pos = log_pos
        want = seg_stop - render_pos

        batches = self._batches(segment, log_pos, full=False, hint=want)
        while True:
            try:
                item = next(batches, None)
            except CorruptRecordError:
                # Serve the whole batches before the damaged one (`cat` prints
                # them); the cursor stops at the damaged batch, so the next read
                # there raises again and the reader gets EIO at that position.
                if pos > position - slot.start + slot.skip:    # some bytes at `position` rendered
                    break
                raise
            if item is None:
                break
            _header, batch, log_pos_after = item
            piece = cast("bytes | bytearray", batch)            # full=False: the batch's rendering
            if pos + len(piece) > slot_end:
                break                      # a batch appended after the size snapshot
            rendered.append(piece)
            pos += len(piece)
            next_log_pos = log_pos_after
            if pos >= seg_stop:
                break
        chunk = rendered[0] if len(rendered) == 1 else b"".join(rendered)
        # keep the cursor in view coordinates
        chunk_view_start = slot.start + chunk_start - slot.skip
        if slot.skip and chunk_start < slot.skip:
            chunk = chunk[slot.skip - chunk_start:]
            chunk_view_start = slot.start
        self._buf = chunk
        self._buf_start = chunk_view_start
        if pos >= slot_end and slot_index + 1 < len(self._slots):
            self._next = (slot_index + 1, 0, 0)
        else:
            self._next = (slot_index, next_log_pos, pos)
        if segment.remote and slot_index + 1 < len(self._slots) \
                and next_log_pos + _STORE_READ_AHEAD_BYTES >= segment.size:
            following = self._slots[slot_index + 1].segment()
            if following is not None:
                following.read_ahead()      # this reader gets there next: a copy's first chunks fetched ahead
        begin = position - chunk_view_start
        return memoryview(chunk)[begin:begin + (stop - position)] if begin >= 0 else b""

    def _batches(self, segment: LogSegment, log_pos: int, *, full: bool,
                 hint: int = 0) -> Iterator[tuple[BatchHeader, BatchColumns | bytes | bytearray, int]]:
        """Yield (header, columns or the batch's rendering, log position after the batch) from ``log_pos`` on.

        Reads the ``.log`` up to the segment's published size in chunks
        through the shared reader (:func:`engine.records.reader.read_chunks`:
        pread on the segment's descriptor, valid after unlink) and decodes
        lazily, batch by batch; a batch larger than a chunk is read whole.

        Every batch is CRC-checked before it is rendered (SPEC section 7): a
        flipped bit in a stored value must fail the read with EIO rather than be
        served.  The check is lazy, so the batches before a corrupt one stay
        readable; CRC32C is C code and costs a few per cent of a decode.
        """
        chunk_size = max(_MIN_LOG_CHUNK, hint + (hint >> 1))
        # No view needs per-record objects: decode_text renders a batch's lines
        # and walk.batch_jsonl its JSON lines straight from the (decompressed)
        # log bytes in one compiled walk; only _size_before takes columns.
        topic, partition = self.topic, self.partition
        decode: Callable[[bytes, int, BatchHeader], BatchColumns | bytes | bytearray]
        if full:
            decode = _records.decode_columns
        elif self._text:
            decode = _records.decode_text
        else:
            def decode(data: bytes, rel: int, header: BatchHeader) -> bytes:
                return walk.batch_jsonl(data, rel, header, topic, partition)
        txn = self._txn
        hidden = _NO_COLUMNS if full else b""
        # stable offset bounded: nothing at or after the last stable offset (read again when reached)
        stable = txn.last_stable_offset() if txn is not None and txn.stable_offset_bounded else None
        # Bounded by the published size: a batch being appended is never seen.
        chunks = read_chunks(segment.read_bytes, log_pos, segment.size, chunk_size, path=segment.log_path,
                             verify_crc=True)
        try:
            for chunk in chunks:
                base, data = chunk.position, chunk.buf
                for rel, header in chunk.batches:
                    if stable is not None and header.base_offset >= stable:
                        # cast: stable is set only when txn is
                        stable = cast("TransactionState", txn).last_stable_offset()
                        if header.base_offset >= stable:
                            return
                    if txn is not None and txn.hides(header):
                        yield header, hidden, base + rel + header.size
                        continue
                    try:
                        item = decode(data, rel, header)
                    except CorruptRecordError as exc:
                        raise exc.at(segment.log_path, base + rel) from None
                    yield header, item, base + rel + header.size
        except CorruptRecordError as exc:
            raise CorruptRecordError(
                f"{exc.detail} while rendering the view of partition "
                f"{self.log.topic_partition}", path=exc.path, position=exc.position) from None

    # ------------------------------------------------------------------ memory

    def _release_read_past(self, position: int) -> None:
        """Drop strong references to slots entirely before ``position``.

        The cursor may still name such a slot (a read that ended exactly at its
        end): it only ever moves on from there, which needs the slot's final
        size, never its segment (see _render_chunk).
        """
        for slot in self._slots[:-1]:
            if slot.strong is None:
                continue
            if slot.final_size is not None and slot.start + slot.final_size - slot.skip <= position:
                slot.strong = None
            else:
                break

    def readable_from(self) -> int:
        """The first view position still readable: 0 unless segments the view let go of were deleted.

        A view followed for long (``tail -F records``) releases the segments it
        read past; once retention or the cleaner deleted them, their bytes stay
        counted in the view's positions (so its size only grows) but can no
        longer be rendered; records below the log start (DeleteRecords) are
        deleted even while their segment is held.  A segment that tiered
        storage's local retention deleted is not gone: its copy serves the
        slot.  This is where what a new reader may read starts.
        """
        with self._lock:
            segments = self.log.reader_segments()
            log_start = self.log.log_start_offset
            for slot in self._slots:
                segment = slot.segment()
                if segment is None or (slot.strong is None and segments.get(slot.base_offset) is not segment):
                    segment = segments.get(slot.base_offset)
                    if segment is None or not segment.remote:
                        continue
                    # local retention deleted the slot's segment once copied: the copy serves its records
                    # (``_copy_serving``), which the log still holds
                if segment.next_offset <= log_start and segment is not segments.peekitem(-1)[1]:
                    continue            # wholly below the log start (DeleteRecords): not to be shown again
                below = self._size_before(segment, log_start) if log_start > segment.base_offset else 0
                return slot.start + max(below - slot.skip, 0)
            return self._end()

    def held_segments(self) -> int:
        """How many segments this view keeps alive (for stats and tests)."""
        return sum(1 for slot in self._slots if slot.strong is not None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for slot in self._slots:
                slot.strong = None
            self._buf = b""
            self._next = None


class ViewIdentity:
    """What the bytes of a view depend on, so the mount can keep one inode per rendering.

    A rendering from ``start_offset`` is the same file for as long as no
    record it covers is deleted or rewritten: appends and rolls only add bytes
    at its end.  It stops being the same file when the log start moves past
    ``start_offset`` (retention, DeleteRecords) or when a segment it covers
    leaves the log or is replaced by another object (retention, the cleaner's
    swap).  The identity holds only weak references, so a name that was looked
    up but is not open pins nothing on disk.

    ``is_current`` is O(1) while the log's segment map is the object it saw
    last (the map is replaced, copy-on-write, at every roll, deletion and
    swap) and O(segments covered) once after each change.  The map is held
    weakly too: it holds every segment it lists.
    """

    __slots__ = ("log", "start_offset", "_single", "_seen", "_covered", "_current")

    def __init__(self, log: Log, start_offset: int, segment: LogSegment | None = None) -> None:
        self.log = log
        self.start_offset = start_offset
        self._single = segment is not None
        segments = log.reader_segments()
        # weakly: the map is replaced at every change and holds its segments,
        # deleted ones included, which must not stay open because of a name
        self._seen = weakref.ref(segments)
        if segment is not None:
            covered = [segment]
        else:
            values = segments.values()
            first = max(segments.bisect_right(start_offset) - 1, 0)
            covered = list(values[first:])
        self._covered: list[tuple[int, weakref.ref[LogSegment]]] = [(seg.base_offset, weakref.ref(seg))
                                                                    for seg in covered]
        self._current = True

    def is_current(self) -> bool:
        """Whether a view anchored now at ``start_offset`` renders the same bytes (plus appends)."""
        if not self._current:
            return False
        log = self.log
        if log.log_start_offset > self.start_offset:
            self._current = False
            return False
        segments = log.reader_segments()
        if segments is self._seen():
            return True
        for base, ref in self._covered:
            seg = ref()
            if seg is None or segments.get(base) is not seg:
                self._current = False
                return False
        if not self._single and self._covered:
            # rolled since: the new segments are part of this rendering from now on
            last_base = self._covered[-1][0]
            values = segments.values()
            for seg in values[segments.bisect_right(last_base):]:
                self._covered.append((seg.base_offset, weakref.ref(seg)))
        self._seen = weakref.ref(segments)
        return True

    def segment(self) -> LogSegment | None:
        """The segment of a single-segment identity (None once it is gone)."""
        return self._covered[0][1]() if self._covered else None

    def last_segment(self) -> LogSegment | None:
        return self._covered[-1][1]() if self._covered else None


def _prefix_of(columns: BatchColumns, n: int) -> BatchColumns:
    """The first ``n`` records of a decoded batch."""
    keys, headers = columns.keys, columns.headers
    return columns._replace(offsets=columns.offsets[:n], timestamps=columns.timestamps[:n],
                            keys=None if keys is None else keys[:n], values=columns.values[:n],
                            headers=None if headers is None else headers[:n])


def record_at(log: Log, offset: int) -> Record:
    """The record stored at exactly ``offset`` (``offset/<N>``); OffsetOutOfRangeError if none."""
    found = log.read_records(offset, 1)
    txn = transactions.read_committed_state(log)
    if not found or found[0].offset != offset or (txn is not None and txn.hides_offset(offset)):
        raise OffsetOutOfRangeError(
            f"No record at offset {offset} in partition {log.topic_partition} "
            f"(log start offset {log.log_start_offset}, log end offset {log.log_end_offset})",
            offset=offset, log_start_offset=log.log_start_offset, log_end_offset=log.log_end_offset)
    return found[0]
