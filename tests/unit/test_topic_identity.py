"""A topic created again after a deletion starts from nothing (issue 18): engine level, no mount.

The mount-level reproduction (kill -9 after the recreation) is in test_mount_integrity.py;
here the crash window the manager cannot close at deletion time is made by hand: the
checkpoints still name the deleted partition when the new one is created.
"""

from __future__ import annotations

import os

from engine.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PREVIOUS_SUFFIX,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpointFile,
)
from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.partition_metadata import PARTITION_METADATA_FILE, read_topic_id
from engine.topic import TopicPartition
from tests.helpers import log_of

T0 = TopicPartition("t", 0)
NAMES = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT)


def started(data_dir, **props) -> LogManager:
    config = {"log.dirs": str(data_dir), "num.partitions": "2", "internal.log.segment.bytes": "1024"}
    config.update(props)
    manager = LogManager(BrokerConfig.from_props(config), clock=ManualClock())
    manager.startup()
    return manager


def test_stale_checkpoint_entries_are_dropped_before_the_partition_exists(tmp_path):
    data = tmp_path / "data"
    manager = started(data)
    manager.create_topic("other", 1)
    # What a crash right after a deletion's renames leaves: every checkpoint and its
    # previous generation still name t-0 (log start 653, recovery point 700, cleaner 680).
    for name, offset in zip(NAMES, (700, 653, 680), strict=True):
        for path in (data / name, data / (name + PREVIOUS_SUFFIX)):
            OffsetCheckpointFile(str(path)).write({T0: offset, TopicPartition("other", 0): 0})
    manager.create_topic("t", 1)
    for name in NAMES:
        for path in (data / name, data / (name + PREVIOUS_SUFFIX)):
            assert T0 not in OffsetCheckpointFile(str(path)).read(), path
    log_of(manager, T0).append_values([b"v%d" % i for i in range(20)])
    log_of(manager, T0).flush()
    manager._unlock_log_dirs()                       # the process dies: no shutdown, no checkpoint

    again = started(data)
    log = log_of(again, T0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 20)
    assert [r.value for r in log.read_records(0)] == [b"v%d" % i for i in range(20)]
    again.shutdown()


def test_partitions_of_a_topic_share_one_topic_id_and_a_new_topic_gets_a_new_one(tmp_path):
    data = tmp_path / "data"
    manager = started(data)
    manager.create_topic("t")
    ids = {read_topic_id(str(data / f"t-{p}")) for p in (0, 1)}
    manager.add_partition("t", 2)
    ids.add(read_topic_id(str(data / "t-2")))
    assert len(ids) == 1
    assert None not in ids
    (topic_id,) = ids
    assert topic_id is not None
    assert len(topic_id) == 22
    assert not topic_id.startswith("-")
    assert (data / "t-0" / PARTITION_METADATA_FILE).read_text() == f"version: 0\ntopic_id: {topic_id}\n"
    manager.delete_topic("t")
    manager.create_topic("t", 1)
    assert read_topic_id(str(data / "t-0")) not in (None, topic_id)
    manager.shutdown()
    assert sorted(os.listdir(data / "t-0")) == ["00000000000000000000.index", "00000000000000000000.log",
                                                "00000000000000000000.timeindex", PARTITION_METADATA_FILE]
