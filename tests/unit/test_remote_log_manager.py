"""The RemoteLogManager copies real closed segments, survives a crash mid-copy and reads copies back.

Real parts only: a Log on disk, the metadata in a real Log, a directory store
(``file://``) or a real SeaweedFS, and a real process killed in the middle of
a copy (``os._exit`` at a chosen object, as kill -9 would leave it).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from engine.clock import ManualClock
from engine.log import Log
from engine.records import decode_batch, iter_batches, read_header
from engine.remote.chunk_cache import RemoteChunkCache
from engine.remote.metadata import RemoteLogMetadataManager
from engine.remote.remote_log_manager import RemoteLogManager, TieredPartition
from engine.remote.storage import RemoteStorageError, TopicIdPartition, open_remote_storage
from tests import ROOT
from tests.helpers import make_config
from tests.seaweedfs import SeaweedFS

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

TIP = TopicIdPartition("t", "Yk8nZ5mKQxa2bH3cVdE1Fw", 0)


def _log(path: Path, segment_bytes: int = 8192) -> Log:
    log = Log.load(str(path), make_config(internal_segment_bytes=segment_bytes))
    log.flush()         # a copy takes only what is at or below the recovery point (flushed)
    return log


def _fill(log: Log, batches: int, start: int = 0) -> None:
    for i in range(start, start + batches):
        log.append_values([b"record-%06d-%s" % (i * 10 + j, b"x" * (j * 7)) for j in range(10)])


class Tiered:
    """A log, its metadata log and a store, as a data dir with tiering holds them."""

    def __init__(self, root: Path, uri: str | None = None, settings: dict[str, str] | None = None) -> None:
        self.root = root
        (root / "store").mkdir(exist_ok=True)
        self.settings = settings or {"rsm.config.uri": uri or f"file://{root / 'store'}"}
        self.log = _log(root / "data" / "t-0")
        self.open()

    def open(self) -> None:
        self.metadata_log = _log(self.root / "data" / "__remote_log_metadata-0", 1 << 20)
        self.storage = open_remote_storage(self.settings)
        self.cache = RemoteChunkCache(self.storage, str(self.root / "cache"), max_bytes=1 << 20, chunk_bytes=4096)
        self.rlm = RemoteLogManager(self.storage, RemoteLogMetadataManager(self.metadata_log), self.cache)

    def close(self) -> None:
        self.cache.close()
        self.storage.close()
        self.metadata_log.close()


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[Tiered]:
    t = Tiered(tmp_path)
    try:
        yield t
    finally:
        t.close()
        t.log.close()


def _copies(t: Tiered) -> list[tuple[int, int]]:
    return [(m.start_offset, m.end_offset) for m in t.rlm.metadata.copied_segments(TIP)]


def test_closed_segments_are_copied_once_in_order_never_the_active_one(tiered: Tiered):
    _fill(tiered.log, 60)
    closed = list(tiered.log.segments.values())[:-1]
    assert len(closed) >= 4
    assert tiered.rlm.copy_log_segments(tiered.log, TIP) == len(closed)
    assert _copies(tiered) == [(s.base_offset, s.next_offset - 1) for s in closed]
    assert tiered.rlm.copy_log_segments(tiered.log, TIP) == 0                    # idempotent
    assert {s.id for s in tiered.storage.list_segment_ids(TIP)} == \
        {m.segment_id.id for m in tiered.rlm.metadata.copied_segments(TIP)}
    _fill(tiered.log, 30, start=60)
    newly = len(tiered.log.segments) - 1 - len(closed)
    assert tiered.rlm.copy_log_segments(tiered.log, TIP) == newly > 0
    ends = _copies(tiered)
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ends)), f"copies not contiguous: {ends}"


def test_a_read_of_a_copy_returns_the_batches_of_the_local_segment(tiered: Tiered):
    _fill(tiered.log, 40)
    tiered.rlm.copy_log_segments(tiered.log, TIP)
    copied_end = tiered.rlm.metadata.highest_copied_offset(TIP)
    expected = {r.offset: r.value for r in tiered.log.read_records(0)}
    for offset in [0, 1, 37, 123, copied_end - 5, copied_end]:
        metadata, position, data = tiered.rlm.read(TIP, offset, 4096)
        assert metadata.start_offset <= offset <= metadata.end_offset
        records = [r for pos, _ in iter_batches(data)
                   for r in decode_batch(data, pos, read_header(data, pos))]
        assert records
        assert records[0].offset <= offset
        assert any(r.offset == offset for r in records), f"offset {offset} not in the batches read"
        assert all(r.value == expected[r.offset] for r in records)
        local = tiered.log.segments[metadata.start_offset]
        assert data == local.read_bytes(position, len(data))
    with pytest.raises(Exception, match="No remote log segment"):
        tiered.rlm.read(TIP, copied_end + 1, 100)


def test_remote_retention_deletes_the_copies_below_an_offset(tiered: Tiered):
    _fill(tiered.log, 40)
    tiered.rlm.copy_log_segments(tiered.log, TIP)
    copies = _copies(tiered)
    cut = copies[2][0] + 1                      # inside the third copy: the first two go
    assert tiered.rlm.delete_remote_segments_below(TIP, cut) == 2
    assert _copies(tiered) == copies[2:]
    assert len(tiered.storage.list_segment_ids(TIP)) == len(copies) - 2
    assert tiered.rlm.delete_partition(TIP) == len(copies) - 2
    assert tiered.storage.list_segment_ids(TIP) == set()
    assert _copies(tiered) == []


def test_a_copy_below_the_log_start_is_deleted_file_delete_delay_ms_later_and_read_until_then(tiered: Tiered):
    # the torture harness's --tiered mode found it: `cat records.jsonl` of a tiered topic failed with ENOENT
    # when retention moved the log start meanwhile, the next round deleting the copies under the open view at
    # once (a local segment's files stay file.delete.delay.ms, and an open view reads on)
    clock = tiered.rlm.clock = ManualClock()
    _fill(tiered.log, 40)
    tiered.rlm.copy_log_segments(tiered.log, TIP)
    copies = _copies(tiered)
    first = copies[0][0]
    tiered.log.maybe_increment_log_start_offset(copies[2][0])     # retention: the first two copies are below
    partition = [TieredPartition(tiered.log, TIP, True)]
    delay = tiered.log.config.file_delete_delay_ms
    assert delay == 60_000
    tiered.rlm.run_once(partition, 100)
    clock.sleep(delay - 1)
    tiered.rlm.run_once(partition, 100)
    assert _copies(tiered)[:2] == copies[:2]
    _metadata, _position, data = tiered.rlm.read(TIP, first, 100)   # a view that opened the copy reads on
    assert len(data) == 100
    clock.sleep(1)
    assert tiered.rlm.run_once(partition, 100) == 2
    assert _copies(tiered)[0] == copies[2]
    with pytest.raises(RemoteStorageError):
        tiered.rlm.read(TIP, first, 100)


CRASH_HELPER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from engine.remote import storage
from tests.unit.test_remote_log_manager import TIP, Tiered

root, crash_at = Path(sys.argv[2]), int(sys.argv[3])
original = storage.FileRemoteStorage._put
puts = 0

def put(self, name, source):
    global puts
    puts += 1
    if puts == crash_at:
        os._exit(137)           # as kill -9: nothing flushed, nothing cleaned up
    original(self, name, source)

storage.FileRemoteStorage._put = put
t = Tiered(root)
t.rlm.copy_log_segments(t.log, TIP)
sys.exit(3)
"""


