"""JSON lines in: the inverse of the JSON-lines rendering of ``engine.views.render``.

``append.jsonl`` takes the lines ``records.jsonl`` gives out, so that
``cat a/0/records.jsonl >> b/0/append.jsonl`` copies every record exactly.
One object per line, with these members (and ``topic``, ``offset`` and
``timestampType``, which an exported line carries and which are ignored: the
log assigns offsets, a CreateTime record keeps its timestamp); any other
member is refused, naming it, never read as a missing value (a line shaped
``{"message": ...}``, as log shippers write, would otherwise be a null value:
on a compacted topic, a tombstone):

* ``value``: a string or null (a tombstone); with ``"valueEncoding":"base64"``
  the string is standard base64 of the bytes (how the rendering carries bytes
  that are not UTF-8); with ``"utf8"``, null or no ``valueEncoding`` it is the
  text.  A missing ``value`` is null.
* ``key``: likewise, with ``keyEncoding``.
* ``headers``: null or a list of ``{"key": string, "value": string|null}``
  objects, a header value with ``"valueEncoding":"base64"`` being base64.

The rendering writes every member on every line; the short forms (members
left out) are accepted as well.
* ``timestamp``: epoch milliseconds, an integer >= -1, kept as the record's
  CreateTime; missing or null: the time of the append, as a producer stamps
  a record it was given no timestamp for.
* ``partition``: returned to the caller (the topic-level file routes by it).

Anything else (not an object, a string that is not valid base64, an unknown
encoding, a float timestamp, a header without a string key ...) is an
:class:`~engine.errors.InvalidRecordError` naming the line number, and the
caller appends nothing of the write.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from engine.errors import InvalidRecordError, RecordTooLargeError
from engine.numbers import LONG_MAX
from engine.records import HEADER_SIZE, Compression, Record, TimestampType, encode_records

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from engine.log import Log

logger = logging.getLogger(__name__)

__all__ = ["JsonRecord", "parse_jsonl_line", "parse_jsonl_lines", "append_json_records"]

#: upper bound of a v2 record's framing besides its key, value and headers:
#: length, attributes, timestamp delta, offset delta, key/value lengths, header count (varints)
_RECORD_OVERHEAD = 1 + 10 + 5 + 5 + 5 + 5 + 5
#: upper bound of one header's framing besides its name and value
_HEADER_OVERHEAD = 10
#: room left for a codec's own framing when the topic compresses
_CODEC_SLACK = 1024

_ENCODINGS = (None, "utf8", "base64")
#: encodings of a member that is its own text
_TEXT_ENCODINGS = (None, "utf8")


class JsonRecord(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None
    partition: int | None


# Any: a parsed JSON object's members
def _bytes_member(obj: dict[str, Any], name: str, encoding_name: str, where: str) -> bytes | None:
    data = obj.get(name)
    encoding = obj.get(encoding_name)
    if encoding not in _ENCODINGS:
        raise ValueError(f"{where}{encoding_name} must be \"utf8\", \"base64\", null or absent, not {encoding!r}")
    if data is None:
        return None
    if not isinstance(data, str):
        raise ValueError(f"{where}{name} must be a string or null, not {type(data).__name__}")
    if encoding == "base64":
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}{name} is not valid base64") from None
    return data.encode("utf-8")


def _headers(raw: object) -> tuple[tuple[str, bytes | None], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"headers must be a list, not {type(raw).__name__}")
    out = []
    for i, header in enumerate(raw):
        where = f"headers[{i}]."
        if not isinstance(header, dict):
            raise ValueError(f"headers[{i}] must be an object")
        unknown = header.keys() - _HEADER_MEMBERS
        if unknown:
            raise ValueError(f"unknown member {_names(unknown)} in headers[{i}] (a header has only "
                             "key, value, valueEncoding)")
        name = header.get("key")
        if not isinstance(name, str):
            raise ValueError(f"{where}key must be a string")
        out.append((name, _bytes_member(header, "value", "valueEncoding", where)))
    return tuple(out)


def _names(members: object) -> str:
    # ignore: the members of a JSON object are str; orjson's stub takes Any only
    return ", ".join(orjson.dumps(name).decode() for name in sorted(members))  # type: ignore[call-overload]


def _int_member(obj: dict[str, Any], name: str, minimum: int) -> int | None:     # Any: a parsed JSON object's members
    value = obj.get(name)
    if value is None:
        return None
    if type(value) is not int:            # bool is an int subclass: refused too
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if value < minimum or value > LONG_MAX:
        raise ValueError(f"{name} {value} is out of range")
    return value


#: members of a line that needs no decoding beyond UTF-8 (the common export line)
_PLAIN_MEMBERS = frozenset(("topic", "partition", "offset", "timestamp", "timestampType", "key", "value"))
#: every member a line may have (the rendering of engine.views.render writes no other)
KNOWN_MEMBERS = _PLAIN_MEMBERS | {"keyEncoding", "valueEncoding", "headers"}
_HEADER_MEMBERS = frozenset(("key", "value", "valueEncoding"))
#: ``headers`` of a line without any (``in`` compares with ==: an empty list, not any false value)
_NO_HEADERS: tuple[None, list[Any]] = (None, [])


def parse_jsonl_line(line: bytes) -> JsonRecord:
    """One line -> JsonRecord; ValueError saying what is wrong."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if type(obj) is dict and (obj.keys() <= _PLAIN_MEMBERS or (
            obj.keys() <= KNOWN_MEMBERS and obj.get("headers") in _NO_HEADERS
            and obj.get("keyEncoding") in _TEXT_ENCODINGS and obj.get("valueEncoding") in _TEXT_ENCODINGS)):
        # fast path: text key and value, no headers; every member's type checked inline
        key, value = obj.get("key"), obj.get("value")
        timestamp, partition = obj.get("timestamp"), obj.get("partition")
        if (key is None or type(key) is str) and (value is None or type(value) is str) \
                and (timestamp is None or (type(timestamp) is int and -1 <= timestamp <= LONG_MAX)) \
                and (partition is None or (type(partition) is int and 0 <= partition <= LONG_MAX)):
            return JsonRecord(None if key is None else key.encode(), None if value is None else value.encode(),
                              (), timestamp, partition)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = obj.keys() - KNOWN_MEMBERS
    if unknown:
        raise ValueError(f"unknown member {_names(unknown)} (a record line has only "
                         f"{', '.join(sorted(KNOWN_MEMBERS))})")
    return JsonRecord(
        key=_bytes_member(obj, "key", "keyEncoding", ""),
        value=_bytes_member(obj, "value", "valueEncoding", ""),
        headers=_headers(obj.get("headers")),
        timestamp=_int_member(obj, "timestamp", -1),
        partition=_int_member(obj, "partition", 0),
    )


