"""The log cleaner on real logs: compaction results, tombstones, partial cleaning, crash states, abort.

Every test works on a real ``Log`` in ``tmp_path``; kafka-python reads the
cleaned ``.log`` files as the independent check of the bytes.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from engine.cleaner import Cleaner, CleanerStats, GilYield, LogCleaner, Throttler
from engine.cleaner.cleaner_manager import (
    LogCleanerManager,
    LogCleaningPaused,
    LogCleaningStateError,
    LogToClean,
    cleanable_offsets,
)
from engine.cleaner.offset_map import BYTES_PER_ENTRY, OffsetMap
from engine.clock import ManualClock
from engine.config import BrokerConfig, LogConfig
from engine.errors import CorruptRecordError
from engine.files import CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX
from engine.log import Log
from engine.records import Compression, Record, TimestampType, encode_records, iter_batches
from engine.segment import LogSegment
from engine.topic import TopicPartition
from engine.views.index import view_index
from tests.helpers import PausedClean

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

T0 = 1_600_000_000_000          # segment mtimes of the first generation (well in the past)
DAY = 86_400_000


# ----------------------------------------------------------------------------------------- helpers

def log_config(**overrides: str) -> LogConfig:
    props = {"cleanup.policy": "compact", "internal.segment.bytes": "4096", "index.interval.bytes": "256",
             "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": str(DAY)}
    props.update(overrides)
    return LogConfig.from_props(props)


def broker_config(log_dir: Path, **overrides: str) -> BrokerConfig:
    props = {"log.dirs": str(log_dir), "log.cleaner.dedupe.buffer.size": str(4 << 20),
             "log.cleaner.io.buffer.size": str(64 << 10)}
    props.update(overrides)
    return BrokerConfig.from_props(props)


def new_log(data: Path, config: LogConfig, clock=None, name: str = "t-0") -> Log:
    d = data / name
    d.mkdir(parents=True, exist_ok=True)
    kwargs = {"clock": clock} if clock is not None else {}
    return Log.load(str(d), config, **kwargs)


def append(log: Log, pairs) -> None:
    """Append (key, value) pairs as one batch."""
    log.append_values([v for _, v in pairs], [k for k, _ in pairs])


def append_each(log: Log, pairs: Iterable[tuple[bytes, bytes]]) -> None:
    """Append each (key, value) pair as a batch of its own, then roll: all of them become cleanable."""
    for pair in pairs:
        append(log, [pair])
    log.roll()


def all_records(log: Log) -> list[Record]:
    return log.read_records(log.log_start_offset)


def set_mtimes(log: Log, start_ms: int) -> None:
    """Give the non-active segments increasing, known modification times."""
    segments = list(log.segments.values())[:-1]
    for i, segment in enumerate(segments):
        segment.set_last_modified(start_ms + i)


def cleaner_for(log: Log, memory: int = 1 << 20, load_factor: float = 0.9, io_buffer: int = 1024) -> Cleaner:
    return Cleaner(0, OffsetMap(memory, load_factor), io_buffer, 1 << 20, load_factor,
                   Throttler(float("inf")), log.clock)


def clean(log: Log, cleaner: Cleaner, first_dirty: int | None = None, now_ms: int | None = None) -> CleanerStats:
    now = log.clock.milliseconds() if now_ms is None else now_ms
    offsets = cleanable_offsets(log, first_dirty, now)
    ltc = LogToClean(log.topic_partition, log, offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset)
    return cleaner.clean(ltc)


def expected_after_clean(history: Sequence[tuple[int, bytes, bytes | None]], end: int,
                         keep_tombstone) -> list[tuple[int, bytes, bytes | None]]:
    """The model: latest record of each key below ``end``; tombstones where ``keep_tombstone(offset)``."""
    latest: dict[bytes, int] = {key: offset for offset, key, _ in history if offset < end}
    out = []
    for offset, key, value in history:
        if offset >= end or (latest[key] == offset and (value is not None or keep_tombstone(offset))):
            out.append((offset, key, value))
    return out


def contents(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in all_records(log)]


# ------------------------------------------------------------------------------- property test

ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 7), st.binary(min_size=0, max_size=40)),
        st.tuples(st.just("del"), st.integers(0, 7), st.none()),
        st.tuples(st.just("roll"), st.none(), st.none())),
    min_size=1, max_size=60)


def run_ops(log: Log, ops, history: list[tuple[int, bytes, bytes | None]]) -> None:
    for op, k, v in ops:
        if op == "roll":
            if log.active_segment.size > 0:
                log.roll()
            continue
        key = b"key-%d" % k
        first, _ = log.append_values([v], [key])
        history.append((first, key, v))
    if log.active_segment.size > 0:
        log.roll()      # everything appended becomes cleanable


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=ops_strategy, second=ops_strategy, short_retention=st.booleans())
def test_cleaning_keeps_exactly_latest_values_and_tombstones_within_horizon(tmp_path_factory, read_kafka,
                                                                             first, second, short_retention):
    data = tmp_path_factory.mktemp("data")
    retention = "0" if short_retention else str(DAY)
    log = new_log(data, log_config(**{"delete.retention.ms": retention, "internal.segment.bytes": "300"}))
    cleaner = cleaner_for(log)
    history: list[tuple[int, bytes, bytes | None]] = []
    try:
        run_ops(log, first, history)
        set_mtimes(log, T0)
        stats = clean(log, cleaner)
        end1 = stats.end_offset
        assert end1 == log.active_segment.base_offset
        # First clean: there is no clean section yet, the horizon is 0, every tombstone stays.
        assert contents(log) == expected_after_clean(history, end1, lambda offset: True)

        run_ops(log, second, history)
        set_mtimes_from = T0 + 10 * DAY
        for segment in log.segments.values():
            if segment.base_offset >= end1 and segment is not log.active_segment:
                segment.set_last_modified(set_mtimes_from + segment.base_offset)
        if log.active_segment.base_offset == end1:
            return          # nothing dirty: the manager would not choose this log again
        stats = clean(log, cleaner, first_dirty=end1)
        end2 = stats.end_offset
        assert end2 == log.active_segment.base_offset
        # Second clean: the horizon is delete.retention.ms before the clean section's last
        # mtime; with 0 ms every tombstone of the clean section goes, those of the dirty
        # section (newer) stay.
        keep = (lambda offset: offset >= end1) if short_retention else (lambda offset: True)
        expected = expected_after_clean(history, end2, keep)
        assert contents(log) == expected
        offsets = [o for o, _, _ in expected]
        assert offsets == sorted(set(offsets))
        # The bytes on disk, read by kafka-python with CRC checks, say the same.
        on_disk = [(r.offset, r.key, r.value) for r in read_kafka(Path(log.dir))]
        assert on_disk == expected
        # Every kept record is found by offset through the rebuilt indexes.
        for offset, key, value in expected:
            rec = log.read_records(offset, 1)[0]
            assert (rec.offset, rec.key, rec.value) == (offset, key, value)
        # The log reloads from disk (indexes, segments) to the same records.
        log.close()
        log = new_log(data, log.config)
        assert contents(log) == expected
    finally:
        log.close()


# ---------------------------------------------------------------------------- focused behaviour

def test_compaction_of_many_updates_keeps_timestamps_offsets_and_views(tmp_path, read_kafka):
    clock = ManualClock()
    log = new_log(tmp_path, log_config(), clock)
    history = []
    for i in range(300):
        clock.sleep(10)
        key = b"k%d" % (i % 10)
        first, _ = log.append_values([b"v%d" % i], [key])
        history.append((first, key, b"v%d" % i, clock.milliseconds()))
    log.roll()
    before = {r.offset: r for r in all_records(log)}
    segments_before = log.num_segments
    stats = clean(log, cleaner_for(log))
    after = all_records(log)
    assert [r.offset for r in after] == list(range(290, 300))
    assert all(r == before[r.offset] for r in after)            # same timestamp, key, value, headers
    assert stats.messages_read == 300
    assert stats.messages_written == 10
    assert stats.bytes_written < stats.bytes_read
    # The first round groups by the sizes before cleaning: one cleaned segment per full one.
    assert log.num_segments == segments_before
    assert [r.offset for r in read_kafka(Path(log.dir))] == list(range(290, 300))
    # The mount's text view of each cleaned segment, rebuilt by a scan (the cleaner sizes no view).
    for segment in log.segments.values():
        assert segment.attachment is None
        vi = view_index(segment)
        values = [r.value for r in after if segment.base_offset <= r.offset < segment.next_offset]
        present = [value for value in values if value is not None]
        assert present == values                        # no tombstone is left in these segments
        assert vi.text_size == sum(len(value) + 1 for value in present)
    # The next round groups the now small cleaned segments into one.
    append(log, [(b"k0", b"last")])
    log.roll()
    clean(log, cleaner_for(log), first_dirty=stats.end_offset)
    assert log.num_segments == 2            # one cleaned segment + the empty active one
    assert [r.offset for r in all_records(log)] == list(range(291, 301))
    log.close()


def test_batches_keep_compression_and_timestamp_type(tmp_path, read_kafka):
    log = new_log(tmp_path, log_config())
    records = [Record(i, 1_700_000_000_000 + i, b"k%d" % (i % 3), b"value-%d" % i, (("h", b"x"),))
               for i in range(12)]
    log.append_batch(encode_records(records, compression=Compression.GZIP,
                                    timestamp_type=TimestampType.CREATE_TIME), assign_offsets=False)
    log.roll()
    clean(log, cleaner_for(log))
    seg = log.segments.peekitem(0)[1]
    batches = list(iter_batches(seg.read_bytes(0, seg.size)))
    assert len(batches) == 1
    header = batches[0][1]
    assert header.compression == Compression.GZIP
    assert header.timestamp_type == TimestampType.CREATE_TIME
    kept = all_records(log)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in kept] == [
        (i, 1_700_000_000_000 + i, b"k%d" % (i % 3), b"value-%d" % i, (("h", b"x"),)) for i in (9, 10, 11)]
    assert [r.offset for r in read_kafka(Path(log.dir))] == [9, 10, 11]
    log.close()


def test_keyless_records_are_dropped(tmp_path):
    # A log that was not compacted when these were appended, then switched to compact.
    log = new_log(tmp_path, log_config(**{"cleanup.policy": "delete"}))
    log.append_values([b"no-key-1", b"no-key-2"])
    append(log, [(b"a", b"1"), (b"a", b"2")])
    log.roll()
    log.update_config(log_config())
    stats = clean(log, cleaner_for(log))
    assert contents(log) == [(3, b"a", b"2")]
    assert stats.invalid_messages_read == 2
    log.close()


def test_full_offset_map_cleans_only_what_it_covered(tmp_path):
    log = new_log(tmp_path, log_config(**{"internal.segment.bytes": "1000"}))
    history = []
    for i in range(200):
        key = b"key-%d" % (i % 50)
        first, _ = log.append_values([b"%d" % i], [key])
        history.append((first, key, b"%d" % i))
    log.roll()
    # Room for 20 keys: the map fills early, so one round cannot clean the whole dirty section.
    cleaner = cleaner_for(log, memory=22 * BYTES_PER_ENTRY, load_factor=0.95)
    assert cleaner.offset_map.capacity == 20
    first_uncleanable = log.active_segment.base_offset
    stats = clean(log, cleaner)
    end = stats.end_offset
    assert 0 < end < first_uncleanable
    assert cleaner.offset_map.size == 20
    assert stats.buffer_utilization == pytest.approx(20 / 22)
    # Below `end`: only the last record of each key seen before `end`; from `end` on: untouched.
    assert contents(log) == expected_after_clean(history, end, lambda o: True)
    # Further rounds continue from the checkpointed position until everything is clean.
    rounds = 1
    while end < first_uncleanable:
        end = clean(log, cleaner, first_dirty=end).end_offset
        rounds += 1
        assert rounds < 30
    assert rounds > 2
    latest = {}
    for offset, key, value in history:
        latest[key] = (offset, key, value)
    assert contents(log) == sorted(latest.values())
    log.close()


def test_group_segments_by_size_respects_segment_and_index_bytes(tmp_path):
    log = new_log(tmp_path, log_config(**{"internal.segment.bytes": "600"}))
    append_each(log, ((b"k%d" % i, b"x" * (i % 17)) for i in range(120)))
    segments = list(log.segments.values())[:-1]
    for max_size in (600, 1500, 4000):
        groups = Cleaner.group_segments_by_size(segments, max_size, 10 << 20, log.active_segment.base_offset)
        assert [s for g in groups for s in g] == segments          # every segment once, in order
        for i, group in enumerate(groups):
            assert sum(s.size for s in group) <= max_size or len(group) == 1
            if i + 1 < len(groups):                               # greedy: the next one did not fit
                assert sum(s.size for s in group) + groups[i + 1][0].size > max_size
    # The index bound applies as well.
    entry_bytes = max(s.offset_index.size_in_bytes for s in segments)
    if entry_bytes:
        groups = Cleaner.group_segments_by_size(segments, 1 << 30, entry_bytes, log.active_segment.base_offset)
        for group in groups:
            assert sum(s.offset_index.size_in_bytes for s in group) <= entry_bytes or len(group) == 1
    log.close()


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path):
    clock = ManualClock()
    log = new_log(tmp_path, log_config(**{"min.compaction.lag.ms": "1000"}), clock)
    append(log, [(b"a", b"old-1"), (b"a", b"old-2")])
    log.roll()
    young_base = log.active_segment.base_offset
    clock.sleep(5000)
    append(log, [(b"a", b"young-1"), (b"a", b"young-2")])
    log.roll()
    clock.sleep(500)                 # the second segment is only 500 ms old
    offsets = cleanable_offsets(log, None, clock.milliseconds())
    assert offsets.first_uncleanable_dirty_offset == young_base
    stats = clean(log, cleaner_for(log))
    assert stats.end_offset == young_base
    assert contents(log) == [(1, b"a", b"old-2"), (2, b"a", b"young-1"), (3, b"a", b"young-2")]
    clock.sleep(1000)                # now old enough
    clean(log, cleaner_for(log), first_dirty=young_base)
    assert contents(log) == [(3, b"a", b"young-2")]
    log.close()


# --------------------------------------------------------------------------- manager and LogCleaner

def test_filthiest_log_is_chosen_and_marked_in_progress(tmp_path):
    logs = []
    for name, dup in (("a-0", 2), ("b-0", 10)):
        log = new_log(tmp_path, log_config(**{"min.cleanable.dirty.ratio": "0.5"}), name=name)
        append_each(log, ((b"k%d" % (i % (60 // dup)), b"v") for i in range(60)))
        logs.append(log)
    manager = LogCleanerManager([str(tmp_path)], lambda: logs)
    # Nothing cleaned yet: both are 100% dirty; ties go to either, but both are cleanable.
    first = manager.grab_filthiest_log()
    second = manager.grab_filthiest_log()
    assert first is not None
    assert second is not None
    assert {first.topic_partition, second.topic_partition} == {TopicPartition("a", 0), TopicPartition("b", 0)}
    assert manager.grab_filthiest_log() is None                 # both in progress
    manager.done_cleaning(first.topic_partition, str(tmp_path), first.first_uncleanable_offset)
    manager.done_cleaning(second.topic_partition, str(tmp_path), 0)
    checkpoint = OffsetCheckpointFile(str(tmp_path / CLEANER_OFFSET_CHECKPOINT)).read()
    assert checkpoint[first.topic_partition] == first.first_uncleanable_offset
    # `first` is now all clean (ratio 0 < 0.5); `second` is still all dirty.
    third = manager.grab_filthiest_log()
    assert third is not None
    assert third.topic_partition == second.topic_partition
    assert third.cleanable_ratio == 1.0
    manager.done_cleaning(third.topic_partition, str(tmp_path), 0)
    # A ratio must be strictly above the threshold: at 1.0 nothing is chosen, but the
    # dirtiest ratio is still reported (Kafka's max-dirty-percent).
    for log in logs:
        log.update_config(log_config(**{"min.cleanable.dirty.ratio": "1.0"}))
    assert manager.grab_filthiest_log() is None
    assert manager.dirtiest_log_cleanable_ratio == 1.0
    # A log that is not compacted is never chosen, however dirty.
    logs[1].update_config(log_config(**{"cleanup.policy": "delete", "min.cleanable.dirty.ratio": "0.0"}))
    assert manager.grab_filthiest_log() is None
    for log in logs:
        log.close()


def test_dirty_ratio_counts_clean_and_dirty_bytes(tmp_path):
    log = new_log(tmp_path, log_config())
    append_each(log, ((b"k%d" % (i % 4), b"value") for i in range(40)))
    dirty_base = log.active_segment.base_offset
    append_each(log, ((b"k%d" % (i % 4), b"value") for i in range(40)))
    manager = LogCleanerManager([str(tmp_path)], lambda: [log])
    manager.update_checkpoints(str(tmp_path), partition_to_update_or_add=(log.topic_partition, dirty_base))
    clean_bytes = sum(s.size for s in log.segments.values() if s.base_offset < dirty_base)
    dirty_bytes = sum(s.size for s in log.segments.values()
                      if dirty_base <= s.base_offset < log.active_segment.base_offset)
    assert manager.dirty_ratio(log) == pytest.approx(dirty_bytes / (clean_bytes + dirty_bytes))
    state = manager.cleaner_state(log)
    assert state["cleaner_position"] == dirty_base
    log.close()


def test_log_cleaner_clean_once_end_to_end(tmp_path):
    log = new_log(tmp_path, log_config())
    append_each(log, ((b"user-%d" % (i % 25), b"state-%d" % i) for i in range(500)))
    cleaner = LogCleaner(broker_config(tmp_path), [str(tmp_path)], lambda: [log])
    stats = cleaner.clean_once()
    assert stats is not None
    assert stats.topic_partition == log.topic_partition
    assert stats.end_offset == log.active_segment.base_offset
    assert [r.offset for r in all_records(log)] == list(range(475, 500))
    checkpoint = OffsetCheckpointFile(str(tmp_path / CLEANER_OFFSET_CHECKPOINT)).read()
    assert checkpoint == {log.topic_partition: stats.end_offset}
    state = cleaner.cleaner_state(log)
    assert state["cleaner_position"] == stats.end_offset
    assert state["dirty_ratio"] == 0.0
    last_cleaning = state["last_cleaning"]
    assert isinstance(last_cleaning, dict)
    assert last_cleaning["records_written"] == 25
    # the map (25 keys, utilization in the stats) is emptied when the clean ends: its pages go back to the
    # system until the next clean, not kept resident by an idle mount
    assert stats.buffer_utilization > 0
    assert cleaner.cleaners[0].offset_map.size == 0
    # Nothing dirty any more: the caller backs off.
    assert cleaner.clean_once() is None
    # No stray files of the swap protocol remain.
    assert not [n for n in os.listdir(log.dir) if n.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX))]
    log.close()


def test_abort_cleaning_stops_a_running_clean_and_changes_nothing(tmp_path):
    log = new_log(tmp_path, log_config())
    append_each(log, ((b"k%d" % (i % 7), b"v%d" % i) for i in range(400)))
    before = contents(log)
    names_before = sorted(os.listdir(log.dir))
    # Like the LogManager, the list of logs is guarded by a lock that topic deletion holds
    # while it aborts the clean: the cleaner must never need it to finish an aborted clean.
    manager_lock = threading.Lock()

    def logs():
        with manager_lock:
            return [log]

    def delete_topic():
        with manager_lock:
            cleaner.abort_cleaning(log.topic_partition)

    cleaner = LogCleaner(broker_config(tmp_path), [str(tmp_path)], logs)
    paused = PausedClean(cleaner)      # in the middle of the clean
    aborter = threading.Thread(target=delete_topic)
    aborter.start()
    paused.wait_aborted(log.topic_partition)
    assert aborter.is_alive()          # abort_cleaning waits for the worker to stop
    stats = paused.release()
    aborter.join(10)
    assert not aborter.is_alive()
    assert stats is None
    assert contents(log) == before
    assert sorted(os.listdir(log.dir)) == names_before      # no .cleaned left behind
    assert cleaner.manager.cleaning_state(log.topic_partition) is None
    assert not os.path.exists(tmp_path / CLEANER_OFFSET_CHECKPOINT) or \
        log.topic_partition not in OffsetCheckpointFile(str(tmp_path / CLEANER_OFFSET_CHECKPOINT)).read()
    # Cleaning resumes afterwards.
    paused.restore()
    assert cleaner.clean_once() is not None
    log.close()


def test_pause_and_resume_counts(tmp_path):
    manager = LogCleanerManager([str(tmp_path)], list)
    tp = TopicPartition("t", 0)
    manager.abort_and_pause_cleaning(tp)
    manager.abort_and_pause_cleaning(tp)
    assert manager.cleaning_state(tp) == LogCleaningPaused(2)
    manager.resume_cleaning([tp])
    assert manager.cleaning_state(tp) == LogCleaningPaused(1)
    manager.resume_cleaning([tp])
    assert manager.cleaning_state(tp) is None
    with pytest.raises(LogCleaningStateError, match="not paused"):
        manager.resume_cleaning([tp])


def test_throttler_sleeps_to_hold_the_rate():
    now = {"ns": 0}
    slept: list[float] = []
    throttler = Throttler(1000.0, 300, nanoseconds=lambda: now["ns"], sleep=slept.append)
    throttler.maybe_throttle(100)            # within the first interval: no check yet
    assert slept == []
    now["ns"] = 400_000_000                   # 0.4 s for 1100 units: 2750/s against 1000/s
    throttler.maybe_throttle(1000)
    assert slept == [pytest.approx(1.1 - 0.4)]
    now["ns"] = 2_000_000_000                 # a slow period: no sleep
    throttler.maybe_throttle(10)
    assert len(slept) == 1


# ------------------------------------------------------------------------------- crash states

def _crash_log(tmp_path) -> Log:
    """The partition of the crash tests, opened (again) with its small segments."""
    return new_log(tmp_path, log_config(**{"internal.segment.bytes": "400"}))


def _reloaded(tmp_path, log: Log) -> Log:
    """``log`` closed where the test's crash left it, and its partition opened again."""
    log.close()
    return _crash_log(tmp_path)


