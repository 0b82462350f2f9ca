"""Text and JSON-lines renderings of records: the bytes of the mount's views.

Two renderings exist (DESIGN.md "Views"):

* text: ``value + b"\\n"`` per record; a null value is an empty line.
* JSON lines: one object per record, fields in a fixed order, no spaces::

    {"topic":"t","partition":0,"offset":5,"timestamp":1700000000000,"timestampType":1,"key":null,"value":"hello"}

  followed by ``,"headers":[{"key":"h","value":"v"},...]`` only when the record
  has headers.  A key or value (or header value) that is not valid UTF-8 is
  written as standard base64 and immediately followed by
  ``"keyEncoding":"base64"`` / ``"valueEncoding":"base64"`` (inside the header
  object for header values).  Null stays ``null``.  Strings are escaped by
  orjson (``"``, ``\\`` and control characters; other characters are raw UTF-8).

The view index (engine.views.index) stores, per batch, how many bytes each
rendering takes, so a read at byte position P of a view never renders from the
start.  Those sizes are computed on the *append* path, which must keep up with
~1.5M records/s: :func:`appended_view_sizes` therefore never renders.  It
proves with one test over the joined batch that every value is plain ASCII
needing no escapes, and then the size is arithmetic (lengths, counts of nulls,
digit counts of a run of offsets).  Anything else falls back to exact
per-value sizing.  The property tests check that every ``*_sizes`` function
equals ``len(render_*)`` byte for byte.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, cast

import orjson

from engine.records import compiled

if TYPE_CHECKING:  # pragma: no cover - only for annotations
    from engine.records import BatchColumns, Record

#: A record's fields in Record's order: a Record, or the plain tuple of the column path (_column_records).
RecordFields = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]

__all__ = [
    "LOG_APPEND_TIME",
    "appended_lines_view_sizes",
    "render_text",
    "render_values",
    "render_jsonl",
    "render_jsonl_line",
    "text_sizes",
    "json_sizes",
    "batch_view_sizes",
    "appended_view_sizes",
    "render_jsonl_columns",
    "columns_view_sizes",
]

#: Kafka's TimestampType.LOG_APPEND_TIME id, the type of every batch logfs appends.
LOG_APPEND_TIME = 1

_NULL = b"null"
_KEY_B64_SUFFIX = b',"keyEncoding":"base64"'
_VALUE_B64_SUFFIX = b',"valueEncoding":"base64"'
_HEADERS_OPEN = b',"headers":['
_LINE_END = b"}\n"


class _JsonPieces(NamedTuple):
    """The constant byte pieces of one (topic, partition, timestamp type) JSON line.

    ``fmt_*`` are ``bytes %`` templates with the constants baked in; ``%`` in
    the topic cannot occur (Kafka topic names are ``[a-zA-Z0-9._-]``) but is
    escaped anyway so a template can never be misread.
    """

    prefix: bytes          # {"topic":"t","partition":0,"offset":
    ts_prefix: bytes       # ,"timestamp":
    key_prefix: bytes      # ,"timestampType":1,"key":
    value_prefix: bytes    # ,"value":
    fmt_nokey: bytes       # whole line for key null, clean value, no headers: % (offset, ts, value)
    fmt_key: bytes         # whole line for clean key and value, no headers: % (offset, ts, key, value)
    fmt_general: bytes     # whole line: % (offset, ts, key piece, value piece, headers piece)
    fixed_len: int         # bytes of one line outside offset, timestamp, key and value pieces


@lru_cache(maxsize=4096)
def _json_pieces(topic: str, partition: int, timestamp_type: int) -> _JsonPieces:
    prefix = b'{"topic":' + orjson.dumps(topic) + b',"partition":%d,"offset":' % partition
    ts_prefix = b',"timestamp":'
    key_prefix = b',"timestampType":%d,"key":' % timestamp_type
    value_prefix = b',"value":'
    safe = prefix.replace(b"%", b"%%")
    fmt_nokey = safe + b"%d" + ts_prefix + b"%d" + key_prefix + b'null,"value":"%s"}\n'
    fmt_key = safe + b"%d" + ts_prefix + b"%d" + key_prefix + b'"%s","value":"%s"}\n'
    fmt_general = safe + b"%d" + ts_prefix + b"%d" + key_prefix + b"%s" + value_prefix + b"%s%s}\n"
    fixed_len = len(prefix) + len(ts_prefix) + len(key_prefix) + len(value_prefix) + len(_LINE_END)
    return _JsonPieces(prefix, ts_prefix, key_prefix, value_prefix, fmt_nokey, fmt_key, fmt_general, fixed_len)


# ---------------------------------------------------------------------------
# JSON pieces of single fields (the exact, slow path)
# ---------------------------------------------------------------------------

def _bytes_field(data: bytes | None, b64_suffix: bytes) -> bytes:
    """The JSON piece after ``"key":``/``"value":`` for ``data``.

    Valid UTF-8 becomes an orjson-escaped string; anything else becomes a
    base64 string followed by its ``...Encoding`` member.  Kafka values are
    arbitrary bytes, so this is how non-UTF-8 data survives the trip.
    """
    if data is None:
        return _NULL
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return b'"' + base64.b64encode(data) + b'"' + b64_suffix
    return orjson.dumps(text)


def _bytes_field_size(data: bytes | None, b64_suffix_len: int) -> int:
    """``len(_bytes_field(data, suffix))`` without building base64 text."""
    if data is None:
        return 4
    if data.isascii():
        # ASCII is valid UTF-8; only escapes can change the length.
        return len(orjson.dumps(data.decode("ascii")))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return 2 + 4 * ((len(data) + 2) // 3) + b64_suffix_len
    return len(orjson.dumps(text))


def _headers_piece(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    if not headers:
        return b""
    parts = []
    for name, value in headers:
        parts.append(b'{"key":' + orjson.dumps(name) + b',"value":'
                     + _bytes_field(value, _VALUE_B64_SUFFIX) + b"}")
    return _HEADERS_OPEN + b",".join(parts) + b"]"


def _plain_ascii(joined: bytes) -> bool:
    """True when ``joined`` is ASCII with nothing JSON must escape.

    One C-speed pass: orjson escapes exactly ``"``, ``\\`` and control
    characters, so for ASCII input its output is ``len + 2`` iff nothing was
    escaped.  (ASCII first: a concatenation of byte strings can be valid UTF-8
    while its pieces are not, so non-ASCII batches take the per-value path.)
    """
    try:
        text = joined.decode("ascii")
    except UnicodeDecodeError:
        return False
    return len(orjson.dumps(text)) == len(joined) + 2


def _digits_total(first: int, count: int) -> int:
    """Total decimal digits of the ``count`` integers ``first, first+1, ...`` (first >= 0)."""
    total = 0
    low = first
    end = first + count
    digits = len(str(low))
    bound = 10 ** digits
    while low < end:
        high = end if end < bound else bound
        total += (high - low) * digits
        low = high
        digits += 1
        bound *= 10
    return total


# ---------------------------------------------------------------------------
# Text rendering
# ---------------------------------------------------------------------------

def render_values(values: Sequence[bytes | None]) -> bytes:
    """Text rendering of a list of values (what records.decode_values returns)."""
    if not values:
        return b""
    if None in values:
        present: Sequence[bytes] = [b"" if value is None else value for value in values]
    else:
        present = cast("Sequence[bytes]", values)      # no None in it: tested just above
    return b"\n".join(present) + b"\n"


def render_text(records: Iterable[RecordFields]) -> bytes:
    """The ``records`` view of ``records``: each value plus a newline."""
    return render_values([record[3] for record in records])


def text_sizes(records: Iterable[RecordFields]) -> list[int]:
    """Per-record sizes of :func:`render_text`."""
    return [1 if record[3] is None else len(record[3]) + 1 for record in records]


# ---------------------------------------------------------------------------
# JSON-lines rendering
# ---------------------------------------------------------------------------

def render_jsonl_line(record: Record, topic: str, partition: int, timestamp_type: int) -> bytes:
    """One JSON line (the exact path; used for single records and escapes)."""
    pieces = _json_pieces(topic, partition, timestamp_type)
    offset, timestamp, key, value, headers = record
    return pieces.fmt_general % (
        offset, timestamp,
        _bytes_field(key, _KEY_B64_SUFFIX),
        _bytes_field(value, _VALUE_B64_SUFFIX),
        _headers_piece(headers),
    )


def render_jsonl(records: Iterable[RecordFields], topic: str, partition: int, timestamp_type: int) -> bytes:
    """The JSON-lines view of ``records`` (all from batches of ``timestamp_type``).

    Read hot path: when every value is plain ASCII (one test over the joined
    values), lines without key or headers come from one ``bytes %`` template;
    the rest take the exact per-field path.
    """
    if not isinstance(records, list):
        records = list(records)
    if not records:
        return b""
    pieces = _json_pieces(topic, partition, timestamp_type)
    general = pieces.fmt_general
    values = [record[3] for record in records]
    if None not in values and _plain_ascii(b"".join(cast("list[bytes]", values))):
        keys = [record[2] for record in records]
        key_nulls = keys.count(None)
        if key_nulls == len(keys) or _plain_ascii(b"".join([key for key in keys if key is not None])):
            nokey = pieces.fmt_nokey
            keyed = pieces.fmt_key
            return b"".join([
                (nokey % (offset, timestamp, value) if key is None else
                 keyed % (offset, timestamp, key, value)) if not headers else
                general % (offset, timestamp, _bytes_field(key, _KEY_B64_SUFFIX),
                           b'"' + value + b'"', _headers_piece(headers))  # type: ignore[operator]  # None not in values
                for offset, timestamp, key, value, headers in records
            ])
    return b"".join([
        general % (offset, timestamp, _bytes_field(key, _KEY_B64_SUFFIX),
                   _bytes_field(value, _VALUE_B64_SUFFIX), _headers_piece(headers))
        for offset, timestamp, key, value, headers in records
    ])


def json_sizes(records: Iterable[RecordFields], topic: str, partition: int, timestamp_type: int) -> list[int]:
    """Per-record sizes of :func:`render_jsonl`."""
    fixed = _json_pieces(topic, partition, timestamp_type).fixed_len
    key_suffix = len(_KEY_B64_SUFFIX)
    value_suffix = len(_VALUE_B64_SUFFIX)
    sizes = []
    for offset, timestamp, key, value, headers in records:
        size = (fixed + len(str(offset)) + len(str(timestamp))
                + _bytes_field_size(key, key_suffix) + _bytes_field_size(value, value_suffix))
        if headers:
            size += len(_headers_piece(headers))
        sizes.append(size)
    return sizes


def batch_view_sizes(records: Sequence[Record], topic: str, partition: int,
                     timestamp_type: int) -> tuple[int, int]:
    """(text bytes, JSON bytes) of one decoded batch: what a view index entry needs.

    Used when a segment's view index is rebuilt by a scan.  Batches logfs wrote
    itself (contiguous offsets, one timestamp, no headers) take the arithmetic
    path of :func:`appended_view_sizes`.
    """
    if not records:
        return 0, 0
    first = records[0]
    count = len(records)
    timestamp = first[1]
    if (records[-1][0] - first[0] == count - 1
            and all(record[1] == timestamp and not record[4] for record in records)):
        return _contiguous_sizes([record[3] for record in records],
                                 [record[2] for record in records],
                                 first[0], timestamp, topic, partition, timestamp_type)
    return sum(text_sizes(records)), sum(json_sizes(records, topic, partition, timestamp_type))


def appended_view_sizes(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                        first_offset: int, timestamp: int, topic: str, partition: int) -> tuple[int, int]:
    """(text bytes, JSON bytes) of a batch appended with LogAppendTime at ``first_offset``.

    Exactly ``len(render_text(...))`` and ``len(render_jsonl(...))`` of the
    records the batch decodes to, computed without rendering.
    """
    return _contiguous_sizes(values, keys, first_offset, timestamp, topic, partition, LOG_APPEND_TIME)


def _frames_json_size(count: int, first_offset: int, timestamp: int, topic: str, partition: int,
                      timestamp_type: int) -> int:
    """JSON bytes of ``count`` lines at consecutive offsets from ``first_offset``, all stamped ``timestamp``,
    apart from their key and value fields: the constant pieces, the timestamps and the offsets' digits."""
    pieces = _json_pieces(topic, partition, timestamp_type)
    return count * (pieces.fixed_len + len(str(timestamp))) + _digits_total(first_offset, count)


