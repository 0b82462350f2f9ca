"""Helpers shared by the test files: topic configs for engine tests, and waits on observable conditions.

Also the fixtures and harnesses more than one file needs: the ``ns`` and
``manager`` fixtures of the namespace's unit tests (a module imports them by
name), and :class:`PausedClean`, a log cleaner held in the middle of a clean.

Every wait of the suite goes through :func:`wait_for`: it polls a condition
with a timeout and fails naming what it waited for, so a slow machine makes a
test slower, never wrong.  To show that a background task of a mount did
*nothing* (retention left a compacted topic alone, the cleaner skipped a
delete topic), a test waits for :func:`wait_for_task_runs`: whole runs of that
task, counted in ``.logfs/stats.json``, that began after the moment of
interest, and then asserts on the state; a fixed ``sleep()`` would prove
nothing on a loaded machine.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pytest

from engine.checkpoint import read_to_end
from engine.cleaner.cleaner_manager import LOG_CLEANING_ABORTED
from engine.clock import ManualClock
from engine.config import BrokerConfig, LogConfig
from engine.manager import LogManager
from engine.topic import TopicPartition
from logfs.namespace import Namespace
from logfs.nodes import Directory, Node
from logfs.stats import MountStats

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from pathlib import Path

    from engine.cleaner import CleanerStats, LogCleaner
    from engine.log import Log
    from logfs.fs import LogfsOperations

T = TypeVar("T")
N = TypeVar("N", bound=Node)

#: mount options for a cleaner that starts at once, backs off 50 ms and needs 1 MiB: several cleans in a test's seconds
QUICK_CLEANER = {
    "log.initial.task.delay.ms": "0",
    "log.cleaner.backoff.ms": "50",
    "log.cleaner.dedupe.buffer.size": str(1 << 20),
}

#: names of the mount's periodic tasks in ``.logfs/stats.json`` (Kafka's scheduler names, see logfs/tasks.py)
RETENTION_TASK = "kafka-log-retention"
FLUSH_TASK = "kafka-log-flusher"
RECOVERY_POINT_TASK = "kafka-recovery-point-checkpoint"
LOG_START_OFFSET_TASK = "kafka-log-start-offset-checkpoint"
DELETE_TASK = "kafka-delete-logs"
CLEANER_TASK = "kafka-log-cleaner-thread-0"


def log_of(manager: LogManager, tp: TopicPartition) -> Log:
    """``manager.get_log(tp)`` of a partition the test has created (an AssertionError naming it if not)."""
    log = manager.get_log(tp)
    assert log is not None, f"no log of {tp}"
    return log


def cleaner_of(manager: LogManager) -> LogCleaner:
    """``manager.cleaner`` of a manager started with the cleaner enabled."""
    cleaner = manager.cleaner
    assert cleaner is not None, "the manager runs no cleaner"
    return cleaner


def make_config(**overrides: object) -> LogConfig:
    """A topic config from keyword overrides, underscores for dots: ``make_config(internal_segment_bytes=1000)``."""
    return LogConfig.from_props({k.replace("_", "."): str(v) for k, v in overrides.items()})


def started_manager(data_dir: str, partitions: int) -> LogManager:
    """A LogManager on ``data_dir`` with topic ``t`` of ``partitions`` partitions, ten values in ``t-0``.

    The namespace's unit tests (no FUSE) look names up and write control files over it;
    the manual clock keeps timestamps fixed.
    """
    m = LogManager(BrokerConfig.from_props({"log.dirs": data_dir, "log.retention.ms": "604800000"}),
                   clock=ManualClock(1_700_000_000_000))
    m.startup()
    m.create_topic("t", partitions)
    log_of(m, TopicPartition("t", 0)).append_values([b"v%d" % i for i in range(10)])
    return m


@pytest.fixture(name="manager")
def namespace_manager(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[LogManager]:
    """:func:`started_manager` in ``tmp_path/data``, with the module's ``NAMESPACE_PARTITIONS`` (default 1)."""
    m = started_manager(str(tmp_path / "data"), partitions=getattr(request.module, "NAMESPACE_PARTITIONS", 1))
    yield m
    m.shutdown()


