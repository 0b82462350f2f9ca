"""LogManager + LogCleaner together, over real log dirs.

The manager owns the cleaner's life (created at startup, stopped first at
shutdown) and coordinates with it as Kafka's LogManager does: topic deletion
aborts a running clean and drops the partition from the
``cleaner-offset-checkpoint``; retention pauses cleaning of the logs it works
on and leaves compacted logs to the cleaner.
"""

from __future__ import annotations

import os
import threading

import pytest

from engine.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from engine.cleaner.cleaner_manager import LogCleaningPaused
from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.errors import StorageError
from engine.files import CLEANED_FILE_SUFFIX, DELETE_DIR_SUFFIX, SWAP_FILE_SUFFIX
from engine.manager import LogManager
from engine.topic import TopicPartition
from tests.helpers import PausedClean, cleaner_of, log_of

COMPACT = {"cleanup.policy": "compact", "internal.segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"}


def started(dirs, clock=None, **props) -> LogManager:
    base = {"log.dirs": ",".join(str(d) for d in dirs), "num.partitions": "1",
            "internal.log.segment.bytes": "2048", "log.index.interval.bytes": "256",
            # small maps and buffers: many cleaner reads, little memory
            "log.cleaner.dedupe.buffer.size": str(2 << 20), "log.cleaner.io.buffer.size": "4096"}
    base.update(props)
    manager = LogManager(BrokerConfig.from_props(base), clock=clock or ManualClock())
    manager.startup()
    return manager


def fill(manager: LogManager, topic: str, count: int, keys: int, tag: bytes = b"v") -> dict[bytes, bytes]:
    """Append ``count`` keyed records (``keys`` distinct keys) and roll; returns each key's latest value."""
    log = log_of(manager, TopicPartition(topic, 0))
    latest = {}
    for i in range(count):
        key, value = b"key-%d" % (i % keys), tag + b"-%d" % i
        log.append_values([value], [key])
        latest[key] = value
    log.roll()              # the active segment is never cleaned
    return latest


def latest_by_key(manager: LogManager, topic: str) -> dict[bytes | None, bytes | None]:
    log = log_of(manager, TopicPartition(topic, 0))
    result: dict[bytes | None, bytes | None] = {}
    for record in log.read_records(log.log_start_offset):
        result[record.key] = record.value
    return result


def checkpoint_text(log_dir) -> str:
    with open(os.path.join(str(log_dir), CLEANER_OFFSET_CHECKPOINT), encoding="ascii") as f:
        return f.read()


def test_cleaner_exists_only_when_enabled_writable_and_threaded(tmp_path):
    manager = started([tmp_path / "a"])
    assert manager.cleaner is not None
    manager.shutdown()
    assert not manager.cleaner.running            # stopped by the manager's shutdown
    assert started([tmp_path / "b"], **{"log.cleaner.enable": "false"}).cleaner is None
    assert started([tmp_path / "c"], **{"log.cleaner.threads": "0"}).cleaner is None
    ro = LogManager(BrokerConfig.from_props({"log.dirs": str(tmp_path / "a")}), read_only=True)
    ro.startup()
    assert ro.cleaner is None


def test_compacted_topic_created_after_startup_is_cleaned_with_checkpoint_in_its_dir(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    manager = started([a, b])
    manager.create_topic("plain", 1)                 # lands in a: the next one goes to b
    manager.create_topic("cmp", 1, COMPACT)
    log = log_of(manager, TopicPartition("cmp", 0))
    assert os.path.dirname(log.dir) == str(b)
    expected = fill(manager, "cmp", 600, 13)
    records_before = len(log.read_records(0))
    size_before = log.size

    stats = cleaner_of(manager).clean_once()

    assert stats is not None
    assert stats.topic_partition == TopicPartition("cmp", 0)
    assert latest_by_key(manager, "cmp") == expected
    assert len(log.read_records(0)) == 13 < records_before
    assert log.size < size_before
    first_dirty = log.active_segment.base_offset
    # Kafka's checkpoint format: version, entry count, "topic partition offset" lines.
    assert checkpoint_text(b) == f"0\n1\ncmp 0 {first_dirty}\n"
    assert not os.path.exists(a / CLEANER_OFFSET_CHECKPOINT) or checkpoint_text(a) == "0\n0\n"
    assert not [n for n in os.listdir(log.dir) if n.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX))]
    assert cleaner_of(manager).clean_once() is None     # nothing dirty left
    manager.shutdown()

    # The cleaned log and its checkpoint survive a restart.
    again = started([a, b])
    assert latest_by_key(again, "cmp") == expected
    assert cleaner_of(again).manager.all_cleaner_checkpoints() == {TopicPartition("cmp", 0): first_dirty}
    again.shutdown()


