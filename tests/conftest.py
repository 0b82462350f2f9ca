"""Shared fixtures: real ``logfs mount`` processes, and an independent reader of segment files.

``mount`` runs ``.venv/bin/logfs mount`` as a subprocess over a data directory
in ``tmp_path``, with short background-task intervals so retention, flushing
and deletion happen within a test, and waits until ``mountpoint -q`` succeeds.
Options come from ``@pytest.mark.mount_options({...})`` or from calling the
``logfs_mount`` factory directly.  ``Mount.kill()`` is a crash (SIGKILL, then
a lazy unmount of the dead connection); ``Mount.start()`` mounts the same data
directory again.

``kafka_records`` reads ``.log`` files with kafka-python, which knows nothing
of our code, so the views of the mount are checked against Kafka's own codec.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import pytest

from devtools.process import ChildProcess
from logfs.fuse_connection import abort_fuse_connection, fuse_connection
from tests import ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator

#: What a test may start, by its markers (tests/markers.py), the real Kafka brokers' module-scoped fixtures
#: (``kafka_broker``, ``kafka_cluster``, ``secure_kafka_broker``), the process's SparkSession (``spark``), and
#: the watchdog that ends a test stuck past its timeout (tests/watchdog.py).
pytest_plugins = [
    "tests.markers", "tests.kafka_broker", "tests.kafka_cluster", "tests.kafka_secure", "tests.spark_util",
    "tests.watchdog"]


LOGFS = ROOT / ".venv" / "bin" / "logfs"

#: Background tasks run often so a test sees them act within a second.
FAST_TASKS = {
    "log.initial.task.delay.ms": "100",
    "log.flush.scheduler.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "log.flush.offset.checkpoint.interval.ms": "300",
    "log.flush.start.offset.checkpoint.interval.ms": "300",
    "log.segment.delete.delay.ms": "200",
}


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (engine, numba, hypothesis, every test module) lives to the end of the run:
    out of the garbage collector's sight (``gc.freeze``), so that the tests' ``gc.collect()`` calls, and the
    collector's own full passes, scan only what the tests made (a full pass over it all took ~80 ms)."""
    gc.freeze()


def _is_mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


class Mount(ChildProcess):
    """One logfs mount process over one data directory."""

    def __init__(self, base: Path, options: dict[str, str] | None = None, *, read_only: bool = False,
                 extra_args: list[str] | None = None) -> None:
        self.base = base
        self.path = base / "mnt"
        self.data = base / "data"
        self.log_file = base / "logfs.log"
        self.options = {**FAST_TASKS, **(options or {})}
        self.read_only = read_only
        self.extra_args = extra_args or []
        self.path.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(parents=True, exist_ok=True)

    # ---- lifecycle

    def start(self, timeout: float = 30.0) -> Mount:
        from tests.markers import require_marker  # a plugin (pytest_plugins): imported once pytest has it

        require_marker("mount", "a logfs mount")
        cmd = [str(LOGFS), "mount", str(self.path), "--data-dir", str(self.data)]
        for name, value in self.options.items():
            cmd += ["-o", f"{name}={value}"]
        if self.read_only:
            cmd.append("--read-only")
        cmd += self.extra_args
        log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.base)
        log.close()
        deadline = time.monotonic() + timeout
        while not _is_mounted(self.path):
            if self.proc.poll() is not None:
                raise RuntimeError(f"logfs mount exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"logfs mount not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 60.0) -> int:
        """Clean unmount (fusermount3 -u) and wait for the process to finish its shutdown."""
        if self.proc is None:
            return 0
        deadline = time.monotonic() + timeout
        while _is_mounted(self.path):
            if subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True).returncode == 0:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)   # busy: a reader in this test is still closing
        return self.wait_stopped(max(1.0, deadline - time.monotonic()))

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM: the mount shuts down cleanly and unmounts itself."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.wait_stopped(timeout)

    def kill(self) -> None:
        """A crash: SIGKILL, the FUSE connection aborted at once (a SIGKILL can leave it held and the mount
        hung: logfs.fuse_connection), then the dead mount detached."""
        connection = fuse_connection(self.path)
        if self.proc is not None:
            self.proc.kill()
            abort_fuse_connection(connection)
        super().kill()
        subprocess.run(["fusermount3", "-uz", str(self.path)], capture_output=True)

    def log(self) -> str:
        """The mount's whole log (tests count and search its lines)."""
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = 20000) -> str:
        """The end of the log, for failure messages."""
        return self.log()[-chars:]

    # ---- conveniences

    def __truediv__(self, other: str) -> Path:
        return self.path / other

    def sh(self, command: str, *, check: bool = True, timeout: float = 120.0,
           **kw) -> subprocess.CompletedProcess[bytes]:
        """Run a shell command with the mount as working directory (``kw``: more of subprocess.run's)."""
        result: subprocess.CompletedProcess[bytes] = subprocess.run(["bash", "-c", command], cwd=self.path,
                                                                    capture_output=True, timeout=timeout, **kw)
        if check and result.returncode != 0:
            raise AssertionError(f"{command!r} exited {result.returncode}: {result.stderr.decode(errors='replace')}")
        return result

    def sh_refused(self, command: str) -> subprocess.CompletedProcess[bytes]:
        """Run ``command`` (as :meth:`sh`), which must fail with EINVAL: "Invalid argument" on its stderr."""
        result = self.sh(command, check=False)
        assert result.returncode != 0, command
        assert b"Invalid argument" in result.stderr, (command, result.stderr)
        return result

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data / f"{topic}-{partition}"