def appended_lines_view_sizes(block: bytes, count: int, first_offset: int, timestamp: int, topic: str,
                              partition: int) -> tuple[int, int]:
    """:func:`appended_view_sizes` of the ``count`` lines of ``block`` (each ending in ``\\n``) as the values
    of a batch without keys (``Log.append_text_lines``), without splitting the block when it is plain.

    The text view is the block itself.  For the JSON view the block is tested
    whole, newlines included: orjson writes each ``\\n`` as two characters,
    so the block is plain ASCII with nothing else to escape exactly when the
    dump is ``len(block) + 2 + count`` long (0.26-0.32 ms per MiB), which the
    compiled ``json_plain`` answers without the dump (0.11 ms).
    """
    kernels = compiled.KERNELS
    if kernels is not None:
        plain = kernels.json_plain(block)
    else:
        try:
            plain = len(orjson.dumps(block.decode("ascii"))) == len(block) + 2 + count
        except UnicodeDecodeError:
            plain = False
    if not plain:
        values = block.split(b"\n")
        values.pop()
        return appended_view_sizes(values, None, first_offset, timestamp, topic, partition)
    # the lines' frames, a null key each (4), each value in quotes (2): the block less its newlines
    json = (_frames_json_size(count, first_offset, timestamp, topic, partition, LOG_APPEND_TIME)
            + count * (4 + 2) + len(block) - count)
    return len(block), json


