"""Issue 9, manager side: one owner per data dir, damaged metadata never deletes data, long topic names.

Each test reproduces a finding of the black-box probe through real mounts:
a second ``logfs mount`` on a data dir in use, a corrupt ``topic-configs.json``,
a ``log-start-offset-checkpoint`` beyond the log end, ``rmdir`` of a topic whose
``-delete`` name would pass 255 bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LOGFS, Mount, kafka_records
from tests.helpers import add_config, mount_stats, partition_state, wait_for
from tests.jvm import require_kafka_marker

pytestmark = pytest.mark.mount




def _append_acknowledged(path: Path, lines: list[bytes]) -> list[tuple[int, int]]:
    """Write each line as one batch through an fd opened read-write, fsync, and read back the offsets."""
    fd = os.open(path, os.O_RDWR)
    try:
        for line in lines:
            os.write(fd, line + b"\n")
        os.fsync(fd)
        acks = os.read(fd, 1 << 20).decode().split("\n")
    finally:
        os.close(fd)
    return [(int(first), int(last)) for first, last in (ack.split()[-2:] for ack in acks if ack)]


def _line(process: subprocess.Popen[bytes]) -> bytes:
    """The next line the process writes to its stdout (a pipe)."""
    assert process.stdout is not None
    return process.stdout.readline()


def _mount_cmd(mountpoint: Path, data: Path, *extra: str) -> list[str]:
    return [str(LOGFS), "mount", str(mountpoint), "--data-dir", str(data), *extra]


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    """Name -> (size, mtime_ns) of everything under ``path``."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.lstat(full)
            out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
    return out


# --------------------------------------------------------------------------- one owner per data dir


def test_second_mount_on_a_data_dir_in_use_is_refused_and_touches_nothing(logfs_mount, tmp_path):
    first = logfs_mount()
    (first / "t").mkdir()
    append = first / "t/0/append"
    acked = _append_acknowledged(append, [b"before-%d" % i for i in range(50)])
    held = os.open(append, os.O_WRONLY)          # a file open on the first mount, as in the finding
    try:
        second_mnt = tmp_path / "second"
        second_mnt.mkdir()
        before = _tree(first.data / "t-0")
        for extra in ((), ("--read-only",)):
            result = subprocess.run(_mount_cmd(second_mnt, first.data, *extra), capture_output=True,
                                    timeout=60, cwd=tmp_path)
            log = result.stderr.decode()
            assert result.returncode != 0, log
            assert f"Failed to acquire lock on file .lock in {first.data}" in log
            assert "Loading logs" not in log
            assert "Recover" not in log
            assert subprocess.run(["mountpoint", "-q", str(second_mnt)]).returncode != 0
        # the refused mounts read no segment and wrote nothing in the partition
        after = _tree(first.data / "t-0")
        assert after == before
        os.write(held, b"".join(b"after-%d\n" % i for i in range(50)))
        os.fsync(held)
    finally:
        os.close(held)
    acked += _append_acknowledged(append, [b"last"])
    assert first.stop() == 0
    records = kafka_records(first.data / "t-0")
    values = [r.value for r in records]
    assert values == [b"before-%d" % i for i in range(50)] + [b"after-%d" % i for i in range(50)] + [b"last"]
    assert [r.offset for r in records] == list(range(101))
    assert acked[0] == (0, 0)
    assert acked[-1] == (100, 100)


