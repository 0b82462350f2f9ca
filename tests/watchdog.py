"""A test that outlives its timeout by a minute dumps every thread's stack to a file and ends its process.

pytest-timeout (``timeout`` in pyproject.toml, per test ``@pytest.mark.timeout``) fails a test that runs too
long by raising in it (its signal method), which cannot interrupt a thread blocked in the kernel: a
``read()`` of a FUSE mount whose daemon stopped answering waits until it is killed.  Such a test would hold
its worker, and the suite, until CI's own limit ends the run with nothing said of where it stood.  This
watchdog (``faulthandler.dump_traceback_later``, armed around each test) writes the stacks to
``LOGFS_TEST_HANG_DIR`` (``scripts/test.sh`` prints the files after the run) and exits the process: xdist
reports the test as a crashed worker's and goes on with a new worker.

The same holds after the last test: a process still alive two minutes after its session finished (a thread
a test left running, which the interpreter's exit waits for) writes its stacks and exits, rather than keep
xdist, and CI, waiting for it.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
from typing import IO, TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

#: beyond the test's own timeout: the signal method's failure, and its fixtures' teardown, come first
GRACE_S = float(os.environ.get("LOGFS_TEST_HANG_GRACE", "60"))


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    if marker is not None and "timeout" in marker.kwargs:
        return float(marker.kwargs["timeout"])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    timeout = _timeout_of(item)
    directory = os.environ.get("LOGFS_TEST_HANG_DIR")
    if timeout <= 0 or not directory:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out: IO[str] = open(os.path.join(directory, f"{worker}-{os.getpid()}.txt"), "w")
    out.write(f"{item.nodeid} ran over its timeout of {timeout:.0f} s by {GRACE_S:.0f} s; its threads:\n")
    out.flush()
    faulthandler.dump_traceback_later(timeout + GRACE_S, exit=True, file=out)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        out.close()
        os.unlink(out.name)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    directory = os.environ.get("LOGFS_TEST_HANG_DIR")
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = open(os.path.join(directory, f"{worker}-{os.getpid()}-exit.txt"), "w")
    out.write(f"the {worker} process was still running {2 * GRACE_S:.0f} s after its session finished; its threads:\n")
    out.flush()
    # cancelled, and its file removed, at the interpreter's exit (atexit runs after it has joined the threads)
    faulthandler.dump_traceback_later(2 * GRACE_S, exit=True, file=out)
    atexit.register(_remove, out)


def _remove(out: IO[str]) -> None:
    faulthandler.cancel_dump_traceback_later()
    out.close()
    os.unlink(out.name)
