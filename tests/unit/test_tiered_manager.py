"""Tiered storage wired into the LogManager: topic settings, the copy round, remote retention, a store that fails.

Real parts only: a LogManager over a real data dir, a directory store
(``file://``), the metadata log in the data dir; a store that fails is a store
directory replaced by a file (every write to it then fails with ENOTDIR).
"""

from __future__ import annotations

import json as _json
import logging
import os
import re
import shutil
import struct as _struct
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.errors import InvalidConfigError, OffsetOutOfRangeError
from engine.manager import LogManager
from engine.remote.remote_log_manager import MAX_BACKOFF_MS
from engine.remote.storage import FileRemoteStorage, open_remote_storage
from engine.topic import TopicPartition
from tests.helpers import log_of
from tests.unit.test_transactions import _LiveModel, _op_batch  # before any @given runs: it has its own

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from engine.log import Log
    from engine.remote.metadata import RemoteLogSegmentMetadata
    from engine.remote.remote_log_manager import RemoteLogManager
    from engine.remote.storage import TopicIdPartition

TP = TopicPartition("t", 0)


def _manager(tmp_path: Path, *, tiered: bool = True, clock: ManualClock | None = None) -> LogManager:
    config = BrokerConfig.from_props({"log.dirs": str(tmp_path / "data"), "internal.log.segment.bytes": "4096",
                                      "remote.log.storage.system.enable": "true" if tiered else "false",
                                      "remote.log.manager.task.interval.ms": "1000"})
    (tmp_path / "store").mkdir(parents=True, exist_ok=True)
    storage = open_remote_storage({"rsm.config.uri": f"file://{tmp_path / 'store'}"}) if tiered else None
    manager = LogManager(config, clock=clock or ManualClock(1_700_000_000_000), remote_storage=storage,
                         remote_cache_bytes=1 << 20, remote_chunk_bytes=4096)
    manager.startup()
    return manager


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[LogManager]:
    m = _manager(tmp_path)
    yield m
    m.shutdown()


def _fill(manager: LogManager, lines: int, tp: TopicPartition = TP) -> None:
    log = manager.get_log(tp)
    assert log is not None
    for start in range(0, lines, 50):
        log.append_values([b"line-%06d-%s" % (i, b"x" * 40) for i in range(start, min(start + 50, lines))])
    log.flush()


def _copied(manager: LogManager, lines: int = 600) -> tuple[RemoteLogManager, Log, TopicIdPartition, int]:
    """Topic ``t`` with ``remote.storage.enable``, ``lines`` lines appended and its closed segments copied:
    (the RemoteLogManager, the log, its TopicIdPartition, the copies made)."""
    manager.create_topic("t", 1, {"remote.storage.enable": "true"})
    _fill(manager, lines)
    copied = manager.copy_to_remote_storage()
    rlm = manager.remote_log_manager
    log = manager.get_log(TP)
    assert rlm is not None
    assert log is not None
    tiered = manager.tiered_partition(log)
    assert tiered is not None
    return rlm, log, tiered.tip, copied


def _unmounted_copies(tmp_path: Path) -> tuple[list[RemoteLogSegmentMetadata], TopicIdPartition, int]:
    """_copied by a mount over ``tmp_path``, then unmounted: the copies' metadata, their TopicIdPartition and
    the copies made."""
    manager = _manager(tmp_path)
    try:
        rlm, _log, tip, copied = _copied(manager)
        return rlm.metadata.copied_segments(tip), tip, copied
    finally:
        manager.shutdown()


def _trimmed(manager: LogManager, lines: int = 1200) -> Log:
    """Topic ``t`` with ``remote.storage.enable`` and a local retention of 12,000 bytes, ``lines`` lines
    appended: its log (nothing copied yet, so nothing local deleted)."""
    manager.create_topic("t", 1, {"remote.storage.enable": "true", "local.retention.bytes": "12000"})
    _fill(manager, lines)
    log = manager.get_log(TP)
    assert log is not None
    return log


def _store_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())


def test_remote_storage_enable_is_refused_without_remote_storage_and_on_compacted_topics(tmp_path: Path):
    plain = _manager(tmp_path / "plain", tiered=False)
    try:
        plain.create_topic("t", 1)
        with pytest.raises(InvalidConfigError, match="the mount has no remote storage"):
            plain.validate_topic_overrides("t", {"remote.storage.enable": "true"})
        with pytest.raises(InvalidConfigError, match=re.escape("remote.log.storage.system.enable=true")):
            plain.alter_topic_config("t", {"remote.storage.enable": "true"})
        assert plain.topic_overrides("t") == {}
        plain.alter_topic_config("t", {"local.retention.bytes": "100"})    # harmless without remote storage
    finally:
        plain.shutdown()
    tiered = _manager(tmp_path / "tiered")
    try:
        tiered.create_topic("c", 1, {"cleanup.policy": "compact"})
        with pytest.raises(InvalidConfigError, match="unsupported for the compacted topics"):
            tiered.alter_topic_config("c", {"remote.storage.enable": "true"})
        # a config write's lines are checked with the overrides they would leave (as close() applies them)
        with pytest.raises(InvalidConfigError, match="unsupported for the compacted topics"):
            tiered.validate_topic_overrides("c", {"remote.storage.enable": "true"})
        tiered.validate_topic_overrides("c", {"cleanup.policy": None, "remote.storage.enable": "true"})
        tiered.create_topic("t", 1)
        tiered.alter_topic_config("t", {"remote.storage.enable": "true"})
        with pytest.raises(InvalidConfigError, match=re.escape("cleanup.policy=compact")):
            tiered.validate_topic_overrides("t", {"cleanup.policy": "compact"})
        with pytest.raises(InvalidConfigError, match=re.escape("cleanup.policy=compact")):
            tiered.alter_topic_config("t", {"cleanup.policy": "compact"})
        with pytest.raises(InvalidConfigError, match=re.escape("local.retention.bytes: Value must not be more than "
                                                               "retention.bytes property value: 1000")):
            tiered.alter_topic_config("t", {"retention.bytes": "1000", "local.retention.bytes": "2000"})
        with pytest.raises(InvalidConfigError, match=re.escape("local.retention.ms: Value must not be -1")):
            tiered.alter_topic_config("t", {"local.retention.ms": "-1"})
        with pytest.raises(InvalidConfigError, match=re.escape("local.retention.ms: Value must be at least -2")):
            tiered.validate_topic_overrides("t", {"local.retention.ms": "-3"})
        with pytest.raises(InvalidConfigError, match="unsupported for the compacted topics"):
            tiered.create_topic("d", 1, {"cleanup.policy": "compact,delete", "remote.storage.enable": "true"})
        assert tiered.topic_overrides("t") == {"remote.storage.enable": "true"}
        assert tiered.topic_config("t").effective_local_retention_bytes == -1     # -2: retention.bytes
    finally:
        tiered.shutdown()