def _assert_recovered(log: Log, expected: list[Record], read_kafka, *stray_suffixes: str) -> None:
    """The reloaded ``log`` holds ``expected`` (so does Kafka's reader of its files), and no file of it ends in
    one of ``stray_suffixes``; then it is closed."""
    assert contents(log) == expected
    assert not [n for n in os.listdir(log.dir) if n.endswith(stray_suffixes)]
    assert [(r.offset, r.key, r.value) for r in read_kafka(Path(log.dir))] == expected
    log.close()


def _prepare_crash(tmp_path):
    log = _crash_log(tmp_path)
    for i in range(80):
        # Every fifth record has a key of its own, so each segment ends with a record that
        # survives cleaning and the cleaned segment covers the group's whole offset range.
        key = b"u%d" % i if i % 5 == 4 else b"k%d" % (i % 6)
        append(log, [(key, b"v%d" % i)])
    log.roll()
    before = contents(log)
    group = list(log.segments.values())[:3]
    # Clean the first three segments into one .cleaned segment, as Cleaner.clean_segments does,
    # and stop before replace_segments: the state a crash leaves.
    cleaner = cleaner_for(log)
    stats = CleanerStats()
    cleaner.build_offset_map(log, 0, log.active_segment.base_offset, cleaner.offset_map, stats)
    cleaned = LogSegment.open(log.dir, group[0].base_offset, log.config, file_suffix=CLEANED_FILE_SUFFIX)
    for segment in group:
        cleaner.clean_into(log, segment, cleaned, cleaner.offset_map, True, stats)
    cleaned.on_becoming_inactive_segment()
    cleaned.flush()
    assert cleaned.next_offset == group[-1].next_offset
    latest = {key: offset for offset, key, _ in before}
    cleaned_records = [r for r in before if r[0] < cleaned.next_offset and latest[r[1]] == r[0]]
    assert 0 < len(cleaned_records) < cleaned.next_offset
    rest = [r for r in before if r[0] >= cleaned.next_offset]
    return log, group, cleaned, before, cleaned_records + rest


