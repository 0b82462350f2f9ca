"""Sparse in-memory index of a segment's positions in the mount's renderings.

The mount serves ``records`` (one value per line) and ``records.jsonl`` (one
JSON object per line) as byte-addressable files.  A read at byte position P
must not decode the log from its start, so every segment keeps a ViewIndex:
for a sparse set of batches (the segment's first batch and every batch the
offset index points at) it records where the batch starts in the ``.log`` and
where its first record starts in each rendering.  A read bisects the column of
its rendering, then decodes forward from the batch found; the cost is bounded
by ``index.interval.bytes`` of log, as a fetch is in Kafka.

Concurrency: there is one writer (appends happen under ``Log.lock``) and any
number of lock-free readers.  Each column is an ``array('q')`` that only grows;
``entries`` is bumped after all four columns have their new value, and readers
never look past it.  The running totals are published as one tuple
(:attr:`totals`) so that a reader sees the sizes and the end offset of the
same batch, never a mix of two.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import NamedTuple


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
                 "index_interval_bytes")

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

    def _entry(self, n: int) -> tuple[int, int, int, int]:
        return (self._offsets[n], self._log_positions[n], self._text_positions[n],
                self._json_positions[n])

    def _floor(self, column: array, key: int) -> tuple[int, int, int, int]:
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