def test_a_round_copies_closed_flushed_segments_of_remote_enabled_topics_only(manager: LogManager, tmp_path: Path):
    manager.create_topic("t", 1)
    manager.create_topic("local", 1)
    _fill(manager, 600)
    _fill(manager, 600, TopicPartition("local", 0))
    assert manager.copy_to_remote_storage() == 0              # no topic has remote.storage.enable yet
    manager.alter_topic_config("t", {"remote.storage.enable": "true"})
    log = manager.get_log(TP)
    assert log is not None
    closed = list(log.segments.values())[:-1]
    assert len(closed) >= 5
    rlm = manager.remote_log_manager
    assert rlm is not None
    tip = manager.tiered_partition(log).tip                   # type: ignore[union-attr]
    assert rlm.copy_lag(log, tip) == (len(closed), sum(s.size for s in closed))
    assert manager.copy_to_remote_storage() == len(closed)
    assert rlm.remote_log_size(tip) == (len(closed), sum(s.size for s in closed), closed[-1].next_offset - 1)
    assert rlm.copy_lag(log, tip) == (0, 0)
    assert {m.segment_id.topic_id_partition.topic for m in rlm.metadata.copied_segments(tip)} == {"t"}
    assert manager.copy_to_remote_storage() == 0              # idempotent
    # the segments closed since are copied at the next round; the active one never
    log.append_values([b"y" * 3000, b"z" * 3000])
    manager.copy_to_remote_storage()
    assert rlm.metadata.highest_copied_offset(tip) == list(log.segments.values())[-2].next_offset - 1
    assert rlm.metadata.highest_copied_offset(tip) < log.active_segment.base_offset + 1
    # the copy is byte for byte the local segment
    assert rlm.read(tip, 0, 1 << 20)[2] == log.segments[0].read_bytes(0, log.segments[0].size)


def _wait_out_the_delete_delay(manager: LogManager) -> None:
    """The copies a round found below the log start go at the first round file.delete.delay.ms later."""
    manager.clock.sleep(manager.get_log(TP).config.file_delete_delay_ms)     # type: ignore[attr-defined, union-attr]


def test_delete_records_retention_and_topic_deletion_delete_the_remote_copies(manager: LogManager, tmp_path: Path):
    rlm, _log, tip, copied = _copied(manager)
    assert copied >= 5
    third = rlm.metadata.copied_segments(tip)[2]
    manager.delete_records(TP, third.start_offset + 1)        # inside the third copy: the first two go
    assert manager.copy_to_remote_storage() == 0              # not before file.delete.delay.ms
    _wait_out_the_delete_delay(manager)
    assert manager.copy_to_remote_storage() == 2
    assert next(m.start_offset for m in rlm.metadata.copied_segments(tip)) == third.start_offset
    assert len(_store_files(tmp_path)) == 6 * (copied - 2)
    manager.delete_topic("t")
    assert manager.copy_to_remote_storage() == copied - 2
    assert rlm.metadata.partitions() == []
    assert _store_files(tmp_path) == []
    # a topic of the same name is a new incarnation (a new topic id): nothing of the old one comes back
    manager.create_topic("t", 1, {"remote.storage.enable": "true"})
    _fill(manager, 600)
    assert manager.copy_to_remote_storage() >= 5
    new_log = manager.get_log(TP)
    assert manager.tiered_partition(new_log).tip != tip       # type: ignore[arg-type, union-attr]


def test_a_failing_store_is_logged_once_and_backed_off_then_copies_resume(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture):
    clock = ManualClock(1_700_000_000_000)
    manager = _manager(tmp_path, clock=clock)
    try:
        manager.create_topic("t", 1, {"remote.storage.enable": "true"})
        _fill(manager, 600)
        store = tmp_path / "store"
        shutil.rmtree(store)
        store.write_bytes(b"not a directory: every copy to it fails")
        rlm = manager.remote_log_manager
        assert rlm is not None
        caplog.set_level(logging.INFO, logger="engine.remote")
        attempts = []
        for _ in range(12):
            errors = rlm.errors
            manager.copy_to_remote_storage()
            attempts.append(rlm.errors - errors)
            clock.sleep(1000)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert str(store) in warnings[0].getMessage()
        assert attempts[0] == 1, attempts
        assert 1 < sum(attempts) < 6, attempts         # backing off: 1, 2, 4, 8 s
        assert rlm.outage
        os.unlink(store)
        store.mkdir()
        clock.sleep(MAX_BACKOFF_MS)
        log = manager.get_log(TP)
        assert log is not None
        assert manager.copy_to_remote_storage() >= len(log.segments) - 1
        assert not rlm.outage
        assert any("answers again" in r.getMessage() for r in caplog.records)
        tip = manager.tiered_partition(log).tip
        assert rlm.copy_lag(log, tip) == (0, 0)
        assert {s.id for s in rlm.storage.list_segment_ids(tip)} == \
            {m.segment_id.id for m in rlm.metadata.copied_segments(tip)}
        assert rlm.metadata.unfinished(tip) == []         # the copies abandoned in the outage are finished off
    finally:
        manager.shutdown()


def test_copies_survive_a_restart_and_unfinished_ones_are_cleaned_up(tmp_path: Path):
    manager = _manager(tmp_path)
    rlm, _log, tip, copied = _copied(manager)
    # what a crash after COPY_SEGMENT_STARTED leaves: the event, some objects, no FINISHED
    from engine.remote.metadata import RemoteLogSegmentMetadata, RemoteLogSegmentState
    from engine.remote.storage import RemoteLogSegmentId
    orphan = RemoteLogSegmentId.generate(tip, 10_000)
    rlm.metadata.add(RemoteLogSegmentMetadata(orphan, 10_000, 10_010, 0, 100, 0,
                                              RemoteLogSegmentState.COPY_SEGMENT_STARTED))
    rlm.storage._put(orphan.object_name("index"), b"")
    manager.shutdown()
    assert os.path.isdir(tmp_path / "data" / "remote-log" / "__remote_log_metadata-0")
    manager = _manager(tmp_path)
    try:
        assert manager.topics() == ["t"]                      # remote-log/ is not a topic
        restarted = manager.remote_log_manager
        assert restarted is not None
        rlm = restarted
        assert rlm.remote_log_size(tip)[0] == copied
        assert [m.segment_id for m in rlm.metadata.unfinished(tip)] == [orphan]
        manager.copy_to_remote_storage()
        assert rlm.metadata.unfinished(tip) == []
        assert len(_store_files(tmp_path)) == 6 * copied
    finally:
        manager.shutdown()


