"""A consumer's view of one partition: from a committed offset to the log end at open.

:class:`ConsumerView` is a :class:`~engine.views.LogView` (same renderings,
same consistency under appends, retention and compaction) with two additions
a consumer group needs:

* it is *bounded*: its bytes end where the log ended when it was opened
  (:func:`open_consumer_view` takes the log end offset, or the last stable
  offset of a live replica's read_committed view, and the view's size under
  the log's lock, which every append holds, so the two agree), so one
  ``cat`` reads exactly what was there, like one run of a batch consumer;
* :meth:`ConsumerView.next_offset_at` maps a byte position back to an
  offset: the first record the reader was not wholly given, which is the
  offset a consumer commits (the position after its last consumed record).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, cast

from engine import transactions
from engine.views import render
from engine.views.log_view import LogView, ViewFormat

if TYPE_CHECKING:  # pragma: no cover
    from engine.log import Log
    from engine.records import BatchColumns

__all__ = ["ConsumerView", "open_consumer_view"]


class ConsumerView(LogView):
    """A LogView from ``start_offset`` up to ``end_offset`` (``limit`` bytes of rendering)."""

    def __init__(self, log: Log, fmt: ViewFormat, start_offset: int) -> None:
        super().__init__(log, fmt, start_offset=start_offset)
        self.end_offset = start_offset
        self.limit = 0
        #: next offset of each segment the view released (keyed by base offset), for next_offset_at
        self._released_next: dict[int, int] = {}

    def size(self) -> int:
        return self.limit

    def read_buffer(self, position: int, size: int) -> bytes | memoryview:
        if position >= self.limit:
            return b""
        return super().read_buffer(position, min(size, self.limit - position))

    def _release_read_past(self, position: int) -> None:
        for slot in self._slots[:-1]:
            segment = slot.strong
            if segment is None:
                continue
            if slot.final_size is not None and slot.start + slot.final_size - slot.skip <= position:
                self._released_next[slot.base_offset] = segment.next_offset
            else:
                break
        super()._release_read_past(position)

    def next_offset_at(self, position: int) -> int:
        """The offset of the first record not wholly within the first ``position`` bytes of the view."""
        if position <= 0:
            return self.start_offset
        if position >= self.limit:
            return self.end_offset
        with self._lock:
            starts = [slot.start for slot in self._slots]
            # the last slot that starts before position: the record ending at position is in it
            slot = self._slots[max(bisect.bisect_left(starts, position) - 1, 0)]
            segment = slot.segment()
            if segment is None:        # released and deleted: position is at its end
                return min(self._released_next.get(slot.base_offset, self.end_offset), self.end_offset)
            target = position - slot.start + slot.skip
            index = self._view_index(segment)      # read_committed: aborted batches render nothing
            if self._text:
                _, log_pos, pos, _ = index.floor_by_text(target)
            else:
                _, log_pos, _, pos = index.floor_by_json(target)
            last = None
            for header, item, _ in self._batches(segment, log_pos, full=True):
                columns = cast("BatchColumns", item)    # full=True: columns, never rendered text
                offsets = columns.offsets
                records = render._column_records(columns)
                if self._text:
                    sizes = render.text_sizes(records)
                else:
                    sizes = render.json_sizes(records, self.topic, self.partition, int(header.timestamp_type))
                for offset, size in zip(offsets, sizes):
                    pos += size
                    if pos > target:
                        return min(max(offset, self.start_offset), self.end_offset)
                    last = offset
            nxt = segment.next_offset if last is None else last + 1
            return min(max(nxt, self.start_offset), self.end_offset)


def open_consumer_view(log: Log, fmt: ViewFormat, committed: int | None) -> ConsumerView:
    """A view from ``committed`` (the log start when None, below the log start or beyond the log end,
    as a consumer resets with ``auto.offset.reset=earliest``) to the log end offset now."""
    with log.lock:          # appends hold it: the end offset and the size agree
        start = log.log_start_offset
        # the log end offset, or the last stable offset of a stable offset bounded read_committed view
        end = transactions.visible_end_offset(log)
        if committed is None or committed < start or committed > end:
            committed = start
        view = ConsumerView(log, fmt, committed)
        view.end_offset = end
        view.limit = LogView.size(view)
    return view