def _contiguous_sizes(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                      first_offset: int, timestamp: int, topic: str, partition: int,
                      timestamp_type: int) -> tuple[int, int]:
    count = len(values)
    if count == 0:
        return 0, 0
    try:
        # join refuses None: the common no-null batch costs one C call, where
        # counting None compares every value with it
        joined = b"".join(values)  # type: ignore[arg-type]  # a None raises TypeError: the except below
        nulls = 0
    except TypeError:
        present = [value for value in values if value is not None]
        nulls = count - len(present)
        joined = b"".join(present)
    text = len(joined) + count

    json = _frames_json_size(count, first_offset, timestamp, topic, partition, timestamp_type)
    if _plain_ascii(joined):
        json += len(joined) + 2 * (count - nulls) + 4 * nulls
    else:
        suffix = len(_VALUE_B64_SUFFIX)
        json += sum([_bytes_field_size(value, suffix) for value in values])
    if keys is None:
        json += 4 * count
    else:
        key_nulls = sum(1 for key in keys if key is None)
        present_keys = [key for key in keys if key is not None]
        joined_keys = b"".join(present_keys)
        if _plain_ascii(joined_keys):
            json += len(joined_keys) + 2 * len(present_keys) + 4 * key_nulls
        else:
            suffix = len(_KEY_B64_SUFFIX)
            json += sum([_bytes_field_size(key, suffix) for key in keys])
    return text, json


