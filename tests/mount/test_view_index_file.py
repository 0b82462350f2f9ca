"""The persisted view index (``<base>.viewindex``, engine.views.persisted).

A first read of a view after a reload reads no ``.log`` byte of a sealed
segment; a missing, truncated, damaged, stale or foreign file is never
trusted: the index is rebuilt by a scan and the views are exactly what a
fresh rendering gives.  The same through a real mount killed with SIGKILL.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING

import pytest

import engine.views.index as view_index_module
from engine.files import VIEW_INDEX_FILE_SUFFIX, view_index_file_path
from engine.log import Log
from engine.segment import LogSegment
from engine.views import LogView, ViewFormat, attach, persisted
from tests.helpers import make_config, wait_for

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

CONFIG = {"internal_segment_bytes": 6_000, "index_interval_bytes": 512}


@pytest.fixture(autouse=True)
def dense_view_index(monkeypatch):
    """Several view index entries per small segment (the default spacing is 64 KiB)."""
    monkeypatch.setattr(view_index_module, "VIEW_INDEX_INTERVAL_BYTES", 1024)


def _values(n: int, start: int = 0) -> list[bytes]:
    # mixed sizes and characters JSON must escape, so both renderings have sizes of their own
    return [b'v%d "q" \\ %s' % (i, b"x" * (i % 37)) for i in range(start, start + n)]


def _build(path: Path, batches: int = 40) -> Log:
    log = Log.load(str(path), make_config(**CONFIG))
    attach(log)
    for b in range(batches):
        log.append_values(_values(25, b * 25))
    return log


def _render_all(log: Log, fmt: ViewFormat) -> bytes:
    view = LogView(log, fmt)
    out = view.read(0, view.size())
    view.close()
    return out


def _reference(tmp_path: Path, log_dir: Path) -> tuple[bytes, bytes]:
    """Both renderings from a copy without any view index file (a scan of every segment)."""
    copy = tmp_path / "reference" / log_dir.name
    shutil.copytree(log_dir, copy)
    for f in copy.glob("*" + VIEW_INDEX_FILE_SUFFIX):
        f.unlink()
    log = Log.load(str(copy), make_config(**CONFIG))
    try:
        return _render_all(log, ViewFormat.TEXT), _render_all(log, ViewFormat.JSONL)
    finally:
        log.close()


class LogReads:
    """Counts the .log reads of each segment (a hook on LogSegment.read_bytes, its one read of bytes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.by_base: dict[int, int] = {}
        read_bytes = LogSegment.read_bytes

        def counted(original: Callable[[LogSegment, int, int], bytes]) -> Callable[[LogSegment, int, int], bytes]:
            def read(segment: LogSegment, position: int, size: int) -> bytes:
                self.by_base[segment.base_offset] = self.by_base.get(segment.base_offset, 0) + 1
                return original(segment, position, size)
            return read
        monkeypatch.setattr(LogSegment, "read_bytes", counted(read_bytes))


def test_files_are_written_at_roll_and_clean_close(tmp_path):
    log = _build(tmp_path / "t-0")
    sealed = list(log.segments.values())[:-1]
    assert len(sealed) >= 3
    assert all(os.path.exists(view_index_file_path(log.dir, s.base_offset)) for s in sealed)
    active = log.active_segment
    assert not os.path.exists(view_index_file_path(log.dir, active.base_offset))
    log.close()
    assert os.path.exists(view_index_file_path(log.dir, active.base_offset))


def test_first_tail_after_a_reload_reads_no_log_byte_of_a_sealed_segment(tmp_path, monkeypatch):
    log = _build(tmp_path / "t-0")
    log.close()
    reads = LogReads(monkeypatch)
    log = Log.load(str(tmp_path / "t-0"), make_config(**CONFIG))
    sealed = [s.base_offset for s in list(log.segments.values())[:-1]]
    reads.by_base.clear()               # what the load itself read is not the view's
    for fmt in (ViewFormat.TEXT, ViewFormat.JSONL):
        view = LogView(log, fmt)
        size = view.size()
        tail = view.read(size - 100, 100)
        assert len(tail) == 100
        assert tail.endswith(b"\n")
        view.close()
    assert not [base for base in sealed if reads.by_base.get(base)], reads.by_base
    log.close()


def _damage_modes():
    def delete(path: Path, other: Path) -> None:
        path.unlink()

    def truncate(path: Path, other: Path) -> None:
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)

    def flip(path: Path, other: Path) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))

    def zero(path: Path, other: Path) -> None:           # a power loss after the rename, before the data
        path.write_bytes(b"\0" * path.stat().st_size)

    def foreign(path: Path, other: Path) -> None:        # another segment's valid file under this name
        shutil.copyfile(other, path)

    def empty(path: Path, other: Path) -> None:
        path.write_bytes(b"")
    return [delete, truncate, flip, zero, foreign, empty]