def test_crash_with_cleaned_files_is_rolled_back_on_load(tmp_path, read_kafka):
    log, _group, cleaned, before, _ = _prepare_crash(tmp_path)
    cleaned.close()
    _assert_recovered(_reloaded(tmp_path, log), before, read_kafka, CLEANED_FILE_SUFFIX)


def test_crash_after_swap_rename_is_completed_on_load(tmp_path, read_kafka):
    log, _group, cleaned, _before, after = _prepare_crash(tmp_path)
    cleaned.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
    cleaned.close()
    _assert_recovered(_reloaded(tmp_path, log), after, read_kafka, SWAP_FILE_SUFFIX, CLEANED_FILE_SUFFIX)


def test_crash_after_old_segments_partly_renamed_deleted_is_completed_on_load(tmp_path, read_kafka):
    log, group, cleaned, _before, after = _prepare_crash(tmp_path)
    cleaned.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
    cleaned.close()
    group[1].change_file_suffixes("", ".deleted")   # replace_segments got this far
    _assert_recovered(_reloaded(tmp_path, log), after, read_kafka, SWAP_FILE_SUFFIX, CLEANED_FILE_SUFFIX)


def test_batches_larger_than_the_io_buffer_grow_it(tmp_path, caplog):
    log = new_log(tmp_path, log_config(**{"internal.segment.bytes": "100000"}))
    big = [(b"k%d" % (i % 3), bytes([65 + i]) * 3000) for i in range(9)]
    append_each(log, big)
    cleaner = cleaner_for(log, io_buffer=512)
    with caplog.at_level("INFO", logger="engine.cleaner"):
        clean(log, cleaner)
    assert contents(log) == [(i, k, v) for i, (k, v) in enumerate(big)][-3:]
    assert "Growing cleaner I/O buffers from 512 bytes" in caplog.text
    assert cleaner._read_buffer_size == 512          # restored after each segment
    log.close()


