"""Figures of the running mount: ``.logfs/stats.json``, ``.logfs/metrics`` and partition ``state``.

The counters here are the mount's own (appends, background task runs); the
per-partition figures are read from the engine at the moment a file is
opened, so every file is a consistent snapshot of live objects and nothing is
cached that could go stale.  Metric names follow what Kafka's JMX exporter
produces for ``kafka.log:type=Log`` (``kafka_log_log_size`` ...), so existing
dashboards apply; the log cleaner's are Kafka's ``kafka.log:type=LogCleaner``
and ``type=LogCleanerManager`` gauges under the names the Prometheus JMX
exporter gives them (``kafka_log_LogCleanerManager_max_dirty_percent`` ...),
plus ``logfs_cleaner_*`` counters summed over every clean.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from engine.records import compiled
from engine.remote.remote_segment import RemoteLogSegment

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

    from engine.consumer_offsets import GroupMetadataManager
    from engine.log import Log
    from engine.manager import LogManager

__all__ = ["MountStats", "TaskRun", "partition_state", "stats_json", "prometheus_metrics"]

@dataclass
class TaskRun:
    """The run history of one periodic task (Kafka's scheduler has no such record; operators want it)."""

    name: str
    interval_ms: int
    runs: int = 0
    errors: int = 0
    last_run_ms: int | None = None
    last_duration_ms: float | None = None
    total_duration_ms: float = 0.0
    last_error: str | None = None
    last_result: Any = None     # Any: a task's result, of its own kind

    def as_dict(self) -> dict[str, Any]:     # Any: JSON values
        return {
            "interval_ms": self.interval_ms, "runs": self.runs, "errors": self.errors,
            "last_run_ms": self.last_run_ms, "last_duration_ms": self.last_duration_ms,
            "total_duration_ms": round(self.total_duration_ms, 3), "last_error": self.last_error,
            "last_result": self.last_result if isinstance(self.last_result, (int, float, str)) else None,
        }


@dataclass
class MountStats:
    """Counters of one mount.  Appends are counted on the trio thread; tasks from workers."""

    started_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    appended_records: int = 0
    appended_bytes: int = 0
    append_batches: int = 0
    #: LogViews anchored by lookups and not yet forgotten by the kernel
    views_open: int = 0
    load_ms: float = 0.0
    #: lookup and getattr requests served (what the kernel's name and attribute caches did not answer)
    metadata_requests: int = 0
    tasks: dict[str, TaskRun] = field(default_factory=dict)
    #: the group coordinator's offsets store (engine.consumer_offsets), set by logfs.groups at mount start
    groups: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_append(self, records: int, nbytes: int) -> None:
        with self._lock:   # appends of flush.messages topics count from worker threads
            self.appended_records += records
            self.appended_bytes += nbytes
            self.append_batches += 1

    def task(self, name: str, interval_ms: int) -> TaskRun:
        with self._lock:
            run = self.tasks.get(name)
            if run is None:
                run = self.tasks[name] = TaskRun(name, interval_ms)
            return run


def partition_state(manager: LogManager, log: Log) -> dict[str, Any]:     # Any: JSON values
    """The JSON of ``MOUNT/<topic>/<p>/state`` (Spark's data source relies on these names)."""
    segments = log.segments  # one copy-on-write reference: a consistent list
    tp = log.topic_partition
    state: dict[str, Any] = {     # Any: JSON values
        "topic": tp.topic,
        "partition": tp.partition,
        "dir": log.dir,
        "log_start_offset": log.log_start_offset,
        # Kafka's localLogStartOffset: above the log start once tiered storage deleted copied segments
        "local_log_start_offset": log.local_log_start_offset,
        "log_end_offset": log.log_end_offset,
        "recovery_point": log.recovery_point,
        "size_bytes": sum(seg.size for seg in segments.values()),
        "num_segments": len(segments),
        "segments": [
            {"base_offset": seg.base_offset, "next_offset": seg.next_offset,
             "size_bytes": seg.size, "largest_timestamp": seg.largest_timestamp}
            for seg in segments.values()
        ],
        # tiered storage: the remote log segments below the local log start, which readers (segments/, the
        # Spark source) read from the store; [] when every record is local.  One deleted locally since
        # `segments` was taken stays listed there only: every base offset once
        "remote_segments": [
            {"base_offset": seg.base_offset, "next_offset": seg.next_offset,
             "size_bytes": seg.size, "largest_timestamp": seg.largest_timestamp}
            for base, seg in log.reader_segments().items()
            if isinstance(seg, RemoteLogSegment) and base not in segments
        ],
        "pending_deletion": {"segments": log.pending_deletion_segments,
                             "bytes": log.pending_deletion_bytes},
    }
    state.update(_cleaner_state(manager, log))
    state["remote_storage"] = _remote_state(manager, log)
    return state


def _remote_state(manager: LogManager, log: Log) -> dict[str, Any] | None:     # Any: JSON values
    """Tiered storage of the partition: None when the mount has no remote storage (the key is always there)."""
    rlm = manager.remote_log_manager
    if rlm is None:
        return None
    tiered = manager.tiered_partition(log)
    if tiered is None:
        return {"enabled": log.config.remote_storage_enable, "segments": 0, "size_bytes": 0,
                "highest_offset_copied": -1, "copy_lag_segments": 0, "copy_lag_bytes": 0}
    copies, size, highest = rlm.remote_log_size(tiered.tip)
    lag_segments, lag_bytes = rlm.copy_lag(log, tiered.tip) if tiered.remote_storage_enable else (0, 0)
    return {"enabled": tiered.remote_storage_enable, "segments": copies, "size_bytes": size,
            "highest_offset_copied": highest, "copy_lag_segments": lag_segments, "copy_lag_bytes": lag_bytes}


#: the cleaner fields of ``state`` when the mount runs no cleaner (read-only, log.cleaner.enable=false)
_NO_CLEANER_STATE: dict[str, Any] = {"cleaner_position": None, "dirty_ratio": None, "cleaning_state": None,
                                     "uncleanable": False, "last_cleaning": None}


def _cleaner_state(manager: LogManager, log: Log) -> dict[str, Any]:     # Any: JSON values
    """Cleaner position (first dirty offset), dirty ratio, cleaning state and the last clean of ``log``.

    The keys are present for every partition, compacted or not, so readers
    (Spark's source, jq scripts) never have to test for them.
    """
    cleaner = manager.cleaner
    if cleaner is None:
        return dict(_NO_CLEANER_STATE)
    return cleaner.cleaner_state(log)


def _logs(manager: LogManager) -> list[Log]:
    return sorted(manager.all_logs(), key=lambda lg: (lg.topic_partition.topic, lg.topic_partition.partition))


def stats_json(manager: LogManager, stats: MountStats) -> bytes:
    topics: dict[str, Any] = {}     # Any: JSON values
    for lg in _logs(manager):
        tp = lg.topic_partition
        topic = topics.setdefault(tp.topic, {"partitions": {}, "size_bytes": 0, "records": 0})
        size = lg.size
        topic["partitions"][str(tp.partition)] = {
            "dir": lg.dir, "log_start_offset": lg.log_start_offset, "local_log_start_offset": lg.local_log_start_offset,
            "log_end_offset": lg.log_end_offset,
            "recovery_point": lg.recovery_point, "size_bytes": size, "num_segments": lg.num_segments,
            "pending_deletion": {"segments": lg.pending_deletion_segments, "bytes": lg.pending_deletion_bytes},
        }
        topic["size_bytes"] += size
        topic["records"] += lg.log_end_offset - lg.log_start_offset
    now = time.time_ns() // 1_000_000
    cleaner = manager.cleaner
    if cleaner is not None:
        positions = cleaner.manager.all_cleaner_checkpoints()   # one read of each dir's checkpoint
        for lg in _logs(manager):
            if lg.config.compact:
                tp = lg.topic_partition
                topics[tp.topic]["partitions"][str(tp.partition)]["cleaner_position"] = positions.get(tp)
    doc = {
        "pid": os.getpid(),          # the serving process: `logfs umount` waits for it to finish its shutdown
        "read_only": manager.read_only,
        "log_dirs": list(manager.log_dirs),
        "uptime_ms": now - stats.started_ms,
        "loaded_logs": getattr(manager, "loaded_logs", None),
        "load_ms": round(stats.load_ms, 3),
        "topics": topics,
        "appends": {"records": stats.appended_records, "bytes": stats.appended_bytes,
                    "batches": stats.append_batches},
        "views_open": stats.views_open,
        "compiled_kernels": compiled.state(),
        "metadata_requests": stats.metadata_requests,
        "pending_log_deletions": manager.pending_deletions(),
        "tasks": {name: run.as_dict() for name, run in sorted(stats.tasks.items())},
        "cleaner": None if cleaner is None else cleaner.metrics(),
        "consumer_groups": _consumer_groups(stats.groups),
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


class _MountCollector:
    """A prometheus_client collector reading the live figures at scrape time."""

    def __init__(self, manager: LogManager, stats: MountStats) -> None:
        self._manager = manager
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        size = GaugeMetricFamily("kafka_log_log_size", "Size of the log in bytes", labels=labels)
        end = GaugeMetricFamily("kafka_log_log_logendoffset", "Log end offset", labels=labels)
        start = GaugeMetricFamily("kafka_log_log_logstartoffset", "Log start offset", labels=labels)
        segs = GaugeMetricFamily("kafka_log_log_numlogsegments", "Number of log segments", labels=labels)
        pending_segs = GaugeMetricFamily("logfs_log_pending_deletion_segments",
                                         "Segments renamed .deleted and waiting for file.delete.delay.ms",
                                         labels=labels)
        pending_bytes = GaugeMetricFamily("logfs_log_pending_deletion_bytes",
                                          "Bytes of segments waiting for deletion", labels=labels)
        for lg in _logs(self._manager):
            tp = lg.topic_partition
            lv = [tp.topic, str(tp.partition)]
            size.add_metric(lv, lg.size)
            end.add_metric(lv, lg.log_end_offset)
            start.add_metric(lv, lg.log_start_offset)
            segs.add_metric(lv, lg.num_segments)
            pending_segs.add_metric(lv, lg.pending_deletion_segments)
            pending_bytes.add_metric(lv, lg.pending_deletion_bytes)
        yield from (size, end, start, segs, pending_segs, pending_bytes)
        yield GaugeMetricFamily("logfs_pending_log_deletions",
                                "Partition directories renamed -delete and waiting for removal",
                                value=len(self._manager.pending_deletions()))
        st = self._stats
        yield CounterMetricFamily("logfs_append_records", "Records appended through the mount",
                                  value=st.appended_records)
        yield CounterMetricFamily("logfs_append_bytes", "Bytes written to append files",
                                  value=st.appended_bytes)
        yield CounterMetricFamily("logfs_append_batches", "Record batches appended", value=st.append_batches)
        yield GaugeMetricFamily("logfs_views_open", "Views held for inodes the kernel has not forgotten",
                                value=st.views_open)
        runs = CounterMetricFamily("logfs_task_runs", "Runs of a background task", labels=["task"])
        errors = CounterMetricFamily("logfs_task_errors", "Failed runs of a background task", labels=["task"])
        last = GaugeMetricFamily("logfs_task_last_duration_seconds", "Duration of the last run",
                                 labels=["task"])
        for name, run in sorted(st.tasks.items()):
            runs.add_metric([name], run.runs)
            errors.add_metric([name], run.errors)
            last.add_metric([name], (run.last_duration_ms or 0.0) / 1000.0)
        yield from (runs, errors, last)
        if self._manager.cleaner is not None:
            yield from _cleaner_metrics(self._manager)
        if self._manager.remote_log_manager is not None:
            yield from _remote_metrics(self._manager)
        if st.groups is not None:
            yield from _consumer_group_metrics(st.groups)


def _cleaner_metrics(manager: LogManager) -> Iterator[Metric]:
    """Kafka's LogCleaner/LogCleanerManager gauges, per-partition dirty ratios and cumulative counters."""
    cleaner = manager.cleaner
    if cleaner is None:         # the caller checks too; a mount without a cleaner has none of these metrics
        return
    m = cleaner.metrics()
    totals = m["totals"]
    last_runs = list(m["last_run"].values())
    recopy = (100.0 * sum(r["bytes_written"] for r in last_runs) / max(sum(r["bytes_read"] for r in last_runs), 1)
              if last_runs else 0.0)
    gauges = (
        ("kafka_log_LogCleanerManager_max_dirty_percent",
         "Dirty ratio of the filthiest compacted log at the last check, in percent", m["max_dirty_percent"]),
        ("kafka_log_LogCleanerManager_time_since_last_run_ms",
         "Milliseconds since the cleaner last looked for a log to clean", m["time_since_last_run_ms"]),
        ("kafka_log_LogCleanerManager_uncleanable_partitions_count",
         "Partitions the cleaner gave up on after an unexpected failure", m["uncleanable_partitions"]),
        ("kafka_log_LogCleaner_max_buffer_utilization_percent",
         "Offset map utilization of the last clean of each worker, maximum, in percent",
         m["max_buffer_utilization_percent"]),
        ("kafka_log_LogCleaner_cleaner_recopy_percent",
         "Bytes written over bytes read by the last clean of each worker, in percent", round(recopy, 3)),
        ("kafka_log_LogCleaner_max_clean_time_secs",
         "Duration of the longest last clean of the workers, in seconds", m["max_clean_time_secs"]),
        ("kafka_log_LogCleaner_DeadThreadCount",
         "Cleaner workers that died (never: a failed clean marks its partition uncleanable instead)", 0),
        ("logfs_cleaner_busy_threads", "Cleaner workers cleaning right now", m["busy_threads"]),
    )
    for name, doc, value in gauges:
        yield GaugeMetricFamily(name, doc, value=value)
    for name, key, doc in (("logfs_cleaner_runs", "runs", "Cleans finished"),
                           ("logfs_cleaner_bytes_read", "bytes_read", "Bytes of log read by the cleaner"),
                           ("logfs_cleaner_bytes_written", "bytes_written", "Bytes of cleaned segments written"),
                           ("logfs_cleaner_records_read", "records_read", "Records read by the cleaner"),
                           ("logfs_cleaner_records_kept", "records_written", "Records copied into cleaned segments"),
                           ("logfs_cleaner_records_dropped", "records_dropped",
                            "Records removed by compaction (superseded, expired tombstones)"),
                           ("logfs_cleaner_segments_cleaned", "segments_cleaned", "Segments replaced by cleans"),
                           ("logfs_cleaner_delete_horizons_set", "horizons_set",
                            "Batches given a KIP-534 delete horizon by a clean"),
                           ("logfs_cleaner_deletes_expired", "deletes_expired",
                            "Tombstones and transaction markers dropped once their delete horizon passed"),
                           ("logfs_cleaner_aborted_records_removed", "aborted_records_removed",
                            "Records of aborted transactions removed by cleans"),
                           ("logfs_cleaner_seconds", "elapsed_secs", "Time spent cleaning")):
        yield CounterMetricFamily(name, doc, value=totals[key])
    labels = ["topic", "partition"]
    ratio = GaugeMetricFamily("logfs_log_cleaner_dirty_ratio", "Dirty ratio of a compacted log", labels=labels)
    position = GaugeMetricFamily("logfs_log_cleaner_position", "First dirty offset of a compacted log",
                                 labels=labels)
    positions = cleaner.manager.all_cleaner_checkpoints()
    for lg in _logs(manager):
        if not lg.config.compact:
            continue
        tp = lg.topic_partition
        lv = [tp.topic, str(tp.partition)]
        ratio.add_metric(lv, cleaner.manager.dirty_ratio(lg))
        if tp in positions:
            position.add_metric(lv, positions[tp])
    yield from (ratio, position)


def _remote_metrics(manager: LogManager) -> Iterator[Metric]:
    """Tiered storage: Kafka's RemoteLogManager metrics (``RemoteCopyLagBytes``, ``RemoteCopyLagSegments``,
    ``RemoteLogSizeBytes``, ``RemoteCopyBytesPerSec``, ``RemoteCopyErrorsPerSec``, ``RemoteFetchBytesPerSec``,
    here cumulative counters), under ``logfs_remote_*``."""
    rlm = manager.remote_log_manager
    if rlm is None:
        return
    labels = ["topic", "partition"]
    lag_bytes = GaugeMetricFamily("logfs_remote_copy_lag_bytes", "Bytes of closed segments not yet copied to "
                                  "remote storage (Kafka's RemoteCopyLagBytes)", labels=labels)
    lag_segments = GaugeMetricFamily("logfs_remote_copy_lag_segments", "Closed segments not yet copied to remote "
                                     "storage (Kafka's RemoteCopyLagSegments)", labels=labels)
    remote_bytes = GaugeMetricFamily("logfs_remote_log_size_bytes", "Bytes of the partition's remote log "
                                     "segments (Kafka's RemoteLogSizeBytes)", labels=labels)
    remote_segments = GaugeMetricFamily("logfs_remote_log_segments", "Remote log segments of the partition",
                                        labels=labels)
    for lg in _logs(manager):
        tiered = manager.tiered_partition(lg)
        if tiered is None:
            continue
        copies, size, _ = rlm.remote_log_size(tiered.tip)
        if not tiered.remote_storage_enable and not copies:
            continue
        lv = [lg.topic_partition.topic, str(lg.topic_partition.partition)]
        segments, waiting = rlm.copy_lag(lg, tiered.tip) if tiered.remote_storage_enable else (0, 0)
        lag_bytes.add_metric(lv, waiting)
        lag_segments.add_metric(lv, segments)
        remote_bytes.add_metric(lv, size)
        remote_segments.add_metric(lv, copies)
    yield from (lag_bytes, lag_segments, remote_bytes, remote_segments)
    for name, value, doc in (
            ("logfs_remote_copy_bytes", rlm.copied_bytes, "Bytes copied to remote storage"),
            ("logfs_remote_copy_segments", rlm.copied_segments, "Segments copied to remote storage"),
            ("logfs_remote_copy_errors", rlm.copy_errors, "Copies to remote storage that failed"),
            ("logfs_remote_errors", rlm.errors, "Failures of the remote storage in the copy task's rounds "
                                                "(copies, deletions, listings)"),
            ("logfs_remote_deleted_segments", rlm.deleted_segments, "Remote log segments deleted"),
            ("logfs_remote_fetch_bytes", rlm.cache.fetched_bytes, "Bytes fetched from remote storage")):
        yield CounterMetricFamily(name, doc, value=value)
    yield GaugeMetricFamily("logfs_remote_storage_unavailable", "1 while the remote storage fails (copies back "
                            "off), else 0", value=int(rlm.outage))
    yield GaugeMetricFamily("logfs_remote_chunk_cache_bytes", "Bytes of remote log segments cached on local disk",
                            value=rlm.cache.cached_bytes)


def _consumer_groups(store: GroupMetadataManager | None) -> dict[str, Any]:     # Any: JSON values
    """group -> topic -> {"lag": total, "partitions": {p: {committed, log_end_offset, lag}}} (issue 13)."""
    if store is None:
        return {}
    out: dict[str, Any] = {}     # Any: JSON values
    for topic, groups in sorted(store.all_groups().items()):
        for group in sorted(groups):
            rows = store.lag(group, topic)
            out.setdefault(group, {})[topic] = {
                "lag": sum(r.lag for r in rows),
                "partitions": {str(r.partition): {"committed": r.committed, "log_end_offset": r.log_end_offset,
                                                  "lag": r.lag} for r in rows},
            }
    return out


def _consumer_group_metrics(store: GroupMetadataManager) -> Iterator[Metric]:
    """kafka_exporter's consumer group gauges (kafka_consumergroup_*), from the committed offsets."""
    labels = ["consumergroup", "topic", "partition"]
    current = GaugeMetricFamily("kafka_consumergroup_current_offset",
                                "Committed offset of a consumer group on a partition (-1: none)", labels=labels)
    lag = GaugeMetricFamily("kafka_consumergroup_lag", "Records between a group's committed offset and the log end",
                            labels=labels)
    lag_sum = GaugeMetricFamily("kafka_consumergroup_lag_sum", "A consumer group's lag over a topic",
                                labels=["consumergroup", "topic"])
    for group, topics in sorted(_consumer_groups(store).items()):
        for topic, doc in sorted(topics.items()):
            for p, row in doc["partitions"].items():
                current.add_metric([group, topic, p], row["committed"])
                lag.add_metric([group, topic, p], row["lag"])
            lag_sum.add_metric([group, topic], doc["lag"])
    yield from (current, lag, lag_sum)


def prometheus_metrics(manager: LogManager, stats: MountStats) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_MountCollector(manager, stats))
    return generate_latest(registry)