@pytest.mark.parametrize("damage", _damage_modes(), ids=lambda f: f.__name__)
def test_a_damaged_or_missing_file_is_rebuilt_and_the_views_stay_exact(tmp_path, damage, caplog):
    log_dir = tmp_path / "t-0"
    log = _build(log_dir)
    log.close()
    expected = _reference(tmp_path, log_dir)
    files = sorted(log_dir.glob("*" + VIEW_INDEX_FILE_SUFFIX))
    damage(files[1], files[2])
    log = Log.load(str(log_dir), make_config(**CONFIG))
    with caplog.at_level(logging.INFO, logger="engine.views.persisted"):
        assert (_render_all(log, ViewFormat.TEXT), _render_all(log, ViewFormat.JSONL)) == expected
    if damage.__name__ != "delete":
        lines = [r for r in caplog.records if files[1].name in r.getMessage()]
        assert len(lines) == 1
        assert "rebuilding" in lines[0].getMessage()
    log.close()
    # the rebuilt file is valid again: a reload loads it
    log = Log.load(str(log_dir), make_config(**CONFIG))
    before = persisted.counters["loaded"]
    assert (_render_all(log, ViewFormat.TEXT), _render_all(log, ViewFormat.JSONL)) == expected
    assert persisted.counters["loaded"] - before == len(files)     # every segment's, the active one's too
    log.close()


def test_a_file_of_a_segment_whose_log_changed_is_stale(tmp_path):
    """Same base offset, same size class: the segment was rewritten (a compaction, a restore)."""
    log_dir = tmp_path / "t-0"
    log = _build(log_dir)
    log.close()
    files = sorted(log_dir.glob("*" + VIEW_INDEX_FILE_SUFFIX))
    kept = files[0].read_bytes()
    # the same partition written again with other values: the old file stays under the new segment
    shutil.rmtree(log_dir)
    log = Log.load(str(log_dir), make_config(**CONFIG))
    for b in range(40):
        log.append_values([v.upper() for v in _values(25, b * 25)])
    log.close()
    files[0].write_bytes(kept)
    expected = _reference(tmp_path, log_dir)
    log = Log.load(str(log_dir), make_config(**CONFIG))
    assert (_render_all(log, ViewFormat.TEXT), _render_all(log, ViewFormat.JSONL)) == expected
    log.close()


def test_an_active_segment_that_grew_after_a_clean_close_is_caught_up(tmp_path):
    log_dir = tmp_path / "t-0"
    log = _build(log_dir, batches=3)            # all in one active segment
    log.close()
    log = Log.load(str(log_dir), make_config(**CONFIG))
    attach(log)
    log.append_values(_values(5, 1000))         # before any view: the file covers a prefix
    expected = _reference(tmp_path, log_dir)
    before = persisted.counters["loaded"]
    assert (_render_all(log, ViewFormat.TEXT), _render_all(log, ViewFormat.JSONL)) == expected
    assert persisted.counters["loaded"] - before == 1
    log.close()


def test_a_read_only_load_writes_no_file(tmp_path):
    log_dir = tmp_path / "t-0"
    log = _build(log_dir)
    log.close()
    for f in log_dir.glob("*" + VIEW_INDEX_FILE_SUFFIX):
        f.unlink()
    names = sorted(os.listdir(log_dir))
    log = Log.load(str(log_dir), make_config(**CONFIG), read_only=True)
    _render_all(log, ViewFormat.JSONL)
    log.close()
    assert sorted(os.listdir(log_dir)) == names


