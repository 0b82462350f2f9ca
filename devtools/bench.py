"""What the benchmarks under scripts/bench/ share: their work directory, waiting for a mount they started,
and the best of runs."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator

T = TypeVar("T")


def add_work_dir_options(parser: argparse.ArgumentParser) -> None:
    """``--dir`` and ``--keep``, what :func:`work_dir` reads."""
    parser.add_argument("--dir", default=None, help="work directory (default: a new temp dir in $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")


@contextlib.contextmanager
def work_dir(args: argparse.Namespace, prefix: str) -> Iterator[Path]:
    """The benchmark's work directory: ``--dir`` (made if missing) or a new temp dir named ``prefix...``;
    removed at the end unless ``--keep``."""
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix=prefix))
    base.mkdir(parents=True, exist_ok=True)
    try:
        yield base
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def wait_mounted(mnt: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str = "mount", *,
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
