"""Text and JSON-lines renderings of records: the bytes of the mount's views.

Two renderings exist (DESIGN.md "Views"):

* text: ``value + b"\\n"`` per record; a null value is an empty line.
* JSON lines: one object per record, fields in a fixed order, no spaces::

    {"topic":"t","partition":0,"offset":5,"timestamp":1700000000000,"timestampType":1,"key":null,"keyEncoding":null,"value":"hello","valueEncoding":"utf8","headers":[]}

  Every line has these members in this order (one schema for every row, so a
  reader that infers a schema from the first rows reads the later ones
  right).  ``keyEncoding`` / ``valueEncoding`` follow their field: ``"utf8"``
  when the bytes are valid UTF-8 (the string is the text), ``"base64"`` when
  they are not (the string is their standard base64), ``null`` exactly when
  the field is null.  ``headers`` is ``[]`` or a list of
  ``{"key":"h","value":"v","valueEncoding":"utf8"}`` objects, the header
  value encoded the same way.  Strings are escaped by orjson (``"``, ``\\``
  and control characters; other characters are raw UTF-8).

The view index (engine.views.index) stores, per batch, how many bytes each
rendering takes, so a read at byte position P of a view never renders from the
start.  Those sizes are computed on the *append* path, which must cost no more
than the append itself: :func:`appended_view_sizes` therefore never renders.  It
proves with one test over the joined batch that every value is plain ASCII
needing no escapes, and then the size is arithmetic (lengths, counts of nulls,
digit counts of a run of offsets).  Anything else falls back to exact
per-value sizing.  The property tests check that every ``*_sizes`` function
equals ``len(render_*)`` byte for byte.
"""

from __future__ import annotations

import base64
from functools import lru_cache
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, cast

import orjson

from engine.records import compiled

if TYPE_CHECKING:  # pragma: no cover - only for annotations
    from collections.abc import Iterable, Sequence

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
#: The encoding members that follow a key, a value (and a header's value), up to their value.
_KEY_ENCODING = b',"keyEncoding":'
_VALUE_ENCODING = b',"valueEncoding":'
_UTF8 = b'"utf8"'
_BASE64 = b'"base64"'
#: Bytes of a key or value piece beyond the text of a plain ASCII field: two quotes and ``"utf8"``, or
#: ``null`` twice for a null field (the same 8 either way), plus the encoding member's name.
_KEY_FIXED = 8 + len(_KEY_ENCODING)
_VALUE_FIXED = 8 + len(_VALUE_ENCODING)
#: The last member, around the header objects, and the line's end.
_HEADERS_OPEN = b',"headers":['
_HEADERS_CLOSE = b"]}\n"
#: A header object's members up to their values (its value's encoding follows it, as a record's value's).
_HEADER_KEY = b'{"key":'
_HEADER_VALUE = b',"value":'


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
    nokey_tail: bytes      # rest of a line for key null, clean value, no headers, from the key on: % value
    key_tail: bytes        # rest of a line for clean key and value, no headers, from the key on: % (key, value)
    fmt_general: bytes     # whole line: % (offset, ts, key piece, value piece, header objects)
    fixed_len: int         # bytes of one line outside offset, timestamp, key and value pieces, header objects


@lru_cache(maxsize=4096)
def _json_pieces(topic: str, partition: int, timestamp_type: int) -> _JsonPieces:
    prefix = b'{"topic":' + orjson.dumps(topic) + b',"partition":%d,"offset":' % partition
    ts_prefix = b',"timestamp":'
    key_prefix = b',"timestampType":%d,"key":' % timestamp_type
    value_prefix = _HEADER_VALUE
    safe = prefix.replace(b"%", b"%%")
    value_tail = value_prefix + b'"%s"' + _VALUE_ENCODING + _UTF8 + _HEADERS_OPEN + _HEADERS_CLOSE
    nokey_tail = key_prefix + _NULL + _KEY_ENCODING + _NULL + value_tail
    key_tail = key_prefix + b'"%s"' + _KEY_ENCODING + _UTF8 + value_tail
    fmt_general = (safe + b"%d" + ts_prefix + b"%d" + key_prefix + b"%s" + value_prefix + b"%s"
                   + _HEADERS_OPEN + b"%s" + _HEADERS_CLOSE)
    fixed_len = (len(prefix) + len(ts_prefix) + len(key_prefix) + len(value_prefix) + len(_HEADERS_OPEN)
                 + len(_HEADERS_CLOSE))
    return _JsonPieces(prefix, ts_prefix, key_prefix, value_prefix, nokey_tail, key_tail, fmt_general, fixed_len)


# ---------------------------------------------------------------------------
# JSON pieces of single fields (the exact, slow path)
# ---------------------------------------------------------------------------

def _bytes_field(data: bytes | None, encoding_member: bytes) -> bytes:
    """The JSON piece after ``"key":``/``"value":`` for ``data``, its encoding member included.

    Valid UTF-8 becomes an orjson-escaped string and ``"utf8"``; anything else
    a base64 string and ``"base64"`` (Kafka values are arbitrary bytes: this
    is how non-UTF-8 data survives the trip); null is ``null`` and ``null``.
    """
    if data is None:
        return _NULL + encoding_member + _NULL
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return b'"' + base64.b64encode(data) + b'"' + encoding_member + _BASE64
    return orjson.dumps(text) + encoding_member + _UTF8


