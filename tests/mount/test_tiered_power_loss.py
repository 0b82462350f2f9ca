"""Tiered storage and a power loss: the metadata of the copies survives it, as their objects in the store do.

The data dir lives in tests/harness/powerloss_fs.py (writes and new names held
in memory until their fsync); the store is a directory outside it (another
machine: what it acknowledged stays).  After copies are recorded, the power
goes, and the metadata log read back from what the disk holds must name every
finished copy: a copy it forgot is an orphan the next mount deletes, and with
the local segments local retention deleted, its records are lost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.log import Log
from engine.log_dirs import unlock_log_dirs
from engine.manager import LogManager
from engine.remote.remote_log_manager import open_remote_log_manager
from engine.remote.storage import TopicIdPartition, open_remote_storage
from engine.topic import TopicPartition
from tests.helpers import make_config
from tests.mount.test_powerloss_fs import Layer, fsync_path

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.mount

TIP = TopicIdPartition("t", "Yk8nZ5mKQxa2bH3cVdE1Fw", 0)
TP = TopicPartition("t", 0)


@pytest.fixture
def layer(tmp_path: Path) -> Iterator[Layer]:
    (tmp_path / "disk").mkdir()
    lay = Layer(tmp_path / "disk").start()
    yield lay
    if lay.proc is not None:
        lay.stop()


def test_finished_copies_are_still_recorded_after_a_power_loss(tmp_path: Path, layer: Layer):
    # the torture harness's --tiered --power-loss mode found it: the first power loss took the whole
    # remote-log directory (made, never fsynced into the data dir), so the next mount deleted every copy as
    # an orphan, and the records of the local segments local retention had deleted were lost
    data = layer.mnt / "data"
    data.mkdir()
    fsync_path(layer.mnt)                      # the data dir itself is durable, as a real one is
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    settings = {"rsm.config.uri": f"file://{store_dir}"}
    log = Log.load(str(data / "t-0"), make_config(internal_segment_bytes=4096))
    for i in range(40):
        log.append_values([b"record-%06d-%s" % (i * 10 + j, b"x" * 40) for j in range(10)])
    log.flush()                                # copies are taken at or below the recovery point
    manager = open_remote_log_manager(open_remote_storage(settings), [str(data)], cache_max_bytes=1 << 20,
                                      chunk_bytes=4096)
    try:
        assert manager.copy_log_segments(log, TIP) >= 3
        copied = [(m.segment_id, m.end_offset) for m in manager.metadata.copied_segments(TIP)]
    finally:
        manager.close()
        log.close()
    layer.lose_power()
    manager = open_remote_log_manager(open_remote_storage(settings), [str(layer.backing / "data")],
                                      cache_max_bytes=1 << 20, chunk_bytes=4096)
    try:
        assert [(m.segment_id, m.end_offset) for m in manager.metadata.copied_segments(TIP)] == copied
        assert manager.clean_up_unfinished(TIP) == 0      # no copy taken for an orphan
    finally:
        manager.close()


def _tiered_manager(data: Path, store: Path) -> LogManager:
    config = BrokerConfig.from_props({"log.dirs": str(data), "internal.log.segment.bytes": "4096",
                                      "remote.log.storage.system.enable": "true", "log.segment.delete.delay.ms": "0"})
    manager = LogManager(config, clock=ManualClock(1_700_000_000_000),
                         remote_storage=open_remote_storage({"rsm.config.uri": f"file://{store}"}),
                         remote_cache_bytes=1 << 20, remote_chunk_bytes=4096)
    manager.startup()
    return manager


def test_a_segment_that_grows_again_after_a_power_loss_is_read_from_its_longer_copy(tmp_path: Path, layer: Layer):
    # the torture harness's --tiered --power-loss run of seed 926958631 reported 8 acknowledged records lost:
    # they were in the store all along, in a second copy of their segment's base offset that readers did not
    # take.  The sequence, step by step: the active segment A is flushed mid-way (a writer's fsync), rolled
    # (the roll's flush has nothing below the recovery point to fsync, so the new segment's name is not made
    # durable), and copied; the power goes before anything fsyncs the new segment; after the restart A is the
    # active segment again, grows, rolls and is copied again: two finished copies of A's base offset
    data = layer.mnt / "data"
    data.mkdir()
    fsync_path(layer.mnt)
    store = tmp_path / "store"
    store.mkdir()
    manager = _tiered_manager(data, store)
    manager.create_topic("t", 1, {"remote.storage.enable": "true"})
    log = manager.get_log(TP)
    assert log is not None
    for i in range(30):
        log.append_values([b"before-%04d" % i])
    log.flush()                                        # a writer's fsync: the recovery point is inside A
    a_base = log.active_segment.base_offset
    acknowledged = {o: b"before-%04d" % o for o in range(log.log_end_offset)}
    n_base = log.roll().base_offset
    log.append_values([b"never-fsynced-%d" % i for i in range(5)])      # unacknowledged: lost with the power
    assert manager.copy_to_remote_storage() >= 1
    tip = manager.tiered_partition(log).tip           # type: ignore[union-attr]
    assert manager.remote_log_manager is not None
    first_copy = {m.start_offset: m for m in manager.remote_log_manager.metadata.copied_segments(tip)}[a_base]
    assert first_copy.end_offset == n_base - 1
    layer.lose_power()                                 # the manager dies with the power: never shut down
    unlock_log_dirs(manager._dir_locks)                # what the process's death does to its locks

    layer.start()
    manager = _tiered_manager(data, store)
    try:
        log = manager.get_log(TP)
        assert log is not None
        assert log.log_end_offset == n_base, "the new segment's name was made durable after all: no repro"
        assert log.active_segment.base_offset == a_base
        first, _last = log.append_values([b"after-%d" % i for i in range(8)])
        assert first == n_base                         # A grows again
        log.flush()
        acknowledged.update({first + i: b"after-%d" % i for i in range(8)})
        log.roll()
        log.append_values([b"tail"])
        log.flush()
        assert manager.copy_to_remote_storage() >= 1
        rlm = manager.remote_log_manager
        assert rlm is not None
        assert len([s for s in rlm.metadata.known_ids(tip) if s.base_offset == a_base]) == 2   # two copies of A
        serving = {m.start_offset: m for m in rlm.metadata.copied_segments(tip)}
        assert serving[a_base].end_offset == n_base + 7                           # the longer one serves
        assert [m.segment_id for m in rlm.metadata.superseded_segments(tip)] == [first_copy.segment_id]
        # every acknowledged record reads back from the store (a reader that took the first copy skipped
        # the 8 records after its end without an error)
        for offset, value in acknowledged.items():
            metadata, _position, batches = rlm.read(tip, offset, 1 << 20)
            assert metadata.segment_id == serving[a_base].segment_id or offset < a_base
            assert value in batches, offset
        # and the superseded copy goes, objects and all (file.delete.delay.ms is 0 here)
        manager.copy_to_remote_storage()
        assert rlm.metadata.superseded_segments(tip) == []
        assert first_copy.segment_id not in rlm.metadata.known_ids(tip)
        assert not list(store.rglob(f"*{first_copy.segment_id.id}*"))
    finally:
        manager.shutdown()
