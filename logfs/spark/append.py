"""Appending one column of a DataFrame to ``MOUNT/<topic>/append`` from Spark tasks."""

from __future__ import annotations

import errno
import functools
import logging
import os
from typing import TYPE_CHECKING, Any

from engine.errors import (
    InvalidConfigError,
    InvalidRecordError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:  # pragma: no cover - imported lazily where used
    from collections.abc import Iterator

    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


def _line_bytes(value: Any, what: str) -> bytes:     # Any: a Spark row's column, checked here
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    else:
        raise InvalidRecordError(f"Cannot append {what} of type {type(value).__name__}: expected string or binary")
    if b"\n" in data:
        raise InvalidRecordError(f"Cannot append {what} containing a newline: a line of an append file is one record")
    return data


# Any: Spark's Rows and accumulator
def _append_partition(rows: Iterator[Any], *, path: str, value_index: int, key_index: int | None,
                      separator: bytes, null_marker: bytes | None, chunk_bytes: int,
                      counter: Any) -> None:
    """Executor side of :func:`append_rows`: lines of one Spark partition, one write per chunk."""
    fd: int | None = None
    buf: list[bytes] = []
    size = appended = 0

    def flush() -> None:
        nonlocal buf, size, appended
        assert fd is not None, "flush() runs only after the first line opened the append file"
        view = memoryview(b"".join(buf))
        while view:
            written = os.write(fd, view)
            view = view[written:]
        appended += len(buf)
        buf, size = [], 0

    try:
        for row in rows:
            value = row[value_index]
            if key_index is None:
                if value is None:
                    raise InvalidRecordError("Cannot append a null value without a key: a line has no null")
                line = _line_bytes(value, "a value")
            else:
                if row[key_index] is None:
                    raise InvalidRecordError("Cannot append a keyed line with a null key")
                key = _line_bytes(row[key_index], "a key")
                if separator in key:
                    raise InvalidRecordError(f"Cannot append key {key!r}: it contains the key.separator {separator!r}")
                if value is None:
                    if null_marker is None:
                        raise InvalidRecordError("Cannot append a null value: the topic has no null.marker set")
                    line = key + separator + null_marker
                else:
                    line = key + separator + _line_bytes(value, "a value")
            if fd is None:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            buf.append(line + b"\n")
            size += len(line) + 1
            if size >= chunk_bytes:
                flush()
        if buf:
            flush()
    except OSError as exc:
        if exc.errno == errno.EMSGSIZE:
            raise InvalidRecordError(f"A record is larger than max.message.bytes of {path}") from exc
        raise
    finally:
        if fd is not None:
            os.close(fd)
        counter.add(appended)


def _topic_config(mount: str, topic: str) -> dict[str, str]:
    with open(os.path.join(mount, topic, "config"), encoding="utf-8") as f:
        # overrides as name=value lines, the defaults as #name=value comments
        lines = (line[1:] if line.startswith("#") else line for line in f.read().splitlines())
        pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith(" "))
        return {name.strip(): value for name, value in pairs}


def append_rows(df: DataFrame, mount: str, topic: str, column: str = "value", *,
                key_column: str | None = None, chunk_bytes: int = 256 << 10) -> int:
    """Append one column of ``df`` to ``topic`` through ``MOUNT/<topic>/append``; return the count.

    Runs on the executors (``foreachPartition``), so it works from any Spark task
    that sees the mount.  Each value (string or binary, no newline) becomes one
    record; the lines of a task are written in chunks of about ``chunk_bytes``,
    one ``write()`` each, which the mount appends as one batch.  With
    ``key_column`` the topic must have ``parse.key=true``; lines are
    ``key<key.separator>value`` and the mount's partitioner places them by key
    (a null value becomes the topic's ``null.marker``, i.e. a tombstone).
    """
    path = os.path.join(mount, topic, "append")
    if not os.path.exists(path):
        raise UnknownTopicOrPartitionError(f"Topic {topic!r} does not exist under {mount} (no {path})")
    columns = df.columns
    if column not in columns:
        raise InvalidConfigError(f"DataFrame has no column {column!r} to append (columns: {columns})")
    separator, null_marker, key_index = b"\t", None, None
    if key_column is not None:
        if key_column not in columns:
            raise InvalidConfigError(f"DataFrame has no key column {key_column!r} (columns: {columns})")
        config = _topic_config(mount, topic)
        if config.get("parse.key", "false").strip().lower() != "true":
            raise InvalidConfigError(
                f"Topic {topic!r} has parse.key=false: write parse.key=true to {mount}/{topic}/config "
                "to append keyed lines")
        separator = config.get("key.separator", "\t").encode() or b"\t"
        marker = config.get("null.marker", "")
        null_marker = marker.encode() if marker else None
        key_index = columns.index(key_column)
    counter = df.sparkSession.sparkContext.accumulator(0)
    df.foreachPartition(functools.partial(
        _append_partition, path=path, value_index=columns.index(column), key_index=key_index,
        separator=separator, null_marker=null_marker, chunk_bytes=chunk_bytes, counter=counter))
    log.info("[logfs sink] Appended %d records to topic %s through %s", counter.value, topic, path)
    return int(counter.value)
