"""``logfs to-kafka restore``: the records only in remote storage brought back into local segments, offline.

Real parts only: a LogManager over a real data dir tiers a topic to a directory
store (``file://``) and local retention deletes its copied segments; then the
command runs as a user runs it (``logfs.cli.main``, or a process killed with
SIGKILL part-way), and the data dir is loaded again, by a mount's LogManager
with and without the store, and by ``to-kafka plan`` and ``logfs check``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

from engine.clock import ManualClock
from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.remote.restore import RESTORE_SUFFIX
from engine.remote.storage import open_remote_storage
from engine.topic import TopicPartition
from engine.views.log_view import LogView, ViewFormat
from logfs.cli import main
from logfs.to_kafka import inspect
from tests.helpers import log_of, wait_for

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARTITIONS = 2


def _manager(tmp_path: Path, *, tiered: bool = True) -> LogManager:
    config = BrokerConfig.from_props({"log.dirs": str(tmp_path / "data"), "internal.log.segment.bytes": "4096",
                                      "remote.log.storage.system.enable": "true" if tiered else "false"})
    (tmp_path / "store").mkdir(parents=True, exist_ok=True)
    storage = open_remote_storage({"rsm.config.uri": f"file://{tmp_path / 'store'}"}) if tiered else None
    manager = LogManager(config, clock=ManualClock(1_700_000_000_000), remote_storage=storage,
                         remote_cache_bytes=1 << 20, remote_chunk_bytes=4096)
    manager.startup()
    return manager


def _line(partition: int, i: int) -> bytes:
    return b"p%d-line-%06d-%s" % (partition, i, b"x" * (i % 50))


def _expected(partition: int, lines: int) -> bytes:
    return b"".join(_line(partition, i) + b"\n" for i in range(lines))


def _text(manager: LogManager, partition: int) -> bytes:
    view = LogView(log_of(manager, TopicPartition("t", partition)), ViewFormat.TEXT)
    try:
        return view.read(0, view.size())
    finally:
        view.close()


def _tiered_data_dir(tmp_path: Path, lines: int = 1500) -> dict[int, tuple[int, int]]:
    """Topic ``t`` (two partitions) with most of its records only in the store, ``local`` untiered: returns
    each partition of ``t``'s (log start, local log start)."""
    manager = _manager(tmp_path)
    try:
        manager.create_topic("t", PARTITIONS, {"remote.storage.enable": "true", "local.retention.bytes": "12000"})
        manager.create_topic("local", 1)
        for p in range(PARTITIONS):
            log = log_of(manager, TopicPartition("t", p))
            for start in range(0, lines, 50):
                log.append_values([_line(p, i) for i in range(start, min(start + 50, lines))])
            log.flush()
        log_of(manager, TopicPartition("local", 0)).append_values([b"stays local"])
        manager.copy_to_remote_storage()
        manager.cleanup_logs()
        starts = {}
        for p in range(PARTITIONS):
            log = log_of(manager, TopicPartition("t", p))
            assert log.log_start_offset < log.local_log_start_offset, "local retention deleted nothing"
            starts[p] = (log.log_start_offset, log.local_log_start_offset)
            assert _text(manager, p) == _expected(p, lines)        # the records below come from the store
    finally:
        manager.shutdown()
    return starts


def _local_files(tmp_path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tmp_path)): p.read_bytes() for p in (tmp_path / "data").rglob("*")
            if p.is_file() and "remote-log" not in p.parts}


def _assert_whole_and_local(tmp_path: Path, lines: int) -> None:
    """Every record of ``t``, byte for byte, from a mount without remote storage: nothing is only in the store."""
    manager = _manager(tmp_path, tiered=False)
    try:
        for p in range(PARTITIONS):
            log = log_of(manager, TopicPartition("t", p))
            assert log.log_start_offset == log.local_log_start_offset == 0
            assert _text(manager, p) == _expected(p, lines)
        assert "remote.storage.enable" not in manager.topic_overrides("t")
    finally:
        manager.shutdown()


