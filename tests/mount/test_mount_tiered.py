"""Tiered storage through a real mount against a real S3 server (SeaweedFS): settings, copies, remote retention.

Driven with real file I/O (``echo >> config``, ``cat >> append``, ``cat
records``, ``rmdir``); the store is a ``weed mini`` this module starts, and
the objects are checked through boto3 against it. With local retention, the
records below the local log start are read from the store through every view.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import LOGFS, Mount
from tests.helpers import JsonObject, partition_state, text_view, wait_for
from tests.jvm import free_port
from tests.seaweedfs import (  # noqa: F401  (the seaweedfs fixtures)
    ACCESS_KEY,
    BUCKET,
    SECRET_KEY,
    SeaweedFS,
    own_seaweedfs_server,
    seaweedfs_server,
)

pytestmark = pytest.mark.mount

COPY_TASK = "kafka-remote-log-manager"


def _client(server: SeaweedFS):
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)


def _objects(server: SeaweedFS, prefix: str) -> list[str]:
    client = _client(server)
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
        return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))
    finally:
        client.close()


def _tiered_options(server: SeaweedFS, prefix: str, **more: str) -> dict[str, str]:
    return {"remote.log.storage.system.enable": "true", "internal.log.segment.bytes": "4096",
            "log.initial.task.delay.ms": "0", "remote.log.manager.task.interval.ms": "200",
            "rsm.config.request.timeout.ms": "2000", **server.settings(prefix=prefix),
            # copies below the log start go file.delete.delay.ms after a round found them there (60 s by default)
            "log.segment.delete.delay.ms": "500", **more}


def _lines(first: int, last: int) -> bytes:
    return b"".join(b"line-%06d-%s\n" % (i, b"x" * 60) for i in range(first, last))


def _append(mount: Mount, first: int, last: int, tmp_path: Path) -> None:
    source = tmp_path / f"lines-{first}-{last}"
    source.write_bytes(_lines(first, last))
    mount.sh(f"cat {source} >> t/0/append")


def _metric(mount: Mount, name: str) -> float:
    """The value of the mount's metric ``name`` (one without labels) in ``.logfs/metrics``."""
    found = re.search(rf"^{name} (\S+)$", (mount / ".logfs/metrics").read_text(), re.M)
    assert found, name
    return float(found.group(1))


def _errors(mount: Mount) -> str:
    return (mount / ".logfs/errors").read_text()


def _closed_segments(state: JsonObject) -> list[JsonObject]:
    segments: list[JsonObject] = state["segments"]
    return segments[:-1]


