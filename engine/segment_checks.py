"""Load-time checks that a segment's files agree with each other (beyond Kafka's ``LogSegment.sanityCheck``).

Kafka's sanity check looks only at each index file by itself; the loader
(:mod:`engine.log_loader`, Kafka's ``LogLoader``) also asks here whether the
indexes agree with the ``.log`` they index (:func:`check_index_against_log`)
and, after a clean shutdown, whether the active segment's tail is whole
(:func:`validate_tail`).  A segment that fails is recovered (its indexes
rebuilt, or its torn tail truncated), as after a crash.

Both read through the segment's public read paths only, at load, before the
log is published: no lock is involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import CorruptIndexError, CorruptRecordError
from engine.records import HEADER_SIZE, LOG_OVERHEAD, MAGIC, read_header, validate_batch

if TYPE_CHECKING:  # pragma: no cover
    from engine.segment import LogSegment

# How many offset index entries besides the first and the last are checked
# against the .log at load (one header read each): enough to catch an index
# that does not belong to its log without reading the whole index.
_INDEX_SAMPLES = 8
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD


def check_index_against_log(segment: LogSegment) -> None:
    """Raise CorruptIndexError if the indexes disagree with the .log (checked cheaply at load).

    Kafka's sanity check only looks at the index file itself; an index that
    passes it can still point into the middle of batches (a damaged or
    foreign file), and every lookup through it then misses.  Here the first,
    the last and ``_INDEX_SAMPLES`` entries in between are checked: entries
    increase in offset and position, and the batch at an entry's position is
    a batch header whose base offset is at or below the entry's offset.  The
    last time index entry must name an offset of this segment.  A few
    header reads per segment; the loader rebuilds an index that fails.
    """
    index = segment.offset_index
    entries = index.entries
    size = segment.size
    if entries:
        step = max(1, entries // (_INDEX_SAMPLES + 1))
        slots = sorted({0, entries - 1, *range(step, entries - 1, step)})
        previous: tuple[int, int] | None = None
        previous_slot = -1
        for slot in slots:
            offset, position = index.entry(slot)
            if slot != previous_slot + 1 and slot > 0:
                previous = index.entry(slot - 1)
            if previous is not None and (offset <= previous[0] or position <= previous[1]):
                raise CorruptIndexError(
                    f"Index file {index.path} entry {slot} (offset {offset}, position {position}) does not "
                    f"follow entry {slot - 1} (offset {previous[0]}, position {previous[1]})")
            _check_entry(segment, index.path, slot, offset, position, size)
            previous, previous_slot = (offset, position), slot
    ts_entries = segment.time_index.entries
    if ts_entries:
        # Sampled the same way: offsets of this segment, timestamps increasing, offsets not decreasing.
        step = max(1, ts_entries // (_INDEX_SAMPLES + 1))
        next_offset = segment.next_offset
        previous_entry: tuple[int, int] | None = None
        for slot in sorted({0, ts_entries - 1, *range(step, ts_entries - 1, step)}):
            timestamp, offset = segment.time_index.entry(slot)
            if slot > 0:
                previous_entry = segment.time_index.entry(slot - 1)
            if not segment.base_offset <= offset < next_offset or (
                    previous_entry is not None
                    and (timestamp <= previous_entry[0] or offset < previous_entry[1])):
                raise CorruptIndexError(
                    f"Time index file {segment.time_index.path} entry {slot} (timestamp {timestamp}, offset "
                    f"{offset}) disagrees with log {segment.log_path} (offsets {segment.base_offset}.."
                    f"{next_offset - 1}) or with the entry before it {previous_entry}")


def _check_entry(segment: LogSegment, path: str, slot: int, offset: int, position: int, size: int) -> None:
    problem = None
    if position + HEADER_SIZE > size:
        problem = f"its position is beyond the {size} bytes of the log"
    else:
        header = read_header(segment.read_bytes(position, HEADER_SIZE), 0)
        if header.magic != MAGIC or header.batch_length < _MIN_BATCH_LENGTH:
            problem = "its position is not the start of a record batch"
        elif position + LOG_OVERHEAD + header.batch_length > size:
            problem = "the batch at its position runs past the end of the log"
        elif not header.base_offset <= offset:
            problem = f"the batch at its position starts at offset {header.base_offset}"
    if problem is not None:
        raise CorruptIndexError(f"Index file {path} entry {slot} (offset {offset}, position {position}) "
                                f"disagrees with log {segment.log_path}: {problem}")


def validate_tail(segment: LogSegment) -> None:
    """CRC-check the batches after the last offset index entry; CorruptRecordError if any fails.

    Where the next append goes must be readable: a clean-shutdown marker
    lets the loader skip recovery, but an active segment cut short or
    damaged after the shutdown would take appends behind a torn batch that
    no reader can get past.  The tail is at most ``index.interval.bytes``
    plus one batch, so this costs one read.
    """
    index_offset, position = segment.offset_index.lookup(segment.offset_index.last_offset)
    size = segment.size
    if position > size:
        raise CorruptRecordError(f"the last offset index entry points at byte {position}, beyond the end",
                                 path=segment.log_path, position=size)
    next_offset = index_offset if position else segment.base_offset
    for pos, header, buf, off in segment.batches_with_bytes(position, size):
        try:
            validate_batch(buf, off)
        except CorruptRecordError as exc:
            raise exc.at(segment.log_path, pos) from None
        if pos > position and header.base_offset < next_offset:
            raise CorruptRecordError(f"Batch base offset {header.base_offset} is below the previous batch's "
                                     f"next offset {next_offset}", path=segment.log_path, position=pos)
        next_offset = header.next_offset
