"""engine.manager: LogManager over real temp log dirs."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest

from engine.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    OffsetCheckpointFile,
)
from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.errors import (
    InvalidConfigError,
    InvalidPartitionError,
    InvalidTopicError,
    ReadOnlyError,
    StorageError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from engine.log import Log
from engine.manager import LogManager
from engine.topic import TopicPartition
from engine.topic_configs import TOPIC_CONFIGS_FILE
from engine.views import LogView, ViewFormat
from tests.helpers import cleaner_of, log_of, tree_snapshot


def broker(dirs, **props) -> BrokerConfig:
    base = {"log.dirs": ",".join(str(d) for d in dirs), "num.partitions": "3",
            "internal.log.segment.bytes": "1024", "log.index.interval.bytes": "128"}
    base.update({k.replace("_", "."): str(v) for k, v in props.items()})
    return BrokerConfig.from_props(base)


def started(dirs, clock=None, read_only=False, **props) -> LogManager:
    manager = LogManager(broker(dirs, **props), clock=clock or ManualClock(), read_only=read_only)
    manager.startup()
    return manager


def crashed(manager: LogManager) -> None:
    """The process of ``manager`` died without shutting down: the OS drops its log dir locks."""
    manager._unlock_log_dirs()


def append(manager: LogManager, topic: str, partition: int, count: int, tag: bytes = b"r") -> None:
    log = log_of(manager, TopicPartition(topic, partition))
    for i in range(count):
        log.append_values([tag + b"-%d-a" % i, tag + b"-%d-b" % i])


def values(manager: LogManager, topic: str, partition: int) -> list[bytes | None]:
    return [r.value for r in log_of(manager, TopicPartition(topic, partition)).read_records(0)]


def test_missing_dirs_are_created_and_duplicates_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "nested" / "b"
    manager = started([a, b])
    assert a.is_dir()
    assert b.is_dir()
    manager.shutdown()
    with pytest.raises(InvalidConfigError, match="Duplicate log directory"):
        LogManager(broker([a, tmp_path / "x" / ".." / "a"])).startup()
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    with pytest.raises(StorageError, match=str(not_dir)):
        LogManager(broker([not_dir])).startup()


def test_partitions_spread_over_dirs_with_fewest_logs(tmp_path):
    dirs = [tmp_path / "d0", tmp_path / "d1", tmp_path / "d2"]
    manager = started(dirs)
    manager.create_topic("spread", 6)
    counts = {str(d): len([n for n in os.listdir(d) if n.startswith("spread-")]) for d in dirs}
    assert sorted(counts.values()) == [2, 2, 2]
    manager.create_topic("one", 1)
    manager.create_topic("two", 2)
    dir_counts = [len([n for n in os.listdir(d) if os.path.isdir(d / n)]) for d in dirs]
    assert sorted(dir_counts) == [3, 3, 3]
    assert manager.partitions("spread") == list(range(6))
    assert manager.topics() == ["one", "spread", "two"]


def test_create_topic_validation_leaves_nothing(tmp_path):
    manager = started([tmp_path / "d"])
    manager.create_topic("t")
    with pytest.raises(TopicExistsError):
        manager.create_topic("t")
    with pytest.raises(InvalidTopicError):
        manager.create_topic("bad/name")
    with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
        manager.create_topic("u", 2, {"retention.ms": "soon"})
    with pytest.raises(InvalidConfigError, match=r"no\.such\.config"):
        manager.create_topic("u", 2, {"no.such.config": "1"})
    assert manager.topics() == ["t"]
    assert sorted(n for n in os.listdir(tmp_path / "d") if not n.startswith((".lock", "topic-configs"))) == [
        f"t-{p}" for p in range(3)]


def test_add_partition_only_next_number(tmp_path):
    manager = started([tmp_path / "d"])
    manager.create_topic("t", 2)
    with pytest.raises(InvalidPartitionError):
        manager.add_partition("t", 3)
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.add_partition("nope", 0)
    manager.add_partition("t", 2)
    assert manager.partitions("t") == [0, 1, 2]


def test_checkpoints_in_kafka_format_and_clean_restart(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    manager.create_topic("t", 2)
    append(manager, "t", 0, 40)
    append(manager, "t", 1, 5)
    log0 = log_of(manager, TopicPartition("t", 0))
    log0.maybe_increment_log_start_offset(log0.segments.keys()[1] + 1, "test")
    manager.shutdown()
    for d in dirs:
        assert (d / CLEAN_SHUTDOWN_FILE).exists()
    home = os.path.dirname(log0.dir)
    lines = Path(os.path.join(home, RECOVERY_POINT_CHECKPOINT)).read_text().splitlines()
    assert lines == ["0", "1", "t 0 80"]     # t-1 lives in the other dir
    start_cp = OffsetCheckpointFile(os.path.join(home, LOG_START_OFFSET_CHECKPOINT)).read()
    assert start_cp == {TopicPartition("t", 0): log0.log_start_offset}

    again = started(dirs)
    assert again.had_clean_shutdown == {str(d): True for d in dirs}
    assert not any((d / CLEAN_SHUTDOWN_FILE).exists() for d in dirs)
    restored = log_of(again, TopicPartition("t", 0))
    assert restored.log_start_offset == log0.log_start_offset
    assert restored.recovery_point == 80
    assert restored.log_end_offset == 80
    assert again.loaded_logs == 2
    assert again.load_seconds >= 0


def test_unclean_reload_keeps_every_record_and_corrupt_checkpoint_means_full_recovery(tmp_path, caplog):
    d = tmp_path / "d"
    manager = started([d])
    manager.create_topic("t", 1)
    append(manager, "t", 0, 30)
    expected = values(manager, "t", 0)
    manager.checkpoint_recovery_points()
    # crash: no shutdown; then damage the checkpoint
    (d / RECOVERY_POINT_CHECKPOINT).write_text("0\n5\nt 0 1\n")
    with caplog.at_level(logging.WARNING, logger="engine.manager"):
        crashed(manager)
        again = started([d])
    assert "recovery-point-offset-checkpoint" in caplog.text
    assert again.had_clean_shutdown == {str(d): False}
    assert values(again, "t", 0) == expected
    assert log_of(again, TopicPartition("t", 0)).log_end_offset == 60


def test_missing_checkpoint_and_torn_tail_recovered(tmp_path):
    d = tmp_path / "d"
    manager = started([d])
    manager.create_topic("t", 1)
    append(manager, "t", 0, 10)
    expected = values(manager, "t", 0)
    log = log_of(manager, TopicPartition("t", 0))
    with open(log.active_segment.log_path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x63\x00\x00\x01")    # torn batch header
    crashed(manager)
    again = started([d])
    assert values(again, "t", 0) == expected
    assert log_of(again, TopicPartition("t", 0)).log_end_offset == 20


def test_duplicate_partition_across_dirs_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    manager = started([a])
    manager.create_topic("dup", 1)
    manager.shutdown()
    os.makedirs(b / "dup-0")
    with pytest.raises(StorageError, match="dup-0"):
        started([a, b])


def test_stray_files_ignored_and_parallel_load(tmp_path, monkeypatch):
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    for i in range(6):
        manager.create_topic(f"t{i}", 2)
        append(manager, f"t{i}", 0, 3)
    manager.shutdown()
    (dirs[0] / "meta.properties").write_text("version=0\n")
    os.makedirs(dirs[1] / "lost+found")
    threads_seen: set[str] = set()
    original = Log.load

    def load_recording_thread(*args, **kwargs):     # the real load, noting which thread ran it
        threads_seen.add(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(Log, "load", load_recording_thread)
    again = started(dirs, num_recovery_threads_per_data_dir=3)
    assert again.loaded_logs == 12
    assert len(threads_seen) > 1
    assert all(name.startswith("log-recovery-") for name in threads_seen)
    assert values(again, "t5", 0)[0] == b"r-0-a"


def test_topic_config_persists_and_invalid_alter_changes_nothing(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    manager.create_topic("c", 2, {"cleanup.policy": "compact"})
    config = manager.alter_topic_config("c", {"retention.ms": "1234", "internal.segment.bytes": "4096"})
    assert config.retention_ms == 1234
    assert config.compact
    assert log_of(manager, TopicPartition("c", 1)).config.segment_size == 4096
    before = [(d / TOPIC_CONFIGS_FILE).read_bytes() for d in dirs]
    with pytest.raises(InvalidConfigError, match=r"segment\.ms"):
        manager.alter_topic_config("c", {"retention.ms": "99", "segment.ms": "-5"})
    with pytest.raises(InvalidConfigError, match="bogus"):
        manager.alter_topic_config("c", {"bogus": None})
    assert [(d / TOPIC_CONFIGS_FILE).read_bytes() for d in dirs] == before
    assert manager.topic_config("c").retention_ms == 1234
    assert log_of(manager, TopicPartition("c", 0)).config.retention_ms == 1234
    manager.alter_topic_config("c", {"internal.segment.bytes": None})
    manager.shutdown()

    doc = json.loads((dirs[1] / TOPIC_CONFIGS_FILE).read_text())
    assert doc["topics"] == {"c": {"cleanup.policy": "compact", "retention.ms": "1234"}}
    # an older copy in one dir loses against the newer one
    stale = dict(doc, generation=1, topics={"c": {"retention.ms": "1"}})
    (dirs[0] / TOPIC_CONFIGS_FILE).write_text(json.dumps(stale))
    again = started(dirs)
    assert again.topic_overrides("c") == {"cleanup.policy": "compact", "retention.ms": "1234"}
    assert log_of(again, TopicPartition("c", 0)).config.retention_ms == 1234
    assert again.topic_config("c").segment_size == again.default_config.segment_size


def test_a_stored_segment_bytes_below_the_minimum_loads_as_the_internal_setting(tmp_path, caplog):
    """An older logfs stored segment.bytes=4096 (Kafka 3's minimum was 14): the topic loads with the same
    segment size, as internal.segment.bytes, and one warning says how to get out of it."""
    dirs = [tmp_path / "a"]
    manager = started(dirs)
    manager.create_topic("t", 1, {"retention.ms": "1234"})
    manager.shutdown()
    doc = json.loads((dirs[0] / TOPIC_CONFIGS_FILE).read_text())
    doc["topics"]["t"]["segment.bytes"] = "4096"
    (dirs[0] / TOPIC_CONFIGS_FILE).write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="engine.manager"):
        again = started(dirs)
    try:
        config = again.topic_config("t")
        assert (config.segment_size, config.segment_bytes, config.retention_ms) == (4096, 1 << 30, 1234)
        assert again.topic_overrides("t") == {"retention.ms": "1234", "internal.segment.bytes": "4096"}
        warnings = [r.getMessage() for r in caplog.records if "below Kafka 4's minimum" in r.getMessage()]
        assert len(warnings) == 1
        assert "Topic t has segment.bytes=4096" in warnings[0]
    finally:
        again.shutdown()


def test_delete_topic_renames_then_removes_after_delay(tmp_path):
    clock = ManualClock()
    d = tmp_path / "d"
    manager = started([d], clock=clock, log_segment_delete_delay_ms=60000)
    manager.create_topic("gone", 2, {"retention.ms": "5000"})
    manager.create_topic("kept", 1)
    append(manager, "gone", 0, 5)
    manager.delete_topic("gone")
    assert manager.topics() == ["kept"]
    assert manager.get_log(TopicPartition("gone", 0)) is None
    names = sorted(os.listdir(d))
    renamed = [n for n in names if n.endswith("-delete")]
    assert len(renamed) == 2
    assert all(n.startswith("gone-") and len(n.split(".")[-1]) == 32 + 7 for n in renamed)
    assert manager.delete_logs() == 0
    clock.sleep(60000)
    assert manager.delete_logs() == 2
    assert not [n for n in os.listdir(d) if n.endswith("-delete")]
    # the name is free again, without the old overrides
    manager.create_topic("gone", 1)
    assert manager.topic_overrides("gone") == {}
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.delete_topic("never")


def test_delete_dirs_found_at_startup_are_queued_and_removed(tmp_path):
    clock = ManualClock()
    d = tmp_path / "d"
    manager = started([d], clock=clock)
    manager.create_topic("x", 1)
    append(manager, "x", 0, 3)
    manager.delete_topic("x")
    manager.shutdown()                      # "crash" before the delay passed
    assert [n for n in os.listdir(d) if n.endswith("-delete")]
    again = started([d], clock=clock, log_segment_delete_delay_ms=1000)
    assert again.topics() == []
    assert len(again.pending_deletions()) == 1
    assert again.delete_logs() == 0
    clock.sleep(1000)
    assert again.delete_logs() == 1
    assert not [n for n in os.listdir(d) if n.endswith("-delete")]


def test_flush_dirty_logs_honours_flush_ms(tmp_path):
    clock = ManualClock()
    manager = started([tmp_path / "d"], clock=clock, log_flush_interval_ms=1000)
    manager.create_topic("f", 1)
    append(manager, "f", 0, 4)
    log = log_of(manager, TopicPartition("f", 0))
    clock.sleep(500)
    manager.flush_dirty_logs()
    assert log.recovery_point == 0
    clock.sleep(600)
    manager.flush_dirty_logs()
    assert log.recovery_point == 8
    manager.checkpoint_recovery_points()
    assert OffsetCheckpointFile(str(tmp_path / "d" / RECOVERY_POINT_CHECKPOINT)).read() == {
        TopicPartition("f", 0): 8}


def test_cleanup_logs_applies_retention_only_to_delete_policy(tmp_path):
    clock = ManualClock()
    manager = started([tmp_path / "d"], clock=clock)
    manager.create_topic("del", 1, {"retention.bytes": "1100", "internal.segment.bytes": "500"})
    manager.create_topic("cmp", 1, {"retention.bytes": "1100", "internal.segment.bytes": "500",
                                    "cleanup.policy": "compact"})
    for topic in ("del", "cmp"):
        log = log_of(manager, TopicPartition(topic, 0))
        for i in range(60):
            log.append_values([b"value-%d" % i], [b"k%d" % (i % 5)])
    deleted = manager.cleanup_logs()
    assert deleted > 0
    assert log_of(manager, TopicPartition("del", 0)).log_start_offset > 0
    assert log_of(manager, TopicPartition("cmp", 0)).log_start_offset == 0


def _populated(dirs, clock) -> None:
    """Two dirs with multi-segment logs, a compacted topic, overrides, .deleted files; shut down cleanly."""
    manager = started(dirs, clock=clock)
    manager.create_topic("t", 3)
    manager.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    manager.create_topic("r", 1, {"retention.bytes": "1500", "file.delete.delay.ms": "86400000"})
    for p in range(3):
        append(manager, "t", p, 40, tag=b"t%d" % p)
    log = log_of(manager, TopicPartition("c", 0))
    for i in range(60):
        log.append_values([b"v%d" % i], [b"k%d" % (i % 4)])
    log.roll()
    assert cleaner_of(manager).clean_once() is not None
    append(manager, "r", 0, 60)
    assert manager.cleanup_logs() > 0            # leaves .deleted files for a day
    manager.shutdown()


def test_read_only_mode_writes_nothing(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    clock = ManualClock()
    _populated(dirs, clock)
    assert any(n.endswith(".deleted") for d in dirs for _, _, ns in os.walk(d) for n in ns)
    before = tree_snapshot(tmp_path, dirs=True)

    ro = started(dirs, clock=clock, read_only=True)
    assert ro.cleaner is None
    assert ro.topics() == ["c", "r", "t"]
    assert all(os.path.exists(d / CLEAN_SHUTDOWN_FILE) for d in dirs)     # the marker stays
    for p in range(3):
        assert values(ro, "t", p) == [b"t%d-%d-%s" % (p, i, s) for i in range(40) for s in (b"a", b"b")]
    compacted = log_of(ro, TopicPartition("c", 0)).read_records(0)
    assert {r.key: r.value for r in compacted} == {b"k%d" % k: b"v%d" % (56 + k) for k in range(4)}
    assert len(compacted) == 4
    retained = log_of(ro, TopicPartition("r", 0))
    assert retained.log_start_offset > 0
    assert [r.value for r in retained.read_records(retained.log_start_offset)] == \
        [b"r-%d-%s" % (i, s) for i in range(60) for s in (b"a", b"b")][retained.log_start_offset:]
    for log in ro.all_logs():          # the renderings and every segment's view index too
        records = log.read_records(log.log_start_offset)
        text, jsonl = LogView(log, ViewFormat.TEXT), LogView(log, ViewFormat.JSONL)
        assert text.read(0, text.size()) == b"".join((r.value or b"") + b"\n" for r in records)
        rows = [json.loads(line) for line in jsonl.read(0, jsonl.size()).splitlines()]
        assert [(row["offset"], row["key"], row["value"]) for row in rows] == \
            [(r.offset, r.key and r.key.decode(), r.value and r.value.decode()) for r in records]
        text.close()
        jsonl.close()
    t0 = log_of(ro, TopicPartition("t", 0))
    for change in (lambda: ro.create_topic("u"), lambda: ro.add_partition("t", 3),
                   lambda: ro.alter_topic_config("t", {"retention.ms": "1"}), lambda: ro.delete_topic("t"),
                   lambda: t0.append_values([b"x"]), t0.roll, lambda: t0.truncate_to(0),
                   lambda: t0.maybe_increment_log_start_offset(2)):
        with pytest.raises(ReadOnlyError):
            change()
    # The periodic jobs do nothing at all.
    assert ro.cleanup_logs() == 0
    assert ro.delete_logs() == 0
    assert ro.delete_expired_segment_files() == 0
    ro.flush_dirty_logs()
    ro.checkpoint_recovery_points()
    ro.checkpoint_log_start_offsets()
    clock.sleep(2 * 86_400_000)
    assert ro.delete_expired_segment_files() == 0
    ro.shutdown()
    assert tree_snapshot(tmp_path, dirs=True) == before

    with pytest.raises(StorageError, match="missing"):
        LogManager(broker([tmp_path / "missing"]), read_only=True).startup()


def _all_values(manager: LogManager) -> dict[tuple[str, int], list[bytes | None]]:
    return {(topic, p): [r.value for r in (lambda log: log.read_records(log.log_start_offset))(
                log_of(manager, TopicPartition(topic, p)))]
            for topic in manager.topics() for p in manager.partitions(topic)}


def test_read_only_recovers_an_unclean_dir_in_memory_and_writes_nothing(tmp_path):
    """Issue 12: a dir without the marker (a copy of a live broker's log.dirs) mounts read-only."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    _populated(dirs, ManualClock())
    clean = started(dirs, read_only=True)
    expected = _all_values(clean)
    clean.shutdown()
    os.unlink(dirs[1] / CLEAN_SHUTDOWN_FILE)          # as after a crash
    before = tree_snapshot(tmp_path, dirs=True)
    manager = started(dirs, read_only=True)
    assert _all_values(manager) == expected
    manager.shutdown()
    assert tree_snapshot(tmp_path, dirs=True) == before
    started(dirs).shutdown()                           # read-write recovers it on disk


def test_read_only_rebuilds_a_missing_index_in_memory(tmp_path):
    d = tmp_path / "d"
    _populated([d], ManualClock())
    clean = started([d], read_only=True)
    expected = _all_values(clean)
    clean.shutdown()
    index = next(p for p in sorted((d / "t-0").iterdir()) if p.name.endswith(".index"))
    index.unlink()
    before = tree_snapshot(tmp_path, dirs=True)
    manager = started([d], read_only=True)
    assert _all_values(manager) == expected
    manager.shutdown()
    assert tree_snapshot(tmp_path, dirs=True) == before


def test_read_only_accepts_an_empty_dir_without_marker(tmp_path):
    d = tmp_path / "fresh"
    d.mkdir()
    manager = started([d], read_only=True)
    assert manager.topics() == []
    manager.shutdown()
    assert os.listdir(d) == []


# ---- crash safety of deletion: what the disk holds at the moment of each step


def _checkpointed_start(log_dir, tp: TopicPartition) -> int | None:
    return OffsetCheckpointFile(os.path.join(str(log_dir), LOG_START_OFFSET_CHECKPOINT)).read().get(tp)


def test_delete_records_checkpoints_the_log_start_before_renaming_and_refuses_beyond_the_end(tmp_path, monkeypatch):
    from engine.errors import InvalidRequestError
    from engine.segment import LogSegment

    d = tmp_path / "d"
    manager = started([d], log_segment_delete_delay_ms=60000)
    manager.create_topic("dr", 1)
    append(manager, "dr", 0, 60)
    tp = TopicPartition("dr", 0)
    log = log_of(manager, tp)
    bases = list(log.segments.keys())
    assert len(bases) >= 4
    end = log.log_end_offset
    with pytest.raises(InvalidRequestError, match="beyond the log end offset"):
        manager.delete_records(tp, end + 1)
    assert log.log_start_offset == 0
    assert _checkpointed_start(d, tp) is None

    seen_at_rename: list[int | None] = []
    real = LogSegment.change_file_suffixes

    def spy(segment, old, new):
        seen_at_rename.append(_checkpointed_start(d, tp))
        return real(segment, old, new)
    monkeypatch.setattr(LogSegment, "change_file_suffixes", spy)
    target = bases[2] + 3
    assert manager.delete_records(tp, target) == target
    assert seen_at_rename == [target, target]         # on disk before the first rename
    assert list(log.segments.keys()) == bases[2:]
    assert _checkpointed_start(d, tp) == target
    assert manager.delete_records(tp, 1) == target      # never backwards
    # a crash now (no shutdown): the next start hides the records below it
    crashed(manager)
    again = started([d])
    relog = log_of(again, tp)
    assert relog.log_start_offset == target
    assert relog.read_records(target)[0].offset == target
    assert not [n for n in os.listdir(relog.dir) if n.endswith(".deleted")]


def test_retention_checkpoints_the_planned_log_start_before_renaming(tmp_path, monkeypatch):
    from engine.segment import LogSegment

    clock = ManualClock()
    d = tmp_path / "d"
    manager = started([d], clock=clock, log_segment_delete_delay_ms=60000)
    manager.create_topic("ret", 1, {"retention.ms": "3600000"})
    tp = TopicPartition("ret", 0)
    for _ in range(8):
        append(manager, "ret", 0, 8)
        clock.sleep(1_000_000)
    log = log_of(manager, tp)
    segments = list(log.segments.values())
    clock.now = segments[2].largest_timestamp + 3_600_001         # three segments are too old
    seen_at_rename: list[int | None] = []
    real = LogSegment.change_file_suffixes

    def crash_after_first_rename(segment, old, new):
        seen_at_rename.append(_checkpointed_start(d, tp))
        real(segment, old, new)
        if len(seen_at_rename) == 1:
            raise SystemExit("simulated crash between two renames")
    monkeypatch.setattr(LogSegment, "change_file_suffixes", crash_after_first_rename)
    with pytest.raises(SystemExit):
        log.delete_old_segments()
    assert seen_at_rename == [segments[3].base_offset]
    monkeypatch.undo()
    # restart over the half-renamed state: segments 1 and 2 are still there, but hidden
    crashed(manager)
    again = started([d], clock=clock)
    relog = log_of(again, tp)
    assert relog.log_start_offset == segments[3].base_offset
    assert relog.read_records(relog.log_start_offset)[0].offset == segments[3].base_offset
    assert again.cleanup_logs() == 2                                 # the run finishes the deletion
    assert next(iter(relog.segments.keys())) == segments[3].base_offset


def test_interrupted_topic_deletion_is_finished_at_startup(tmp_path, monkeypatch):
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    manager = started([d1, d2], log_segment_delete_delay_ms=1000)
    manager.create_topic("half", 4, {"retention.ms": "1000"})
    manager.create_topic("other", 1)
    for p in range(4):
        append(manager, "half", p, 3)
    real = Log.rename_dir
    calls: list[str] = []

    def crash_after_two(log, new_name):
        if len(calls) == 2:
            raise SystemExit("simulated crash between two partition renames")
        calls.append(new_name)
        real(log, new_name)
    monkeypatch.setattr(Log, "rename_dir", crash_after_two)
    with pytest.raises(SystemExit):
        manager.delete_topic("half")
    monkeypatch.undo()
    live = sorted(n for d in (d1, d2) for n in os.listdir(d) if n.startswith("half-") and "-delete" not in n)
    assert live == ["half-2", "half-3"]                               # the crash left two partitions
    assert json.loads((d1 / TOPIC_CONFIGS_FILE).read_text())["deleting"] == ["half"]

    crashed(manager)
    again = started([d1, d2], log_segment_delete_delay_ms=1000)
    assert again.topics() == ["other"]                                # never resurrected, not even in part
    assert len(again.pending_deletions()) == 4
    assert "deleting" not in json.loads((d2 / TOPIC_CONFIGS_FILE).read_text())
    again.create_topic("half", 1)                                     # the name is free at once
    assert again.topic_overrides("half") == {}
    assert values(again, "half", 0) == []
    again.shutdown()
    third = started([d1, d2])
    assert third.topics() == ["half", "other"]
    assert third.partitions("half") == [0]


def test_create_topic_clears_a_deletion_intent_left_by_a_failed_write(tmp_path, monkeypatch):
    d = tmp_path / "d"
    manager = started([d])
    manager.create_topic("again", 2)
    real = LogManager._write_topic_configs
    writes = []

    def fail_second_write(self, overrides):
        writes.append(dict(overrides))
        if len(writes) == 2:
            raise StorageError("Error while writing topic-configs.json: No space left on device")
        real(self, overrides)
    monkeypatch.setattr(LogManager, "_write_topic_configs", fail_second_write)
    manager.delete_topic("again")            # the intent cannot be cleared: it stays on disk
    monkeypatch.undo()
    assert json.loads((d / TOPIC_CONFIGS_FILE).read_text())["deleting"] == ["again"]
    manager.create_topic("again", 1)
    assert "deleting" not in json.loads((d / TOPIC_CONFIGS_FILE).read_text())
    append(manager, "again", 0, 2)
    manager.shutdown()
    assert values(started([d]), "again", 0) == [b"r-0-a", b"r-0-b", b"r-1-a", b"r-1-b"]


def test_delete_topic_refused_whole_when_its_intent_cannot_be_written(tmp_path, monkeypatch):
    d = tmp_path / "d"
    manager = started([d])
    manager.create_topic("stay", 2, {"retention.ms": "1000"})

    def fail(self, overrides):
        raise StorageError("Error while writing topic-configs.json: Read-only file system")
    monkeypatch.setattr(LogManager, "_write_topic_configs", fail)
    with pytest.raises(StorageError, match="Read-only file system"):
        manager.delete_topic("stay")
    monkeypatch.undo()
    assert manager.partitions("stay") == [0, 1]
    assert manager.topic_overrides("stay") == {"retention.ms": "1000"}
    assert sorted(n for n in os.listdir(d) if n.startswith("stay")) == ["stay-0", "stay-1"]


def test_topic_configs_unreadable_in_one_dir_are_taken_from_another(tmp_path, caplog):
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = started(dirs)
    manager.create_topic("c", 2, {"cleanup.policy": "compact"})
    manager.alter_topic_config("c", {"min.cleanable.dirty.ratio": "0.3"})
    manager.shutdown()
    for name in (TOPIC_CONFIGS_FILE, TOPIC_CONFIGS_FILE + ".prev"):
        (dirs[0] / name).write_bytes(b"{torn")
    with caplog.at_level(logging.ERROR, logger="engine.topic_configs"):
        again = started(dirs)
    assert again.topic_overrides("c") == {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.3"}
    assert "in place of the corrupt copies" in caplog.text
    again.shutdown()
    # every copy unreadable: refused, with how to repair
    for name in (TOPIC_CONFIGS_FILE, TOPIC_CONFIGS_FILE + ".prev"):
        (dirs[1] / name).write_bytes(b"[]")
        (dirs[0] / name).write_bytes(b"")
    with pytest.raises(StorageError, match=r"Refusing to start.*restore topic-configs\.json from a backup"):
        started(dirs)


def test_a_config_write_after_a_corrupt_current_keeps_the_good_previous_generation(tmp_path):
    d = tmp_path / "d"
    manager = started([d])
    manager.create_topic("c", 1, {"cleanup.policy": "compact"})
    manager.alter_topic_config("c", {"retention.ms": "1000"})
    manager.shutdown()
    previous = (d / (TOPIC_CONFIGS_FILE + ".prev")).read_bytes()
    (d / TOPIC_CONFIGS_FILE).write_bytes(b'{"version": 1, "gener')
    again = started([d])                               # loads .prev (the generation before retention.ms)
    assert again.topic_overrides("c") == {"cleanup.policy": "compact"}
    again.alter_topic_config("c", {"segment.ms": "60000"})
    # written over the corrupt file: the good previous generation was never at risk
    assert (d / (TOPIC_CONFIGS_FILE + ".prev")).read_bytes() == previous
    assert json.loads((d / TOPIC_CONFIGS_FILE).read_text())["topics"]["c"] == {
        "cleanup.policy": "compact", "segment.ms": "60000"}
    again.shutdown()