def test_closed_segments_are_copied_to_s3_and_removed_with_the_records_and_the_topic(logfs_mount, seaweedfs: SeaweedFS,
                                                                                      tmp_path: Path):
    mount = logfs_mount(_tiered_options(seaweedfs, "copy"))
    assert "Opened remote storage s3://tier/copy" in mount.log()
    assert seaweedfs.settings()["rsm.config.s3.secret.access.key"] not in mount.log()
    mount.sh("mkdir t")
    assert partition_state(mount)["remote_storage"] == {"enabled": False, "segments": 0, "size_bytes": 0,
                                               "highest_offset_copied": -1, "copy_lag_segments": 0,
                                               "copy_lag_bytes": 0}
    mount.sh("echo remote.storage.enable=true >> t/config")
    assert "remote.storage.enable=true" in (mount / "t/config").read_text().splitlines()
    _append(mount, 0, 2000, tmp_path)

    def copied() -> JsonObject | None:
        state = partition_state(mount)
        closed = _closed_segments(state)
        remote = state["remote_storage"]
        if remote["segments"] == len(closed) and remote["highest_offset_copied"] == closed[-1]["next_offset"] - 1:
            return state
        return None

    state = wait_for(copied, "every closed segment copied")
    assert state is not None
    closed = _closed_segments(state)
    assert len(closed) >= 20
    assert state["remote_storage"]["size_bytes"] == sum(s["size_bytes"] for s in closed)
    assert state["remote_storage"]["copy_lag_bytes"] == 0
    objects = _objects(seaweedfs, "copy")
    logs = [k for k in objects if k.endswith(".log")]
    assert len(logs) == len(closed)
    topic_dir = {k.split("/")[1] for k in objects}
    assert len(topic_dir) == 1
    assert re.fullmatch(r"t-[A-Za-z0-9_-]{22}", topic_dir.pop())
    assert sorted(int(k.rsplit("/", 1)[1].split("-")[0]) for k in logs) == [s["base_offset"] for s in closed]
    # a copy is the local segment, byte for byte
    client = _client(seaweedfs)
    try:
        first = next(k for k in logs if k.rsplit("/", 1)[1].startswith("%020d-" % 0))
        body = client.get_object(Bucket=BUCKET, Key=first)["Body"].read()
    finally:
        client.close()
    assert body == (mount.partition_dir("t", 0) / ("%020d.log" % 0)).read_bytes()
    assert _metric(mount, "logfs_remote_copy_bytes_total") == state["remote_storage"]["size_bytes"]
    assert re.search(r'^logfs_remote_copy_lag_bytes\{partition="0",topic="t"\} 0\.0$',
                     (mount / ".logfs/metrics").read_text(), re.M)
    assert _metric(mount, "logfs_remote_storage_unavailable") == 0
    # every record is still read from the local segments
    assert (mount / "t/0/records").read_bytes() == text_view(_lines(0, 2000).splitlines())
    # DeleteRecords: the copies wholly below the new log start go from the store
    cut = closed[3]["base_offset"] + 1
    mount.sh(f"echo 'before {cut}' > t/0/delete")
    wait_for(lambda: partition_state(mount)["remote_storage"]["segments"] == len(closed) - 3,
             "the copies below deleted")
    wait_for(lambda: len([k for k in _objects(seaweedfs, "copy") if k.endswith(".log")]) == len(closed) - 3,
             "their objects deleted")
    # topic deletion: every object of the topic goes
    mount.sh("rmdir t")
    wait_for(lambda: _objects(seaweedfs, "copy") == [], "every object of the deleted topic deleted")
    assert "whose topic was deleted" in mount.log()


def test_remote_storage_enable_is_refused_on_compacted_topics_and_without_remote_storage(logfs_mount,
                                                                                         seaweedfs: SeaweedFS):
    mount = logfs_mount(_tiered_options(seaweedfs, "refusals"))
    mount.sh("mkdir c t")
    mount.sh("echo cleanup.policy=compact >> c/config")
    mount.sh_refused("echo remote.storage.enable=true >> c/config")
    assert re.search(r"c/config EINVAL .*Remote log storage is unsupported for the compacted topics", _errors(mount))
    assert "Remote log storage is unsupported for the compacted topics" in mount.log()
    mount.sh("echo remote.storage.enable=true >> t/config")
    mount.sh_refused("echo cleanup.policy=compact >> t/config")
    assert re.search(r"t/config EINVAL .*cleanup.policy=compact", _errors(mount))
    mount.sh_refused("printf 'retention.bytes=100000\\nlocal.retention.bytes=200000\\n' >> t/config")
    assert "local.retention.bytes: Value must not be more than retention.bytes" in _errors(mount)
    assert "cleanup.policy" not in (mount / "t/config").read_text().split("# Defaults")[0]

    plain = logfs_mount({}, name="plain")
    plain.sh("mkdir t")
    plain.sh_refused("echo remote.storage.enable=true >> t/config")
    assert re.search(r"t/config EINVAL .*the mount has no remote storage", _errors(plain))
    assert "the mount has no remote storage" in plain.log()
    plain.sh("echo local.retention.ms=1000 >> t/config")      # valid, and without effect until tiering is on


def _failed_mount(logfs_mount, options: dict[str, str], name: str, extra_args: list[str] | None = None) -> str:
    mount = logfs_mount(options, name=name, start=False, extra_args=extra_args)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="logfs mount exited with 2") as failed:
        mount.start(timeout=60)
    assert time.monotonic() - started < 15, "the mount took too long to refuse the store"
    mount.proc = None
    return str(failed.value)