def test_plan_names_the_partitions_only_in_the_store_and_restore_brings_them_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]):
    starts = _tiered_data_dir(tmp_path)
    data, uri = str(tmp_path / "data"), f"rsm.config.uri=file://{tmp_path / 'store'}"

    # the plan refuses, naming every partition, what is only in the store, and the command to run
    assert main(["to-kafka", "plan", data]) == 1
    refusal = caplog.text
    assert f"{PARTITIONS} partitions hold records only in the remote storage" in refusal
    for p, (start, local_start) in starts.items():
        assert f"t-{p}: offsets {start} to {local_start - 1} only in remote storage (" in refusal
    assert f"logfs to-kafka restore {data} --config FILE --topic t" in refusal
    assert "local-0" not in refusal          # the untiered topic is not named
    caplog.clear()

    # without the store's settings the restore says what is missing and changes nothing
    before = _local_files(tmp_path)
    assert main(["to-kafka", "restore", data]) == 1
    assert "rsm.config.* settings" in caplog.text
    assert _local_files(tmp_path) == before

    assert main(["to-kafka", "restore", data, "-o", uri]) == 0, caplog.text
    out = capsys.readouterr().out
    assert "remote.storage.enable turned off for t" in out
    for p, (start, _) in starts.items():
        assert f"t-{p} restored_segments=" in out
        assert f"local_log_start_offset={start}" in out
    # no temporary file is left, the copies stay in the store (and the metadata still names them)
    assert not list((tmp_path / "data").rglob(f"*{RESTORE_SUFFIX}"))
    assert list((tmp_path / "store").rglob("*.log"))
    _assert_whole_and_local(tmp_path, 1500)
    assert main(["check", data, "-o", uri]) == 0, capsys.readouterr().out

    # the plan takes the topic now, saying the copies are still in the store
    caplog.clear()
    assert main(["to-kafka", "plan", data]) == 0, caplog.text
    plan = capsys.readouterr().out
    assert "kafka-topics.sh --bootstrap-server localhost:9092 --create --topic t" in plan
    assert "stay in the mount's remote storage, every record of them is in the local segments" in plan
    state = inspect([data])
    assert state.remote_only() == []
    assert [p.log_start_offset for p in state.partitions if p.topic_partition.topic == "t"] == [0, 0]

    # again: nothing to do; then the copies deleted from the store, recorded in the metadata
    assert main(["to-kafka", "restore", data, "-o", uri, "--topic", "t"]) == 0
    assert "restored_segments=0" in capsys.readouterr().out
    assert main(["to-kafka", "restore", data, "-o", uri, "--topic", "t", "--delete-remote-copies"]) == 0
    assert "Deleted" in capsys.readouterr().out
    assert not list((tmp_path / "store").rglob("*.log"))
    assert main(["check", data, "-o", uri]) == 0
    _assert_whole_and_local(tmp_path, 1500)
    assert main(["to-kafka", "plan", data]) == 0
    assert "stay in the mount's remote storage" not in capsys.readouterr().out


def test_restore_refuses_a_mounted_data_dir_and_an_unknown_topic(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    _tiered_data_dir(tmp_path, lines=600)
    data, uri = str(tmp_path / "data"), f"rsm.config.uri=file://{tmp_path / 'store'}"
    before = _local_files(tmp_path)
    assert main(["to-kafka", "restore", data, "-o", uri, "--topic", "nope"]) == 1
    assert "No topic nope in" in caplog.text
    # another process holds the dir as a mount does (its LogManager's locks), until its stdin closes
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom engine.log_dirs import lock_log_dirs\n"
                               f"lock_log_dirs([{data!r}], read_only=False)\nprint('locked', flush=True)\n"
                               "sys.stdin.read()"],
        env={**os.environ, "PYTHONPATH": ROOT}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"locked\n"
        caplog.clear()
        assert main(["to-kafka", "restore", data, "-o", uri]) == 1
        assert "is in use" in caplog.text
        assert "logfs umount" in caplog.text
    finally:
        holder.communicate(b"")
    assert _local_files(tmp_path) == before


