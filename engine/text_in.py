"""Text lines in: kafka-console-producer's line reader (``parse.key``, ``key.separator``, ``null.marker``).

The other input format, JSON lines, is ``engine.jsonl_in``; the mount's one
append handle (``logfs.appender``) splits the byte stream into lines and hands
them to one of the two.  A line is one record, its bytes up to the newline
(``\\r`` included, as the console producer's ``LineMessageReader`` keeps it):

* without ``parse.key`` the line is the value and there is no key: no
  per-line Python work at all (the hot path of ``cat file >> append``);
* with ``parse.key`` a line is ``key<key.separator>value``, split at the
  first separator (any non-empty string: a tab, a space, ``::``); a line
  without it is an :class:`~engine.errors.InvalidRecordError` naming its line
  number, and the caller appends nothing of the write;
* with ``null.marker`` set, a key or value equal to it is null (a value that
  is null is a tombstone).
"""

from __future__ import annotations

from engine.errors import InvalidRecordError

__all__ = ["parse_text_lines"]


def parse_text_lines(lines: list[bytes], *, parse_key: bool, key_separator: str, null_marker: str | None,
                     first_line_number: int = 1, what: str = "the write",
                     ) -> tuple[list[bytes | None] | None, list[bytes | None]]:
    """``(keys or None, values)`` of ``lines`` as kafka-console-producer reads them (``LineMessageReader``)."""
    keys: list[bytes | None] | None = None
    values: list[bytes | None] = lines  # type: ignore[assignment]   # list is invariant; read-only here
    if parse_key:
        separator = key_separator.encode()
        pairs = [line.split(separator, 1) for line in lines]
        for n, pair in enumerate(pairs):
            if len(pair) != 2:
                raise InvalidRecordError(
                    f"No key separator {separator!r} found on line {first_line_number + n} of {what}: "
                    f"{lines[n][:80]!r}")
        keys = [p[0] for p in pairs]
        values = [p[1] for p in pairs]
    if null_marker is not None:
        marker = null_marker.encode()
        values = [None if v == marker else v for v in values]
        if keys is not None:
            keys = [None if k == marker else k for k in keys]
    return keys, values
