"""Reading one offset range through the mount's ``from/<N>.jsonl`` view (``readFormat=jsonl``)."""

from __future__ import annotations

import base64
import logging
import os
from typing import TYPE_CHECKING, Any

from engine.errors import (
    StorageError,
    UnknownTopicOrPartitionError,
)
from logfs.spark.mount_client import offset_bounds, skip_deleted

if TYPE_CHECKING:  # pragma: no cover - imported lazily where used
    from collections.abc import Iterator

    import pyarrow as pa

    from logfs.spark.options import SourceOptions
    from logfs.spark.planning import OffsetRangePartition

log = logging.getLogger(__name__)

_MIN_READ = 64 << 10
_MAX_READ = 8 << 20
_BYTES_PER_RECORD_GUESS = 256

def _json_schema(include_headers: bool) -> pa.Schema:
    import pyarrow as pa
    fields = [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
              ("timestamp", pa.int64()), ("timestampType", pa.int32()),
              ("key", pa.string()), ("value", pa.string()),
              ("keyEncoding", pa.string()), ("valueEncoding", pa.string())]
    if include_headers:
        fields.append(("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.string()),
                                                      ("valueEncoding", pa.string())]))))
    return pa.schema(fields)

def _decode_bytes(text: pa.Array, encoding: pa.Array, what: str) -> pa.Array:
    """String column -> binary column, base64-decoding the rows the mount marked (``"utf8"`` or null: the text)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    binary = text.cast(pa.binary())
    if encoding.null_count == len(encoding) or pc.all(pc.equal(encoding, "utf8")).as_py():
        return binary  # the common case: every key/value was UTF-8 (or null), zero-copy cast
    values = binary.to_pylist()
    for i, enc in enumerate(encoding.to_pylist()):
        if enc is None or enc == "utf8":
            continue
        if enc != "base64":
            raise StorageError(f"Unknown {what} encoding {enc!r} in a logfs JSON view")
        values[i] = base64.b64decode(values[i])
    return pa.array(values, pa.binary())

def _decode_headers(headers: pa.Array) -> pa.Array:
    import pyarrow as pa
    out: list[list[dict[str, Any]] | None] = []     # Any: JSON headers
    for row in headers.to_pylist():
        if not row:             # Spark's Kafka source: null, not [], for a record without headers
            out.append(None)
            continue
        decoded = []
        for h in row:
            value = h.get("value")
            if value is not None:
                value = base64.b64decode(value) if h.get("valueEncoding") == "base64" else value.encode()
            decoded.append({"key": h.get("key"), "value": value})
        out.append(decoded)
    return pa.array(out, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))

def _to_kafka_batch(table: pa.Table, lo: int, hi: int, include_headers: bool) -> pa.RecordBatch | None:
    """Parsed JSON rows -> a RecordBatch of the Kafka schema, keeping offsets in [lo, hi)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    table = table.combine_chunks()
    offsets = table.column("offset")
    if offsets[0].as_py() < lo or offsets[-1].as_py() >= hi:
        table = table.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
        if table.num_rows == 0:
            return None

    def col(name: str) -> pa.Array:
        return table.column(name).combine_chunks()

    timestamps = col("timestamp").cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
    arrays = [_decode_bytes(col("key"), col("keyEncoding"), "key"),
              _decode_bytes(col("value"), col("valueEncoding"), "value"),
              col("topic"), col("partition"), col("offset"), timestamps, col("timestampType")]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if include_headers:
        arrays.append(_decode_headers(col("headers")))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)