def test_topic_switched_to_compact_is_picked_up(tmp_path):
    manager = started([tmp_path / "d"])
    manager.create_topic("t", 1, {"internal.segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"})
    expected = fill(manager, "t", 300, 5)
    assert cleaner_of(manager).clean_once() is None      # delete policy: never cleaned
    manager.alter_topic_config("t", {"cleanup.policy": "compact"})
    assert cleaner_of(manager).clean_once() is not None
    assert latest_by_key(manager, "t") == expected
    manager.shutdown()


def test_deleting_a_topic_while_it_is_cleaned_aborts_the_clean_and_drops_its_checkpoint(tmp_path):
    d = tmp_path / "d"
    manager = started([d])
    cleaner = cleaner_of(manager)
    manager.create_topic("keep", 1, COMPACT)
    manager.create_topic("cmp", 1, COMPACT)
    fill(manager, "keep", 200, 7)
    fill(manager, "cmp", 200, 7)
    assert cleaner.clean_once() is not None
    assert cleaner.clean_once() is not None
    checkpointed = cleaner.manager.all_cleaner_checkpoints()
    assert set(checkpointed) == {TopicPartition("keep", 0), TopicPartition("cmp", 0)}
    fill(manager, "cmp", 800, 7, tag=b"w")           # only cmp is dirty now
    log = log_of(manager, TopicPartition("cmp", 0))
    tp = log.topic_partition

    paused = PausedClean(cleaner)                    # in the middle of cleaning cmp
    deleting = threading.Thread(target=manager.delete_topic, args=("cmp",))
    deleting.start()
    paused.wait_aborted(tp)
    assert deleting.is_alive()                       # waits for the clean to stop ...
    assert os.path.isdir(d / "cmp-0")                # ... before renaming the directory
    assert manager.get_log(TopicPartition("keep", 0)) is not None   # lookups are not blocked
    stats = paused.release()
    deleting.join(10)
    assert not deleting.is_alive()

    assert stats is None                             # the clean was aborted
    assert not os.path.exists(d / "cmp-0")
    renamed = [n for n in os.listdir(d) if n.startswith("cmp-0.") and n.endswith(DELETE_DIR_SUFFIX)]
    assert len(renamed) == 1
    assert not [n for n in os.listdir(d / renamed[0]) if n.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX))]
    assert cleaner.manager.cleaning_state(tp) is None    # resumed: a new "cmp" could be cleaned
    assert OffsetCheckpointFile(str(d / CLEANER_OFFSET_CHECKPOINT)).read() == {
        TopicPartition("keep", 0): checkpointed[TopicPartition("keep", 0)]}
    assert manager.topics() == ["keep"]
    manager.shutdown()


def test_delete_of_an_idle_compacted_topic_removes_its_checkpoint_entry(tmp_path):
    d = tmp_path / "d"
    manager = started([d])
    manager.create_topic("cmp", 1, COMPACT)
    fill(manager, "cmp", 200, 3)
    assert cleaner_of(manager).clean_once() is not None
    assert TopicPartition("cmp", 0) in OffsetCheckpointFile(str(d / CLEANER_OFFSET_CHECKPOINT)).read()
    manager.delete_topic("cmp")
    assert OffsetCheckpointFile(str(d / CLEANER_OFFSET_CHECKPOINT)).read() == {}
    assert cleaner_of(manager).manager.cleaning_state(TopicPartition("cmp", 0)) is None
    manager.shutdown()


RETAINED = {"retention.bytes": "2500", "internal.segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.99"}


def mixed_topics(manager: LogManager) -> dict[str, int]:
    """Three topics with the same data and retention, one per policy; returns segments per topic."""
    policies = {"del": "delete", "cmp": "compact", "both": "compact,delete"}
    for topic, policy in policies.items():
        manager.create_topic(topic, 1, dict(RETAINED, **{"cleanup.policy": policy}))
        fill(manager, topic, 200, 200)      # unique keys: cleaning would remove nothing
    return {t: log_of(manager, TopicPartition(t, 0)).num_segments for t in policies}


