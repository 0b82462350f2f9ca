"""Faults in segment files, each reproduced through a real mount (issue 9, "on disk").

Links and special files where segments belong, a torn active segment behind a
clean-shutdown marker, stray ``.swap`` files, sealed segments cut short or with a
damaged length field, an offset index that passes Kafka's sanity check but does
not belong to its log, the noise of a remount after a crash, and the modes of
what logfs creates.  Every test damages the data directory the way a user or a
disk would, mounts it with ``logfs mount`` and looks through the mount with
coreutils and Python I/O, and with kafka-python as the independent reader.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from typing import TYPE_CHECKING

import pytest

from tests.conftest import Mount, kafka_records
from tests.helpers import add_config, text_view

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.mount

SMALL_SEGMENTS = {"internal.log.segment.bytes": "4096", "log.index.interval.bytes": "256"}


def _fill(mount: Mount, topic: str, records: int, per_write: int = 10) -> None:
    """``records`` lines ``<topic>-<i>`` appended ``per_write`` lines per write(2)."""
    if not (mount / topic).exists():
        (mount / topic).mkdir()
    fd = os.open(mount / topic / "0" / "append", os.O_WRONLY)
    try:
        for start in range(0, records, per_write):
            os.write(fd, b"".join(b"%s-%d\n" % (topic.encode(), i)
                                  for i in range(start, min(records, start + per_write))))
    finally:
        os.close(fd)


def _segments(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))


def _fingerprint(path: Path) -> tuple[bytes, int]:
    st = os.stat(path, follow_symlinks=False)
    return path.read_bytes(), st.st_mtime_ns


def _errors_naming(mount: Mount, text: str) -> list[str]:
    return [line for line in mount.log().splitlines() if " ERROR " in line and text in line]


# --------------------------------------------------------------------------- links and special files


@pytest.mark.parametrize("kind", ["segment link", "index link", "dangling link", "fifo", "partition dir link"])
def test_links_and_special_files_are_never_followed(logfs_mount, tmp_path, kind):
    """A planted ``00000000000000000100.log -> outside`` must leave ``outside`` byte-identical."""
    m = logfs_mount(SMALL_SEGMENTS)
    _fill(m, "t", 300)
    _fill(m, "u", 50)
    assert m.stop() == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "passwd"
    target.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 50)
    (outside / "00000000000000000000.log").write_bytes(b"not a segment\n")
    before = {p.name: _fingerprint(p) for p in outside.iterdir()}
    pdir = m.partition_dir("t", 0)
    if kind == "segment link":
        planted = pdir / "00000000000000000100.log"
        planted.symlink_to(target)
    elif kind == "index link":
        planted = pdir / "00000000000000000000.index"
        planted.unlink()
        planted.symlink_to(target)
    elif kind == "dangling link":
        planted = pdir / "00000000000000009999.timeindex"
        planted.symlink_to(outside / "does-not-exist")
    elif kind == "fifo":
        planted = pdir / "00000000000000009999.log"
        os.mkfifo(planted)
    else:
        planted = m.data / "t-1"
        planted.symlink_to(outside)

    m.start()
    try:
        assert "t" not in os.listdir(m.path)                   # not served: a partition would be missing
        assert (m / "u/0/records").read_bytes() == b"".join(b"u-%d\n" % i for i in range(50))
        with pytest.raises(OSError):
            (m / "t").mkdir()                                  # nothing is created over it either
        m.sh("seq 1 20 > u/0/append")
    finally:
        assert m.stop() == 0
    errors = _errors_naming(m, str(planted))
    assert len(errors) == 1, m.log()
    assert {p.name: _fingerprint(p) for p in outside.iterdir()} == before
    assert os.path.islink(planted) or stat.S_ISFIFO(os.lstat(planted).st_mode)
    assert not (outside / "does-not-exist").exists()
    # the partition's own files are untouched too: still there for a fixed remount
    planted.unlink()
    assert [r.value for r in kafka_records(pdir)] == [b"t-%d" % i for i in range(300)]


# --------------------------------------------------------------------------- torn active segment + clean marker


def _append_with_offsets(mount: Mount, path: str, lines: list[bytes]) -> tuple[int, int]:
    """Write ``lines`` in one write(2), fsync, and return (first, last) offset read back from the fd."""
    fd = os.open(mount / path, os.O_RDWR)
    try:
        os.write(fd, b"".join(line + b"\n" for line in lines))
        os.fsync(fd)
        first, last = map(int, os.read(fd, 4096).split())
    finally:
        os.close(fd)
    return first, last


@pytest.mark.parametrize("damage", ["cut short", "flipped byte"])
def test_damaged_active_segment_behind_a_clean_shutdown_marker(logfs_mount, damage):
    mount = logfs_mount(SMALL_SEGMENTS)
    _fill(mount, "t", 300)                          # 30 batches of 10 records
    assert mount.stop() == 0
    assert (mount.data / ".kafka_cleanshutdown").exists()
    active = _segments(mount.partition_dir("t", 0))[-1]
    readable = kafka_records(mount.partition_dir("t", 0))[:-10]      # all but the last batch
    with open(active, "r+b") as f:
        if damage == "cut short":
            f.truncate(active.stat().st_size - 7)
        else:                                       # the CRC of the last batch no longer matches
            f.seek(active.stat().st_size - 2)
            f.write(b"#")

    mount.start()
    assert (mount / "t/0/records").read_bytes() == text_view(r.value for r in readable)
    first, last = _append_with_offsets(mount, "t/0/append", [b"after-%d" % i for i in range(5)])
    assert first == len(readable)
    assert last == first + 4
    for i in range(5):
        assert mount.sh(f"cat t/0/offset/{first + i}").stdout == b"after-%d\n" % i
    # named at load (as an index that disagrees with the log, or a tail that fails its check)
    assert any(" WARNING " in line and str(active) in line for line in mount.log().splitlines())
    mount.kill()                                    # acknowledged and fsync'ed: must survive a crash

    mount.start()
    try:
        for i in range(5):
            assert mount.sh(f"cat t/0/offset/{first + i}").stdout == b"after-%d\n" % i
        again, _ = _append_with_offsets(mount, "t/0/append", [b"later"])
        assert again == last + 1                    # offsets never handed out twice
    finally:
        assert mount.stop() == 0
    values = [r.value for r in kafka_records(mount.partition_dir("t", 0))]
    assert values == [r.value for r in readable] + [b"after-%d" % i for i in range(5)] + [b"later"]


# --------------------------------------------------------------------------- stray .swap files


@pytest.mark.parametrize("content", ["random bytes", "another segment"])
def test_a_stray_swap_is_validated_before_it_replaces_anything(logfs_mount, content):
    m = logfs_mount(SMALL_SEGMENTS)
    _fill(m, "t", 780)
    assert m.stop() == 0
    pdir = m.partition_dir("t", 0)
    segments = _segments(pdir)
    assert len(segments) >= 4
    victim = segments[len(segments) // 2]
    swap = victim.with_name(victim.name + ".swap")
    if content == "random bytes":
        swap.write_bytes(os.urandom(5000))
    else:
        swap.write_bytes(segments[0].read_bytes())   # another segment's valid batches: offsets go back
    before = {p.name: p.read_bytes() for p in pdir.iterdir()}

    m.start()
    try:
        lines = (m / "t/0/records.jsonl").read_bytes().splitlines()
        offsets = [json.loads(line)["offset"] for line in lines]
        assert offsets == list(range(780))
        assert [json.loads(line)["value"] for line in lines] == ["t-%d" % i for i in range(780)]
    finally:
        assert m.stop() == 0
    assert len(_errors_naming(m, str(swap))) == 1, m.log()
    after = {p.name: p.read_bytes() for p in pdir.iterdir()}
    assert after[victim.name] == before[victim.name]         # the original is kept
    assert after[swap.name] == before[swap.name]             # and the .swap left for the operator


# --------------------------------------------------------------------------- silent gaps


def _batch_positions(segment: Path) -> list[int]:
    data = segment.read_bytes()
    positions, pos = [], 0
    while pos + 12 <= len(data):
        positions.append(pos)
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    return positions


@pytest.mark.parametrize("damage", ["cut mid-batch", "length field"])
def test_damage_in_a_sealed_segment_is_eio_never_a_silent_gap(logfs_mount, damage):
    m = logfs_mount(SMALL_SEGMENTS)
    _fill(m, "t", 600)
    assert m.stop() == 0
    segments = _segments(m.partition_dir("t", 0))
    sealed = segments[1]
    positions = _batch_positions(sealed)
    damaged_at = positions[len(positions) // 2]
    with open(sealed, "r+b") as f:
        if damage == "cut mid-batch":
            f.truncate(damaged_at + 30)
        else:
            f.seek(damaged_at + 8)
            f.write(struct.pack(">i", 100_000))          # the length field now runs past the file
    first_offset_of_next = int(segments[2].name.split(".")[0])

    m.start()
    try:
        for view in ("t/0/records", "t/0/records.jsonl"):
            result = m.sh(f"cat {view} > /dev/null", check=False)
            assert result.returncode != 0, view
            assert b"Input/output error" in result.stderr, view
        damaged_offset = int(segments[1].name.split(".")[0]) + (len(positions) // 2) * 10 + 3
        result = m.sh(f"cat t/0/offset/{damaged_offset}", check=False)
        assert b"Input/output error" in result.stderr
        # what is before and after the damage is still served
        assert m.sh("cat t/0/offset/5").stdout == b"t-5\n"
        assert m.sh(f"cat t/0/offset/{first_offset_of_next}").stdout == b"t-%d\n" % first_offset_of_next
        assert m.sh(f"cat t/0/from/{first_offset_of_next}").stdout == b"".join(
            b"t-%d\n" % i for i in range(first_offset_of_next, 600))
        assert (m / f"t/0/segments/{sealed.name}").read_bytes() == sealed.read_bytes()
    finally:
        assert m.stop() == 0
    named = [line for line in m.log().splitlines() if str(sealed) in line and f"position {damaged_at}" in line]
    assert named, m.log()


@pytest.mark.mount_options(SMALL_SEGMENTS)
def test_an_index_that_disagrees_with_its_log_is_rebuilt(mount):
    _fill(mount, "t", 780, per_write=5)
    assert mount.stop() == 0
    segments = _segments(mount.partition_dir("t", 0))
    index = segments[0].with_suffix(".index")
    good = index.read_bytes()
    entries = [struct.unpack_from(">ii", good, i) for i in range(0, len(good), 8)]
    assert len(entries) >= 3
    # Every position moved by one byte: increasing, last offset above the first and above
    # the base -- Kafka's sanity check passes, yet no entry points at a batch.
    index.write_bytes(b"".join(struct.pack(">ii", rel, pos + 1) for rel, pos in entries))

    mount.start()
    try:
        last_of_segment = int(segments[1].name.split(".")[0])
        values = mount.sh(f"for n in $(seq 0 {last_of_segment - 1}); do cat t/0/offset/$n; done").stdout
        assert values == b"".join(b"t-%d\n" % i for i in range(last_of_segment))
    finally:
        assert mount.stop() == 0
    assert "Found a corrupted index file" in mount.log()
    assert "disagrees with log" in mount.log()
    assert index.read_bytes() == good                        # rebuilt on disk


# --------------------------------------------------------------------------- noise


@pytest.mark.mount_options(SMALL_SEGMENTS)
def test_no_warning_about_the_active_index_after_a_crash_or_a_clean_shutdown(mount):
    _fill(mount, "t", 300)
    mount.kill()
    mount.start()
    _fill(mount, "t", 100)
    assert mount.stop() == 0
    mount.start()
    assert mount.stop() == 0
    warnings = [line for line in mount.log().splitlines() if "corrupted index" in line]
    assert warnings == []


# --------------------------------------------------------------------------- privacy on disk


@pytest.mark.parametrize(("umask", "dir_mode", "file_mode"), [(None, 0o700, 0o600), ("022", 0o755, 0o644)])
def test_data_is_private_on_disk_by_default(logfs_mount, umask, dir_mode, file_mode):
    m = logfs_mount(SMALL_SEGMENTS, start=False,
                    extra_args=["--data-umask", umask] if umask else None)
    m.data.rmdir()                                  # let logfs create the data dir itself
    m.start()
    _fill(m, "t", 300)
    assert m.stop() == 0
    paths = [m.data, *m.data.rglob("*")]
    assert len([p for p in paths if p.name.endswith((".log", ".index", ".timeindex"))]) >= 3
    assert any(p.name.endswith("checkpoint") for p in paths)
    for path in paths:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert mode == (dir_mode if path.is_dir() else file_mode), f"{path}: {oct(mode)}"


# --------------------------------------------------------------------------- multi-batch writes and crashes


@pytest.mark.parametrize("cut", ["between batches", "inside a batch"])
def test_a_split_write_cut_by_a_crash_leaves_a_prefix_of_whole_batches(logfs_mount, cut):
    """docs/usage.md's contract for a write larger than a segment: across a crash, a prefix of whole batches.

    A crash during such a write leaves on disk the batches written before it,
    and maybe part of the next one.  Every such state is made here from the
    files of a real split write (later segments removed, the next one cut) and
    mounted: the records are a prefix of whole batches, contiguous, and the
    next append continues right after them.
    """
    m = logfs_mount({"internal.log.segment.bytes": "4096", "log.index.interval.bytes": "256"})
    (m / "t").mkdir()
    lines = [b"%04d-" % i + b"v" * 90 for i in range(200)]               # ~19 KB: about 6 batches
    first, last = _append_with_offsets(m, "t/0/append", lines)
    assert (first, last) == (0, 199)
    m.kill()
    pdir = m.partition_dir("t", 0)
    segments = _segments(pdir)
    assert len(segments) >= 4                      # one batch per segment: each fills one
    keep = len(segments) // 2
    for segment in segments[keep + 1:]:
        for suffix in (".log", ".index", ".timeindex"):
            segment.with_suffix(suffix).unlink(missing_ok=True)
    partial = segments[keep]
    if cut == "between batches":
        partial.unlink()
        partial.with_suffix(".index").unlink(missing_ok=True)
        partial.with_suffix(".timeindex").unlink(missing_ok=True)
    else:
        with open(partial, "r+b") as f:
            f.truncate(partial.stat().st_size // 2)
    survivors = int(partial.name.split(".")[0])     # the base offset of the cut batch

    m.start()
    try:
        assert (m / "t/0/records").read_bytes() == b"".join(line + b"\n" for line in lines[:survivors])
        again, _ = _append_with_offsets(m, "t/0/append", [b"next"])
        assert again == survivors
    finally:
        assert m.stop() == 0
    assert [r.offset for r in kafka_records(pdir)] == list(range(survivors + 1))


def test_links_planted_under_temporary_names_are_not_written_through(logfs_mount, tmp_path):
    """Checkpoints, topic configs and the shutdown marker are written as ``<name>.tmp`` then renamed."""
    m = logfs_mount(SMALL_SEGMENTS)
    _fill(m, "t", 50)
    assert m.stop() == 0
    target = tmp_path / "passwd"
    target.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    before = _fingerprint(target)
    for name in ("recovery-point-offset-checkpoint.tmp", "log-start-offset-checkpoint.tmp",
                 "topic-configs.json.tmp", ".kafka_cleanshutdown.tmp"):
        (m.data / name).symlink_to(target)
    m.start()
    try:
        add_config(m / "t/config", b"retention.ms=86400000\n")
    except OSError:
        pass                                       # refusing is fine; writing through the link is not
    _fill(m, "t", 20)
    m.stop()
    assert _fingerprint(target) == before
