"""One batch's renderings through the compiled walk of its records section, for every producer's layout.

The view index's catch-up needs the sizes of a batch's two renderings and
``records.jsonl`` needs its JSON lines.  Both come from one compiled walk
(``engine.records.kernels.records_jsonl``) over the batch's records section
(decompressed first when the batch is compressed): no Python object per
record, whatever wrote the batch (logfs, Kafka's Java producer, librdkafka;
own timestamp and offset deltas, keys, null values, headers).  The walk writes
the lines of :mod:`engine.views.render` from its constant pieces
(:func:`engine.views.render.compiled_pieces`), so its bytes are that module's byte for byte (the
property tests in tests/unit/test_walk.py hold them equal).

When the walk refuses a batch (anything the general decoder would read
otherwise or name as damage), or the extension is not built, the batch takes
the column path (``records.decode_columns`` and render's column functions),
which renders the same bytes or raises the same CorruptRecordError.
"""

from __future__ import annotations

from engine.records import BatchHeader, compiled, decode_columns
from engine.records.decode import _records_section
from engine.records.format import TIMESTAMP_TYPE_MASK, RecordBuffer
from engine.views import render

__all__ = ["batch_jsonl", "batch_view_sizes"]


def _walk(buf: RecordBuffer, pos: int, header: BatchHeader, topic: str, partition: int,
          render_lines: bool) -> bytes | tuple[int, int] | None:
    kernels = compiled.KERNELS
    if kernels is None:
        return None
    header, data = _records_section(buf, pos, header, view=True)
    if data is None:
        return b"" if render_lines else (0, 0)
    found: bytes | tuple[int, int] | None = kernels.records_jsonl(
        data, header.records_count, header.base_offset, header.base_timestamp,
        bool(header.attributes & TIMESTAMP_TYPE_MASK), header.max_timestamp,
        render.compiled_pieces(topic, partition, int(header.timestamp_type)), render_lines)
    return found


def batch_jsonl(buf: RecordBuffer, pos: int, header: BatchHeader, topic: str, partition: int) -> bytes:
    """The JSON lines of the batch at ``pos`` (nothing for a control batch); CorruptRecordError if damaged."""
    lines = _walk(buf, pos, header, topic, partition, True)
    if isinstance(lines, bytes):
        return lines
    return render.render_jsonl_columns(decode_columns(buf, pos, header), topic, partition,
                                       int(header.timestamp_type))


def batch_view_sizes(buf: RecordBuffer, pos: int, header: BatchHeader, topic: str,
                     partition: int) -> tuple[int, int, int]:
    """(text bytes, JSON bytes, records rendered) of the batch at ``pos``; CorruptRecordError if damaged."""
    sizes = _walk(buf, pos, header, topic, partition, False)
    if isinstance(sizes, tuple):
        text, json = sizes
        return text, json, header.records_count if text else 0      # a control batch renders no record
    columns = decode_columns(buf, pos, header)
    text, json = render.columns_view_sizes(columns, topic, partition, int(header.timestamp_type))
    return text, json, len(columns.values)