def test_corrupt_batch_marks_partition_uncleanable_and_changes_nothing(tmp_path, caplog):
    log = new_log(tmp_path, log_config())
    append_each(log, ((b"k%d" % (i % 5), b"value-%d" % i) for i in range(100)))
    first = log.segments.peekitem(0)[1]
    with open(first.log_path, "r+b") as f:          # flip one byte of a record, not the framing
        f.seek(80)
        byte = f.read(1)
        f.seek(80)
        f.write(bytes([byte[0] ^ 0xFF]))
    names_before = sorted(os.listdir(log.dir))
    cleaner = LogCleaner(broker_config(tmp_path), [str(tmp_path)], lambda: [log])
    with caplog.at_level("WARNING", logger="engine.cleaner"):
        assert cleaner.clean_once() is None
    assert "Marking its partition (t-0) as uncleanable" in caplog.text
    assert cleaner.manager.uncleanable_partitions(str(tmp_path)) == {log.topic_partition}
    assert sorted(os.listdir(log.dir)) == names_before
    assert cleaner.clean_once() is None                # not chosen again
    log.close()


def test_largest_dirty_ratio_wins(tmp_path):
    logs = []
    for name in ("a-0", "b-0"):
        log = new_log(tmp_path, log_config(**{"internal.segment.bytes": "500"}), name=name)
        append_each(log, ((b"k%d" % (i % 4), b"value") for i in range(60)))
        logs.append(log)
    a, b = logs
    manager = LogCleanerManager([str(tmp_path)], lambda: logs)
    # `a` has its first half clean, `b` is all dirty; then the other way round.
    half = list(a.segments.keys())[len(a.segments) // 2]
    manager.update_checkpoints(str(tmp_path), partition_to_update_or_add=(a.topic_partition, half))
    assert manager.dirty_ratio(a) < manager.dirty_ratio(b) == 1.0
    chosen = manager.grab_filthiest_log()
    assert chosen is not None
    assert chosen.topic_partition == b.topic_partition
    assert chosen.cleanable_ratio == 1.0
    manager.done_cleaning(b.topic_partition, str(tmp_path), b.active_segment.base_offset - 1)
    chosen = manager.grab_filthiest_log()
    assert chosen is not None
    assert chosen.topic_partition == a.topic_partition
    assert chosen.first_dirty_offset == half
    manager.done_cleaning(a.topic_partition, str(tmp_path), half)
    for log in logs:
        log.close()


# ------------------------------------------------------------------- offset map filling

def test_map_filling_up_inside_one_read_chunk_stops_at_the_same_record(tmp_path):
    """A chunk holding the whole dirty section: the map stops where a record-by-record build would."""
    log = new_log(tmp_path, log_config(**{"internal.segment.bytes": "100000"}))
    history = []
    for i in range(0, 200, 4):
        pairs = [(b"key-%d" % ((i + j) % 50), b"%d" % (i + j)) for j in range(4)]
        first, _ = log.append_values([v for _, v in pairs], [k for k, _ in pairs])
        history += [(first + j, k, v) for j, (k, v) in enumerate(pairs)]
    log.roll()
    cleaner = cleaner_for(log, memory=22 * BYTES_PER_ENTRY, load_factor=0.95, io_buffer=1 << 20)
    stats = clean(log, cleaner)
    # keys 0..19 fill the map; offset 20 (key-20) is the first record it cannot take
    assert stats.end_offset == 20
    assert cleaner.offset_map.size == 20
    assert cleaner.offset_map.latest_offset == 19
    assert contents(log) == expected_after_clean(history, 20, lambda o: True)
    log.close()


def test_gil_yield_sleeps_once_per_interval():
    now = [0.0]
    sleeps: list[float] = []
    gil_yield = GilYield(0.001, 0.0, clock=lambda: now[0], sleep=sleeps.append, threads=lambda: 2)
    calls_that_slept: list[int] = []
    for call in range(1, 11):       # 0.4 ms apart: the deadline is 1 ms after the last yield
        now[0] += 0.0004
        gil_yield()
        if len(sleeps) > len(calls_that_slept):
            calls_that_slept.append(call)
    assert calls_that_slept == [3, 6, 9]
    assert sleeps == [0.0] * 3


def test_gil_yield_does_not_sleep_without_another_thread():
    now = [0.0]
    sleeps: list[float] = []
    gil_yield = GilYield(0.001, 0.0, clock=lambda: now[0], sleep=sleeps.append, threads=lambda: 1)
    for _ in range(10):
        now[0] += 0.0004
        gil_yield()
    assert sleeps == []


def test_keys_are_decoded_once_per_batch_and_retention_is_judged_by_offsets(tmp_path, monkeypatch):
    """The copy pass decides a mapped batch without tombstones by its offsets: its keys were read once."""
    import engine.cleaner.cleaner as cleaner_module
    log = new_log(tmp_path, log_config())
    for i in range(0, 400, 4):      # batches of 4 records over 30 keys: some kept whole, some rebuilt
        log.append_values([b"v%d" % j for j in range(i, i + 4)], [b"k%d" % (j % 30) for j in range(i, i + 4)])
    append(log, [(b"k1", None)])    # one batch with a tombstone: judged by its key, as before
    log.roll()
    batches = sum(1 for segment in log.segments.values() for _ in iter_batches(segment.read_bytes(0, segment.size)))
    decoded: list[int] = []
    real = cleaner_module.decode_key_columns

    def counting(buf, pos, header):
        decoded.append(header.base_offset)
        return real(buf, pos, header)

    import engine.records.kernels as kernels
    real_columns = kernels.key_columns

    def counting_columns(buf, table, records):      # the map pass's compiled walk, a chunk at a time
        decoded.extend(table[:, 1].tolist())
        return real_columns(buf, table, records)

    monkeypatch.setattr(cleaner_module, "decode_key_columns", counting)
    monkeypatch.setattr(kernels, "key_columns", counting_columns)
    stats = clean(log, cleaner_for(log))
    latest = {b"k%d" % (j % 30): j for j in range(400)}
    latest.pop(b"k1")
    assert [r.offset for r in all_records(log)] == sorted([*latest.values(), 400])
    assert stats.messages_read == 401
    assert stats.messages_written == 30
    # every batch once in the map pass, and only the tombstone's batch again in the copy pass
    assert sorted(decoded) == sorted([*range(0, 400, 4), 400, 400])
    assert len(decoded) == batches + 1
    log.close()


_KEYS = st.sampled_from([None, b"", b"a", b"bb", b"k" * 70, b"\x80" * 200])
_VALUES = st.sampled_from([None, b"", b"v", b"x" * 300])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.tuples(_KEYS, _VALUES, st.integers(0, 3)), min_size=1, max_size=12), min_size=1,
                max_size=8),
       st.one_of(st.none(), st.tuples(st.integers(0, 1 << 20), st.integers(0, 255))))
