"""OffsetCheckpointFile: Kafka's text format, corrupt and missing files, atomic replacement."""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import checkpoint as cp
from engine.checkpoint import OffsetCheckpointFile
from engine.errors import CorruptCheckpointError, InvalidRequestError, LogDirFullError, StorageError
from engine.topic import TopicPartition

topics = st.from_regex(r"[a-zA-Z0-9._-]{1,30}", fullmatch=True).filter(lambda t: t not in (".", ".."))
offset_maps = st.dictionaries(st.builds(TopicPartition, topics, st.integers(0, 2**31 - 1)),
                              st.integers(-1, 2**63 - 1), max_size=30)


def test_file_names_are_kafkas():
    assert cp.RECOVERY_POINT_CHECKPOINT == "recovery-point-offset-checkpoint"
    assert cp.LOG_START_OFFSET_CHECKPOINT == "log-start-offset-checkpoint"
    assert cp.CLEANER_OFFSET_CHECKPOINT == "cleaner-offset-checkpoint"
    assert cp.CLEAN_SHUTDOWN_FILE == ".kafka_cleanshutdown"


@settings(max_examples=50, deadline=None)
@given(offsets=offset_maps)
def test_round_trip(tmp_path_factory, offsets):
    f = OffsetCheckpointFile(str(tmp_path_factory.mktemp("cp") / cp.RECOVERY_POINT_CHECKPOINT))
    f.write(offsets)
    assert f.read() == offsets
    assert not os.path.exists(f.temp_path)


def test_written_bytes_are_kafkas_format(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / cp.RECOVERY_POINT_CHECKPOINT))
    f.write({TopicPartition("orders", 1): 987, TopicPartition("orders", 0): 1234, TopicPartition("a-b", 10): 0})
    assert (tmp_path / cp.RECOVERY_POINT_CHECKPOINT).read_text() == "0\n3\na-b 10 0\norders 0 1234\norders 1 987\n"
    f.write({})
    assert (tmp_path / cp.RECOVERY_POINT_CHECKPOINT).read_text() == "0\n0\n"
    assert f.read() == {}


def test_reads_a_file_written_by_kafka(tmp_path):
    # As Java's BufferedWriter.newLine writes it, and with Windows line ends.
    path = tmp_path / cp.LOG_START_OFFSET_CHECKPOINT
    path.write_bytes(b"0\r\n2\r\n__consumer_offsets 17 42\r\nt 0 9223372036854775807\r\n")
    assert OffsetCheckpointFile(str(path)).read() == {
        TopicPartition("__consumer_offsets", 17): 42, TopicPartition("t", 0): 2**63 - 1}


def test_missing_and_empty_files(tmp_path):
    assert OffsetCheckpointFile(str(tmp_path / "nope")).read() == {}
    (tmp_path / "empty").write_bytes(b"")
    assert OffsetCheckpointFile(str(tmp_path / "empty")).read() == {}
    (tmp_path / "version-only").write_bytes(b"0\n")
    assert OffsetCheckpointFile(str(tmp_path / "version-only")).read() == {}


@pytest.mark.parametrize(("content", "message"), [
    ("1\n0\n", "Unrecognised version:1"),
    ("x\n0\n", "line 1"),
    ("0\nabc\n", "line 2: 'abc'"),
    ("0\n-1\n", "line 2"),
    ("0\n1\nt 0\n", "line 3: 't 0'"),
    ("0\n1\nt 0 1 2\n", "line 3"),
    ("0\n1\nt x 1\n", "line 3"),
    ("0\n1\nt 0 1.5\n", "line 3"),
    ("0\n1\nt -1 5\n", "line 3"),
    ("0\n2\nt 0 1\n\n", "line 4: ''"),
    ("0\n2\nt 0 1\n", r"Expected \[2\] entries .* found only \[1\]"),
    ("0\n1\nt 0 1\nt 1 2\n", r"Expected \[1\] entries"),
])
def test_corrupt_files_name_file_and_line(tmp_path, content, message):
    path = tmp_path / cp.CLEANER_OFFSET_CHECKPOINT
    path.write_text(content)
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        OffsetCheckpointFile(str(path)).read()
    assert str(path) in str(info.value)


def test_not_utf8_is_corrupt(tmp_path):
    path = tmp_path / "cp"
    path.write_bytes(b"0\n1\n\xff 0 1\n")
    with pytest.raises(CorruptCheckpointError, match="not UTF-8"):
        OffsetCheckpointFile(str(path)).read()