class MountFactory(Protocol):
    """The ``logfs_mount`` fixture: a Mount at ``tmp_path/name``, started unless ``start`` is False."""

    def __call__(self, options: dict[str, str] | None = None, *, read_only: bool = False, name: str = "m",
                 extra_args: list[str] | None = None, start: bool = True) -> Mount: ...


@pytest.fixture
def logfs_mount(tmp_path: Path) -> Iterator[MountFactory]:
    """Factory: ``logfs_mount(options, read_only=False, name="m")`` -> a started Mount."""
    mounts: list[Mount] = []

    def make(options: dict[str, str] | None = None, *, read_only: bool = False, name: str = "m",
             extra_args: list[str] | None = None, start: bool = True) -> Mount:
        m = Mount(tmp_path / name, options, read_only=read_only, extra_args=extra_args)
        mounts.append(m)
        return m.start() if start else m

    yield make
    for m in mounts:
        if m.proc is not None:
            try:
                code = m.stop()
            except Exception:
                m.kill()
                raise
            assert code == 0, f"logfs exited with {code}:\n{m.log_tail()}"
        elif _is_mounted(m.path):
            subprocess.run(["fusermount3", "-uz", str(m.path)], capture_output=True)


@pytest.fixture
def mount(request: pytest.FixtureRequest, logfs_mount: MountFactory) -> Mount:
    marker = request.node.get_closest_marker("mount_options")
    options = dict(marker.args[0]) if marker else {}
    return logfs_mount(options)


# --------------------------------------------------------------------------- independent reader


class KafkaRecord(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def kafka_records(partition_dir: Path) -> list[KafkaRecord]:
    """Every record of a partition directory's ``.log`` files, decoded by kafka-python (CRC checked)."""
    from kafka.record.memory_records import MemoryRecords

    out: list[KafkaRecord] = []
    for name in sorted(os.listdir(partition_dir)):
        if not name.endswith(".log"):
            continue
        records = MemoryRecords((partition_dir / name).read_bytes())
        while True:
            batch = records.next_batch()
            if batch is None:
                break
            assert batch.validate_crc(), f"CRC mismatch in {name} at offset {batch.base_offset}"
            if batch.is_control_batch:
                continue
            out.extend(KafkaRecord(rec.offset, rec.timestamp, rec.key, rec.value) for rec in batch)
    return out


@pytest.fixture
def read_kafka():
    return kafka_records


if str(ROOT) not in sys.path:  # tests import engine/logfs from the work tree
    sys.path.insert(0, str(ROOT))
# ... and so do the processes they start (`logfs mount`, Spark's Python workers):
# PYTHONPATH comes before the editable install's finder, so a second work tree
# (git worktree) sharing one .venv tests its own code.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)])


def _spark_kafka_source_on_the_classpath() -> None:
    """Put Spark's Kafka source on the classpath of the JVM PySpark starts.

    PySpark starts one JVM per test process, with the jars named when the first
    session is made, and a later session's ``spark.jars`` does not make
    ``format("kafka")`` findable.  So every Spark session of the suite starts
    with the jars scripts/setup-kafka.sh fetched; without them the side-by-side
    tests fail, saying which set-up step is missing.
    """
    from engine.errors import StorageError
    from logfs.spark.kafka_jars import spark_kafka_jars

    try:
        jars = spark_kafka_jars()
    except StorageError:       # not fetched: test_spark_kafka names the missing step
        return
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--jars {','.join(jars)} pyspark-shell")


_spark_kafka_source_on_the_classpath()


def _temporary_files_in_memory() -> None:
    """The suite's temporary files (``tmp_path``, ``tempfile``, the brokers' and mounts' data dirs) on tmpfs.

    The tests prove what the engine and the mount do, not how fast this machine's shared disk syncs: on
    its ext4 ``/tmp`` the engine's fsyncs (rolls, checkpoints, deletes) took half of some tests' time.
    ``LOGFS_TEST_TMPDIR`` names another place (``/tmp`` to run on the disk); without it ``/dev/shm`` is
    used when it is a tmpfs with 8 GiB free.  pytest keeps the directories of failed tests only
    (``tmp_path_retention_policy`` in pyproject.toml), so the memory is given back.
    """
    chosen = os.environ.get("LOGFS_TEST_TMPDIR")
    if chosen is None:
        shm = Path("/dev/shm")
        try:
            st = os.statvfs(shm)
        except OSError:
            return
        if st.f_bavail * st.f_frsize < 8 << 30:
            return
        chosen = str(shm / f"logfs-tests-{os.getuid()}")
    os.makedirs(chosen, exist_ok=True)
    os.environ["TMPDIR"] = chosen          # the processes the tests start, xdist's workers
    tempfile.tempdir = chosen              # this process (gettempdir caches its first answer)


_temporary_files_in_memory()