def test_cleanup_logs_with_cleaner_pauses_non_compacted_logs_and_leaves_compacted_to_the_cleaner(tmp_path, monkeypatch):
    manager = started([tmp_path / "d"])
    segments = mixed_topics(manager)
    logs = {t: log_of(manager, TopicPartition(t, 0)) for t in segments}
    states = []
    retain = logs["del"].delete_old_segments

    def observed_retention():
        states.append(cleaner_of(manager).manager.cleaning_state(logs["del"].topic_partition))
        return retain()

    monkeypatch.setattr(logs["del"], "delete_old_segments", observed_retention)

    deleted = manager.cleanup_logs()

    assert states == [LogCleaningPaused(1)]          # paused for the cleaner during retention
    assert deleted > 0
    assert logs["del"].log_start_offset > 0
    assert logs["del"].num_segments < segments["del"]
    assert logs["both"].log_start_offset == 0
    assert logs["both"].num_segments == segments["both"]
    assert logs["cmp"].log_start_offset == 0
    assert logs["cmp"].num_segments == segments["cmp"]
    for log in logs.values():                        # everything resumed
        assert cleaner_of(manager).manager.cleaning_state(log.topic_partition) is None

    # compact,delete retention is the cleaner's job, after its clean of the filthiest log
    # (unique keys: cleaning keeps every record).
    cmp_records = logs["cmp"].read_records(0)
    cleaner_of(manager).clean_once()
    assert logs["both"].log_start_offset > 0
    assert logs["both"].size <= 2500 + 1024
    assert logs["cmp"].log_start_offset == 0
    assert logs["cmp"].read_records(0) == cmp_records
    manager.shutdown()


def test_cleanup_logs_without_cleaner_retains_delete_and_compact_delete_logs(tmp_path):
    manager = started([tmp_path / "d"], **{"log.cleaner.enable": "false"})
    assert manager.cleaner is None
    segments = mixed_topics(manager)
    logs = {t: log_of(manager, TopicPartition(t, 0)) for t in segments}
    assert manager.cleanup_logs() > 0
    assert logs["del"].log_start_offset > 0
    assert logs["del"].num_segments < segments["del"]
    assert logs["both"].log_start_offset > 0
    assert logs["both"].num_segments < segments["both"]
    assert logs["cmp"].log_start_offset == 0
    assert logs["cmp"].num_segments == segments["cmp"]
    manager.shutdown()


def test_retention_failure_still_resumes_cleaning(tmp_path, monkeypatch):
    manager = started([tmp_path / "d"])
    manager.create_topic("del", 1, RETAINED)
    log = log_of(manager, TopicPartition("del", 0))

    def failing():
        raise OSError("disk gone")

    monkeypatch.setattr(log, "delete_old_segments", failing)
    with pytest.raises(StorageError, match=r"retention failed for 1 item.*disk gone"):
        manager.cleanup_logs()            # the run counts as failed (issue 9)
    assert cleaner_of(manager).manager.cleaning_state(log.topic_partition) is None
    manager.shutdown()


if __name__ == "__main__":    # pragma: no cover
    pytest.main([__file__, "-q"])


def test_deleting_hundreds_of_segments_logs_one_line_each_and_no_failures(tmp_path, caplog):
    """Issue 9: one compaction logged 1,200 "Failed to delete ... because it does not exist" lines."""
    import logging
    clock = ManualClock()
    d = tmp_path / "d"
    manager = started([d], clock=clock, **{"log.segment.delete.delay.ms": "0"})
    manager.create_topic("cmp", 1, COMPACT)
    fill(manager, "cmp", 3000, 5)
    log = log_of(manager, TopicPartition("cmp", 0))
    replaced = len(log.segments) - 1
    assert replaced > 100
    with caplog.at_level(logging.DEBUG, logger="engine.segment"):
        assert cleaner_of(manager).clean_once() is not None
        clock.sleep(1)
        for deleted in [p.segment for p in log.local_log.pending_deletions][:50]:
            os.unlink(deleted.paths[1])                 # an index already gone is no failure
        assert manager.delete_expired_segment_files() >= replaced
        manager.delete_topic("cmp")
        clock.sleep(manager.default_config.file_delete_delay_ms)
        assert manager.delete_logs() == 1
    lines = [r for r in caplog.records if r.name == "engine.segment" and r.levelno >= logging.INFO]
    assert not [r for r in lines if "Failed" in r.getMessage() or "does not exist" in r.getMessage()]
    assert len([r for r in lines if r.getMessage().startswith("Deleted")]) <= replaced + len(log.segments) + 5
    manager.shutdown()
