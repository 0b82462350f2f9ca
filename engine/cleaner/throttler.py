"""Rate limits of the log cleaner: the I/O throttler (Kafka's ``Throttler``) and GIL yields."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger("engine.cleaner")     # one logger for the package: what operators filter on

#: Kafka's cleaner throttler checks its rate every 300 ms.
THROTTLER_CHECK_INTERVAL_MS = 300


# -- throttling --------------------------------------------------------------------------------

class Throttler:
    """Sleeps just enough to hold a process to ``desired_rate_per_sec`` units (Kafka's ``Throttler``).

    Shared by all cleaner workers, so ``log.cleaner.io.max.bytes.per.second``
    bounds their sum, as in Kafka.  The rate is measured over periods of
    ``check_interval_ms``; a period that ran too fast is followed by a sleep.
    """

    def __init__(self, desired_rate_per_sec: float, check_interval_ms: int = THROTTLER_CHECK_INTERVAL_MS,
                 *, nanoseconds: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], object] = time.sleep,
                 threads: Callable[[], int] = threading.active_count) -> None:
        self.desired_rate_per_sec = float(desired_rate_per_sec)
        self._check_interval_ns = check_interval_ms * 1_000_000
        self._nanoseconds = nanoseconds
        self._sleep = sleep
        self._threads = threads
        self._lock = threading.Lock()
        self._period_start_ns = nanoseconds()
        self._observed_so_far = 0.0
        #: total milliseconds slept, for stats and tests
        self.throttled_ms = 0

    def maybe_throttle(self, observed: float) -> None:
        rate = self.desired_rate_per_sec
        with self._lock:
            self._observed_so_far += observed
            now = self._nanoseconds()
            elapsed_ns = now - self._period_start_ns
            if elapsed_ns > self._check_interval_ns and self._observed_so_far > 0:
                rate_in_secs = self._observed_so_far * 1e9 / elapsed_ns
                if rate_in_secs > rate:
                    sleep_ms = round(self._observed_so_far / (rate / 1000.0) - elapsed_ns // 1_000_000)
                    if sleep_ms > 0:
                        logger.debug("Natural rate is %.1f per second but desired rate is %.1f, sleeping "
                                     "for %d ms to compensate.", rate_in_secs, rate, sleep_ms)
                        self._sleep(sleep_ms / 1000.0)
                        self.throttled_ms += sleep_ms
                self._period_start_ns = self._nanoseconds()
                self._observed_so_far = 0.0


class GilYield:
    """Lets other threads take the GIL at least every ``interval`` seconds of cleaning.

    The cleaner runs in a worker thread of the mount, whose trio thread serves
    every FUSE request.  When the trio thread wakes up (a request arrived, a
    system call returned) while the cleaner computes, it waits for the GIL
    until the interpreter forces a switch after ``sys.getswitchinterval()``
    (5 ms), and a small append that blocks a few times waits that long each
    time.  ``time.sleep(pause)`` releases the GIL and gives up the CPU, so the
    waiting thread takes over; with ``pause=0`` that costs about a
    microsecond when nobody waits.  Measured on a clean of 200k records, the
    wake-up delay of a thread sleeping 1 ms in a loop went from p50 2-5 ms to
    p50 0.2 ms with ``interval`` = 1 ms (scripts/bench/bench_cleaner.py ``gil``).
    Called once per batch by the cleaner's loops.  With no other thread in
    the process (``threads()``, default ``threading.active_count``) it does
    not sleep: nobody waits for the GIL, and on a loaded machine the sleep
    handed the CPU to other processes, a third of an engine-level clean.
    """

    __slots__ = ("interval", "pause", "_deadline", "_clock", "_sleep", "_threads")

    def __init__(self, interval: float = 0.001, pause: float = 0.0, *,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], object] = time.sleep,
                 threads: Callable[[], int] = threading.active_count) -> None:
        self.interval = interval
        self.pause = pause
        self._clock = clock
        self._sleep = sleep
        self._threads = threads
        self._deadline = clock() + interval

    def __call__(self) -> None:
        if self._clock() >= self._deadline:
            # Alone in the process (a benchmark, a tool) nobody waits for the GIL, and on a
            # loaded machine the sleep would hand the CPU to other processes for nothing.
            if self._threads() > 1:
                self._sleep(self.pause)
            self._deadline = self._clock() + self.interval