def test_the_compiled_map_pass_reads_what_the_batch_loop_reads(batches, damage):
    """engine.records.kernels.key_columns, through the cleaner's chunk walk, against decode_key_columns batch by
    batch: the same keys (by their MD5, hashed compiled), offsets, batch ends and special batches; None exactly
    when that loop finds damage."""
    from engine.cleaner.cleaner import AbortedTransactions, _map_chunk_compiled
    from engine.records import decode_key_columns
    from engine.records.reader import BatchChunk

    buf, offset = b"", 0
    for records in batches:
        built = []
        for key, value, gap in records:         # gaps: offsets as a clean leaves them
            built.append(Record(offset, 1_000 + offset, key, value, ()))
            offset += 1 + gap
        buf += encode_records(built)
    framed = list(iter_batches(buf))
    if damage is not None:                      # one byte of a records section changed (the framing stays)
        pos, header = framed[damage[0] % len(framed)]
        at = pos + 61 + damage[0] % (header.size - 61)
        buf = buf[:at] + bytes([damage[1]]) + buf[at + 1:]
    chunk = BatchChunk(0, buf, framed, len(buf))
    special: set[int] = set()
    got = _map_chunk_compiled(chunk, 0, AbortedTransactions(), special)
    keys, offsets, ends, expected_special = [], [], [], set()
    try:
        for pos, header in framed:
            batch_offsets, batch_keys, tombstones = decode_key_columns(buf, pos, header)
            base = header.base_offset
            if tombstones or None in batch_keys or batch_offsets != [*range(base, base + header.records_count)]:
                expected_special.add(base)
            pairs = [(o, k) for o, k in zip(batch_offsets, batch_keys) if k is not None]
            offsets += [o for o, _ in pairs]
            keys += [k for _, k in pairs]
            ends.append((len(keys), header.last_offset))
    except CorruptRecordError:
        assert got is None
        return
    if damage is None:
        assert got is not None      # every batch the log writes takes the compiled walk
    elif got is None:       # damaged: the walk may refuse what the loop still reads (a non-minimal varint),
        return              # never the reverse, and never another answer
    digests, got_offsets, got_ends, got_records = got
    assert [bytes(d) for d in digests] == [hashlib.md5(k).digest() for k in keys]
    assert (got_offsets.tolist(), got_ends, got_records) == (offsets, ends, sum(h.records_count for _, h in framed))
    assert special == expected_special


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from([None, b"a", b"b", b"c", b"d", b"e", b"f", b"g"]), max_size=5),
                min_size=1, max_size=8),
       st.integers(0, 6), st.integers(1, 8))