# ---------------------------------------------------------------------------
# Column-wise rendering (the read path of the JSON-lines view)
# ---------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def _column_templates(topic: str, partition: int, timestamp_type: int) -> tuple[bytes, bytes, bytes]:
    """(line up to the timestamp digits, rest of a null-key line, rest of a keyed line).

    A batch's line template is ``head + b"%d" % timestamp + tail`` with
    ``%d`` (offset) and ``%s`` (value, key) left open: the timestamp is
    formatted once per batch, not once per record.
    """
    pieces = _json_pieces(topic, partition, timestamp_type)
    head = pieces.prefix.replace(b"%", b"%%") + b"%d" + pieces.ts_prefix
    key_prefix = pieces.key_prefix.replace(b"%", b"%%")
    return head, key_prefix + b'null,"value":"%s"}\n', key_prefix + b'"%s","value":"%s"}\n'


def render_jsonl_columns(columns: BatchColumns, topic: str, partition: int, timestamp_type: int) -> bytes:
    """The JSON-lines view of one decoded batch (records.decode_columns), equal to render_jsonl.

    Read hot path.  When no record has headers, every value (and key) is
    non-null plain ASCII (one C-speed test over the joined column) and the
    keys are all null or all present, every line is one template with the
    constants baked in; the whole batch is then a single ``bytes %`` over the
    template repeated once per record, with the columns interleaved as its
    arguments: no per-record Python call.  Anything else takes render_jsonl.
    """
    offsets, timestamps, keys, values, headers = columns
    n = len(values)
    if n == 0:
        return b""
    if headers is None and _plain_ascii_column(values) and (keys is None or _plain_ascii_column(keys)):
        head, nokey_tail, key_tail = _column_templates(topic, partition, timestamp_type)
        timestamp = timestamps[0]
        same_time = timestamps.count(timestamp) == n
        if same_time:           # LogAppendTime batches: one timestamp for all
            template = head + b"%d" % timestamp + (nokey_tail if keys is None else key_tail)
            columns_in_order: list[Sequence[int] | Sequence[bytes | None]] = (
                [offsets] if keys is None else [offsets, keys])
        else:
            template = head + b"%d" + (nokey_tail if keys is None else key_tail)
            columns_in_order = [offsets, timestamps] if keys is None else [offsets, timestamps, keys]
        columns_in_order.append(values)
        width = len(columns_in_order)
        args: list = [None] * (width * n)
        for i, column in enumerate(columns_in_order):
            args[i::width] = column
        return (template * n) % tuple(args)
    return render_jsonl(_column_records(columns), topic, partition, timestamp_type)