@pytest.fixture(name="ns")
def namespace(manager: LogManager) -> Namespace:
    """The mount's namespace over the ``manager`` fixture, without FUSE."""
    return Namespace(manager, MountStats())


@pytest.fixture(name="ops")
def page_cache_ops(manager: LogManager) -> LogfsOperations:
    """The FUSE operations over the ``manager`` fixture, views through the page cache (no direct I/O)."""
    from logfs.fs import LogfsOperations
    return LogfsOperations(Namespace(manager, MountStats(), views_direct_io=False))


def text_view(values: Iterable[bytes | None]) -> bytes:
    """What a text view (``records``, ``from/N``) shows of these values: each and a newline, a null one empty."""
    return b"".join((b"" if value is None else value) + b"\n" for value in values)


def walk(ns: Namespace, path: str) -> Node:
    """The node at ``path`` (names joined by ``/``), looked up a name at a time from the root as logfs.fs does."""
    node: Node = ns.root
    for name in path.split("/"):
        assert isinstance(node, Directory), f"{node.path()} is a file: nothing is below it"
        node = node.lookup(name)
    return node


def walk_to(ns: Namespace, path: str, kind: type[N]) -> N:
    """:func:`walk`, where the test knows which kind of node the path names."""
    node = walk(ns, path)
    assert isinstance(node, kind), f"{path} is a {type(node).__name__}, not a {kind.__name__}"
    return node


