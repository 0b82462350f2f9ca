"""What the benchmarks under scripts/bench/ share: waiting for a mount they started, and the best of runs."""

from __future__ import annotations

import subprocess
import time
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

T = TypeVar("T")


def wait_mounted(mnt: Path, proc: subprocess.Popen, log: Path, timeout: float, what: str = "mount", *,
                 interval: float = 0.05) -> None:
    """Return once ``mnt`` is a mount point; if its FUSE server ``proc`` exits first, or ``timeout`` seconds
    pass, the benchmark exits saying ``what`` failed, with the last 3000 characters of the server's ``log``."""
    deadline = time.monotonic() + timeout
    while subprocess.run(["mountpoint", "-q", str(mnt)]).returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} failed:\n{log.read_text()[-3000:]}")
        time.sleep(interval)


def best_of(run: Callable[[], T], repeat: int, clock: Callable[[], float] = time.perf_counter) -> tuple[float, T]:
    """The fewest seconds (by ``clock``) of ``repeat`` runs of ``run``, and what the last run returned."""
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        result = run()
        best = min(best, clock() - start)
    return best, result