def test_read_only_mounts_share_a_dir_and_exclude_a_writer(logfs_mount, tmp_path):
    writer = logfs_mount()
    (writer / "t").mkdir()
    _append_acknowledged(writer / "t/0/append", [b"x"])
    assert writer.stop() == 0
    lock = writer.data / ".lock"
    assert lock.exists()
    lock.unlink()                 # a data dir copied without .lock: read-only must not create it
    first_ro = Mount(tmp_path / "ro1", read_only=True)
    first_ro.data = writer.data
    first_ro.start()
    second_ro = Mount(tmp_path / "ro2", read_only=True)
    second_ro.data = writer.data
    names = sorted(os.listdir(writer.data))
    try:
        second_ro.start()         # readers share the dir
        assert (second_ro / "t/0/records").read_bytes() == b"x\n"
        assert sorted(os.listdir(writer.data)) == names        # no .lock, nothing created
        rw_mnt = tmp_path / "rw"
        rw_mnt.mkdir()
        result = subprocess.run(_mount_cmd(rw_mnt, writer.data), capture_output=True, timeout=60, cwd=tmp_path)
        assert result.returncode != 0
        assert f"Failed to acquire lock on file .lock in {writer.data}" in result.stderr.decode()
        assert "Loading logs" not in result.stderr.decode()
    finally:
        second_ro.stop()
        first_ro.stop()
    # and a read-only mount over the dir whose .lock now exists takes a shared lock on it
    ro = Mount(tmp_path / "ro3", read_only=True)
    ro.data = writer.data
    ro.start()
    try:
        result = subprocess.run(_mount_cmd(tmp_path / "rw", writer.data), capture_output=True, timeout=60,
                                cwd=tmp_path)
        assert result.returncode != 0
        assert "Failed to acquire lock" in result.stderr.decode()
    finally:
        ro.stop()


#: What Kafka's LogManager does with each log dir's .lock (kafka.utils.FileLock): FileChannel.tryLock.
JAVA_LOCKER = """
import java.io.File;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.file.StandardOpenOption;

public class Locker {
    public static void main(String[] args) throws Exception {
        FileChannel channel = FileChannel.open(new File(args[0]).toPath(),
            StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE);
        FileLock lock = channel.tryLock();
        System.out.println(lock == null ? "busy" : "locked");
        System.out.flush();
        System.in.read();
    }
}
"""


