"""What one append to a log is made of and what it returns (Kafka's ``AppendOrigin``, ``LogAppendInfo``).

``Log.append`` is the one append pipeline; what differs between a client's
lines, a client's values, a batch built elsewhere and a replica's fetched
batches is only how the batches are built: an :data:`AppendBuilder`, called
under the log's lock with the log end offset and the time, returns the
:class:`AppendRun` s to write, each into one segment.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from engine.local_log import AppendObserver
    from engine.segment import LogSegment


class AppendOrigin(enum.Enum):
    """Who appends (Kafka's ``AppendOrigin``)."""

    #: a client of this log: offsets are assigned from the log end, and the append is all or nothing
    CLIENT = "client"
    #: a follower keeping its leader's batches byte for byte, at the leader's offsets
    REPLICATION = "replication"


#: tells the log's ``append_observer`` of a batch the log encoded itself, once written at ``position``
Report = Callable[["AppendObserver", "LogSegment", int], None]


class AppendRun(NamedTuple):
    """Consecutive batches appended to one segment."""

    data: bytes | bytearray
    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    #: None for batches encoded elsewhere: state derived from them is rebuilt from the bytes
    report: Report | None


#: ``build(log end offset, now in ms) -> runs`` (at least one), called under ``Log.lock``; raising writes nothing
AppendBuilder = Callable[[int, int], list[AppendRun]]


class LogAppendInfo(NamedTuple):
    """What one append wrote (Kafka's ``LogAppendInfo``)."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    #: bytes of batches written
    valid_bytes: int
    origin: AppendOrigin
