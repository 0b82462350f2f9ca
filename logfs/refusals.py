"""``.logfs/errors``: the mount's recent refusals, readable from inside the mount (the file is
``logfs.nodes.ErrorsFile``).

A shell user sees ``Invalid argument``; the reason is in the log of a process
they may not have started.  Every refusal the mount logs (``logfs.fs``
translates errors into errnos in one place, and records each one here) is
also one line of ``.logfs/errors``::

    2026-11-27T17:43:38.681Z t/0/append EMSGSIZE write: A line of at least 1100000 bytes ...

time (UTC), the path, the errno's name, the operation and the reason.  The
file grows like ``records`` does (``tail -f`` follows it); it keeps the last
``MAX_LINES`` refusals: a reader behind the oldest one kept goes on from it.
Probes that are part of normal operation (a missing name looked up: ENOENT)
are not refusals and are not recorded.

Kafka has no counterpart: a client sees the error code of its own request only.
"""

from __future__ import annotations

import collections
import errno as _errno
import threading
import time

from logfs.handles import Handle

__all__ = ["ErrorsHandle", "MAX_LINES", "RecentRefusals"]

#: the refusals ``.logfs/errors`` keeps
MAX_LINES = 1000
#: the longest reason kept on a line
_MAX_REASON = 1000


class RecentRefusals:
    """The last ``MAX_LINES`` refusals as lines at fixed byte positions (a file that only grows).

    Positions count every byte ever recorded since the mount started; the
    lines before ``start`` were dropped (the log start offset of this file).
    """

    def __init__(self, max_lines: int = MAX_LINES) -> None:
        self._lines: collections.deque[bytes] = collections.deque()
        self._max = max_lines
        self.start = 0          # position of the oldest line kept
        self.end = 0            # position after the newest line
        self.last_ns = 0        # when the newest line was recorded (0: none yet)
        self._lock = threading.Lock()

    def record(self, path: str, code: int, reason: str) -> None:
        """One refusal: ``path`` refused with errno ``code`` because of ``reason``."""
        now = time.time_ns()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 1_000_000_000))
        name = _errno.errorcode.get(code, str(code))
        text = " ".join(reason.split())[:_MAX_REASON]
        line = f"{stamp}.{now // 1_000_000 % 1000:03d}Z {path or '/'} {name} {text}\n".encode("utf-8", "replace")
        with self._lock:
            self._lines.append(line)
            self.end += len(line)
            while len(self._lines) > self._max:
                self.start += len(self._lines.popleft())
            self.last_ns = now

    def read(self, position: int, size: int) -> tuple[int, bytes]:
        """Up to ``size`` bytes from ``position`` (from ``start`` if that was dropped), and where they begin."""
        with self._lock:
            position = max(position, self.start)
            out = bytearray()
            at = self.start
            for line in self._lines:
                if len(out) >= size:
                    break
                if at + len(line) > position:
                    out += line[max(0, position - at):]
                at += len(line)
            return position, bytes(out[:size])


class ErrorsHandle(Handle):
    """A reader of ``.logfs/errors``: positions are the file's, except that dropped lines are skipped.

    A reader at a position whose line was dropped (``cat`` from 0 after more
    than ``MAX_LINES`` refusals, a ``tail -f`` left behind) reads from the
    oldest line kept, and its later positions are shifted by the same amount,
    so it reads each kept line once.
    """

    def __init__(self, refusals: RecentRefusals) -> None:
        self._refusals = refusals
        self._shift = 0

    def read(self, offset: int, size: int) -> bytes:
        wanted = offset + self._shift
        begins, data = self._refusals.read(wanted, size)
        self._shift += begins - wanted
        return data