# ------------------------------------------------------------------ reads of copies (not wired to the mount yet)

def test_a_remote_log_segment_renders_in_a_view_exactly_as_its_local_segment(manager: LogManager, tmp_path: Path):
    from engine.remote.remote_segment import RemoteLogSegment, RemoteReadError
    from engine.views.log_view import LogView, ViewFormat

    rlm, log, tip, copied = _copied(manager)
    assert copied >= 5
    for metadata in rlm.metadata.copied_segments(tip):
        remote = RemoteLogSegment(rlm, metadata, TP)
        local = log.segments[metadata.start_offset]
        assert (remote.base_offset, remote.next_offset, remote.size) == (local.base_offset, local.next_offset,
                                                                         local.size)
        for fmt in (ViewFormat.TEXT, ViewFormat.JSONL):
            for start in (None, metadata.start_offset + 7):
                expected = LogView(log, fmt, start, segment=local)
                got = LogView(log, fmt, start, segment=remote)    # type: ignore[arg-type]  # a LogSegment to the views
                assert got.size() == expected.size() > 0
                assert got.read(0, got.size()) == expected.read(0, expected.size())
                assert got.read(5, 100) == expected.read(5, 100)
        wanted = metadata.start_offset + 13
        position, header = remote.first_batch_at_or_after(wanted)         # type: ignore[misc]
        assert header.base_offset <= wanted <= header.last_offset
        assert local.translate_offset(wanted).position == position
    assert rlm.cache.fetched_bytes > 0
    # the store gone: a read fails with the store's errno, naming the segment, never a short read
    metadata = rlm.metadata.copied_segments(tip)[-1]
    shutil.rmtree(tmp_path / "store")
    rlm.cache.forget(lambda s: True)
    with pytest.raises(RemoteReadError, match="Reading remote log segment") as failed:
        RemoteLogSegment(rlm, metadata, TP).read_bytes(0, 100)
    assert failed.value.errno == 2


# ------------------------------------------------------------------ local retention and reads below the local start

def _expected_text(lines: int, first: int = 0) -> bytes:
    return b"".join(b"line-%06d-%s\n" % (i, b"x" * 40) for i in range(first, lines))


def test_a_view_reads_on_from_the_copy_of_a_segment_local_retention_deleted_under_it(manager: LogManager):
    # the torture harness's --tiered kill -9 run (seed 224805676) found it: `records.jsonl` failed with ENOENT
    # ("Segment ... was deleted after this view read past it") when local retention deleted a copied segment
    # whose slot the view had let go of, and a read came back into it (the kernel's reads of one file may
    # arrive out of order); the records were in the store all along
    import gc

    from engine.views.log_view import LogView, ViewFormat

    log = _trimmed(manager)
    views, rendered = [], []
    for fmt in (ViewFormat.TEXT, ViewFormat.JSONL):
        view = LogView(log, fmt)
        size = view.size()
        rendered.append(b"".join(view.read(position, 4096) for position in range(0, size, 4096)))
        assert view.held_segments() == 1             # read to the end: it let go of every slot but the last
        views.append(view)
    assert rendered[0] == _expected_text(1200)
    first_base = log.segments.peekitem(0)[0]
    manager.copy_to_remote_storage()
    assert manager.cleanup_logs() > 0                  # local retention deletes the copied segments
    manager.clock.sleep(log.config.file_delete_delay_ms + 1)     # type: ignore[attr-defined]
    manager.delete_expired_segment_files()
    gc.collect()
    assert log.local_log_start_offset > first_base
    for view, before in zip(views, rendered):
        assert view.readable_from() == 0               # a new reader of the followed view starts at the start
        assert view.read(0, len(before)) == before     # from the copies, byte for byte
        assert view.read(100, 50) == before[100:150]
        view.close()


def test_local_retention_deletes_only_copied_segments_and_reads_below_the_local_start_come_from_the_store(
        tmp_path: Path):
    from engine.views.log_view import LogView, ViewFormat, record_at

    manager = _manager(tmp_path)
    try:
        log = _trimmed(manager)
        local_before = len(log.segments)
        assert manager.cleanup_logs() == 0                    # nothing copied yet: nothing local goes
        assert len(log.segments) == local_before
        manager.copy_to_remote_storage()
        assert manager.cleanup_logs() > 0
        assert log.log_start_offset == 0 < log.local_log_start_offset
        # the log start is checkpointed before the first local segment moves above it (a crash keeps it)
        checkpoint = (tmp_path / "data" / "log-start-offset-checkpoint").read_text().split("\n")
        assert "t 0 0" in checkpoint, checkpoint
        assert sum(s.size for s in log.segments.values()) <= 12000 + 4096      # as retention.bytes: within a segment
        local_start = log.local_log_start_offset
        # every view, from the log start: the remote segments, then the local ones
        text = LogView(log, ViewFormat.TEXT)
        assert text.read(0, text.size()) == _expected_text(1200)
        jsonl = LogView(log, ViewFormat.JSONL)
        rows = jsonl.read(0, jsonl.size()).splitlines()
        assert len(rows) == 1200
        assert b'"offset":0,' in rows[0]
        assert b'"offset":1199,' in rows[-1]
        below = LogView(log, ViewFormat.TEXT, local_start - 30)
        assert below.read(0, below.size()) == _expected_text(1200, local_start - 30)
        assert record_at(log, 7).value == b"line-000007-" + b"x" * 40
        assert [r.offset for r in log.read_records(5, 3)] == [5, 6, 7]
        assert log.fetch_offset_by_timestamp(0) == (0, log.read_records(0, 1)[0].timestamp)
        # local segments deleted later are held by nothing once no view reads them (their disk space goes)
        import gc
        import weakref
        text.close()
        below.close()
        jsonl.close()
        _fill(manager, 600)
        manager.copy_to_remote_storage()
        going = [weakref.ref(s) for s in list(log.segments.values())[:3]]
        assert manager.cleanup_logs() > 0
        assert log.local_log_start_offset > local_start
        manager.clock.sleep(log.config.file_delete_delay_ms + 1)     # type: ignore[attr-defined]
        assert manager.delete_expired_segment_files() >= 3           # the .deleted files go
        gc.collect()
        assert [r() for r in going] == [None, None, None]
        local_start = log.local_log_start_offset
        # turning tiering off would drop what only the store holds
        with pytest.raises(InvalidConfigError, match="only in remote storage"):
            manager.alter_topic_config("t", {"remote.storage.enable": "false"})
    finally:
        manager.shutdown()
    # a restart keeps the log start below the local segments (checkpointed) and reads on from the store
    manager = _manager(tmp_path)
    try:
        log = log_of(manager, TP)
        assert log.log_start_offset == 0
        assert log.local_log_start_offset == local_start
        text = LogView(log, ViewFormat.TEXT)
        assert text.read(0, text.size()) == _expected_text(1200) + _expected_text(600)    # 600 more appended above
        # retention.bytes bounds the whole log: the log start moves, and the round deletes the copies below
        rlm = manager.remote_log_manager
        assert rlm is not None
        tip = manager.tiered_partition(log).tip               # type: ignore[union-attr]
        copies = rlm.remote_log_size(tip)[0]
        manager.alter_topic_config("t", {"retention.bytes": "30000"})
        manager.cleanup_logs()
        assert log.log_start_offset > 0
        manager.copy_to_remote_storage()
        _wait_out_the_delete_delay(manager)
        manager.copy_to_remote_storage()
        assert rlm.remote_log_size(tip)[0] < copies
        assert all(m.end_offset >= log.log_start_offset for m in rlm.metadata.copied_segments(tip))
        text = LogView(log, ViewFormat.TEXT)
        every_line = (_expected_text(1200) + _expected_text(600)).splitlines(keepends=True)
        assert text.read(0, text.size()) == b"".join(every_line[log.log_start_offset:])
    finally:
        manager.shutdown()
    # a mount without remote storage refuses a data dir whose records are partly only in the store, as
    # does the move to Kafka (naming the partition: nothing is silently left behind)
    from logfs.to_kafka import inspect, refuse_remote_only
    with pytest.raises(Exception, match=r"t-0: offsets \d+ to \d+ only in remote storage"):
        refuse_remote_only(inspect([str(tmp_path / "data")]), [str(tmp_path / "data")])
    with pytest.raises(Exception, match="only in remote storage"):
        _manager(tmp_path, tiered=False)