def _open_view(opts: SourceOptions, rng: OffsetRangePartition) -> tuple[Any, int]:     # Any: an open binary file
    """Open ``from/<N>.jsonl`` for the range; handle a start below the log start offset."""
    start = rng.from_offset
    path = os.path.join(opts.mount, rng.topic, str(rng.partition), "from", f"{start}.jsonl")
    try:
        return open(path, "rb", buffering=0), start
    except FileNotFoundError:
        pass
    # The mount refuses offsets outside [log start, log end]: find out which case this is.
    log_start, log_end = offset_bounds(opts.mount, rng.topic, rng.partition)
    if start < log_start:
        start = skip_deleted(opts.fail_on_data_loss, f"{rng.topic}-{rng.partition}", start, log_start, log_end)
        if start >= rng.until_offset:
            return None, start
        path = os.path.join(opts.mount, rng.topic, str(rng.partition), "from", f"{start}.jsonl")
        return open(path, "rb", buffering=0), start
    raise UnknownTopicOrPartitionError(
        f"No view {path}: offset {start} is outside [{log_start}, {log_end}] of {rng.topic}-{rng.partition}")


class _ViewChunks:
    """Chunks of an open view, read ahead by one thread while the caller parses.

    Reading a FUSE file and parsing JSON both release the GIL, so reading the
    next chunk while Arrow parses this one hides most of the read latency.  The
    reader counts lines as it goes and sizes each read to the records still
    wanted (at the average line length seen so far), so it stops close to the
    range's end instead of reading megabytes past it.
    """

    _QUEUE_DEPTH = 2

    def __init__(self, view: Any, records_wanted: int) -> None:     # Any: as _open_view's
        import queue
        import threading

        self._view = view
        self._wanted = records_wanted
        self._queue: queue.Queue[bytes | BaseException] = queue.Queue(self._QUEUE_DEPTH)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"logfs-read-{view.name}", daemon=True)
        self._thread.start()

    def _put(self, item: bytes | BaseException) -> bool:
        import queue
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        lines = total = 0
        size = min(_MAX_READ, max(_MIN_READ, self._wanted * _BYTES_PER_RECORD_GUESS))
        try:
            while True:
                data = self._view.read(size)
                if not self._put(data) or not data:
                    return
                lines += data.count(b"\n")
                total += len(data)
                remaining = self._wanted - lines
                if remaining <= 0:
                    self._put(b"")  # every wanted record has been read
                    return
                average = total / lines if lines else 2 * size
                size = int(min(_MAX_READ, max(_MIN_READ, remaining * average * 1.05)))
        except BaseException as exc:  # handed to the consumer, which raises it in its task
            self._put(exc)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if not item:
                return
            yield item

    def close(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._view.close()


def read_range_jsonl(opts: SourceOptions, rng: OffsetRangePartition) -> Iterator[pa.RecordBatch]:
    """``readFormat=jsonl``: the records of one offset range from ``from/<N>.jsonl``.

    Reads the JSON-lines view in chunks cut at the last newline and parses each
    chunk with Arrow's JSON reader (C++), which is what keeps the source close
    to Spark's own JSON reader on a local file.  Stops at the first offset >=
    ``until_offset`` or at the end of the view (a compacted log has gaps, so
    the range may hold fewer records than its width).
    """
    import pyarrow as pa
    import pyarrow.json as pj

    view, lo = _open_view(opts, rng)
    if view is None:
        return
    schema = _json_schema(opts.include_headers)
    parse_options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    chunks = _ViewChunks(view, rng.until_offset - lo)
    pending = b""
    try:
        for data in chunks:
            data = pending + data if pending else data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                pending = data  # a record longer than what was read so far
                continue
            chunk, pending = (data, b"") if cut == len(data) else (data[:cut], data[cut:])
            table = pj.read_json(pa.BufferReader(chunk),
                                 read_options=pj.ReadOptions(use_threads=False, block_size=len(chunk) + 1),
                                 parse_options=parse_options)
            if table.num_rows == 0:
                continue
            last = table.column("offset")[-1].as_py()
            batch = _to_kafka_batch(table, lo, rng.until_offset, opts.include_headers)
            if batch is not None:
                yield batch
            if last >= rng.until_offset - 1:
                return
        if pending:
            raise StorageError(
                f"View {view.name} ended inside a record ({len(pending)} bytes without a newline)")
    finally:
        chunks.close()
