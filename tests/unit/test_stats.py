"""``.logfs/stats.json``, ``.logfs/metrics`` and partition ``state`` without FUSE.

Rendered from a real LogManager on disk (appends, a roll, DeleteRecords leaving
``.deleted`` segments, a compacted topic cleaned once) and checked field by
field against the live logs.  The Prometheus text is read back with
prometheus_client's own parser, as a scraper would read it.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.topic import TopicPartition
from logfs.stats import MountStats, TaskRun, partition_state, prometheus_metrics, stats_json
from tests.helpers import cleaner_of, log_of

T0 = 1_700_000_000_000


def _manager(data, read_only: bool = False) -> LogManager:
    m = LogManager(BrokerConfig.from_props({"log.dirs": str(data), "internal.log.segment.bytes": "1024",
                                            "log.segment.delete.delay.ms": "60000"}),
                   clock=ManualClock(T0), read_only=read_only)
    m.startup()
    return m


@pytest.fixture
def manager(tmp_path):
    m = _manager(tmp_path / "data")
    m.create_topic("t", 2)
    for p in range(2):
        log = log_of(m, TopicPartition("t", p))
        for i in range(30):
            log.append_values([b"t%d-%03d" % (p, i)] * 3)
    m.delete_records(TopicPartition("t", 0), 50)          # leaves .deleted segments for a minute
    m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    c = log_of(m, TopicPartition("c", 0))
    for i in range(40):
        c.append_values([b"v%d" % i], [b"k%d" % (i % 4)])
    c.roll()
    assert cleaner_of(m).clean_once() is not None
    yield m
    m.shutdown()


@pytest.fixture
def stats() -> MountStats:
    s = MountStats(started_ms=T0)
    s.record_append(90, 1000)
    s.record_append(40, 300)
    run = s.task("kafka-log-retention", 300_000)
    run.runs, run.errors, run.last_run_ms, run.last_duration_ms, run.total_duration_ms = 3, 1, T0 + 5, 1.5, 4.25
    run.last_error, run.last_result = "StorageError: disk", 2
    return s


def test_stats_json_figures_are_the_live_logs(manager, stats):
    doc = json.loads(stats_json(manager, stats))
    assert doc["log_dirs"] == list(manager.log_dirs)
    assert sorted(doc["topics"]) == ["c", "t"]
    for topic, parts in (("t", 2), ("c", 1)):
        expected_records = 0
        for p in range(parts):
            log = log_of(manager, TopicPartition(topic, p))
            got = doc["topics"][topic]["partitions"][str(p)]
            assert {k: got[k] for k in ("dir", "log_start_offset", "log_end_offset", "recovery_point",
                                        "size_bytes", "num_segments")} == {
                "dir": log.dir, "log_start_offset": log.log_start_offset, "log_end_offset": log.log_end_offset,
                "recovery_point": log.recovery_point, "size_bytes": log.size, "num_segments": log.num_segments}
            assert got["pending_deletion"] == {"segments": log.pending_deletion_segments,
                                               "bytes": log.pending_deletion_bytes}
            expected_records += log.log_end_offset - log.log_start_offset
        assert doc["topics"][topic]["records"] == expected_records
        assert doc["topics"][topic]["size_bytes"] == sum(
            log_of(manager, TopicPartition(topic, p)).size for p in range(parts))
    pending = doc["topics"]["t"]["partitions"]["0"]["pending_deletion"]
    assert pending["segments"] > 0
    assert pending["bytes"] > 0                                           # DeleteRecords left .deleted files
    assert doc["topics"]["t"]["partitions"]["0"]["log_start_offset"] == 50
    # only compacted partitions carry the cleaner position, the checkpointed first dirty offset
    assert "cleaner_position" not in doc["topics"]["t"]["partitions"]["0"]
    assert doc["topics"]["c"]["partitions"]["0"]["cleaner_position"] == \
        manager.cleaner.manager.all_cleaner_checkpoints()[TopicPartition("c", 0)]
    assert doc["appends"] == {"records": 130, "bytes": 1300, "batches": 2}
    assert doc["views_open"] == 0
    assert doc["tasks"] == {"kafka-log-retention": {
        "interval_ms": 300_000, "runs": 3, "errors": 1, "last_run_ms": T0 + 5, "last_duration_ms": 1.5,
        "total_duration_ms": 4.25, "last_error": "StorageError: disk", "last_result": 2}}
    assert doc["cleaner"]["totals"]["runs"] == 1
    assert doc["cleaner"]["threads"] == 1
    assert doc["cleaner"]["last_run"]["0"]["topic_partition"] == "c-0"


def test_task_run_shows_only_scalar_results():
    run = TaskRun("kafka-log-cleaner-thread-0", 15_000, last_result=object(), total_duration_ms=1 / 3)
    assert run.as_dict()["last_result"] is None                   # a CleanerStats is not JSON
    assert run.as_dict()["total_duration_ms"] == 0.333
    assert TaskRun("x", 1, last_result="ok").as_dict()["last_result"] == "ok"


def test_partition_state_lists_every_segment_and_the_cleaner_fields(manager):
    log = log_of(manager, TopicPartition("t", 0))
    state = partition_state(manager, log)
    assert state["segments"] == [{"base_offset": s.base_offset, "next_offset": s.next_offset,
                                  "size_bytes": s.size, "largest_timestamp": s.largest_timestamp}
                                 for s in log.segments.values()]
    assert state["segments"][0]["base_offset"] <= 50 < state["segments"][0]["next_offset"]
    assert (state["topic"], state["partition"], state["num_segments"], state["size_bytes"]) == \
        ("t", 0, len(log.segments), log.size)
    # the cleaner's keys are there for every partition, compacted or not
    assert {k: state[k] for k in ("cleaner_position", "cleaning_state", "uncleanable", "last_cleaning")} == \
        {"cleaner_position": None, "cleaning_state": None, "uncleanable": False, "last_cleaning": None}
    compacted = partition_state(manager, log_of(manager, TopicPartition("c", 0)))
    assert compacted["cleaner_position"] == manager.cleaner.manager.all_cleaner_checkpoints()[TopicPartition("c", 0)]
    assert compacted["last_cleaning"]["records_read"] > compacted["last_cleaning"]["records_written"] > 0


def test_partition_state_of_a_mount_without_cleaner(tmp_path):
    rw = _manager(tmp_path / "ro")
    rw.create_topic("c", 1, {"cleanup.policy": "compact"})
    log_of(rw, TopicPartition("c", 0)).append_values([b"v"], [b"k"])
    rw.shutdown()
    ro = _manager(tmp_path / "ro", read_only=True)
    try:
        assert ro.cleaner is None
        state = partition_state(ro, log_of(ro, TopicPartition("c", 0)))
        assert {k: state[k] for k in ("cleaner_position", "dirty_ratio", "cleaning_state", "uncleanable",
                                      "last_cleaning")} == {"cleaner_position": None, "dirty_ratio": None,
                                                            "cleaning_state": None, "uncleanable": False,
                                                            "last_cleaning": None}
        assert json.loads(stats_json(ro, MountStats()))["cleaner"] is None
        assert b"logfs_cleaner_runs_total" not in prometheus_metrics(ro, MountStats())
    finally:
        ro.shutdown()


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_prometheus_metrics_are_kafkas_gauges_with_the_live_values(manager, stats):
    samples = _samples(prometheus_metrics(manager, stats))
    for topic, parts in (("t", 2), ("c", 1)):
        for p in range(parts):
            log = log_of(manager, TopicPartition(topic, p))
            labels = (("partition", str(p)), ("topic", topic))
            assert samples[("kafka_log_log_size", labels)] == log.size
            assert samples[("kafka_log_log_logendoffset", labels)] == log.log_end_offset
            assert samples[("kafka_log_log_logstartoffset", labels)] == log.log_start_offset
            assert samples[("kafka_log_log_numlogsegments", labels)] == log.num_segments
            assert samples[("logfs_log_pending_deletion_segments", labels)] == log.pending_deletion_segments
            assert samples[("logfs_log_pending_deletion_bytes", labels)] == log.pending_deletion_bytes
    assert samples[("logfs_append_records_total", ())] == 130
    assert samples[("logfs_append_bytes_total", ())] == 1300
    assert samples[("logfs_append_batches_total", ())] == 2
    task = (("task", "kafka-log-retention"),)
    assert samples[("logfs_task_runs_total", task)] == 3
    assert samples[("logfs_task_errors_total", task)] == 1
    assert samples[("logfs_task_last_duration_seconds", task)] == 0.0015
    assert samples[("logfs_cleaner_runs_total", ())] == 1
    c0 = (("partition", "0"), ("topic", "c"))
    assert samples[("logfs_log_cleaner_position", c0)] == \
        manager.cleaner.manager.all_cleaner_checkpoints()[TopicPartition("c", 0)]
    assert samples[("logfs_log_cleaner_dirty_ratio", c0)] == manager.cleaner.manager.dirty_ratio(
        log_of(manager, TopicPartition("c", 0)))
    assert ("logfs_log_cleaner_dirty_ratio", (("partition", "0"), ("topic", "t"))) not in samples
    assert samples[("logfs_pending_log_deletions", ())] == 0