@pytest.mark.mount
def test_view_index_files_survive_kill_9_and_views_stay_exact(logfs_mount):
    mount = logfs_mount()
    (mount / "t").mkdir()
    (mount / "t/config").write_text("internal.segment.bytes=20000\n")
    lines = [b'line %d "quoted" %s' % (i, b"y" * (i % 50)) for i in range(3000)]
    with open(mount / "t/0/append", "ab") as f:
        for i in range(0, len(lines), 100):
            f.write(b"\n".join(lines[i:i + 100]) + b"\n")
            f.flush()
    part = mount.partition_dir("t", 0)
    wait_for(lambda: len(list(part.glob("*" + VIEW_INDEX_FILE_SUFFIX))) >= 3, "view index files at rolls")
    mount.kill()
    # a crash can leave a torn file or a temporary one: a zero-filled one stands for it
    files = sorted(part.glob("*" + VIEW_INDEX_FILE_SUFFIX))
    files[0].write_bytes(b"\0" * files[0].stat().st_size)
    (part / (files[1].name + ".tmp")).write_bytes(b"partial")
    mount.start()
    text = (mount / "t/0/records").read_bytes()
    assert text.splitlines() == lines
    jsonl = (mount / "t/0/records.jsonl").read_bytes().splitlines()
    assert len(jsonl) == len(lines)
    assert b'"offset":2999' in jsonl[-1].replace(b" ", b"")
    assert not list(part.glob("*.tmp"))
    assert "is not used: its checksum does not match" in mount.log()


def _view_index_files(log_dir: str) -> set[str]:
    return {name for name in os.listdir(log_dir) if name.endswith(VIEW_INDEX_FILE_SUFFIX)}


def test_a_deleted_segment_takes_its_file_along(tmp_path):
    """Retention or DeleteRecords renames a segment .deleted: its view index file goes at once, and the
    files of the segments that stay are kept (a remount in between used to leave the file for ever)."""
    log = _build(tmp_path / "t-0")
    sealed = list(log.segments.values())[:-1]
    assert _view_index_files(log.dir) >= {os.path.basename(view_index_file_path(log.dir, s.base_offset))
                                          for s in sealed}
    gone, kept = sealed[:2], sealed[2:]
    log.maybe_increment_log_start_offset(kept[0].base_offset)     # DeleteRecords: renamed .deleted
    assert sum(name.endswith(".log.deleted") for name in os.listdir(log.dir)) == 2
    names = _view_index_files(log.dir)
    assert not any(os.path.basename(view_index_file_path(log.dir, s.base_offset)) in names for s in gone)
    assert all(os.path.basename(view_index_file_path(log.dir, s.base_offset)) in names for s in kept)
    log.close()                     # the .deleted files are still due (file.delete.delay.ms)
    reloaded = Log.load(log.dir, make_config(**CONFIG))
    try:
        assert _view_index_files(reloaded.dir) == names | {
            os.path.basename(view_index_file_path(log.dir, reloaded.active_segment.base_offset))}
        assert not any(name.endswith(".deleted") for name in os.listdir(reloaded.dir))
    finally:
        reloaded.close()


def test_orphaned_files_are_removed_at_load_with_one_line(tmp_path, caplog):
    log = _build(tmp_path / "t-0")
    bases = [s.base_offset for s in log.segments.values()]
    log.close()
    # what an older version left: the files of segments deleted before a remount
    for orphan in (bases[-1] + 1000, bases[-1] + 2000, bases[-1] + 3000):
        shutil.copy(view_index_file_path(log.dir, bases[0]), view_index_file_path(log.dir, orphan))
    before = _view_index_files(log.dir)
    with caplog.at_level(logging.INFO, logger="engine.log"):
        reloaded = Log.load(log.dir, make_config(**CONFIG))
    try:
        assert len(before) - len(_view_index_files(reloaded.dir)) == 3
        assert _view_index_files(reloaded.dir) == {
            os.path.basename(view_index_file_path(log.dir, b)) for b in bases}
        lines = [r.getMessage() for r in caplog.records if "view index files of deleted segments" in r.getMessage()]
        assert len(lines) == 1
        assert "Removed 3 view index files" in lines[0]
        assert _render_all(reloaded, ViewFormat.TEXT) == b"".join(v + b"\n" for v in _values(1000))
    finally:
        reloaded.close()
