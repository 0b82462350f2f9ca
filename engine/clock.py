"""Wall-clock time in milliseconds, injectable so tests can drive roll and retention."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def milliseconds(self) -> int: ...


class SystemClock:
    """Kafka's ``Time.SYSTEM``: epoch milliseconds from the OS clock."""

    def milliseconds(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_CLOCK: Clock = SystemClock()


class ManualClock:
    """A clock that moves only when told to (Kafka's ``MockTime``), for tests and tools."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms

    def milliseconds(self) -> int:
        return self.now

    def sleep(self, ms: int) -> None:
        self.now += ms