@pytest.mark.parametrize("crash_at", [1, 4, 5, 6, 7, 12, 20])
def test_a_copy_cut_by_a_crash_is_cleaned_up_and_done_again(tmp_path: Path, crash_at: int):
    t = Tiered(tmp_path)
    _fill(t.log, 60)
    assert len(t.log.segments) >= 5        # 4 closed: the last crash point falls in the fourth copy
    t.close()
    t.log.close()
    crashed = subprocess.run([sys.executable, "-c", CRASH_HELPER, str(ROOT), str(tmp_path), str(crash_at)],
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    t = Tiered(tmp_path)
    try:
        copied_before = len(_copies(t))
        # each copy: index, timeindex, txnindex, snapshot, epochs, then its log
        assert copied_before == (crash_at - 1) // 6
        cleaned = t.rlm.clean_up_unfinished(TIP)
        assert cleaned == 1                                 # the copy under way at the crash
        assert t.rlm.metadata.unfinished(TIP) == []
        t.rlm.copy_log_segments(t.log, TIP)
        closed = list(t.log.segments.values())[:-1]
        assert _copies(t) == [(s.base_offset, s.next_offset - 1) for s in closed]
        # the store holds exactly the finished copies: nothing orphaned, nothing twice
        assert {s.id for s in t.storage.list_segment_ids(TIP)} == \
            {m.segment_id.id for m in t.rlm.metadata.copied_segments(TIP)}
        leftovers = sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())
        assert len(leftovers) == 6 * len(closed), leftovers
    finally:
        t.close()
        t.log.close()