def test_stale_tmp_from_crash_is_ignored_and_replaced(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / cp.RECOVERY_POINT_CHECKPOINT))
    f.write({TopicPartition("t", 0): 5})
    # A crash in the middle of the next write left a torn temp file.
    with open(f.temp_path, "w") as torn:
        torn.write("0\n7\nt 0 9")
    assert f.read() == {TopicPartition("t", 0): 5}
    f.write({TopicPartition("t", 0): 6})
    assert f.read() == {TopicPartition("t", 0): 6}
    assert not os.path.exists(f.temp_path)


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    f = OffsetCheckpointFile(str(tmp_path / cp.RECOVERY_POINT_CHECKPOINT))
    f.write({TopicPartition("t", 0): 5})

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(LogDirFullError, match=cp.RECOVERY_POINT_CHECKPOINT):
        f.write({TopicPartition("t", 0): 6})
    monkeypatch.undo()
    assert f.read() == {TopicPartition("t", 0): 5}


def test_unwritable_directory_is_storage_error(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / "no-such-dir" / cp.RECOVERY_POINT_CHECKPOINT))
    with pytest.raises(StorageError, match="Error while writing to checkpoint file"):
        f.write({TopicPartition("t", 0): 1})


def test_refuses_topic_that_would_corrupt_the_format(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / "cp"))
    with pytest.raises(InvalidRequestError):
        f.write({TopicPartition("a b", 0): 1})
    assert not os.path.exists(f.path)


def test_each_write_keeps_the_previous_generation(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / cp.LOG_START_OFFSET_CHECKPOINT))
    f.write({TopicPartition("t", 0): 5})
    assert not os.path.exists(f.previous_path)          # nothing came before the first
    f.write({TopicPartition("t", 0): 6})
    f.write({TopicPartition("t", 0): 7})
    assert f.read() == {TopicPartition("t", 0): 7}
    assert OffsetCheckpointFile(f.previous_path).read() == {TopicPartition("t", 0): 6}


def test_writes_in_place_over_the_previous_generation_on_a_full_disk(tmp_path):
    """On a full tmpfs a checkpoint of about the same size is still written; a bigger one gets ENOSPC."""
    import subprocess
    fs = tmp_path / "fs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(fs)], check=True)
    try:
        f = OffsetCheckpointFile(str(fs / cp.LOG_START_OFFSET_CHECKPOINT))
        f.write({TopicPartition("t", p): 1 for p in range(3)})
        f.write({TopicPartition("t", p): 2 for p in range(3)})
        with open(fs / "filler", "wb") as filler, pytest.raises(OSError) as full:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        assert full.value.errno == errno.ENOSPC
        f.write({TopicPartition("t", p): 3 for p in range(3)})        # fits the blocks of .prev
        assert f.read() == {TopicPartition("t", p): 3 for p in range(3)}
        assert OffsetCheckpointFile(f.previous_path).read() == {TopicPartition("t", p): 2 for p in range(3)}
        with pytest.raises(LogDirFullError):
            f.write({TopicPartition("t" * 200, p): 4 for p in range(100)})   # needs new blocks
        assert f.read() == {TopicPartition("t", p): 3 for p in range(3)}
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def test_a_link_in_place_of_the_previous_generation_is_removed_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    f = OffsetCheckpointFile(str(tmp_path / cp.RECOVERY_POINT_CHECKPOINT))
    f.write({TopicPartition("t", 0): 1})
    os.symlink(victim, f.previous_path)
    f.write({TopicPartition("t", 0): 2})
    assert victim.read_bytes() == b"precious\n"
    assert f.read() == {TopicPartition("t", 0): 2}
    os.unlink(f.path)
    os.symlink(victim, f.path)
    with pytest.raises(StorageError):
        f.read()                                          # a link is never read either


def test_a_hard_linked_previous_generation_is_not_written_through(tmp_path):
    """A data dir copied with `cp -al` shares its files with the original: the in-place write must not."""
    f = OffsetCheckpointFile(str(tmp_path / cp.RECOVERY_POINT_CHECKPOINT))
    f.write({TopicPartition("t", 0): 1})
    f.write({TopicPartition("t", 0): 2})
    other = tmp_path / "original-copy.prev"
    os.link(f.previous_path, other)
    before = other.read_bytes()
    f.write({TopicPartition("t", 0): 3})
    assert other.read_bytes() == before
    assert f.read() == {TopicPartition("t", 0): 3}


def test_a_corrupt_current_is_written_over_so_the_good_previous_generation_survives(tmp_path):
    f = OffsetCheckpointFile(str(tmp_path / cp.LOG_START_OFFSET_CHECKPOINT))
    f.write({TopicPartition("t", 0): 5})
    f.write({TopicPartition("t", 0): 6})
    with open(f.path, "w") as torn:
        torn.write("0\n2\nt 0")
    f.write({TopicPartition("t", 0): 7})
    assert f.read() == {TopicPartition("t", 0): 7}
    # the only good copy at the time of the write (.prev: 5) was not the one written over
    assert OffsetCheckpointFile(f.previous_path).read() == {TopicPartition("t", 0): 5}
