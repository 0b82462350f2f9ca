"""Directory entries a restart relies on are fsynced in their directory before they matter (issue 18).

A power loss keeps a new name, a rename or an unlink only once its directory
is fsynced.  Every real ``mkdir``, ``rename``/``replace``, ``unlink`` and
``fsync`` of the test is recorded in order (each still happens), and the test
asserts that the directory fsync comes between the change and the moment it
is relied on.
"""

from __future__ import annotations

import os
import stat

import pytest

from engine.checkpoint import CLEAN_SHUTDOWN_FILE
from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.topic import TopicPartition
from tests.unit.test_cleaner import append, clean, cleaner_for, log_config, new_log

T0 = TopicPartition("t", 0)


@pytest.fixture
def events(monkeypatch) -> list[tuple[str, str]]:
    """(operation, path) of every mkdir, rename/replace, unlink and fsync, in order; each really happens."""
    seen: list[tuple[str, str]] = []

    def wrap(name: str, path_of):
        real = getattr(os, name)

        def recording(*args, **kwargs):
            result = real(*args, **kwargs)
            seen.append((name, os.path.abspath(path_of(*args))))
            return result
        monkeypatch.setattr(os, name, recording)

    def fd_path(fd: int) -> str:
        path = os.readlink(f"/proc/self/fd/{fd}")
        return path + "/" if stat.S_ISDIR(os.fstat(fd).st_mode) else path

    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        seen.append(("fsync", fd_path(fd)))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    wrap("mkdir", lambda path, *a: os.fspath(path))
    wrap("rename", lambda src, dst, *a: os.fspath(dst))
    wrap("replace", lambda src, dst, *a: os.fspath(dst))
    wrap("unlink", lambda path, *a: os.fspath(path))
    return seen


def started(data_dir) -> LogManager:
    manager = LogManager(BrokerConfig.from_props({"log.dirs": str(data_dir)}), clock=ManualClock())
    manager.startup()
    return manager


def first(events: list[tuple[str, str]], op: str, path: str, after: int = -1) -> int:
    for i, (o, p) in enumerate(events):
        if i > after and o == op and p == path:
            return i
    raise AssertionError(f"no {op} of {path} after event {after}: {events}")


def test_a_new_partition_dir_is_durable_in_its_parent_before_the_topic_exists(tmp_path, events):
    data = str(tmp_path / "data")
    manager = started(data)
    events.clear()
    manager.create_topic("t", 1)
    partition_dir = os.path.join(data, "t-0")
    made = first(events, "mkdir", partition_dir)
    first(events, "fsync", partition_dir + "/", made)       # its segment files and partition.metadata
    first(events, "fsync", data + "/", made)                # the directory itself
    manager.shutdown()


def test_the_clean_shutdown_marker_is_gone_for_good_before_any_log_is_loaded(tmp_path, events):
    data = str(tmp_path / "data")
    manager = started(data)
    manager.create_topic("t", 1)
    manager.shutdown()
    events.clear()
    again = started(data)
    removed = first(events, "unlink", os.path.join(data, CLEAN_SHUTDOWN_FILE))
    synced = first(events, "fsync", data + "/", removed)
    loads = [i for i, (op, path) in enumerate(events) if path.startswith(os.path.join(data, "t-0"))]
    assert not loads or synced < loads[0]
    again.shutdown()


def test_the_cleaners_swap_names_are_durable_before_the_old_segments_are_renamed_deleted(tmp_path, events):
    log = new_log(tmp_path, log_config(**{"internal.segment.bytes": "1024"}))
    for i in range(60):
        append(log, [(b"k%d" % (i % 5), b"v%d" % i)])
    log.roll()
    events.clear()
    clean(log, cleaner_for(log))
    swaps = [i for i, (op, path) in enumerate(events) if op in ("rename", "replace") and path.endswith(".swap")]
    deleted = [i for i, (op, path) in enumerate(events) if op in ("rename", "replace") and path.endswith(".deleted")]
    assert swaps
    assert deleted
    for d in deleted:                       # each group the cleaner swaps in: its .swap names, then .deleted
        swap = max(i for i in swaps if i < d)
        assert first(events, "fsync", log.dir + "/", swap) < d
    log.close()