def test_the_compiled_put_of_a_chunk_stops_where_the_batch_loop_stops(batches, before, max_desired):
    """Cleaner._put_chunk_digests (the compiled map pass) against _put_chunk (keys by value): the same answer,
    the same keys in the map and the same latest offset, wherever the map reaches its load factor -- at a
    batch's first key, inside a batch, after keyless batches."""
    from engine.cleaner.cleaner import Cleaner

    keys, offsets, batch_ends = [], [], []
    offset = 0
    for batch in batches:
        for key in batch:
            if key is not None:
                keys.append(key)
                offsets.append(offset)
            offset += 1
        batch_ends.append((len(keys), offset - 1 if batch else offset))
        offset += 1 if not batch else 0
    by_keys, by_digests = OffsetMap(40 * BYTES_PER_ENTRY, 1.0), OffsetMap(40 * BYTES_PER_ENTRY, 1.0)
    for m in (by_keys, by_digests):
        for i in range(before):                       # keys from earlier chunks
            m.put(b"old-%d" % i, i - 100)
    digests = np.frombuffer(b"".join(hashlib.md5(k).digest() for k in keys), dtype=np.uint8).reshape(-1, 16)
    expected = Cleaner._put_chunk(by_keys, keys, offsets, batch_ends, max_desired)
    got = Cleaner._put_chunk_digests(by_digests, digests, np.array(offsets, dtype=np.int64), batch_ends,
                                     max_desired)
    assert got == expected
    assert (by_digests.size, by_digests.latest_offset) == (by_keys.size, by_keys.latest_offset)
    probes = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", *(b"old-%d" % i for i in range(before))]
    assert [by_digests.get(k) for k in probes] == [by_keys.get(k) for k in probes]