def test_remote_log_segments_serve_their_files_byte_for_byte_and_never_short(tmp_path: Path):
    """segments/ and the Spark source read a copy's .log, .index and .timeindex through RemoteLogSegment.read_file:
    the bytes the local files held, sized from the metadata (no request), and EIO when the store holds less."""
    import dataclasses
    import errno
    from pathlib import Path

    from crc32c import crc32c

    from engine.files import INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX, SEGMENT_FILE_SUFFIXES, TIME_INDEX_FILE_SUFFIX
    from engine.remote.metadata import RemoteLogSegmentMetadata
    from engine.remote.remote_segment import RemoteLogSegment, RemoteReadError
    from engine.views.log_view import LogView, ViewFormat

    manager = _manager(tmp_path)
    try:
        log = _trimmed(manager)
        kept = {s.base_offset: {suffix: Path(path).read_bytes() for suffix, path in
                                ((LOG_FILE_SUFFIX, s.log_path), (INDEX_FILE_SUFFIX, s.offset_index.path),
                                 (TIME_INDEX_FILE_SUFFIX, s.time_index.path))}
                for s in list(log.segments.values())[:-1]}
        manager.copy_to_remote_storage()
        manager.cleanup_logs()
        remote = [s for s in log.reader_segments().values() if isinstance(s, RemoteLogSegment)]
        assert len(remote) >= 3
        assert [s.base_offset for s in remote] == [b for b in sorted(kept) if b < log.local_log_start_offset]
        for segment in remote:
            for suffix in SEGMENT_FILE_SUFFIXES:
                original = kept[segment.base_offset][suffix]
                assert segment.file_size(suffix) == len(original), (segment, suffix)
                assert segment.read_file(suffix, 0, 1 << 20) == original, (segment, suffix)
                assert segment.read_file(suffix, 5, 17) == original[5:22]
                assert segment.read_file(suffix, len(original), 10) == b""
        # a copy recorded before the metadata held its index sizes: its indexes are fetched to size them
        rlm = manager.remote_log_manager
        assert rlm is not None
        older = dataclasses.replace(remote[0].metadata, offset_index_size_bytes=None, time_index_size_bytes=None,
                                    offset_index_crc32c=None)
        assert RemoteLogSegmentMetadata.from_event(older.to_event()) == older
        assert RemoteLogSegmentMetadata.from_event(remote[0].metadata.to_event()) == remote[0].metadata
        unsized = RemoteLogSegment(rlm, older, TP)
        for suffix in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):
            assert unsized.file_size(suffix) == len(kept[0][suffix])
            assert unsized.read_file(suffix, 0, 1 << 20) == kept[0][suffix]
        # what binds a kept view index to the copy: its offset index's CRC, from the metadata or the store
        entries = len(kept[0][INDEX_FILE_SUFFIX]) // 8
        assert remote[0].metadata.offset_index_crc32c == crc32c(kept[0][INDEX_FILE_SUFFIX])
        for segment in (remote[0], unsized):
            assert segment.offset_index_crc(entries) == crc32c(kept[0][INDEX_FILE_SUFFIX])
            assert segment.offset_index_crc(entries - 1) == crc32c(kept[0][INDEX_FILE_SUFFIX][:-8])
            assert segment.offset_index_crc(entries + 1) is None
        # the views of the store's range, sized once (their view indexes kept for the copies)
        assert LogView(log, ViewFormat.TEXT).size() == len(_expected_text(1200))
        rendered = LogView(log, ViewFormat.JSONL, segment=remote[1]).size()     # type: ignore[arg-type]
        # a new manager sizes every file from the metadata log alone: the store is not asked
        manager.shutdown()
        manager = _manager(tmp_path)
        log = log_of(manager, TP)
        store = tmp_path / "store"
        moved = tmp_path / "store-gone"
        store.rename(moved)
        try:
            remote = [s for s in log.reader_segments().values() if isinstance(s, RemoteLogSegment)]
            for segment in remote:
                for suffix in SEGMENT_FILE_SUFFIXES:
                    assert segment.file_size(suffix) == len(kept[segment.base_offset][suffix])
            # the renderings of the whole log and of one copy are sized by the view indexes kept for the copies,
            # bound to them by the metadata's CRC of their offset indexes
            assert LogView(log, ViewFormat.TEXT).size() == len(_expected_text(1200))
            assert LogView(log, ViewFormat.JSONL, segment=remote[1]).size() == rendered   # type: ignore[arg-type]
            with pytest.raises(RemoteReadError) as gone:
                remote[0].read_file(LOG_FILE_SUFFIX, 0, 100)
            assert gone.value.errno == errno.ENOENT
        finally:
            moved.rename(store)
        # a copy the store holds fewer bytes of than its metadata says: EIO, not a short read
        first = remote[0]
        (log_object,) = [p for p in store.rglob("*.log") if p.name.startswith("%020d-" % first.base_offset)]
        log_object.write_bytes(log_object.read_bytes()[:-10])
        with pytest.raises(RemoteReadError, match=r"not the \d+ its metadata says") as short:
            first.read_file(LOG_FILE_SUFFIX, 0, 1 << 20)
        assert short.value.errno == errno.EIO
    finally:
        manager.shutdown()