def test_a_wrong_endpoint_bucket_or_key_fails_the_mount_naming_the_setting(logfs_mount, seaweedfs: SeaweedFS,
                                                                           tmp_path: Path):
    dead = f"http://127.0.0.1:{free_port()}"
    text = _failed_mount(logfs_mount, _tiered_options(seaweedfs, "x", **{"rsm.config.s3.endpoint.url": dead}),
                         "endpoint")
    assert "rsm.config.s3.endpoint.url" in text
    text = _failed_mount(logfs_mount, _tiered_options(seaweedfs, "x", **{"rsm.config.uri": "s3://no-such-bucket/x"}),
                         "bucket")
    assert "no-such-bucket" in text
    assert "rsm.config.uri" in text
    wrong = "not-the-secret-key"
    text = _failed_mount(logfs_mount, _tiered_options(seaweedfs, "x", **{"rsm.config.s3.secret.access.key": wrong}),
                         "key")
    assert "rsm.config.s3.secret.access.key" in text
    assert wrong not in text
    text = _failed_mount(logfs_mount, {"remote.log.storage.system.enable": "true"}, "no-uri")
    assert "rsm.config.uri must name the remote storage" in text
    text = _failed_mount(logfs_mount, _tiered_options(seaweedfs, "x", **{"rsm.config.fetch.chunk.cache.size": "10"}),
                         "cache")
    assert "rsm.config.fetch.chunk.cache.size=10 must hold at least one chunk" in text
    # the secrets in a --config file, as a cluster mount's: read from it, never logged
    settings = tmp_path / "tiered.properties"
    settings.write_text("".join(f"{k}={v}\n" for k, v in seaweedfs.settings(prefix="file").items()))
    settings.chmod(0o600)
    mount = logfs_mount({"remote.log.storage.system.enable": "true"}, name="file",
                        extra_args=["--config", str(settings)])
    assert "Opened remote storage s3://tier/file" in mount.log()
    assert SECRET_KEY not in mount.log()


