"""``java.util.Properties`` text, the format of a ``server.properties``: parse and write back."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from engine.errors import InvalidConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_BLANKS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str, source: str = "<properties>") -> dict[str, str]:
    """Parse ``java.util.Properties`` text: the format of ``server.properties``.

    Comment lines start with ``#`` or ``!``; a key ends at the first unescaped
    ``=``, ``:`` or blank; a line ending in an odd number of backslashes continues
    on the next (whose leading blanks are dropped); ``\\t \\n \\r \\f \\uXXXX``
    are escapes and any other escaped character stands for itself.  The last of
    duplicate keys wins.  A malformed ``\\u`` escape raises InvalidConfigError
    naming ``source`` and the line.
    """
    props: dict[str, str] = {}
    lines = _LINE_BREAK.split(text)
    i = 0
    while i < len(lines):
        number = i + 1
        logical = lines[i].lstrip(_BLANKS)
        i += 1
        if not logical or logical[0] in "#!":
            continue
        while _continues(logical):
            logical = logical[:-1]
            if i >= len(lines):
                break
            logical += lines[i].lstrip(_BLANKS)
            i += 1
        key, value = _split_key_value(logical)
        props[_unescape(key, source, number)] = _unescape(value, source, number)
    return props


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_key_value(line: str) -> tuple[str, str]:
    end, length, escaped, separator = 0, len(line), False, False
    value_start = length
    while end < length:
        c = line[end]
        if not escaped and c in "=:":
            value_start, separator = end + 1, True
            break
        if not escaped and c in _BLANKS:
            value_start = end + 1
            break
        escaped = (c == "\\") and not escaped
        end += 1
    while value_start < length:
        c = line[value_start]
        if c not in _BLANKS:
            if not separator and c in "=:":
                separator = True
            else:
                break
        value_start += 1
    return line[:end], line[value_start:]


def _unescape(text: str, source: str, number: int) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i, length = 0, len(text)
    while i < length:
        c = text[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        if i >= length:
            break                     # a lone backslash at the very end of the file
        c = text[i]
        i += 1
        if c == "u":
            digits = text[i:i + 4]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise InvalidConfigError(f"Malformed \\uxxxx encoding in {source} line {number}")
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_ESCAPES.get(c, c))
    return "".join(out)


_STORE_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}


def _escape(text: str, is_key: bool) -> str:
    out = []
    for i, c in enumerate(text):
        if c in _STORE_ESCAPES:
            out.append(_STORE_ESCAPES[c])
        elif c == " " and (is_key or i == 0):
            out.append("\\ ")
        elif c in "=:#!" and (is_key or i == 0):
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return "".join(out)


def format_properties(props: Mapping[str, str]) -> str:
    """``name=value`` lines that :func:`parse_properties` reads back exactly (``Properties.store``'s
    escaping: a tab separator is written ``\\t``, a leading blank is escaped)."""
    return "".join(f"{_escape(name, True)}={_escape(value, False)}\n" for name, value in props.items())