def test_the_spark_source_reads_from_the_log_start_not_the_local_log_start(tmp_path: Path):
    """The logfs Spark source reads the remote log segments through segments/: the records only in the store
    are not lost to it (failOnDataLoss)."""
    import json as _json

    from logfs.spark.mount_client import offset_bounds

    part = tmp_path / "mnt" / "t" / "0"
    part.mkdir(parents=True)
    (part / "state").write_text(_json.dumps({"log_start_offset": 0, "local_log_start_offset": 700,
                                             "log_end_offset": 1200, "segments": [], "remote_segments": []}))
    assert offset_bounds(str(tmp_path / "mnt"), "t", 0) == (0, 1200)


def test_read_committed_views_hide_aborted_transactions_held_only_in_remote_storage(tmp_path: Path):
    """The aborted-transaction walk reads the remote log segments too: an aborted batch copied and deleted
    locally stays hidden."""
    import json as _json
    import struct

    from engine.views.log_view import LogView, ViewFormat
    from tests.unit.test_transactions import ABORT, _batch

    config = BrokerConfig.from_props({"log.dirs": str(tmp_path / "data"), "internal.log.segment.bytes": "4096",
                                      "remote.log.storage.system.enable": "true",
                                      "isolation.level": "read_committed"})
    (tmp_path / "store").mkdir()
    manager = LogManager(config, clock=ManualClock(1_700_000_000_000),
                         remote_storage=open_remote_storage({"rsm.config.uri": f"file://{tmp_path / 'store'}"}),
                         remote_cache_bytes=1 << 20, remote_chunk_bytes=4096)
    manager.startup()
    try:
        manager.create_topic("t", 1, {"remote.storage.enable": "true", "local.retention.bytes": "8000"})
        log = manager.get_log(TP)
        assert log is not None
        visible: list[int] = []
        log.append_as_follower(_batch(0, [b"aborted-%d" % i for i in range(5)], producer_id=7, transactional=True))
        log.append_as_follower(_batch(5, [], producer_id=7, transactional=True,
                                      control=struct.pack(">hh", 0, ABORT)))
        offset = 6
        while offset < 1500:
            log.append_as_follower(_batch(offset, [b"plain-%06d-%s" % (offset + i, b"y" * 40) for i in range(10)]))
            visible += range(offset, offset + 10)
            offset += 10
        log.flush()
        manager.copy_to_remote_storage()
        manager.cleanup_logs()
        assert log.local_log_start_offset > 100
        assert log.log_start_offset == 0
        log.transaction_state = None                  # walked afresh: only the store holds the marker now
        view = LogView(log, ViewFormat.JSONL)
        assert [_json.loads(line)["offset"] for line in view.read(0, view.size()).splitlines()] == visible
    finally:
        manager.shutdown()