def parse_jsonl_lines(lines: Sequence[bytes], first_line_number: int = 1, what: str = "the write") -> list[JsonRecord]:
    """Every line parsed, or InvalidRecordError naming the first bad line (numbered from ``first_line_number``)."""
    out = []
    for n, line in enumerate(lines):
        try:
            out.append(parse_jsonl_line(line))
        except ValueError as exc:
            shown = line[:80].decode("utf-8", "replace")
            raise InvalidRecordError(
                f"Malformed JSON line {first_line_number + n} of {what}: {exc} ({shown!r})") from None
    return out


# ---------------------------------------------------------------------------- appending


def _record_bound(record: JsonRecord) -> int:
    size = _RECORD_OVERHEAD + (len(record.key) if record.key is not None else 0) \
        + (len(record.value) if record.value is not None else 0)
    for name, value in record.headers:
        size += _HEADER_OVERHEAD + len(name.encode("utf-8")) + (len(value) if value is not None else 0)
    return size


def _codec(name: str) -> Compression:
    # as Log does for its own batches: "producer" keeps what logfs (the producer) writes, uncompressed
    if name in ("producer", "uncompressed", "none", ""):
        return Compression.NONE
    return Compression.from_name(name)


def append_json_records(log: Log, parsed: Sequence[JsonRecord], now_ms: int | None = None) -> tuple[int, int]:
    """Append ``parsed`` to ``log`` with their own timestamps (CreateTime) and headers, all or nothing.

    Records are packed into batches of at most ``max.message.bytes`` (a
    filesystem write may hold more than one producer batch); the batches go
    in with ``Log.append_batch``, which validates them and assigns offsets.
    When they cannot all go in one call (more than ``segment.bytes``), they
    are appended under the log's lock, so no other writer lands between them,
    and truncated back if one fails.  Returns (first offset, last offset).
    """
    if not parsed:
        raise InvalidRecordError(f"Cannot append an empty batch to {log.topic_partition}")
    config = log.config
    now = int(time.time() * 1000) if now_ms is None else now_ms
    codec = _codec(config.compression_type)
    max_batch = min(config.max_message_bytes, config.segment_size)
    budget = max_batch - HEADER_SIZE - (_CODEC_SLACK if codec != Compression.NONE else 0)
    batches: list[bytes] = []
    current: list[Record] = []
    used = 0

    def close_batch() -> None:
        nonlocal current, used
        if current:
            batches.append(encode_records(current, compression=codec, timestamp_type=TimestampType.CREATE_TIME))
            current, used = [], 0

    for i, record in enumerate(parsed):
        bound = _record_bound(record)
        if bound > budget:
            single = encode_records([_as_record(0, record, now)], compression=codec)
            if len(single) > max_batch:
                raise RecordTooLargeError(
                    f"The record at line {i + 1} of the append to {log.topic_partition} is {len(single)} bytes "
                    f"which exceeds the maximum configured value of {max_batch} (max.message.bytes="
                    f"{config.max_message_bytes}, segment.bytes={config.segment_size}).")
            close_batch()
            batches.append(single)
            continue
        if used + bound > budget:
            close_batch()
        current.append(_as_record(len(current), record, now))
        used += bound
    close_batch()

    # consecutive batches grouped so each append_batch call stays within segment.bytes
    calls: list[bytes] = []
    pending = b""
    for batch in batches:
        if pending and len(pending) + len(batch) > config.segment_size:
            calls.append(pending)
            pending = b""
        pending += batch
    calls.append(pending)
    if len(calls) == 1:
        return log.append_batch(calls[0], assign_offsets=True)
    with log.lock:
        first = log.log_end_offset
        last = first - 1
        try:
            for call in calls:
                _, last = log.append_batch(call, assign_offsets=True)
        except BaseException:
            if log.log_end_offset > first:
                logger.warning("[Log partition=%s] Append of %d JSON records failed part-way; truncating back "
                               "to %d.", log.topic_partition, len(parsed), first)
                log.truncate_to(first)
            raise
    return first, last


def _as_record(offset: int, record: JsonRecord, now: int) -> Record:
    timestamp = now if record.timestamp is None else record.timestamp
    return Record(offset, timestamp, record.key, record.value, record.headers)