@pytest.mark.kafka
def test_logfs_and_a_kafka_broker_exclude_each_other(tmp_path):
    """Java's FileChannel.tryLock (a broker's lock) and the mount's lock conflict, both ways."""
    source = tmp_path / "Locker.java"
    source.write_text(JAVA_LOCKER)
    data = tmp_path / "data"
    data.mkdir()

    def java_lock() -> subprocess.Popen[bytes]:
        require_kafka_marker("Java's FileChannel.tryLock")
        return subprocess.Popen(["java", str(source), str(data / ".lock")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)

    broker = java_lock()
    try:
        assert _line(broker) == b"locked\n"
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        for extra in ((), ("--read-only",)):
            result = subprocess.run(_mount_cmd(mnt, data, *extra), capture_output=True, timeout=60, cwd=tmp_path)
            assert result.returncode != 0
            assert f"Failed to acquire lock on file .lock in {data}" in result.stderr.decode()
        assert sorted(os.listdir(data)) == [".lock"]
    finally:
        broker.communicate(timeout=60)     # closes stdin (the lock goes), reads and closes stdout
    m = Mount(tmp_path / "m")
    m.data = data
    m.start()                                   # the broker is gone: logfs owns the dir now
    try:
        broker = java_lock()
        try:
            assert _line(broker) == b"busy\n"
        finally:
            broker.communicate(timeout=60)
    finally:
        assert m.stop() == 0


# --------------------------------------------------------------------------- topic configs


@pytest.mark.mount_options({"log.retention.ms": "200", "log.cleaner.enable": "false",
                            "internal.log.segment.bytes": "1024"})
def test_corrupt_topic_configs_load_the_previous_generation_and_never_fall_back_to_delete(mount, caplog):
    (mount / "c").mkdir()
    add_config(mount / "c/config", b"cleanup.policy=compact\nparse.key=true\n")
    add_config(mount / "c/config", b"min.cleanable.dirty.ratio=0.9\n")     # two generations on disk
    fd = os.open(mount / "c/0/append", os.O_WRONLY)
    for i in range(0, 200, 20):
        os.write(fd, b"".join(b"k%d\tv%d\n" % (j, j) for j in range(i, i + 20)))
    os.fsync(fd)
    os.close(fd)
    assert mount.stop() == 0
    configs = mount.data / "topic-configs.json"
    previous = mount.data / "topic-configs.json.prev"
    assert json.loads(previous.read_text())["topics"]["c"]["cleanup.policy"] == "compact"
    configs.write_bytes(b'{"version": 1, "generation": 9, "topics": {"c": {"cleanup.po')   # torn
    mount.start()
    log = mount.log()
    assert "topic-configs.json is corrupt" in log
    assert "loading the previous generation" in log
    assert b"cleanup.policy=compact" in (mount / "c/config").read_bytes()
    # retention (200 ms for delete topics) has run several times and deleted nothing
    deadline_runs = mount_stats(mount)["tasks"]["kafka-log-retention"]["runs"]
    wait_for(lambda: mount_stats(mount)["tasks"]["kafka-log-retention"]["runs"]
              >= deadline_runs + 3, what="three retention runs")
    assert partition_state(mount, "c")["log_start_offset"] == 0
    assert len((mount / "c/0/records").read_bytes().splitlines()) == 200
    assert mount.stop() == 0

    # neither generation readable: refuse to start, say how to repair, delete nothing
    configs.write_bytes(b"garbage")
    previous.write_bytes(b"{}")
    result = subprocess.run(_mount_cmd(mount.path, mount.data), capture_output=True, timeout=60, cwd=mount.base)
    err = result.stderr.decode()
    assert result.returncode != 0
    assert "Refusing to start" in err
    assert "restore topic-configs.json from a backup" in err
    assert len(kafka_records(mount.data / "c-0")) == 200


# --------------------------------------------------------------------------- log start checkpoint


@pytest.mark.mount_options({"internal.log.segment.bytes": "4096"})
def test_log_start_checkpoint_beyond_the_log_end_keeps_every_segment(mount):
    (mount / "t").mkdir()
    fd = os.open(mount / "t/0/append", os.O_WRONLY)
    for i in range(0, 3000, 100):
        os.write(fd, b"".join(b"r%d\n" % j for j in range(i, i + 100)))
    os.close(fd)
    (mount / "t/0/delete").write_bytes(b"before 10\n")
    assert mount.stop() == 0
    segments = sorted(p.name for p in (mount.data / "t-0").iterdir() if p.name.endswith(".log"))
    assert len(segments) > 3
    (mount.data / "log-start-offset-checkpoint").write_text("0\n1\nt 0 999999999\n")
    mount.start()
    assert "The checkpointed log start offset 999999999 is beyond the log end offset 3000" in mount.log()
    state = partition_state(mount, "t")
    assert state["log_start_offset"] == 0
    assert state["log_end_offset"] == 3000
    assert (mount / "t/0/offset/2999").read_bytes() == b"r2999\n"
    assert len((mount / "t/0/records").read_bytes().splitlines()) == 3000
    assert sorted(p.name for p in (mount.data / "t-0").iterdir() if p.name.endswith(".log")) == segments


# --------------------------------------------------------------------------- long topic names


@pytest.mark.parametrize("length", [214, 249])
def test_rmdir_of_a_long_topic_name_succeeds_and_a_quick_restart_finishes_the_deletion(logfs_mount, length):
    mount = logfs_mount({"log.segment.delete.delay.ms": "60000"})
    topic = ("t" * length)
    (mount / topic).mkdir()
    _append_acknowledged(mount / f"{topic}/0/append", [b"a", b"b"])
    os.rmdir(mount / topic)                                   # was EIO: the -delete name passed 255 bytes
    assert topic not in os.listdir(mount.path)
    deleting = [n for n in os.listdir(mount.data) if n.endswith("-delete")]
    assert len(deleting) == 1
    assert all(len(n) <= 255 for n in deleting)
    assert mount.stop() == 0                                  # well within file.delete.delay.ms
    mount.options["log.segment.delete.delay.ms"] = "100"
    mount.start()
    wait_for(lambda: not any(n.endswith("-delete") for n in os.listdir(mount.data)), what="-delete dirs removed")
    (mount / topic).mkdir()                                   # the name is free again, the topic empty
    assert (mount / f"{topic}/0/records").read_bytes() == b""


# --------------------------------------------------------------------------- logfs check


def _check(*dirs: Path) -> tuple[int, list[str]]:
    result = subprocess.run([str(LOGFS), "check", *map(str, dirs)], capture_output=True, timeout=120)
    return result.returncode, result.stdout.decode().splitlines()


def _write_batches(mount: Mount, topic: str, count: int, per_batch: int = 10) -> None:
    fd = os.open(mount / f"{topic}/0/append", os.O_WRONLY)
    for i in range(0, count, per_batch):
        os.write(fd, b"".join(b"%s-%06d\n" % (topic.encode(), j) for j in range(i, i + per_batch)))
    os.close(fd)


def _check_reports_one(data: Path, log: Path, raw: bytearray, *said: str) -> None:
    """``raw`` written over ``log``: ``logfs check`` of ``data`` exits 1 with one line, which says each of ``said``."""
    log.write_bytes(bytes(raw))
    code, lines = _check(data)
    assert code == 1, lines
    assert len(lines) == 1, lines
    for part in said:
        assert part in lines[0], (part, lines)


def _batch_positions(log: Path) -> list[tuple[int, int]]:
    from engine.records import read_header
    data = log.read_bytes()
    out, position = [], 0
    while position < len(data):
        header = read_header(data, position)
        out.append((position, header.size))
        position += header.size
    return out


def test_check_covers_topics_starting_with_a_dot(mount):
    (mount / ".internal").mkdir()
    _write_batches(mount, ".internal", 100)
    assert mount.stop() == 0
    assert _check(mount.data) == (0, [])
    log = mount.data / ".internal-0" / "00000000000000000000.log"
    position, size = _batch_positions(log)[3]
    raw = bytearray(log.read_bytes())
    raw[position + size - 2] ^= 0xFF                          # a record byte: the CRC fails
    _check_reports_one(mount.data, log, raw, f"{log}, position {position}", "crc")


def test_check_reports_one_bad_batch_once_not_the_rest_of_the_segment(mount):
    (mount / "t").mkdir()
    _write_batches(mount, "t", 3000)                          # one segment of 300 batches
    assert mount.stop() == 0
    log = mount.data / "t-0" / "00000000000000000000.log"
    positions = _batch_positions(log)
    position, size = positions[100]
    raw = bytearray(log.read_bytes())
    raw[position + size - 5] ^= 0x01
    # one line: was "... bytes unreadable" + every later index entry
    _check_reports_one(mount.data, log, raw, f"position {position}", "offsets 1000..1009")
    # a length field that breaks the framing: the rest is unreadable, said once, no index entries after it
    raw[position + 8:position + 12] = (10 ** 6).to_bytes(4, "big")
    _check_reports_one(mount.data, log, raw, f"position {position}", "cannot be framed")


def test_check_of_empty_partitions_after_a_crash_is_clean(logfs_mount):
    mount = logfs_mount()
    for topic in ("a", "b"):
        (mount / topic).mkdir()
    _write_batches(mount, "b", 50)
    mount.kill()                                              # active indexes stay preallocated, zero-filled
    index = mount.data / "a-0" / "00000000000000000000.index"
    assert index.stat().st_size > 0
    assert not index.read_bytes().strip(b"\0")
    assert _check(mount.data) == (0, [])
    mount.start()
    assert mount.stop() == 0
    assert _check(mount.data) == (0, [])


def test_check_reports_a_swap_file_the_next_mount_would_install(mount):
    (mount / "t").mkdir()
    add_config(mount / "t/config", b"internal.segment.bytes=4096\n")
    _write_batches(mount, "t", 1000)
    assert mount.stop() == 0
    pdir = mount.data / "t-0"
    segments = sorted(p for p in pdir.iterdir() if p.name.endswith(".log"))
    assert len(segments) > 3
    garbage = segments[2].with_name(segments[2].name + ".swap")
    garbage.write_bytes(os.urandom(5000))
    code, lines = _check(mount.data)
    assert code == 1, lines
    assert len(lines) == 1, lines
    assert str(garbage) in lines[0], lines
    garbage.unlink()
    other = segments[2].with_name(segments[2].name + ".swap")
    other.write_bytes(segments[1].read_bytes())               # another segment's content
    code, lines = _check(mount.data)
    assert code == 1, lines
    assert str(other) in lines[0], lines
    assert "holds another segment" in lines[0], lines
    other.unlink()
    assert _check(mount.data) == (0, [])


# --------------------------------------------------------------------------- access by other users


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd],
                          capture_output=True, timeout=60)