def test_a_missing_object_or_a_store_that_fails_fails_the_restore_and_loses_nothing_local(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    _tiered_data_dir(tmp_path)
    data, uri = str(tmp_path / "data"), f"rsm.config.uri=file://{tmp_path / 'store'}"
    before = _local_files(tmp_path)
    store = tmp_path / "store"

    # a store that is not there
    assert main(["to-kafka", "restore", data, "-o", f"rsm.config.uri=file://{tmp_path / 'gone'}"]) == 1
    assert f"Cannot open the remote storage: Remote storage file://{tmp_path / 'gone'} does not exist" in caplog.text
    assert _local_files(tmp_path) == before

    # an S3 endpoint that takes connections and never answers: the bounded wait, then the store named
    caplog.clear()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert main(["to-kafka", "restore", data, "-o", "rsm.config.uri=s3://bucket/prefix", "-o",
                     f"rsm.config.s3.endpoint.url={endpoint}", "-o", "rsm.config.request.timeout.ms=300", "-o",
                     "rsm.config.s3.access.key.id=key-id", "-o",
                     "rsm.config.s3.secret.access.key=a-secret-only-this-test-uses"]) == 1
    assert f"Cannot open the remote storage: Could not open bucket bucket: remote storage s3://bucket/prefix at " \
           f"{endpoint} did not answer in time" in caplog.text
    assert _local_files(tmp_path) == before

    # a copy whose .log is gone: named, with its store, before anything changes
    caplog.clear()
    logs = sorted(store.rglob("*.log"))
    hidden = logs[0].with_suffix(".hidden")
    logs[0].rename(hidden)
    assert main(["to-kafka", "restore", data, "-o", uri]) == 1
    assert f"is missing from remote storage file://{store}" in caplog.text
    assert logs[0].name in caplog.text
    assert _local_files(tmp_path) == before
    hidden.rename(logs[0])

    # an index object lost part-way: the segments restored before it stay (a valid tiered log), its own
    # files are not left, and every record still reads from the store
    caplog.clear()
    index = sorted(store.rglob("*.timeindex"))[2]
    index.rename(index.with_suffix(".hidden"))
    assert main(["to-kafka", "restore", data, "-o", uri, "--topic", "t"]) == 1
    assert "Cannot restore remote log segment" in caplog.text
    assert f"file://{store}" in caplog.text
    assert index.name.split(".")[0] in caplog.text
    assert not list((tmp_path / "data").rglob(f"*{RESTORE_SUFFIX}"))
    manager = _manager(tmp_path)
    try:
        for p in range(PARTITIONS):
            assert _text(manager, p) == _expected(p, 1500)
        assert manager.topic_overrides("t")["remote.storage.enable"] == "true"
    finally:
        manager.shutdown()
    index.with_suffix(".hidden").rename(index)
    assert main(["to-kafka", "restore", data, "-o", uri]) == 0
    _assert_whole_and_local(tmp_path, 1500)


def test_a_restore_killed_at_any_point_leaves_a_whole_log_and_runs_again(tmp_path: Path):
    """SIGKILL once restored files appear, again and again: after each kill a tiered mount serves every record
    (the segments restored below the local ones, the store the rest), and the last run finishes the job."""
    lines = 3000
    starts = _tiered_data_dir(tmp_path, lines)
    data, uri = str(tmp_path / "data"), f"rsm.config.uri=file://{tmp_path / 'store'}"
    command = [sys.executable, "-m", "logfs.cli", "to-kafka", "restore", data, "-o", uri]
    env = {**os.environ, "PYTHONPATH": ROOT}
    partition_dirs = [tmp_path / "data" / f"t-{p}" for p in range(PARTITIONS)]

    def local_start(p: int) -> int:
        return min(int(f.name.split(".")[0]) for f in partition_dirs[p].glob("*.log"))

    kills = 0
    for _ in range(4):
        progress = [local_start(p) for p in range(PARTITIONS)]

        def changed(proc: subprocess.Popen[bytes], progress: list[int] = progress) -> bool:
            return proc.poll() is not None or any(list(d.glob(f"*{RESTORE_SUFFIX}")) for d in partition_dirs) \
                or [local_start(p) for p in range(PARTITIONS)] != progress

        if progress == [starts[p][0] for p in range(PARTITIONS)]:
            break
        with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            # killed as soon as it has changed something: a temporary file, or a segment restored
            moved = wait_for(lambda: changed(proc), "the restore to start writing", timeout=60, interval=0.001)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
            assert moved
        manager = _manager(tmp_path)        # a mount of the dir as the kill left it: every record is there
        try:
            for p in range(PARTITIONS):
                assert _text(manager, p) == _expected(p, lines)
                assert log_of(manager, TopicPartition("t", p)).log_start_offset == starts[p][0]
        finally:
            manager.shutdown()
        assert main(["check", data, "-o", uri]) == 0
    assert kills >= 1, "the restore finished before it could be killed"
    assert main(["to-kafka", "restore", data, "-o", uri]) == 0
    _assert_whole_and_local(tmp_path, lines)
    assert main(["check", data, "-o", uri]) == 0


def test_the_log_loader_never_loads_a_half_restored_segment(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """What a kill leaves inside one segment's restore: its temporary files (never opened by the loader),
    or its indexes renamed but not its .log (orphans the loader deletes): a mount serves every record."""
    starts = _tiered_data_dir(tmp_path, lines=900)
    d = tmp_path / "data" / "t-0"
    first = min(d.glob("*.log"))
    below = starts[0][1] - 1
    (d / f"{below - 5:020d}.log{RESTORE_SUFFIX}").write_bytes(first.read_bytes()[:100])
    (d / f"{below - 5:020d}.index").write_bytes(b"")
    caplog.set_level(logging.INFO)
    manager = _manager(tmp_path)
    try:
        log = log_of(manager, TopicPartition("t", 0))
        assert log.local_log_start_offset == starts[0][1]
        assert _text(manager, 0) == _expected(0, 900)
    finally:
        manager.shutdown()
    assert main(["to-kafka", "restore", str(tmp_path / "data"), "-o",
                 f"rsm.config.uri=file://{tmp_path / 'store'}"]) == 0
    assert "Removed 1 files of a restore that was stopped" in caplog.text
    _assert_whole_and_local(tmp_path, 900)
