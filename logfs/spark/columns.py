"""The Arrow record batches of the ``logfs`` source, built from the spans of the compiled walk.

Each batch's records come as arrays of positions in its records section
(``engine.records.decode_spans``: one compiled walk, no Python object per
record).  A flush turns the records gathered so far into the columns of
Spark's Kafka source with ``pa.Array.from_buffers``: the keys, values and
header fields copied one after the other into one buffer per column
(``kernels.gather_spans``, a ``memcpy`` per field), their int32 offsets and
validity bitmaps computed with numpy, offsets and timestamps the walk's own
int64 arrays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from engine.records import compiled

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from engine.records import BatchSpans

#: the most bytes one flush's column may hold: Arrow's binary arrays have int32 offsets
MAX_COLUMN_BYTES = (1 << 31) - 1


def headers_arrow_type() -> pa.DataType:
    import pyarrow as pa
    return pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class _Part(NamedTuple):
    """Records ``lo:hi`` of one batch, waiting for the next flush."""

    data: bytes | memoryview
    table: npt.NDArray[np.int64]            # the batch's span table, columns lo:hi
    headers: npt.NDArray[np.int64] | None   # the header spans of those records
    timestamp_type: int


def _gather(data: bytes | memoryview, starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
            out: npt.NDArray[np.uint8], position: int) -> int:
    """``kernels.gather_spans``, or the same copies one by one when the extension is not built."""
    kernels = compiled.KERNELS
    if kernels is not None:
        end: int = kernels.gather_spans(data, starts, lengths, out, position)
        return end
    view = memoryview(data).cast("B")
    for start, length in zip(starts.tolist(), lengths.tolist()):
        if length >= 0:
            out[position:position + length] = view[start:start + length]
            position += length
    return position


def _binary(parts: list[tuple[bytes | memoryview, npt.NDArray[np.int64], npt.NDArray[np.int64]]],
            lengths: npt.NDArray[np.int64], arrow_type: pa.DataType) -> pa.Array:
    """A binary (or string) array of the spans (data, starts, lengths) of ``parts`` in order; a negative
    length is a null.  ``lengths`` is all the parts' lengths, concatenated."""
    import numpy as np
    import pyarrow as pa
    count = len(lengths)
    valid = lengths >= 0
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.where(valid, lengths, 0), out=offsets[1:])
    total = int(offsets[-1])
    if total > MAX_COLUMN_BYTES:
        raise ValueError(f"{total} bytes in one Arrow column, more than its int32 offsets address")
    data = np.empty(total, dtype=np.uint8)
    position = 0
    for part_data, starts, part_lengths in parts:
        position = _gather(part_data, starts, part_lengths, data, position)
    assert position == total
    null_count = count - int(np.count_nonzero(valid))
    validity = None if null_count == 0 else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(arrow_type, count, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                     pa.py_buffer(data)], null_count)


class ColumnBuilder:
    """Records of one task accumulated as spans, turned into Arrow record batches of the Kafka schema."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self._parts: list[_Part] = []
        self._records = 0
        #: bytes of the records sections the parts point into: a bound on what a flush copies
        self.section_bytes = 0

    def __len__(self) -> int:
        return self._records

    def add(self, spans: BatchSpans, lo: int, hi: int, timestamp_type: int) -> None:
        """Records ``lo:hi`` of one batch's spans (``decode_spans``, with headers when they are included).

        OverflowError when one of them has an offset or a timestamp outside 64 bits (``pa.array`` of the
        decoded ints raised it before).
        """
        if spans.unrepresentable is not None and spans.unrepresentable[lo:hi].any():
            raise OverflowError(f"A record of offsets [{spans.table[0, lo]}, ...) has an offset or timestamp "
                                f"outside 64 bits")
        table = spans.table if lo == 0 and hi == spans.table.shape[1] else spans.table[:, lo:hi]
        headers = None
        if self.include_headers:
            assert spans.headers is not None
            headers = spans.headers
            if table is not spans.table:
                counts = spans.table[7]
                first, last = int(counts[:lo].sum()), int(counts[:hi].sum())
                headers = headers[:, first:last]
        self._parts.append(_Part(spans.data, table, headers, timestamp_type))
        self._records += hi - lo
        self.section_bytes += len(spans.data)

    def flush(self) -> pa.RecordBatch | None:
        import numpy as np
        import pyarrow as pa
        count = self._records
        if count == 0:
            return None
        parts = self._parts
        table = parts[0].table if len(parts) == 1 else np.concatenate([p.table for p in parts], axis=1)
        key_lengths = table[3]
        if int(np.count_nonzero(key_lengths >= 0)) == 0:
            keys = pa.nulls(count, pa.binary())
        else:
            keys = _binary([(p.data, p.table[2], p.table[3]) for p in parts], key_lengths, pa.binary())
        arrays = [
            keys,
            _binary([(p.data, p.table[4], p.table[5]) for p in parts], table[5], pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), count),
            pa.repeat(pa.scalar(self.partition, pa.int32()), count),
            pa.array(table[0], pa.int64()),
            pa.array(table[1], pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            pa.array(np.repeat(np.array([p.timestamp_type for p in parts], dtype=np.int32),
                               [p.table.shape[1] for p in parts]), pa.int32()),
        ]
        names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        if self.include_headers:
            arrays.append(self._headers(parts, table[7]))
            names.append("headers")
        self._parts = []
        self._records = 0
        self.section_bytes = 0
        return pa.RecordBatch.from_arrays(arrays, names=names)

    @staticmethod
    def _headers(parts: list[_Part], counts: npt.NDArray[np.int64]) -> pa.Array:
        """``headers``: a list of (key, value) structs per record, null (as Spark's Kafka source gives,
        not an empty list) for a record without headers."""
        import numpy as np
        import pyarrow as pa
        spans = [p.headers for p in parts if p.headers is not None]
        table = spans[0] if len(spans) == 1 else np.concatenate(spans, axis=1)
        fields = [(p.data, p.headers) for p in parts if p.headers is not None]
        names = _binary([(data, h[0], h[1]) for data, h in fields], table[1], pa.string())
        values = _binary([(data, h[2], h[3]) for data, h in fields], table[3], pa.binary())
        struct = pa.StructArray.from_arrays([names, values], fields=list(headers_arrow_type().value_type))
        count = len(counts)
        offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        present = counts > 0
        null_count = count - int(np.count_nonzero(present))
        validity = None if null_count == 0 else pa.py_buffer(np.packbits(present, bitorder="little"))
        return pa.Array.from_buffers(headers_arrow_type(), count, [validity, pa.py_buffer(offsets)], null_count,
                                     children=[struct])