def test_other_users_are_refused_without_allow_other_and_nothing_outside_the_data_dir_is_touched():
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="logfs-access-"))
    try:
        os.chmod(base, 0o755)                 # other users can reach the mount point, not more
        m = Mount(base / "m")
        os.chmod(m.base, 0o755)
        m.log_file.touch()                    # the test's own log of the mount, not the mount's doing
        (base / "bystander").write_bytes(b"not logfs\n")
        os.symlink(base / "bystander", m.base / "link-next-to-the-data")
        outside_before = {k: v for k, v in _tree(base).items()
                          if not k.startswith(("m/data", "m/logfs.log", "m/mnt"))}
        m.start()
        try:
            (m / "t").mkdir()
            (m / "t/0/append").write_bytes(b"secret\n")
            denied = _as_nobody("cat", str(m / "t/0/records"))
            assert denied.returncode != 0, denied
            assert b"Permission denied" in denied.stderr, denied
            assert _as_nobody("ls", str(m.path)).returncode != 0
            assert _as_nobody("sh", "-c", f"echo x > {m / 't/0/append'}").returncode != 0
        finally:
            assert m.stop() == 0
        m.extra_args = ["--allow-other"]
        m.start()
        try:
            allowed = _as_nobody("cat", str(m / "t/0/records"))
            assert allowed.returncode == 0, allowed
            assert allowed.stdout == b"secret\n", allowed
        finally:
            assert m.stop() == 0
        assert (m.data / "t-0").is_dir()
        outside_after = {k: v for k, v in _tree(base).items()
                         if not k.startswith(("m/data", "m/logfs.log", "m/mnt"))}
        assert outside_after == outside_before
    finally:
        subprocess.run(["fusermount3", "-uz", str(base / "m" / "mnt")], capture_output=True)
        import shutil
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- noise


