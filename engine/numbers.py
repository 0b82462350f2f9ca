"""The one parser of integers typed by users: offsets, partitions, config values, markers.

Every number a user writes (a path component such as ``offset/7``, a partition
directory, a ``before 500`` marker, a config value) has exactly one spelling:
ASCII digits, no sign unless negative values are allowed, no leading zero,
nothing around it.  ``007``, ``00``, ``+7``, ``-0`` and digits of other scripts
(``٣``, which Python's ``int()`` accepts) name no number, so two different paths
never reach the same record and a name read back is the name written.

The length is checked before ``int()`` runs: Python refuses to convert strings
of more than 4,300 digits (a ValueError that would otherwise surface as EIO),
and no offset, partition or config value of Kafka has more than 19 digits.
"""

from __future__ import annotations

import re

__all__ = ["LONG_MAX", "INT_MAX", "parse_canonical_int", "is_canonical_int"]

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1

# [0-9] under re.ASCII: other scripts' digits are not digits here.
_CANONICAL = re.compile(r"-?(?:0|[1-9][0-9]{0,18})", re.ASCII)


def is_canonical_int(text: str, *, signed: bool = False) -> bool:
    """Whether ``text`` is the one spelling of an integer (no range check beyond 19 digits)."""
    if not isinstance(text, str) or _CANONICAL.fullmatch(text) is None or text == "-0":
        return False
    return signed or not text.startswith("-")


def parse_canonical_int(text: str, *, minimum: int = 0, maximum: int = LONG_MAX) -> int | None:
    """The integer ``text`` spells canonically, within [minimum, maximum]; None otherwise.

    A negative ``minimum`` allows a leading ``-`` (Kafka's ``-1`` for "no limit").
    Callers turn None into their own error: ENOENT for a path name, EINVAL for
    a marker or a config value, each naming what was refused.
    """
    if not is_canonical_int(text, signed=minimum < 0):
        return None
    value = int(text)
    if value < minimum or value > maximum:
        return None
    return value
