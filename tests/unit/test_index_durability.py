"""What a power loss leaves of the indexes (issue 18): trims and rebuilds are fsynced, and check agrees.

A power loss keeps what was fsynced and drops the rest; a test cannot pull the
plug, so it records every real ``fsync`` (the file and its size at that moment,
the call itself goes through) and asserts the order the guarantees rest on:
a sealed segment's indexes are fsynced at their trimmed size before the
append that sealed them returns, and at shutdown before the clean-shutdown
marker.  The state a lost trim leaves (a sealed index back at its preallocated,
zero-filled size) is made by hand: ``logfs check`` reports it, as the loader
does, and the loader's rebuild is fsynced.
"""

from __future__ import annotations

import io
import logging
import os

import pytest

from engine.checkpoint import CLEAN_SHUTDOWN_FILE
from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.tools import check_dirs
from engine.topic import TopicPartition
from tests.helpers import log_of

T0 = TopicPartition("t", 0)


@pytest.fixture
def fsyncs(monkeypatch) -> list[tuple[str, int]]:
    """Every os.fsync of the test: (path, size at that moment), in order; the fsync itself is real."""
    calls: list[tuple[str, int]] = []
    real = os.fsync

    def recording(fd: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return calls


def started(data_dir) -> LogManager:
    manager = LogManager(BrokerConfig.from_props({
        "log.dirs": str(data_dir), "internal.log.segment.bytes": "600", "log.index.interval.bytes": "100"}),
        clock=ManualClock())
    manager.startup()
    return manager


def index_files(partition_dir) -> list[str]:
    return sorted(os.path.join(partition_dir, n) for n in os.listdir(partition_dir)
                  if n.endswith((".index", ".timeindex")))


def test_a_roll_fsyncs_the_sealed_indexes_at_their_trimmed_size_when_the_records_are_synced(tmp_path, fsyncs):
    manager = started(tmp_path / "data")
    manager.create_topic("t", 1)
    log = log_of(manager, T0)
    for i in range(40):
        log.append_values([b"record-%03d" % i])
        log.flush()                        # a writer that fsyncs each write: the recovery point keeps up
    sealed = list(log.segments.values())[:-1]
    assert len(sealed) >= 3
    synced = set(fsyncs)
    for segment in sealed:
        for index in (segment.offset_index, segment.time_index):
            size = os.path.getsize(index.path)
            assert size == index.entries * index.entry_size < index.max_index_size
            assert (index.path, size) in synced, f"{index.path} never fsynced at its trimmed size {size}"
    manager.shutdown()


def test_shutdown_fsyncs_the_trimmed_indexes_before_the_clean_shutdown_marker(tmp_path, fsyncs):
    data = tmp_path / "data"
    manager = started(data)
    manager.create_topic("t", 1)
    log = log_of(manager, T0)
    log.append_values([b"record-%03d" % i for i in range(5)])
    active = log.active_segment
    paths = (active.offset_index.path, active.time_index.path)
    manager.shutdown()
    marker = [i for i, (path, _) in enumerate(fsyncs) if os.path.basename(path).startswith(CLEAN_SHUTDOWN_FILE)]
    assert marker, "the marker is written with an fsync"
    for path in paths:
        size = os.path.getsize(path)
        trims = [i for i, entry in enumerate(fsyncs) if entry == (path, size)]
        assert trims, f"{path} not fsynced at its trimmed size {size} before the marker"
        assert trims[-1] < marker[0], f"{path} not fsynced at its trimmed size {size} before the marker"


def test_a_lost_trim_is_reported_by_check_and_rebuilt_durably_by_the_loader(tmp_path, fsyncs, caplog):
    data = tmp_path / "data"
    manager = started(data)
    manager.create_topic("t", 1)
    log = log_of(manager, T0)
    for i in range(20):
        log.append_values([b"record-%03d" % i])
    sealed = next(iter(log.segments.values()))
    index_path, max_size = sealed.offset_index.path, sealed.offset_index.max_index_size
    manager.shutdown()
    out = io.StringIO()
    assert check_dirs([str(data)], out) == 0, out.getvalue()

    trimmed = os.path.getsize(index_path)
    os.truncate(index_path, max_size)      # the trim a power loss loses: back to preallocated, zero-filled
    out = io.StringIO()
    assert check_dirs([str(data)], out) == 1
    assert "zero-filled preallocated tail" in out.getvalue()
    assert index_path in out.getvalue()

    fsyncs.clear()
    with caplog.at_level(logging.WARNING, logger="engine"):
        again = started(data)
    assert "Found a corrupted index file" in caplog.text        # the loader sees what check saw
    assert os.path.getsize(index_path) == trimmed
    assert (index_path, trimmed) in fsyncs                      # the rebuild survives the next power loss
    assert [r.value for r in log_of(again, T0).read_records(0)] == [b"record-%03d" % i for i in range(20)]
    again.shutdown()
    out = io.StringIO()
    assert check_dirs([str(data)], out) == 0, out.getvalue()