def _bytes_field_size(data: bytes | None, encoding_member_len: int) -> int:
    """``len(_bytes_field(data, member))`` without building base64 text."""
    if data is None:
        return 8 + encoding_member_len
    if data.isascii():
        # ASCII is valid UTF-8; only escapes can change the length.
        return len(orjson.dumps(data.decode("ascii"))) + 6 + encoding_member_len
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return 2 + 4 * ((len(data) + 2) // 3) + 8 + encoding_member_len
    return len(orjson.dumps(text)) + 6 + encoding_member_len


def _headers_piece(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """The header objects of a record, between the brackets of ``"headers":[...]``."""
    if not headers:
        return b""
    return b",".join([_HEADER_KEY + orjson.dumps(name) + _HEADER_VALUE + _bytes_field(value, _VALUE_ENCODING) + b"}"
                      for name, value in headers])


@lru_cache(maxsize=4096)
def compiled_pieces(topic: str, partition: int, timestamp_type: int) -> tuple[bytes, ...]:
    """The constant pieces of a JSON line, in the order the compiled walk (``kernels.records_jsonl``) writes
    them, so that its lines are this module's byte for byte.

    head (up to the offset), timestamp, key prefix, after a null / text /
    base64 key, value prefix, after a null / text / base64 value, a record
    without headers, headers open, header key, header value, after a null /
    text / base64 header value, header close, separator, headers close, line end.
    """
    pieces = _json_pieces(topic, partition, timestamp_type)
    encodings = (_NULL, _UTF8, _BASE64)
    return (pieces.prefix, pieces.ts_prefix, pieces.key_prefix,
            *(_KEY_ENCODING + e for e in encodings),
            pieces.value_prefix, *(_VALUE_ENCODING + e for e in encodings),
            _HEADERS_OPEN + _HEADERS_CLOSE[:1], _HEADERS_OPEN, _HEADER_KEY, _HEADER_VALUE,
            *(_VALUE_ENCODING + e for e in encodings),
            b"}", b",", _HEADERS_CLOSE[:1], _HEADERS_CLOSE[1:])


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
        _bytes_field(key, _KEY_ENCODING),
        _bytes_field(value, _VALUE_ENCODING),
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
    # cast: no None in values, checked just before
    if None not in values and _plain_ascii(b"".join(cast("list[bytes]", values))):
        keys = [record[2] for record in records]
        key_nulls = keys.count(None)
        if key_nulls == len(keys) or _plain_ascii(b"".join([key for key in keys if key is not None])):
            head = pieces.prefix.replace(b"%", b"%%") + b"%d" + pieces.ts_prefix + b"%d"
            nokey = head + pieces.nokey_tail
            keyed = head + pieces.key_tail
            return b"".join([
                (nokey % (offset, timestamp, value) if key is None else
                 keyed % (offset, timestamp, key, value)) if not headers else
                general % (offset, timestamp, _bytes_field(key, _KEY_ENCODING),
                           b'"' + value + b'"' + _VALUE_ENCODING + _UTF8,  # type: ignore[operator]  # None not in values
                           _headers_piece(headers))
                for offset, timestamp, key, value, headers in records
            ])
    return b"".join([
        general % (offset, timestamp, _bytes_field(key, _KEY_ENCODING),
                   _bytes_field(value, _VALUE_ENCODING), _headers_piece(headers))
        for offset, timestamp, key, value, headers in records
    ])


def json_sizes(records: Iterable[RecordFields], topic: str, partition: int, timestamp_type: int) -> list[int]:
    """Per-record sizes of :func:`render_jsonl`."""
    fixed = _json_pieces(topic, partition, timestamp_type).fixed_len
    key_member = len(_KEY_ENCODING)
    value_member = len(_VALUE_ENCODING)
    sizes = []
    for offset, timestamp, key, value, headers in records:
        size = (fixed + len(str(offset)) + len(str(timestamp))
                + _bytes_field_size(key, key_member) + _bytes_field_size(value, value_member))
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
    """JSON bytes of ``count`` lines without headers at consecutive offsets from ``first_offset``, all stamped
    ``timestamp``, apart from their key and value pieces: the constant pieces, the timestamps and the offsets'
    digits."""
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
    # the lines' frames, a null key each, each value in quotes with "utf8": the block less its newlines
    json = (_frames_json_size(count, first_offset, timestamp, topic, partition, LOG_APPEND_TIME)
            + count * (_KEY_FIXED + _VALUE_FIXED) + len(block) - count)
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
    except TypeError:
        joined = b"".join([value for value in values if value is not None])
    text = len(joined) + count

    json = _frames_json_size(count, first_offset, timestamp, topic, partition, timestamp_type)
    # a plain ASCII or null field takes its text and _*_FIXED bytes
    if _plain_ascii(joined):
        json += len(joined) + _VALUE_FIXED * count
    else:
        member = len(_VALUE_ENCODING)
        json += sum([_bytes_field_size(value, member) for value in values])
    if keys is None:
        json += _KEY_FIXED * count
    else:
        joined_keys = b"".join([key for key in keys if key is not None])
        if _plain_ascii(joined_keys):
            json += len(joined_keys) + _KEY_FIXED * count
        else:
            member = len(_KEY_ENCODING)
            json += sum([_bytes_field_size(key, member) for key in keys])
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
    return head, pieces.nokey_tail, pieces.key_tail


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
        args: list[object] = [None] * (width * n)
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