def test_copies_back_off_while_the_store_is_down_and_resume_when_it_returns(logfs_mount, own_seaweedfs: SeaweedFS,
                                                                             tmp_path: Path):
    mount = logfs_mount(_tiered_options(own_seaweedfs, "outage"))
    mount.sh("mkdir t && echo remote.storage.enable=true >> t/config")
    _append(mount, 0, 500, tmp_path)
    wait_for(lambda: partition_state(mount)["remote_storage"]["copy_lag_segments"] == 0
             and partition_state(mount)["remote_storage"]["segments"] > 0, "the first copies")
    own_seaweedfs.kill()
    _append(mount, 500, 1500, tmp_path)                   # appends go on while the store is down
    wait_for(lambda: "tiered storage backs off" in mount.log(), "the outage logged")
    wait_for(lambda: _metric(mount, "logfs_remote_storage_unavailable") == 1, "the outage in the metrics")
    lag = partition_state(mount)["remote_storage"]["copy_lag_segments"]
    assert lag > 0
    assert len((mount / "t/0/records").read_bytes().splitlines()) == 1500       # reads go on
    wait_for(lambda: _metric(mount, "logfs_remote_errors_total") >= 3, "three failed rounds")
    assert mount.log().count("tiered storage backs off") == 1      # logged once, not at every round
    own_seaweedfs.start()
    wait_for(lambda: partition_state(mount)["remote_storage"]["copy_lag_segments"] == 0, "copies resumed",
             timeout=90)
    assert "answers again: tiered storage resumes" in mount.log()
    state = partition_state(mount)
    closed = _closed_segments(state)
    assert state["remote_storage"]["segments"] == len(closed)
    assert len([k for k in _objects(own_seaweedfs, "outage") if k.endswith(".log")]) == len(closed)   # no orphan
    # logfs check of the unmounted data dir: the metadata and the store agree
    assert mount.stop() == 0
    args = [f"-o{k}={v}" for k, v in own_seaweedfs.settings(prefix="outage").items()]
    checked = subprocess.run([str(LOGFS), "check", str(mount.data), *args], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_local_retention_keeps_the_disk_bounded_and_every_view_reads_below_the_local_start_from_s3(
        logfs_mount, own_seaweedfs: SeaweedFS, tmp_path: Path):
    options = _tiered_options(own_seaweedfs, "local", **{"rsm.config.fetch.chunk.cache.size": "8192",
                                                  "rsm.config.chunk.size": "4096"})
    mount = logfs_mount(options)
    mount.sh("mkdir t && printf 'remote.storage.enable=true\\nlocal.retention.bytes=12000\\n' >> t/config")
    _append(mount, 0, 2000, tmp_path)
    expected = text_view(_lines(0, 2000).splitlines())

    def trimmed() -> JsonObject | None:
        state = partition_state(mount)
        local = sum(s["size_bytes"] for s in state["segments"])
        return state if state["local_log_start_offset"] > 1000 and local <= 12000 + 2 * 4096 else None

    state = wait_for(trimmed, "local segments deleted down to local.retention.bytes once copied")
    assert state is not None
    assert state["log_start_offset"] == 0
    local_start = state["local_log_start_offset"]
    assert state["remote_storage"]["highest_offset_copied"] >= local_start - 1
    local_files = sorted(p.name for p in mount.partition_dir("t", 0).glob("*.log"))
    assert len(local_files) == len(state["segments"])
    assert local_files[0] == "%020d.log" % local_start

    def every_view() -> None:
        assert (mount / "t/0/records").read_bytes() == expected
        rows = (mount / "t/0/records.jsonl").read_bytes().splitlines()
        assert len(rows) == 2000
        assert json.loads(rows[5])["offset"] == 5
        assert (mount / "t/0/offset/5").read_bytes() == _lines(5, 6)
        assert (mount / f"t/0/from/{local_start - 10}").read_bytes() == \
            b"".join(expected.splitlines(keepends=True)[local_start - 10:])
        assert (mount / "t/0/since/0").read_bytes() == expected
        assert mount.sh("head -c 100 t/0/records").stdout == expected[:100]

    every_view()
    assert (mount / "t/0/consume/g1").read_bytes() == expected      # a new group starts at the log start
    assert (mount / "t/groups/g1").read_text().split()[:2] == ["0", "2000"]
    assert _metric(mount, "logfs_remote_fetch_bytes_total") > 0
    # kill -9, then a new mount of the same data dir: the log still starts at 0, below the local segments
    mount.kill()
    mount.start()
    state = partition_state(mount)
    assert state["log_start_offset"] == 0
    assert state["local_log_start_offset"] >= local_start
    every_view()
    # the store down: local records read on, a remote read fails with an errno within the bound
    own_seaweedfs.kill()
    assert (mount / "t/0/offset/1999").read_bytes() == _lines(1999, 2000)
    started = time.monotonic()
    failed = mount.sh("cat t/0/offset/3", check=False)
    assert failed.returncode != 0, failed
    assert failed.stderr, failed
    assert time.monotonic() - started < 30
    assert re.search(r"t/0/offset/3 ETIMEDOUT .*remote log segment 0 of t-0", _errors(mount)), _errors(mount)
    assert "remote log segment 0 of t-0" in mount.log()
    # the store back: the same reads are served again, nothing lost
    own_seaweedfs.start()
    assert (mount / "t/0/offset/3").read_bytes() == _lines(3, 4)
    every_view()


def test_a_new_reader_of_a_followed_records_file_gets_every_record_after_local_retention_moved_them_to_s3(
        logfs_mount, own_seaweedfs: SeaweedFS, tmp_path: Path):
    # a follower (tail -F) holds records open and has read past its first segments; local retention then
    # deletes them once copied.  A `cat` of records shares the follower's view: it must start at the log start
    # (the copies serve those records), not where the local segments start now (found by the torture run of
    # seed 224805676: the view took the deleted local segments for deleted records)
    mount = logfs_mount(_tiered_options(own_seaweedfs, "followed"))
    mount.sh("mkdir t && echo remote.storage.enable=true >> t/config")
    _append(mount, 0, 2000, tmp_path)
    expected = text_view(_lines(0, 2000).splitlines())
    with open(mount / "t/0/records", "rb") as follower:
        assert follower.read() == expected                 # read to the end, and held open
        mount.sh("echo local.retention.bytes=12000 >> t/config")
        wait_for(lambda: partition_state(mount)["local_log_start_offset"] > 1000,
                 "local retention to delete the copied segments the follower read")
        assert (mount / "t/0/records").read_bytes() == expected
        assert mount.sh("wc -l < t/0/records").stdout.strip() == b"2000"
        _append(mount, 2000, 2100, tmp_path)
        assert follower.read() == text_view(_lines(2000, 2100).splitlines())     # the follower reads on


def _waiting_on_the_mount(pid: int) -> bool:
    """Whether ``cat`` (process ``pid``) sleeps in a system call other than its write to its stdout: in the
    open, stat or read of its file of the mount (its FUSE request, or a page the kernel asked the mount for)."""
    try:
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return bool(syscall) and syscall[0] not in ("running", "1") and state in ("S", "D")


def test_a_store_that_does_not_answer_stops_only_the_reads_of_its_records(logfs_mount, own_seaweedfs: SeaweedFS,
                                                                          tmp_path: Path):
    """A read of records only in the store waits on the store off the mount's event loop: while the store
    hangs (SIGSTOP, no answer at all), every other request is served; when it answers, the read completes."""
    options = _tiered_options(own_seaweedfs, "hang", **{"rsm.config.request.timeout.ms": "30000",
                                                 "rsm.config.chunk.size": "4096"})
    mount = logfs_mount(options)
    mount.sh("mkdir t u && printf 'remote.storage.enable=true\\nlocal.retention.bytes=12000\\n' >> t/config")
    _append(mount, 0, 2000, tmp_path)
    mount.sh("printf 'a\\nb\\n' >> u/0/append")
    expected = text_view(_lines(0, 2000).splitlines())
    wait_for(lambda: partition_state(mount)["local_log_start_offset"] > 1000, "local segments deleted once copied")
    mount.stop()
    mount.start()                   # nothing of the store's range in memory or in the chunk cache
    assert own_seaweedfs.process is not None
    os.killpg(own_seaweedfs.process.pid, signal.SIGSTOP)
    try:
        reader = subprocess.Popen(["cat", str(mount / "t/0/records")], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        wait_for(lambda: _waiting_on_the_mount(reader.pid), "the reader waiting on the mount")
        # every other request is answered meanwhile (the store's timeout is 2 x 30 s)
        assert mount.sh("cat u/0/records", timeout=20).stdout == b"a\nb\n"
        mount.sh("printf 'c\\n' >> u/0/append", timeout=20)
        assert mount.sh("cat u/0/records", timeout=20).stdout == b"a\nb\nc\n"
        assert "records" in mount.sh("ls t/0", timeout=20).stdout.decode()
        assert json.loads(mount.sh("cat t/0/state", timeout=20).stdout)["log_start_offset"] == 0
        assert reader.poll() is None, "the read of the store's records ended while the store hung"
    finally:
        os.killpg(own_seaweedfs.process.pid, signal.SIGCONT)
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    assert out == expected


def test_a_read_committed_mount_hides_aborted_transactions_in_s3_by_the_copies_transaction_indexes(
        logfs_mount, seaweedfs: SeaweedFS):
    """A data dir whose transactional partition is partly only in S3 (copied with each segment's transaction
    index and producer snapshot, then trimmed locally), mounted with ``isolation.level=read_committed``: the
    records from the local log start are shown without one byte of a copy's ``.log`` fetched (the walk of the
    aborted transactions takes the copies' indexes), and every record reads back as a read_committed consumer
    sees it."""
    from engine.clock import ManualClock
    from engine.config import BrokerConfig
    from engine.manager import LogManager
    from engine.remote.storage import open_remote_storage
    from engine.topic import TopicPartition
    from tests.helpers import log_of
    from tests.unit.test_tiered_manager import _append_transactions

    mount = logfs_mount(_tiered_options(seaweedfs, "txn", **{"isolation.level": "read_committed"}), start=False)
    settings = seaweedfs.settings(prefix="txn")
    config = BrokerConfig.from_props({"log.dirs": str(mount.data), "internal.log.segment.bytes": "4096",
                                      "remote.log.storage.system.enable": "true"})
    manager = LogManager(config, clock=ManualClock(1_700_000_000_000), remote_storage=open_remote_storage(settings),
                         remote_cache_bytes=1 << 20, remote_chunk_bytes=4096)
    manager.startup()
    try:
        manager.create_topic("t", 1, {"remote.storage.enable": "true", "local.retention.bytes": "8000"})
        log = log_of(manager, TopicPartition("t", 0))
        visible = _append_transactions(log)
        log.flush()
        manager.copy_to_remote_storage()
        manager.cleanup_logs()
        local_start = log.local_log_start_offset
        assert local_start > 600
    finally:
        manager.shutdown()
    assert len([k for k in _objects(seaweedfs, "txn") if k.endswith(".txnindex")]) > 5
    mount.start()

    def fetched() -> float:
        return _metric(mount, "logfs_remote_fetch_bytes_total")

    # the mount's own rounds may copy and trim more; the active segment stays local (nothing is appended)
    active = partition_state(mount)["segments"][-1]["base_offset"]
    assert active >= local_start
    rows = (mount / f"t/0/from/{active}.jsonl").read_bytes().splitlines()
    assert [json.loads(row)["offset"] for row in rows] == [o for o in visible if o >= active]
    assert fetched() == 0
    rows = (mount / "t/0/records.jsonl").read_bytes().splitlines()
    assert [json.loads(row)["offset"] for row in rows] == visible
    assert fetched() > 0
    assert mount.sh("cat t/0/offset/0", check=False).returncode != 0     # 1003's transaction, aborted locally


def test_segments_lists_the_remote_log_segments_and_serves_their_files_from_s3_byte_for_byte(
        logfs_mount, own_seaweedfs: SeaweedFS, tmp_path: Path):
    """``segments/`` of a tiered partition lists the copies below the local log start beside the local segments,
    as a Kafka data dir listed every segment; their files read from the store as the local files were, and fail
    with the store's errno while it is down (never a short read that exits 0)."""
    options = _tiered_options(own_seaweedfs, "segments", **{"rsm.config.fetch.chunk.cache.size": "8192",
                                                     "rsm.config.chunk.size": "4096"})
    mount = logfs_mount(options)
    mount.sh("mkdir t && echo remote.storage.enable=true >> t/config")
    _append(mount, 0, 2000, tmp_path)

    def copied() -> JsonObject | None:
        state = partition_state(mount)
        closed = _closed_segments(state)
        return state if state["remote_storage"]["segments"] == len(closed) >= 20 else None

    state = wait_for(copied, "every closed segment copied")
    assert state is not None
    assert state["remote_segments"] == []          # every record still local
    closed = [s["base_offset"] for s in _closed_segments(state)]
    segments = mount / "t/0/segments"
    names = sorted(p.name for p in segments.iterdir())
    # the original files and renderings, kept before local retention deletes them
    kept = {"%020d%s" % (base, suffix): (mount.partition_dir("t", 0) / ("%020d%s" % (base, suffix))).read_bytes()
            for base in closed for suffix in (".log", ".index", ".timeindex")}
    kept.update({"%020d.jsonl" % base: (segments / ("%020d.jsonl" % base)).read_bytes() for base in closed})
    assert all(kept[name] == (segments / name).read_bytes() for name in kept)

    mount.sh("echo local.retention.bytes=12000 >> t/config")
    state = wait_for(lambda: (s := partition_state(mount)) and s["local_log_start_offset"] > 1000 and s,
                     "local segments deleted once copied")
    assert state is not None
    local_start = state["local_log_start_offset"]
    remote = [base for base in closed if base < local_start]
    assert [s["base_offset"] for s in state["remote_segments"]] == remote
    assert remote[0] == 0
    assert state["segments"][0]["base_offset"] == local_start
    assert not (mount.partition_dir("t", 0) / ("%020d.log" % 0)).exists()

    def every_remote_file() -> None:
        assert sorted(p.name for p in segments.iterdir()) == names
        for base in remote:
            for suffix in (".log", ".index", ".timeindex", ".jsonl"):
                name = "%020d%s" % (base, suffix)
                assert (segments / name).stat().st_size == len(kept[name]), name
                assert (segments / name).read_bytes() == kept[name], name

    every_remote_file()
    # an opening of a copy's rendering reads on whole while `ls` lists the directory (which does not size
    # the rendering): the listing never shrinks what the kernel holds of it
    rendering = "%020d.jsonl" % remote[3]
    with open(segments / rendering, "rb", buffering=0) as opened:
        head = opened.read(100)
        assert sorted(p.name for p in segments.iterdir()) == names
        assert os.fstat(opened.fileno()).st_size == len(kept[rendering])
        rest = b"".join(iter(lambda: opened.read(1000), b""))
    assert head + rest == kept[rendering]
    first = "%020d.log" % 0
    assert mount.sh(f"cat t/0/segments/{first}").stdout == kept[first]
    assert mount.sh(f"dd if=t/0/segments/{first} bs=1000 skip=1 status=none").stdout == kept[first][1000:]
    refused = mount.sh(f"echo x >> t/0/segments/{first}", check=False)
    assert refused.returncode != 0
    assert "Permission denied" in refused.stderr.decode()
    assert mount.sh("du -sk t/0/segments").stdout.split()[0] != b"0"      # the local segments' blocks only

    # kill -9 and a new mount (an empty chunk cache): the same listing and bytes
    mount.kill()
    mount.start()
    every_remote_file()
    mount.kill()
    mount.start()
    # the store down: the listing and sizes come from the metadata, local files read on, and a remote
    # file fails with the store's errno within the bound
    own_seaweedfs.kill()
    assert sorted(p.name for p in segments.iterdir()) == names      # nothing left out
    raw = ["%020d%s" % (base, suffix) for base in remote for suffix in (".log", ".index", ".timeindex")]
    assert [(segments / name).stat().st_size for name in raw] == [len(kept[name]) for name in raw]
    local = "%020d.log" % local_start
    assert (segments / local).read_bytes() == (mount.partition_dir("t", 0) / local).read_bytes()
    started = time.monotonic()
    failed = mount.sh(f"cat t/0/segments/{first}", check=False)
    assert failed.returncode != 0, failed
    assert b"Connection timed out" in failed.stderr, failed
    assert failed.stdout == b""
    assert time.monotonic() - started < 30
    assert re.search(rf"t/0/segments/{first} ETIMEDOUT .*remote log segment 0 of t-0", _errors(mount)), \
        _errors(mount)
    failed = mount.sh("cat t/0/segments/%020d.timeindex" % remote[1], check=False)
    assert failed.returncode != 0, failed
    # a copy's rendering is sized from its kept view index, bound to the copy by the metadata, and not
    # read short
    rendering = "%020d.jsonl" % remote[2]
    assert (segments / rendering).stat().st_size == len(kept[rendering])
    failed = mount.sh(f"cat t/0/segments/{rendering}", check=False)
    assert failed.returncode != 0, failed
    assert failed.stdout == b""
    # the store back: served again
    own_seaweedfs.start()
    every_remote_file()
    # a store that hangs (SIGSTOP): listing and sizing go on at once, a read fails within the bound
    assert own_seaweedfs.process is not None
    os.killpg(own_seaweedfs.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        listed = mount.sh("ls -l t/0/segments").stdout.decode().splitlines()[1:]
        assert time.monotonic() - started < 5, "listing segments/ waited for the store"
        sizes = {line.split()[-1]: int(line.split()[4]) for line in listed}
        assert {name: sizes[name] for name in kept if int(name[:20]) in remote} == \
            {name: len(data) for name, data in kept.items() if int(name[:20]) in remote}
        started = time.monotonic()
        failed = mount.sh(f"cat t/0/segments/{first}", check=False)
        assert failed.returncode != 0, failed
        assert b"Connection timed out" in failed.stderr, failed
        assert time.monotonic() - started < 30
    finally:
        os.killpg(own_seaweedfs.process.pid, signal.SIGCONT)
    every_remote_file()
