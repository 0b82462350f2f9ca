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

from engine.log import Log
from engine.remote.remote_log_manager import open_remote_log_manager
from engine.remote.storage import TopicIdPartition, open_remote_storage
from tests.helpers import make_config
from tests.mount.test_powerloss_fs import Layer, fsync_path

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.mount

TIP = TopicIdPartition("t", "Yk8nZ5mKQxa2bH3cVdE1Fw", 0)


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
