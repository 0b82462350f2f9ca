"""What a name of the tree spells: times (``since/<T>``, ``reset <T>``) and the ``.jsonl`` format suffix.

A leaf module (it imports only the engine), so the directories (logfs.dirs)
and the consumer-group files (logfs.groups) parse names the same way without
importing each other.  Offsets and partitions have one spelling, read by
``engine.numbers.parse_canonical_int``.
"""

from __future__ import annotations

import datetime as _dt

from engine.numbers import parse_canonical_int
from engine.views import ViewFormat

#: the suffix selecting the JSON-lines rendering of a view (``from/5.jsonl``, ``consume/<group>.jsonl``)
JSONL_SUFFIX = ".jsonl"


def split_format(name: str) -> tuple[str, ViewFormat]:
    """``"5.jsonl"`` -> ``("5", JSONL)``; any other name is its own stem in the text rendering."""
    if name.endswith(JSONL_SUFFIX):
        return name[:-len(JSONL_SUFFIX)], ViewFormat.JSONL
    return name, ViewFormat.TEXT


def parse_timestamp(text: str) -> int | None:
    """Epoch milliseconds or ISO 8601 (a naive time is UTC) -> epoch ms; None if neither.

    Epoch milliseconds have one spelling (engine.numbers); ISO 8601 is read by
    ``datetime.fromisoformat`` on ASCII text only (it would accept other
    scripts' digits).  Every refusal is None, so every bad name is ENOENT.
    """
    if not text.isascii() or not text:
        return None
    if text[0].isdigit() and text.isdigit():
        return parse_canonical_int(text)
    try:
        when = _dt.datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    try:
        return int(when.timestamp() * 1000)
    except (OverflowError, OSError, ValueError):
        return None