@pytest.mark.mount_options({"internal.log.segment.bytes": "2048", "log.cleaner.backoff.ms": "50",
                            "log.cleaner.min.compaction.lag.ms": "0", "log.segment.delete.delay.ms": "100"})
def test_a_compaction_of_hundreds_of_segments_logs_no_failed_deletes(mount):
    """The probe saw one compaction log 1,200 "Failed to delete ... because it does not exist" lines."""
    (mount / "c").mkdir()
    add_config(mount / "c/config", b"parse.key=true\n")
    fd = os.open(mount / "c/0/append", os.O_WRONLY)
    for i in range(0, 9000, 30):
        os.write(fd, b"".join(b"k%d\tvalue-%06d\n" % (j % 7, j) for j in range(i, i + 30)))
    os.close(fd)
    segments = len(partition_state(mount, "c")["segments"])
    assert segments > 100
    add_config(mount / "c/config", b"cleanup.policy=compact\nmin.cleanable.dirty.ratio=0.01\n")
    wait_for(lambda: "cleaned log c-0" in mount.log(), timeout=60, what="compaction")
    wait_for(lambda: partition_state(mount, "c")["pending_deletion"]["segments"] == 0, what="old segments removed")
    # The first clean leaves one (mostly empty) segment per segment it read; the next one
    # groups those and deletes them: that is where the probe saw the failed deletes.
    fd = os.open(mount / "c/0/append", os.O_WRONLY)
    for i in range(0, 600, 30):
        os.write(fd, b"".join(b"k%d\tagain-%06d\n" % (j % 7, j) for j in range(i, i + 30)))
    os.close(fd)
    wait_for(lambda: mount.log().count("cleaned log c-0") >= 2, timeout=60, what="a second compaction")
    wait_for(lambda: partition_state(mount, "c")["pending_deletion"]["segments"] == 0, what="old segments removed")
    remaining = len(partition_state(mount, "c")["segments"])
    os.rmdir(mount / "c")                        # and the topic with what the cleaner left
    assert mount.stop() == 0
    log = mount.log()
    assert "Failed to delete" not in log
    assert "does not exist" not in log
    deleted = [line for line in log.splitlines() if " INFO Deleted " in line and " of segment " in line]
    # one line per segment file set (the replaced ones, then those of the deleted topic), not three
    assert len(deleted) <= 2 * segments + remaining + 20, len(deleted)