def _plain_ascii_column(column: Sequence[bytes | None]) -> bool:
    """No null and nothing JSON must escape in ``column`` (join refuses None, in C)."""
    try:
        return _plain_ascii(b"".join(column))  # type: ignore[arg-type]  # a None raises TypeError, caught
    except TypeError:
        return False


def _column_records(columns: BatchColumns) -> list[RecordFields]:
    """Record-shaped tuples of ``columns`` (the exact, per-record path)."""
    offsets, timestamps, keys, values, headers = columns
    n = len(values)
    return list(zip(offsets, timestamps, keys if keys is not None else repeat(None, n), values,
                    headers if headers is not None else repeat((), n)))


def columns_view_sizes(columns: BatchColumns, topic: str, partition: int,
                       timestamp_type: int) -> tuple[int, int]:
    """(text bytes, JSON bytes) of one decoded batch, without rendering it.

    The view index rebuild's path.  A batch with gap-free offsets, one
    timestamp and no headers (every batch the log writes itself, and most
    producers' batches) is sized arithmetically as on the append path
    (:func:`appended_view_sizes`); anything else record by record.
    """
    offsets, timestamps, keys, values, headers = columns
    n = len(values)
    if n == 0:
        return 0, 0
    first_offset = offsets[0]
    timestamp = timestamps[0]
    if headers is None and offsets[-1] - first_offset == n - 1 and timestamps.count(timestamp) == n:
        return _contiguous_sizes(values, keys, first_offset, timestamp, topic, partition, timestamp_type)
    records = _column_records(columns)
    return sum(text_sizes(records)), sum(json_sizes(records, topic, partition, timestamp_type))