class _CountingStorage(FileRemoteStorage):
    """The directory store, counting the GETs of each kind of object and the bytes they returned (not a mock:
    every call goes to the directory)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.gets: Counter[str] = Counter()
        self.got_bytes: Counter[str] = Counter()

    def _get(self, name: str, start: int, end: int | None) -> bytes:
        data = super()._get(name, start, end)
        suffix = name.rpartition(".")[2]
        self.gets[suffix] += 1
        self.got_bytes[suffix] += len(data)
        return data


def _transactional_manager(tmp_path: Path, storage: FileRemoteStorage) -> LogManager:
    config = BrokerConfig.from_props({"log.dirs": str(tmp_path / "data"), "internal.log.segment.bytes": "4096",
                                      "remote.log.storage.system.enable": "true",
                                      "isolation.level": "read_committed"})
    storage.check()
    manager = LogManager(config, clock=ManualClock(1_700_000_000_000), remote_storage=storage,
                         remote_cache_bytes=1 << 20, remote_chunk_bytes=4096)
    manager.startup()
    return manager


def _append_transactions(log: Log) -> list[int]:
    """Plain batches, committed and aborted transactions of three producers over many segments, a transaction
    of producer 1003 open from the start and aborted by the last batch, and one of producer 1004 left open:
    the offsets a read_committed consumer sees."""
    import random
    import struct

    from tests.unit.test_transactions import ABORT, COMMIT, _batch

    rng = random.Random(37)
    visible: list[int] = []
    ongoing: dict[int, list[int]] = {}
    offset = 0

    def data(pid: int, n: int) -> None:
        nonlocal offset
        log.append_as_follower(_batch(offset, [b"tx%d-%06d-%s" % (pid, offset + i, b"t" * 60) for i in range(n)],
                                      producer_id=pid, transactional=True))
        ongoing.setdefault(pid, []).extend(range(offset, offset + n))
        offset += n

    def end(pid: int, commit: bool) -> None:
        nonlocal offset, visible
        log.append_as_follower(_batch(offset, [], producer_id=pid, transactional=True,
                                      control=struct.pack(">hh", 0, COMMIT if commit else ABORT)))
        if commit:
            visible = sorted(visible + ongoing.get(pid, []))
        ongoing.pop(pid, None)
        offset += 1

    data(1003, 3)
    while offset < 1500:
        choice = rng.random()
        if choice < 0.4:
            n = rng.randint(1, 8)
            log.append_as_follower(_batch(offset, [b"plain-%06d-%s" % (offset + i, b"p" * 60) for i in range(n)]))
            visible += range(offset, offset + n)
            offset += n
        elif choice < 0.8:
            data(rng.choice((1000, 1001, 1002)), rng.randint(1, 5))
        else:
            pid = rng.choice((1000, 1001, 1002))
            if pid in ongoing:
                end(pid, rng.random() < 0.5)
    data(1004, 2)
    data(1003, 2)
    end(1003, False)
    return visible


def _tiered_transactions(tmp_path: Path) -> tuple[_CountingStorage, LogManager, Log, list[int]]:
    """A mount over a new store (``tmp_path / "store"``) with topic t tiered, keeping 8000 bytes locally, and
    _append_transactions' batches appended and flushed: the store, the manager (to shut down), the log and the
    offsets a read_committed consumer sees."""
    store = tmp_path / "store"
    store.mkdir()
    counting = _CountingStorage(str(store))
    manager = _transactional_manager(tmp_path, counting)
    try:
        manager.create_topic("t", 1, {"remote.storage.enable": "true", "local.retention.bytes": "8000"})
        log = log_of(manager, TP)
        visible = _append_transactions(log)
        log.flush()
    except BaseException:
        manager.shutdown()
        raise
    return counting, manager, log, visible


def _copy_and_clean_up(manager: LogManager) -> RemoteLogManager:
    """Copies the closed segments to the store, then deletes the local ones beyond local retention: the
    remote log manager."""
    manager.copy_to_remote_storage()
    manager.cleanup_logs()
    rlm = manager.remote_log_manager
    assert rlm is not None
    return rlm


def test_read_committed_views_over_remote_storage_take_the_copies_transaction_indexes_and_snapshots(
        tmp_path: Path):
    """Each copy carries its transaction index and producer snapshot; the aborted-transaction walk of a new
    mount takes them instead of fetching the copies' batches (not one byte of a .log for a walk of the
    whole log), and every view shows the same bytes as when the log was all local: a transaction aborted by
    a local marker hides its batches in the store (the snapshot said it was open), one without a marker is
    hidden too."""
    from engine import transactions
    from engine.views.log_view import LogView, ViewFormat, record_at

    def render(log: Log) -> tuple[bytes, bytes]:
        out = []
        for fmt in (ViewFormat.JSONL, ViewFormat.TEXT):
            view = LogView(log, fmt)
            try:
                out.append(view.read(0, view.size()))
            finally:
                view.close()
        return out[0], out[1]

    _, manager, log, visible = _tiered_transactions(tmp_path)
    try:
        jsonl, text = render(log)                              # all local
        assert [_json.loads(line)["offset"] for line in jsonl.splitlines()] == visible
        aborted = transactions.read_committed_state(log).aborted_transactions()   # type: ignore[union-attr]
        assert len(aborted) > 10
        rlm = _copy_and_clean_up(manager)
        local_start = log.local_log_start_offset
        assert log.log_start_offset == 0
        assert local_start > 600
        copies = rlm.metadata.copied_segments(manager.tiered_partition(log).tip)   # type: ignore[union-attr]
        assert sum(m.transaction_index_entries for m in copies) == len([a for a in aborted
                                                                         if a.last_offset <= copies[-1].end_offset])
    finally:
        manager.shutdown()
    counting = _CountingStorage(str(tmp_path / "store"))
    manager = _transactional_manager(tmp_path, counting)            # a new mount: nothing in memory
    try:
        log = log_of(manager, TP)
        assert log.local_log_start_offset == local_start
        state = transactions.read_committed_state(log)
        assert state is not None
        assert state.aborted_transactions() == aborted           # the walk of the whole log, remote part too
        assert counting.gets["log"] == 0, counting.gets          # ... without a byte of a copy's .log
        # one GET of each copy below the local log start with an aborted transaction (the others are empty)
        assert counting.gets["txnindex"] == len([m for m in copies
                                                 if m.transaction_index_entries > 0 and m.end_offset < local_start])
        assert counting.gets["snapshot"] == 1                     # the producers at the local log start
        assert render(log) == (jsonl, text)
        hidden = sorted(set(range(local_start)) - set(visible))
        assert hidden[:3] == [0, 1, 2]         # 1003's first batch: only the snapshot says its transaction is open
        for offset in hidden[:3] + hidden[-3:]:
            with pytest.raises(OffsetOutOfRangeError):
                record_at(log, offset)
        assert record_at(log, visible[0]).offset == visible[0]
        # The copies of this mount start from the producers of the last copy's snapshot: 1003's transaction,
        # open since offset 0, is aborted at the end of a segment copied now, and 1004's after it.
        fetched = counting.gets["log"]                          # the views above read the copies
        assert _abort_1004_and_copy(manager, log) == fetched, counting.gets   # the producers at its start: a snapshot
    finally:
        manager.shutdown()


def _abort_1004_and_copy(manager: LogManager, log: Log) -> int:
    """After _append_transactions: 1004's ABORT, then enough plain batches to roll, copied.  Checks the copies
    index 1003's transaction (open since offset 0) and 1004's from their first offsets; returns the GETs of
    .log objects the store has served."""
    from tests.unit.test_transactions import ABORT, _batch

    marker = log.log_end_offset
    log.append_as_follower(_batch(marker, [], producer_id=1004, transactional=True,
                                  control=_struct.pack(">hh", 0, ABORT)))
    for offset in range(marker + 1, marker + 400, 10):
        log.append_as_follower(_batch(offset, [b"after-%06d-%s" % (offset + i, b"a" * 60) for i in range(10)]))
    log.flush()
    assert manager.copy_to_remote_storage() > 0
    tip = manager.tiered_partition(log).tip                   # type: ignore[union-attr]
    rlm = manager.remote_log_manager
    assert rlm is not None
    assert rlm.copy_lag(log, tip) == (0, 0)
    entries = [(e.producer_id, e.first_offset, e.last_offset) for m in rlm.metadata.copied_segments(tip)
               for e in rlm.transaction_index(m)]
    assert (1003, 0, marker - 1) in entries
    assert (1004, marker - 5, marker) in entries
    assert isinstance(rlm.storage, _CountingStorage)
    return rlm.storage.gets["log"]


def test_a_damaged_snapshot_of_a_copy_makes_the_next_copy_walk_from_an_earlier_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """The producers at the start of a copy after a restart come from the previous copy's snapshot; when it
    does not read back (its CRC), from an earlier copy's and the batches after it, with a warning naming the
    object: the copies go on, with the same transaction indexes."""
    _, manager, log, _ = _tiered_transactions(tmp_path)
    try:
        rlm = _copy_and_clean_up(manager)
        local_start = log.local_log_start_offset
        copies = rlm.metadata.copied_segments(manager.tiered_partition(log).tip)   # type: ignore[union-attr]
    finally:
        manager.shutdown()
    below = [m for m in copies if m.end_offset < local_start]
    assert copies[-1].end_offset >= local_start                 # the last copy's segment is still local
    damaged = {copies[-1].segment_id, below[-1].segment_id}     # the last copy's, and the last one in the store
    store = tmp_path / "store"
    for sid in damaged:
        path = store / sid.object_name("snapshot")
        path.write_bytes(path.read_bytes()[:-1] + b"\xff")
    manager = _transactional_manager(tmp_path, _CountingStorage(str(store)))
    try:
        with caplog.at_level(logging.WARNING, logger="engine"):
            _abort_1004_and_copy(manager, log_of(manager, TP))
        warned = "\n".join(r.getMessage() for r in caplog.records)
        for sid in damaged:
            assert f"{sid.object_name('snapshot')} is corrupt" in warned
    finally:
        manager.shutdown()


def test_a_damaged_transaction_index_or_snapshot_of_a_copy_makes_the_walk_read_that_copys_batches(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """A ``.txnindex`` or ``.snapshot`` that does not read back is passed over with a warning naming it: the
    walk reads that copy's batches instead (only that copy's), and the views are the same."""
    from engine import transactions
    from engine.views.log_view import LogView, ViewFormat

    _, manager, log, _ = _tiered_transactions(tmp_path)
    try:
        aborted = transactions.read_committed_state(log).aborted_transactions()   # type: ignore[union-attr]
        view = LogView(log, ViewFormat.JSONL)
        jsonl = view.read(0, view.size())
        view.close()
        rlm = _copy_and_clean_up(manager)
        local_start = log.local_log_start_offset
        below = [m for m in rlm.metadata.copied_segments(manager.tiered_partition(log).tip)  # type: ignore[union-attr]
                 if m.end_offset < local_start]
    finally:
        manager.shutdown()
    indexed = [m for m in below[:-1] if m.transaction_index_entries > 0]
    damaged_index, damaged_snapshot = indexed[len(indexed) // 2], below[-1]
    store = tmp_path / "store"
    path = store / damaged_index.segment_id.object_name("txnindex")
    path.write_bytes(path.read_bytes() + b"x")                     # trailing bytes
    path = store / damaged_snapshot.segment_id.object_name("snapshot")
    path.write_bytes(path.read_bytes()[:-1] + b"\xff")            # its CRC
    counting = _CountingStorage(str(store))
    manager = _transactional_manager(tmp_path, counting)
    try:
        log = log_of(manager, TP)
        with caplog.at_level(logging.WARNING, logger="engine"):
            state = transactions.read_committed_state(log)
            assert state is not None
            assert state.aborted_transactions() == aborted
        warned = "\n".join(r.getMessage() for r in caplog.records)
        assert f"{damaged_index.segment_id.object_name('txnindex')} has 1 trailing bytes" in warned
        assert f"{damaged_snapshot.segment_id.object_name('snapshot')} is corrupt" in warned
        assert 0 < counting.got_bytes["log"] <= damaged_index.segment_size_bytes + \
            damaged_snapshot.segment_size_bytes, counting.got_bytes
        view = LogView(log, ViewFormat.JSONL)
        assert view.read(0, view.size()) == jsonl
        view.close()
    finally:
        manager.shutdown()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(ops=[("data", 0, 2), ("plain", 1), ("roll",), ("data", 1, 1), ("end", 0, False), ("roll",),
              ("data", 0, 1), ("roll",), ("end", 1, True), ("plain", 2), ("roll",), ("end", 0, False), ("plain", 1),
              ("data", 2, 1), ("roll",), ("plain", 1)])
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("plain"), st.integers(1, 3)),
    st.tuples(st.just("data"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("end"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("roll")),
), max_size=40))
def test_read_committed_views_of_copies_show_what_a_read_committed_consumer_sees(tmp_path_factory, ops):
    """Any interleaving of plain batches, transactions of three producers and rolls, every closed segment
    copied and deleted locally: a walk from the copies' transaction indexes and snapshots hides what a
    read_committed consumer does not see (the model of tests/unit/test_transactions.py), and no more."""
    from engine import transactions
    from engine.views.log_view import LogView, ViewFormat

    base = tmp_path_factory.mktemp("tiered-txn")
    (base / "store").mkdir()
    counting = _CountingStorage(str(base / "store"))
    manager = _transactional_manager(base, counting)
    try:
        manager.create_topic("t", 1, {"remote.storage.enable": "true", "local.retention.bytes": "1"})
        log = log_of(manager, TP)
        model = _LiveModel()
        for op in ops:
            if op[0] == "roll":
                log.roll()
                continue
            batch, count = _op_batch(op, model.end)
            log.append_as_follower(batch)
            model.apply(op, count)
        log.roll()
        log.flush()
        _copy_and_clean_up(manager)
        # every segment but the last closed one (local.retention.bytes keeps one) and the active one is a copy
        assert all(getattr(s, "remote", False) for s in list(log.reader_segments().values())[:-2])
        log.transaction_state = None                                  # walked afresh, from the copies
        state = transactions.read_committed_state(log)
        assert state is not None
        state.last_stable_offset()
        assert counting.gets["log"] == 0
        view = LogView(log, ViewFormat.JSONL)
        try:
            rows = view.read(0, view.size()).splitlines()
        finally:
            view.close()
        assert [_json.loads(row)["offset"] for row in rows] == model.visible
    finally:
        manager.shutdown()


def test_a_copy_without_transaction_index_made_by_an_earlier_logfs_is_walked(tmp_path: Path):
    """A metadata event without ``txnIndexEntries`` (a copy from before logfs copied the transaction index
    and producer snapshot) is a copy without them: the producers at the local log start are then found by
    walking its batches, and they are the same as from the snapshots."""
    from dataclasses import replace

    from sortedcontainers import SortedDict

    from engine import transactions
    from engine.remote.metadata import RemoteLogSegmentMetadata
    from engine.remote.remote_segment import RemoteLogSegment

    counting, manager, log, _ = _tiered_transactions(tmp_path)
    try:
        rlm = _copy_and_clean_up(manager)
        local_start = log.local_log_start_offset
        copies = [m for m in rlm.metadata.copied_segments(manager.tiered_partition(log).tip)  # type: ignore[union-attr]
                  if m.end_offset < local_start]
        event = _json.loads(replace(copies[0], transaction_index_entries=5).to_event())
        assert event["txnIndexEntries"] == 5
        del event["txnIndexEntries"]
        assert RemoteLogSegmentMetadata.from_event(_json.dumps(event).encode()).has_transaction_index is False
        indexed = SortedDict({m.start_offset: RemoteLogSegment(rlm, m, TP) for m in copies})
        legacy = SortedDict({m.start_offset: RemoteLogSegment(rlm, replace(m, transaction_index_entries=-1), TP)
                             for m in copies})
        assert legacy.peekitem(-1)[1].transaction_index() is None
        assert legacy.peekitem(-1)[1].producer_snapshot() is None
        fetched = counting.gets["log"]
        from_snapshot = transactions.producer_state_at(indexed, local_start).open_transactions()
        assert counting.gets["log"] == fetched
        assert transactions.producer_state_at(legacy, local_start).open_transactions() == from_snapshot
        assert counting.gets["log"] > fetched                   # the legacy copies' batches were fetched
        assert from_snapshot[1003] == 0                           # open since the first batch
    finally:
        manager.shutdown()


def test_the_view_index_of_a_remote_log_segment_is_kept_so_a_new_mount_sizes_views_without_fetching(
        tmp_path: Path):
    from engine.views import persisted
    from engine.views.log_view import LogView, ViewFormat

    manager = _manager(tmp_path)
    try:
        log = _trimmed(manager)
        manager.copy_to_remote_storage()
        manager.cleanup_logs()
        assert log.local_log_start_offset > 0
        view = LogView(log, ViewFormat.TEXT)
        size = view.size()
        assert view.read(0, size) == _expected_text(1200)
        kept = sorted((tmp_path / "data" / "remote-log" / "view-index").rglob("*.viewindex"))
        remote = [s for s in log.reader_segments().values() if getattr(s, "remote", False)]
        assert len(kept) == len(remote) > 0
    finally:
        manager.shutdown()
    manager = _manager(tmp_path)
    try:
        log = log_of(manager, TP)
        rlm = manager.remote_log_manager
        assert rlm is not None
        loaded = persisted.counters["loaded"]
        view = LogView(log, ViewFormat.TEXT)
        assert view.size() == size
        assert rlm.cache.fetched_bytes == 0              # sized from the kept indexes: no .log byte fetched
        assert persisted.counters["loaded"] - loaded >= len(remote)
        assert view.read(0, size) == _expected_text(1200)
        # remote retention deletes a copy's kept view index with it
        manager.delete_records(TP, log.local_log_start_offset)
        manager.copy_to_remote_storage()
        _wait_out_the_delete_delay(manager)
        manager.copy_to_remote_storage()
        assert list((tmp_path / "data" / "remote-log" / "view-index").rglob("*.viewindex")) == []
    finally:
        manager.shutdown()


def test_logfs_check_verifies_the_remote_segments_metadata_against_the_store(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]):
    from logfs.cli import main

    copies, tip, copied = _unmounted_copies(tmp_path)
    assert copied >= 5
    data, uri = str(tmp_path / "data"), f"rsm.config.uri=file://{tmp_path / 'store'}"
    assert main(["check", data]) == 0
    assert f"{copied} remote log segments not checked against the store" in capsys.readouterr().out
    assert main(["check", data, "-o", uri]) == 0, capsys.readouterr().out
    capsys.readouterr()
    # an orphan (a copy no metadata names) and a finished copy whose .log is gone
    store = tmp_path / "store"
    first_log = store / copies[0].segment_id.object_name("log")
    orphan = store / (copies[1].segment_id.object_name("log").replace(copies[1].segment_id.id, "f" * 32))
    orphan.write_bytes(b"x")
    first_log.unlink()
    assert main(["check", data, "-o", uri]) == 1
    out = capsys.readouterr().out
    assert f"{first_log}: the finished copy of offsets 0 to {copies[0].end_offset} of {tip} is missing" in out
    assert f"{orphan}: no metadata names this copy" in out


def test_logfs_check_verifies_the_transaction_index_and_producer_snapshot_of_each_copy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from engine.transactions import ProducerEntry, TxnIndexEntry, encode_producer_snapshot, encode_txn_index
    from logfs.cli import main

    copies, _tip, copied = _unmounted_copies(tmp_path)
    assert copied >= 4
    data, uri = str(tmp_path / "data"), f"rsm.config.uri=file://{tmp_path / 'store'}"
    assert all(m.transaction_index_entries == 0 for m in copies)       # no transaction: empty indexes
    assert main(["check", data, "-o", uri]) == 0, capsys.readouterr().out
    capsys.readouterr()
    store = tmp_path / "store"
    missing = store / copies[0].segment_id.object_name("txnindex")
    missing.unlink()
    damaged = store / copies[1].segment_id.object_name("snapshot")
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\x01")
    extra = store / copies[2].segment_id.object_name("txnindex")
    extra.write_bytes(encode_txn_index([TxnIndexEntry(7, copies[2].start_offset, copies[2].start_offset + 1, 0)]))
    outside = store / copies[3].segment_id.object_name("snapshot")
    outside.write_bytes(encode_producer_snapshot([ProducerEntry(9, 0, -1, copies[3].end_offset + 5)]))
    assert main(["check", data, "-o", uri]) == 1
    out = capsys.readouterr().out
    assert f"{missing}: the transaction index of the copy of offsets {copies[0].start_offset} to " \
           f"{copies[0].end_offset} is missing from the store" in out
    assert f"{damaged}: cannot be read: Producer snapshot file://{damaged} is corrupt" in out
    assert f"{extra}: lists 1 aborted transactions where the metadata recorded 0" in out
    assert f"{outside}: holds producer 9 at offset {copies[3].end_offset + 5}" in out
    assert len(out.splitlines()) == 4, out


def test_since_a_time_finds_the_same_record_in_a_copy_as_in_its_local_segment(tmp_path: Path):
    """since/T below the local log start: the copy's time index, offset index, then a short walk."""
    from engine.remote.remote_segment import RemoteLogSegment

    clock = ManualClock(1_700_000_000_000)
    manager = _manager(tmp_path, clock=clock)
    try:
        manager.create_topic("t", 1, {"remote.storage.enable": "true", "index.interval.bytes": "512"})
        log = manager.get_log(TP)
        assert log is not None
        for i in range(120):
            log.append_values([b"t-%04d-%s" % (i, b"z" * 200) for _ in range(5)])
            clock.sleep(1000)
        log.flush()
        manager.copy_to_remote_storage()
        rlm = manager.remote_log_manager
        assert rlm is not None
        tip = manager.tiered_partition(log).tip               # type: ignore[union-attr]
        copies = rlm.metadata.copied_segments(tip)
        assert len(copies) >= 3
        fetched = 0             # time index entries read from the copies
        for metadata in copies:
            remote, local = RemoteLogSegment(rlm, metadata, TP), log.segments[metadata.start_offset]
            for ts in (0, local.largest_timestamp - 2500, local.largest_timestamp - 1000, local.largest_timestamp,
                       local.largest_timestamp + 1):
                for start in (0, metadata.start_offset + 3):
                    assert remote.find_offset_by_timestamp(ts, start) == local.find_offset_by_timestamp(ts, start)
            assert remote._time_index is not None
            fetched += len(remote._time_index[0])
        assert fetched > len(copies), "the copies' time indexes have entries: they are what since/T looks up"
    finally:
        manager.shutdown()
