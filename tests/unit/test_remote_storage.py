"""Remote log segments in a real store: a directory (``file://``) and a real SeaweedFS S3 server.

No mock anywhere: the S3 store talks HTTP to ``weed mini`` (tests/seaweedfs.py);
the segments copied are real closed segments of a real Log; the metadata
events go through a real Log and are replayed from its files.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from engine.config import BrokerConfig
from engine.errors import CorruptRecordError, InvalidConfigError, InvalidRequestError
from engine.log import Log
from engine.remote.chunk_cache import RemoteChunkCache
from engine.remote.metadata import RemoteLogMetadataManager, RemoteLogSegmentMetadata, RemoteLogSegmentState
from engine.remote.storage import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteStorageError,
    RemoteStorageManager,
    TopicIdPartition,
    open_remote_storage,
)
from engine.transactions import ProducerEntry, encode_producer_snapshot
from tests.helpers import wait_for
from tests.jvm import free_port
from tests.seaweedfs import own_seaweedfs_server, seaweedfs_server  # noqa: F401  (the seaweedfs fixtures)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from engine.segment import LogSegment
    from tests.seaweedfs import SeaweedFS

T0 = TopicIdPartition("t", "Yk8nZ5mKQxa2bH3cVdE1Fw", 0)
U3 = TopicIdPartition("u", "q0pL9rS8tU7vW6xY5zA4Bc", 3)
STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RemoteStorageManager]:
    if request.param == "file":
        (tmp_path / "store").mkdir()
        opened = open_remote_storage({"rsm.config.uri": f"file://{tmp_path / 'store'}"})
    else:
        server: SeaweedFS = request.getfixturevalue("seaweedfs")
        opened = open_remote_storage(server.settings(prefix=f"t{time.monotonic_ns()}"))
    try:
        yield opened
    finally:
        opened.close()


def _log(path: Path) -> Log:
    config = BrokerConfig.from_props({"log.dirs": str(path.parent), "log.segment.bytes": "1048576",
                                      "log.flush.interval.messages": str(2**62)}).log_config()
    return Log.load(str(path), config)


@pytest.fixture
def closed_segment(tmp_path: Path) -> Iterator[LogSegment]:
    """The first segment of a log with two: 3,000 records in batches of 100, then rolled."""
    log = _log(tmp_path / "data" / "t-0")
    for i in range(30):
        log.append_values([b"value-%06d" % (i * 100 + j) for j in range(100)])
    log.roll()
    log.append_values([b"after the roll"])
    try:
        yield log.segments[0]
    finally:
        log.close()


#: a producer snapshot of one producer with a transaction open at offset 3
_SNAPSHOT = encode_producer_snapshot([ProducerEntry(1000, 0, -1, 3, 0, 1_700_000_000_000, -1, 3)])


def _data(segment: LogSegment) -> LogSegmentData:
    # an empty transaction index (no transaction aborted in it) is an object too
    return LogSegmentData(segment.log_path, segment.offset_index.path, segment.time_index.path, b"", _SNAPSHOT,
                          b"0\n1\n0 0\n")


def test_a_copied_segment_reads_back_byte_for_byte(store: RemoteStorageManager, closed_segment: LogSegment):
    segment_id = RemoteLogSegmentId.generate(T0, closed_segment.base_offset)
    store.copy_log_segment_data(segment_id, _data(closed_segment))
    log_bytes = Path(closed_segment.log_path).read_bytes()
    assert len(log_bytes) > 30_000
    assert store.fetch_log_segment(segment_id, 0) == log_bytes
    assert store.fetch_log_segment(segment_id, 1000, 5000) == log_bytes[1000:5000]
    assert store.fetch_log_segment(segment_id, len(log_bytes) - 10) == log_bytes[-10:]
    assert store.fetch_log_segment(segment_id, 5, 5) == b""
    closed_segment.offset_index.flush()
    assert store.fetch_index(segment_id, IndexType.OFFSET) == Path(closed_segment.offset_index.path).read_bytes()
    assert store.fetch_index(segment_id, IndexType.TIMESTAMP) == Path(closed_segment.time_index.path).read_bytes()
    assert store.fetch_index(segment_id, IndexType.LEADER_EPOCH) == b"0\n1\n0 0\n"
    assert store.fetch_index(segment_id, IndexType.TRANSACTION) == b""
    assert store.fetch_index(segment_id, IndexType.PRODUCER_SNAPSHOT) == _SNAPSHOT
    assert store.list_objects(T0) == {segment_id: {"log", "index", "timeindex", "txnindex", "snapshot",
                                                   "leader-epoch-checkpoint"}}
    # a second copy of the same segment (a retry after a crash) is another object: both are listed
    retry = RemoteLogSegmentId.generate(T0, closed_segment.base_offset)
    store.copy_log_segment_data(retry, _data(closed_segment))
    assert store.list_segment_ids(T0) == {segment_id, retry}
    assert store.list_segment_ids(TopicIdPartition("t", T0.topic_id, 1)) == set()
    assert store.list_segment_ids(TopicIdPartition("t", "another-incarnation", 0)) == set()   # recreated topic
    store.delete_log_segment_data(segment_id)
    store.delete_log_segment_data(segment_id)          # idempotent
    assert store.list_segment_ids(T0) == {retry}
    with pytest.raises(RemoteStorageError) as missing:
        store.fetch_log_segment(segment_id, 0)
    assert missing.value.errno == errno.ENOENT
    assert store.fetch_log_segment(retry, 0, 100) == log_bytes[:100]


def test_a_copy_without_its_log_object_is_not_listed(store: RemoteStorageManager, closed_segment: LogSegment):
    """The ``.log`` object is written last: a copy cut short by a crash before it is not a segment yet."""
    class CrashBeforeLog(Exception):
        pass

    original = store._put
    segment_id = RemoteLogSegmentId.generate(T0, 0)

    def put(name: str, source: str | bytes) -> None:
        if name.endswith(".log"):
            raise CrashBeforeLog(name)
        original(name, source)

    store._put = put  # type: ignore[method-assign]  # the crash point, on the real store
    with pytest.raises(CrashBeforeLog):
        store.copy_log_segment_data(segment_id, _data(closed_segment))
    store._put = original  # type: ignore[method-assign]
    assert store.list_segment_ids(T0) == set()
    store.delete_log_segment_data(segment_id)          # what the orphan clean-up does: removes its other objects
    assert store._list(T0.directory) == []


def test_open_names_the_setting_that_is_wrong(seaweedfs: SeaweedFS, tmp_path: Path):
    def refused(settings: dict[str, str]) -> RemoteStorageError:
        start = time.monotonic()
        with pytest.raises(RemoteStorageError) as failed:
            open_remote_storage(settings)
        assert time.monotonic() - start < 30, "a wrong store must fail within seconds"
        return failed.value

    bad_key = refused(seaweedfs.settings(**{"rsm.config.s3.secret.access.key": "wrong"}))
    assert bad_key.errno == errno.EACCES
    assert "rsm.config.s3.secret.access.key" in str(bad_key)
    bad_bucket = refused({**seaweedfs.settings(), "rsm.config.uri": "s3://no-such-bucket/x"})
    assert bad_bucket.errno == errno.ENOENT
    assert "no-such-bucket" in str(bad_bucket)
    closed = refused(seaweedfs.settings(**{"rsm.config.s3.endpoint.url": f"http://127.0.0.1:{free_port()}",
                                           "rsm.config.request.timeout.ms": "1000"}))
    assert closed.errno == errno.ETIMEDOUT
    assert "rsm.config.s3.endpoint.url" in str(closed)
    missing_dir = refused({"rsm.config.uri": f"file://{tmp_path / 'nowhere'}"})
    assert missing_dir.errno == errno.ENOENT
    assert "rsm.config.uri" in str(missing_dir)
    for settings, named in [({"rsm.config.uri": "ftp://x/y"}, "rsm.config.uri"),
                            ({"rsm.config.uri": "s3:///prefix"}, "names no bucket"),
                            ({}, "rsm.config.uri"),
                            ({**seaweedfs.settings(), "rsm.config.s3.endpoint": "x"}, "rsm.config.s3.endpoint"),
                            ({**seaweedfs.settings(), "rsm.config.request.timeout.ms": "0"}, "timeout")]:
        with pytest.raises(InvalidConfigError, match=named):
            open_remote_storage(settings)


def test_a_stopped_store_fails_reads_within_the_bound_then_serves_again(own_seaweedfs: SeaweedFS,
                                                                         closed_segment: LogSegment):
    store = open_remote_storage(own_seaweedfs.settings(prefix="p", **{"rsm.config.request.timeout.ms": "1000"}))
    segment_id = RemoteLogSegmentId.generate(T0, 0)
    store.copy_log_segment_data(segment_id, _data(closed_segment))
    own_seaweedfs.kill()
    start = time.monotonic()
    with pytest.raises(RemoteStorageError) as down:
        store.fetch_log_segment(segment_id, 0, 100)
    assert down.value.errno == errno.ETIMEDOUT
    assert own_seaweedfs.endpoint in str(down.value)
    assert time.monotonic() - start < 10
    # the same data dir, the same port: the store answers again and nothing was lost
    own_seaweedfs.start()
    assert store.fetch_log_segment(segment_id, 0) == Path(closed_segment.log_path).read_bytes()
    store.close()


# ------------------------------------------------------------------------------ metadata


def _metadata(segment_id: RemoteLogSegmentId, state: RemoteLogSegmentState, start: int, end: int,
              ts: int = 1) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(segment_id, start, end, 1_700_000_000_000 + end, 4096, ts, state, {0: start})


def test_metadata_events_replay_to_the_same_state_after_a_restart(tmp_path: Path):
    path = tmp_path / "data" / "__remote_log_metadata-0"
    log = _log(path)
    rlmm = RemoteLogMetadataManager(log)
    first = RemoteLogSegmentId.generate(T0, 0)
    second = RemoteLogSegmentId.generate(T0, 100)
    crashed = RemoteLogSegmentId.generate(T0, 200)
    deleting = RemoteLogSegmentId.generate(U3, 0)
    rlmm.add(_metadata(first, STARTED, 0, 99))
    rlmm.update_state(first, FINISHED, 2)
    rlmm.add(_metadata(second, STARTED, 100, 199))
    rlmm.update_state(second, FINISHED, 3)
    rlmm.add(_metadata(crashed, STARTED, 200, 299))      # a copy the crash below interrupts
    rlmm.add(_metadata(deleting, STARTED, 0, 9))
    rlmm.update_state(deleting, FINISHED, 4)
    rlmm.update_state(deleting, DELETE_STARTED, 5)       # a deletion the crash below interrupts
    with pytest.raises(InvalidRequestError, match="cannot follow"):
        rlmm.update_state(first, DELETE_FINISHED, 6)     # not deleting: refused, nothing written
    end = log.log_end_offset
    assert end == 8
    log.close()

    replayed = RemoteLogMetadataManager(_log(path))
    assert [m.segment_id for m in replayed.copied_segments(T0)] == [first, second]
    assert replayed.segment_for_offset(T0, 150).segment_id == second  # type: ignore[union-attr]
    assert replayed.segment_for_offset(T0, 250) is None            # its copy never finished
    assert replayed.highest_copied_offset(T0) == 199
    assert [m.segment_id for m in replayed.unfinished(T0)] == [crashed]
    assert [(m.segment_id, m.state) for m in replayed.unfinished(U3)] == [(deleting, DELETE_STARTED)]
    assert replayed.known_ids(T0) == {first, second, crashed}
    # what the copy task does with them: the orphan is abandoned, the deletion finished
    replayed.update_state(crashed, DELETE_STARTED, 7)
    replayed.update_state(crashed, DELETE_FINISHED, 8)
    replayed.update_state(deleting, DELETE_FINISHED, 9)
    assert replayed.partitions() == [T0]
    assert replayed.known_ids(T0) == {first, second}


def test_a_damaged_metadata_event_is_refused_with_its_cause(tmp_path: Path):
    log = _log(tmp_path / "data" / "__remote_log_metadata-0")
    log.append_values([b'{"state": "COPY_SEGMENT_STARTED"}'])
    with pytest.raises(CorruptRecordError, match="Unreadable remote log metadata event"):
        RemoteLogMetadataManager(log)
    log.close()


# ------------------------------------------------------------------------------ chunk cache


def _copied(store: RemoteStorageManager, segment: LogSegment) -> tuple[RemoteLogSegmentId, bytes]:
    segment_id = RemoteLogSegmentId.generate(T0, segment.base_offset)
    store.copy_log_segment_data(segment_id, _data(segment))
    return segment_id, Path(segment.log_path).read_bytes()


def test_the_chunk_cache_serves_any_range_within_its_bound(store: RemoteStorageManager, closed_segment: LogSegment,
                                                           tmp_path: Path):
    segment_id, data = _copied(store, closed_segment)
    cache = RemoteChunkCache(store, str(tmp_path / "cache"), max_bytes=3 * 4096, chunk_bytes=4096, read_ahead=0)
    try:
        size = len(data)
        for position, length in [(0, 100), (4000, 200), (size - 50, 500), (12_345, 9_000), (0, size), (size, 10)]:
            assert cache.read(segment_id, position, length, size) == data[position:position + length]
            assert cache.cached_bytes <= 3 * 4096
            on_disk = sum(os.path.getsize(tmp_path / "cache" / n) for n in os.listdir(tmp_path / "cache"))
            assert on_disk == cache.cached_bytes
        fetched = cache.fetched_chunks
        assert cache.read(segment_id, size - 50, 50, size) == data[-50:]      # still cached: no fetch
        assert cache.fetched_chunks == fetched
        assert cache.hits > 0
        cache.forget(lambda s: s == segment_id)
        assert cache.cached_bytes == 0
        assert os.listdir(tmp_path / "cache") == []
    finally:
        cache.close()


def test_a_sequential_reader_gets_the_next_chunks_read_ahead(store: RemoteStorageManager,
                                                             closed_segment: LogSegment, tmp_path: Path):
    segment_id, data = _copied(store, closed_segment)
    cache = RemoteChunkCache(store, str(tmp_path / "cache"), max_bytes=64 * 4096, chunk_bytes=4096, read_ahead=2)
    try:
        assert cache.read(segment_id, 0, 4096, len(data)) == data[:4096]        # first read: not sequential yet
        assert cache.read(segment_id, 4096, 4096, len(data)) == data[4096:8192]  # sequential: chunks 2, 3 ahead
        wait_for(lambda: cache.fetched_chunks >= 4, "the read-ahead of chunks 2 and 3")
        hits = cache.hits
        assert cache.read(segment_id, 8192, 8192, len(data)) == data[8192:16384]
        assert cache.hits == hits + 2, "chunks 2 and 3 were read ahead: served from the cache"
    finally:
        cache.close()


def test_cached_chunks_are_served_while_the_store_is_down(own_seaweedfs: SeaweedFS, tmp_path: Path,
                                                          closed_segment: LogSegment):
    store = open_remote_storage(own_seaweedfs.settings(prefix="c", **{"rsm.config.request.timeout.ms": "1000"}))
    segment_id, data = _copied(store, closed_segment)
    cache = RemoteChunkCache(store, str(tmp_path / "cache"), max_bytes=1 << 20, chunk_bytes=4096, read_ahead=0)
    assert cache.read(segment_id, 0, 5000, len(data)) == data[:5000]
    own_seaweedfs.kill()
    assert cache.read(segment_id, 100, 4000, len(data)) == data[100:4100]   # chunks 0 and 1: local
    start = time.monotonic()
    with pytest.raises(RemoteStorageError) as down:
        cache.read(segment_id, 20_000, 10, len(data))
    assert down.value.errno == errno.ETIMEDOUT
    assert time.monotonic() - start < 10
    cache.close()
    store.close()


def test_a_hung_store_fails_a_sequential_reader_within_one_bound_even_with_a_read_ahead_in_flight(
        own_seaweedfs: SeaweedFS, tmp_path: Path, closed_segment: LogSegment):
    """A store that accepts connections and never answers (SIGSTOP): the reader waits for the read-ahead of
    its chunk once and gets its ETIMEDOUT, instead of trying again and waiting twice as long."""
    import signal

    store = open_remote_storage(own_seaweedfs.settings(prefix="h", **{"rsm.config.request.timeout.ms": "1000"}))
    segment_id, data = _copied(store, closed_segment)
    assert len(data) >= 6 * 4096
    requested: list[int] = []                  # the ranged GETs the cache asks the real store for, by position
    fetch = store.fetch_log_segment

    def counted(segment: RemoteLogSegmentId, start: int, end: int | None = None) -> bytes:
        requested.append(start)
        return fetch(segment, start, end)

    store.fetch_log_segment = counted          # type: ignore[method-assign, assignment]
    cache = RemoteChunkCache(store, str(tmp_path / "cache"), max_bytes=1 << 20, chunk_bytes=4096, read_ahead=1)
    assert cache.read(segment_id, 0, 2048, len(data)) == data[:2048]           # chunk 0 fetched and kept
    assert own_seaweedfs.process is not None
    os.killpg(own_seaweedfs.process.pid, signal.SIGSTOP)
    try:
        # sequential, served from chunk 0: the read-ahead of chunk 1 starts, and hangs
        assert cache.read(segment_id, 2048, 2048, len(data)) == data[2048:4096]
        start = time.monotonic()
        with pytest.raises(RemoteStorageError) as waited:
            cache.read(segment_id, 4096, 10, len(data))      # chunk 1: the read-ahead's result
        assert waited.value.errno == errno.ETIMEDOUT
        assert time.monotonic() - start < 30, "bounded: the store's request timeout, not a hang"
        assert requested.count(4096) == 1, f"chunk 1 was asked for again after its read-ahead failed: {requested}"
    finally:
        os.killpg(own_seaweedfs.process.pid, signal.SIGCONT)
    cache.close()
    store.close()


def test_one_copy_of_a_base_offset_serves_the_longest() -> None:
    """A segment copied when closed, grown again after a power loss took the roll past it, and copied again:
    the longer copy serves, so no record of it is skipped, and the shorter one is superseded (deleted by
    the copy task).  The wall clock is no judge: it may have gone back across the restart."""
    from engine.remote.metadata import serving_copies

    older = _metadata(RemoteLogSegmentId.generate(T0, 100), FINISHED, 100, 199, ts=5)
    newer = _metadata(RemoteLogSegmentId.generate(T0, 100), FINISHED, 100, 207, ts=9)
    before = _metadata(RemoteLogSegmentId.generate(T0, 0), FINISHED, 0, 99, ts=1)
    after = _metadata(RemoteLogSegmentId.generate(T0, 208), FINISHED, 208, 300, ts=10)
    for order in ([before, older, newer, after], [after, newer, older, before]):
        assert serving_copies(order) == ([before, newer, after], [older])
    clock_went_back = _metadata(RemoteLogSegmentId.generate(T0, 100), FINISHED, 100, 210, ts=2)
    assert serving_copies([newer, clock_went_back, older]) == ([clock_went_back], sorted(
        [newer, older], key=lambda m: m.segment_id.id))