def wait_for(predicate: Callable[[], T | Literal[False] | None], what: str, timeout: float = 30.0,
             interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; fail after ``timeout`` s.

    ``predicate`` may say "not yet" with False or None (``ready and value``), which the answer then is not.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- a mount's stats.json


#: a parsed JSON object (Any: its members are whatever the document holds)
JsonObject = dict[str, Any]


def json_object(text: bytes | str) -> JsonObject:
    """``text`` parsed as JSON, which must be an object (a mount's ``state`` and ``stats.json`` are)."""
    doc = json.loads(text)
    assert isinstance(doc, dict), doc
    return doc


def mount_stats(mount: Any) -> JsonObject:
    """``.logfs/stats.json`` of a running mount (``mount`` is a tests.conftest.Mount)."""
    return json_object((mount / ".logfs/stats.json").read_bytes())


def partition_state(mount: Any, topic: str = "t", partition: int = 0) -> JsonObject:
    """``<topic>/<partition>/state`` of a running mount (``mount`` is a tests.conftest.Mount)."""
    return json_object((mount / f"{topic}/{partition}/state").read_bytes())


def cleaner_totals(mount: Any) -> JsonObject:
    """The log cleaner's totals in ``.logfs/stats.json`` (runs, horizons set, deletes expired, ...)."""
    totals: JsonObject = mount_stats(mount)["cleaner"]["totals"]
    return totals


def cleaner_runs(mount: Any) -> int:
    """Whole runs of the log cleaner so far."""
    runs: int = cleaner_totals(mount)["runs"]
    return runs


def task_runs(mount: Any, task: str) -> int:
    """Finished runs of a periodic task of the mount (0 before its first run)."""
    run = mount_stats(mount)["tasks"].get(task)
    return 0 if run is None else run["runs"]


def wait_for_task_runs(mount: Any, task: str, runs: int = 1, timeout: float = 30.0) -> int:
    """Wait until ``runs`` whole runs of ``task`` have started and finished after this call.

    The counter goes up when a run ends; a run under way at the call may have
    begun before it, so ``runs + 1`` increments are awaited: the last ``runs``
    of them began after the call.  Returns the counter reached.
    """
    target = task_runs(mount, task) + runs + 1
    return wait_for(lambda: (n := task_runs(mount, task)) >= target and n,
                    f"{runs} more run(s) of {task}", timeout=timeout)


# --------------------------------------------------------------------------- a clean held in the middle


class PausedClean:
    """A ``clean_once`` of ``cleaner`` on a thread, held at its worker's ``at_check``-th ``check_done``.

    ``check_done`` is where Kafka's cleaner notices an abort, so a test can
    abort (delete the topic, ``abort_cleaning``) while the clean is under way,
    see that it waits for the worker, then :meth:`release` it.  Created
    running: the constructor returns once the clean reached the pause.
    """

    def __init__(self, cleaner: LogCleaner, at_check: int = 5) -> None:
        self.cleaner = cleaner
        self.worker = cleaner.cleaners[0]
        self._original_check = self.worker.check_done
        self._at_check = at_check
        self._calls = 0
        self._reached = threading.Event()
        self._release = threading.Event()
        self._result: dict[str, CleanerStats | None] = {}
        self.worker.check_done = self._pausing_check
        self.thread = threading.Thread(target=lambda: self._result.setdefault("stats", cleaner.clean_once()))
        self.thread.start()
        assert self._reached.wait(10), "the clean never reached its pause"

    def _pausing_check(self, tp: TopicPartition) -> None:
        self._calls += 1
        if self._calls == self._at_check:
            self._reached.set()
            self._release.wait(10)
        self._original_check(tp)

    def wait_aborted(self, tp: TopicPartition) -> None:
        """Until the cleaner manager marks ``tp``'s clean aborted (the aborting thread is then waiting)."""
        wait_for(lambda: self.cleaner.manager.cleaning_state(tp) is LOG_CLEANING_ABORTED,
                 f"the clean of {tp} to be marked aborted", timeout=10)

    def release(self) -> CleanerStats | None:
        """Let the clean go on; returns what ``clean_once`` returned (None: aborted)."""
        self._release.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self._result["stats"]

    def restore(self) -> None:
        """The worker's own ``check_done`` again (cleans after this one are not held)."""
        self.worker.check_done = self._original_check


def add_config(path: Any, text: str | bytes) -> None:
    """``echo name=value >> <topic>/config``: add overrides (a write with ``>``/O_TRUNC replaces them all)."""
    with open(path, "ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) on the new directory ``path``, unmounted on exit; the test
    is skipped where this process may not mount one."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def tree_snapshot(root: Any, *, dirs: bool = False) -> dict[str, tuple[bytes, int] | int]:
    """Every file under ``root`` by its relative path: its bytes and mtime (ns); with ``dirs`` also every
    directory (its relative path and a ``/``): its mtime (ns)."""
    result: dict[str, tuple[bytes, int] | int] = {}
    for dirpath, _, names in os.walk(root):
        if dirs:
            result[os.path.relpath(dirpath, root) + "/"] = os.stat(dirpath).st_mtime_ns
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                result[os.path.relpath(path, root)] = (f.read(), os.stat(path).st_mtime_ns)
    return result


def append_lines(path: Any, lines: list[bytes], *, sync: bool = False) -> None:
    """``lines``, each ended by a newline, written to ``path`` (a mount's append file) in one write(2); with
    ``sync`` fsync'd before the close."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, b"".join(line + b"\n" for line in lines))
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_then_refused(path: Any, flags: int, accepted: bytes, *refused: bytes) -> None:
    """Through one opening of ``path`` (``flags``): ``accepted`` is written, then each write of ``refused``
    fails with EINVAL; the close succeeds."""
    fd = os.open(path, flags)
    try:
        os.write(fd, accepted)
        for data in refused:
            with pytest.raises(OSError) as exc:
                os.write(fd, data)
            assert exc.value.errno == errno.EINVAL, data
    finally:
        os.close(fd)


def direct_read(path: Any) -> bytes:
    """A whole file read that bypasses the page cache (O_DIRECT): every byte from the mount itself."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        return read_to_end(fd)
    finally:
        os.close(fd)