MID_PUT_HELPER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from engine.remote import storage
from tests.unit.test_remote_log_manager import TIP, Tiered

root, crash_at = Path(sys.argv[2]), int(sys.argv[3])
store = str(root / "store")
original = os.replace
renames = 0

def replace(src, dst, *args, **kwargs):
    global renames
    if str(dst).startswith(store):
        renames += 1
        if renames == crash_at:
            os._exit(137)       # as kill -9 inside a put: its temporary file written, not yet renamed
    return original(src, dst, *args, **kwargs)

storage.os.replace = replace
t = Tiered(root)
t.rlm.copy_log_segments(t.log, TIP)
sys.exit(3)
"""


@pytest.mark.parametrize("crash_at", [1, 2, 4, 7])
def test_a_put_cut_by_a_crash_leaves_no_temporary_file_in_the_store(tmp_path: Path, crash_at: int):
    # the torture harness's --tiered mode found them: `.index.tmp` files of copies cut by a kill -9, left in
    # a file:// store for good (the clean-up deleted the copy's objects, not the temporary file of its put)
    t = Tiered(tmp_path)
    _fill(t.log, 60)
    t.close()
    t.log.close()
    crashed = subprocess.run([sys.executable, "-c", MID_PUT_HELPER, str(ROOT), str(tmp_path), str(crash_at)],
                             capture_output=True, text=True, timeout=120)
    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    assert [p.name for p in (tmp_path / "store").rglob("*.tmp")] != []
    t = Tiered(tmp_path)
    try:
        assert t.rlm.clean_up_unfinished(TIP) == 1            # the copy under way at the crash
        t.rlm.copy_log_segments(t.log, TIP)
        closed = list(t.log.segments.values())[:-1]
        assert _copies(t) == [(s.base_offset, s.next_offset - 1) for s in closed]
        leftovers = sorted(p.name for p in (tmp_path / "store").rglob("*") if p.is_file())
        assert [n for n in leftovers if n.endswith(".tmp")] == []
        assert len(leftovers) == 6 * len(closed), leftovers
    finally:
        t.close()
        t.log.close()


def test_a_copy_while_the_store_is_down_is_abandoned_and_done_when_it_returns(tmp_path: Path):
    server = SeaweedFS(tmp_path / "weed").start()
    try:
        t = Tiered(tmp_path, settings=server.settings(prefix="rlm", **{"rsm.config.request.timeout.ms": "1000"}))
    except BaseException:
        server.stop()
        raise
    try:
        _fill(t.log, 40)
        server.kill()
        assert t.rlm.copy_log_segments(t.log, TIP) == 0
        assert t.rlm.copy_errors == 1
        assert _copies(t) == []
        server.start()
        t.rlm.clean_up_unfinished(TIP)
        assert t.rlm.metadata.unfinished(TIP) == []
        closed = list(t.log.segments.values())[:-1]
        assert t.rlm.copy_log_segments(t.log, TIP) == len(closed)
        assert {s.id for s in t.storage.list_segment_ids(TIP)} == \
            {m.segment_id.id for m in t.rlm.metadata.copied_segments(TIP)}
    finally:
        t.close()
        t.log.close()
        server.stop()


def test_a_partition_deleted_takes_its_superseded_copies_too(tiered: Tiered):
    # two finished copies of one base offset (a segment copied again after a power loss took its roll,
    # tests/mount/test_tiered_power_loss.py): one serves, the other is superseded, and deleting the partition
    # (its topic deleted, or `to-kafka restore --delete-remote-copies`) deletes both
    _fill(tiered.log, 40)
    tiered.rlm.copy_log_segments(tiered.log, TIP)
    first = tiered.log.segments.peekitem(0)[1]
    tiered.rlm._copy(tiered.log, first, TIP, first.next_offset - 1)     # the same segment, copied once more
    assert len(tiered.rlm.metadata.superseded_segments(TIP)) == 1
    assert len({m.start_offset for m in tiered.rlm.metadata.copied_segments(TIP)}) == \
        len(tiered.rlm.metadata.copied_segments(TIP))                   # one copy per base offset serves
    tiered.rlm.delete_partition(TIP)
    assert tiered.rlm.metadata.known_ids(TIP) == set()
    assert tiered.storage.list_segment_ids(TIP) == set()
