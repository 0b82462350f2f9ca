"""The log cleaner in a real mount: compaction on its own, tombstones, readers across a clean, crashes.

Every test drives ``logfs mount`` as a subprocess and looks only through the
mount and at the files on disk: ``records.jsonl`` before and after cleaning,
the partition ``state``, ``.logfs/stats.json`` and ``.logfs/metrics``, and the
cleaned ``.log`` files decoded by kafka-python (CRCs checked), which knows
nothing of our codec.

The crash tests kill a real process at each step of a clean (offset map built,
``.cleaned`` written, ``.swap`` renamed, old segments renamed ``.deleted``,
swapped in before the checkpoint): a helper Python process opens the data
directory with a ``LogManager``, wraps one cleaner step so that it ends the
process with ``os._exit(137)`` right there, and runs one ``clean_once``.  The
test then mounts the directory and checks that the recovered log is correct:

* every record present is exactly the record written at that offset (nothing
  invented, nothing altered), offsets strictly increasing;
* every key's latest record is present, exactly once, at its offset;
* older records of a key may still be present (not yet cleaned), never lost
  latest ones; and after the mount's own cleaner has run, no key appears twice
  below the cleaner position;
* ``logfs check`` passes and kafka-python reads the segment files.
"""

from __future__ import annotations

import errno
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from tests.conftest import LOGFS, ROOT, Mount, kafka_records
from tests.helpers import (
    CLEANER_TASK,
    QUICK_CLEANER,
    JsonObject,
    add_config,
    cleaner_runs,
    mount_stats,
    partition_state,
    wait_for,
    wait_for_task_runs,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.mount

#: Small segments and a short backoff, so a test sees several cleans within seconds.
CLEANER_OPTIONS = {**QUICK_CLEANER, "internal.log.segment.bytes": "4096", "log.index.interval.bytes": "512",
                   "num.partitions": "1"}

#: A compacted topic fed by ``key<TAB>value`` lines, ``NULL`` meaning a null value (a tombstone).
COMPACTED_TOPIC = ("cleanup.policy=compact\nparse.key=true\nnull.marker=NULL\n"
                   "min.cleanable.dirty.ratio=0.1\ninternal.segment.bytes=4096\n")


# --------------------------------------------------------------------------------- helpers

def _rows(mount: Mount, topic: str = "t", partition: int = 0) -> list[JsonObject]:
    data = (mount / f"{topic}/{partition}/records.jsonl").read_bytes()
    return [json.loads(line) for line in data.splitlines()]


def _append(mount: Mount, lines: list[str], topic: str = "t", partition: int = 0) -> None:
    """One write() of all lines: one batch."""
    fd = os.open(mount / f"{topic}/{partition}/append", os.O_WRONLY)
    try:
        os.write(fd, "".join(line + "\n" for line in lines).encode())
    finally:
        os.close(fd)


def _keyed_rounds(rounds: int, keys: int, prefix: str = "k", start: int = 0) -> list[list[str]]:
    """``rounds`` batches, each one line per key, values unique: ``k<i>\\tv<round>-<i>-xxx``."""
    return [[f"{prefix}{i}\tv{r}-{i}-" + "x" * 24 for i in range(keys)] for r in range(start, start + rounds)]


def _latest(rows: list[JsonObject]) -> dict[str, JsonObject]:
    latest: dict[str, JsonObject] = {}
    for row in rows:
        latest[row["key"]] = row
    return latest


def _assert_consistent_subset(rows: list[JsonObject], original: dict[int, JsonObject]) -> None:
    """Offsets strictly increasing and every row exactly the record written at its offset."""
    offsets = [row["offset"] for row in rows]
    assert all(a < b for a, b in itertools.pairwise(offsets)), "offsets not strictly increasing"
    for row in rows:
        assert row == original[row["offset"]], f"record at offset {row['offset']} differs from what was written"


def _assert_latest_present_once(rows: list[JsonObject], original_rows: list[JsonObject]) -> None:
    """Each key's latest record is present, and only once (its offset is unique)."""
    by_offset = {row["offset"]: row for row in rows}
    assert len(by_offset) == len(rows), "a record appears twice"
    for key, row in _latest(original_rows).items():
        assert by_offset.get(row["offset"]) == row, f"the latest record of key {key!r} was lost"


def _assert_compacted_below(rows: list[JsonObject], position: int) -> None:
    """Below the cleaner position every key appears at most once."""
    keys = [row["key"] for row in rows if row["offset"] < position]
    assert len(keys) == len(set(keys)), "a key appears twice in the cleaned section"


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"metric {name} missing"
    return float(match.group(1))


def _text(data: bytes | None) -> str | None:
    """A key or value of a segment file as the JSON view shows a UTF-8 one (a null stays null)."""
    return None if data is None else data.decode()


def _more_cleaner_runs(mount: Mount, before: int) -> Callable[[], int | None]:
    """For wait_for: the cleaner's total runs once more than ``before``."""
    def runs() -> int | None:
        n = cleaner_runs(mount)
        return n if n > before else None
    return runs


def _logfs_check(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LOGFS), "check", str(data)], capture_output=True, text=True, timeout=120)


def _create_compacted_topic(mount: Mount, topic: str = "t", config: str = COMPACTED_TOPIC) -> None:
    (mount / topic).mkdir()
    add_config(mount / f"{topic}/config", config)


# ----------------------------------------------------------------------------- compaction

@pytest.mark.mount_options(CLEANER_OPTIONS)
def test_compaction_runs_on_its_own_and_keeps_the_latest_value_of_each_key(mount):
    # Written under cleanup.policy=delete so that the uncompacted log can be read first; the
    # switch to compact is an ordinary topic config write, picked up by the running cleaner.
    _create_compacted_topic(mount, config=COMPACTED_TOPIC.replace("=compact", "=delete"))
    for batch in _keyed_rounds(30, 20):
        _append(mount, batch)
    before = _rows(mount)
    assert len(before) == 600
    assert [r["offset"] for r in before] == list(range(600))
    wait_for_task_runs(mount, CLEANER_TASK, 2)        # the cleaner looked, twice, and found nothing to clean
    assert partition_state(mount)["last_cleaning"] is None, "a delete topic was cleaned"
    assert len(_rows(mount)) == 600, "a delete topic was cleaned"
    assert cleaner_runs(mount) == 0
    add_config(mount / "t/config", "cleanup.policy=compact\n")

    wait_for(lambda: (s := partition_state(mount))["last_cleaning"] and s, "the first clean")
    # Until the dirty ratio drops below min.cleanable.dirty.ratio, more cleans may follow: wait
    # for the last, so that the views read below are of one and the same log.
    wait_for(lambda: (s := partition_state(mount))["dirty_ratio"] <= 0.1 and s["cleaning_state"] is None,
              "the cleaner to go idle")
    after = _rows(mount)
    original = {row["offset"]: row for row in before}
    _assert_consistent_subset(after, original)
    _assert_latest_present_once(after, before)
    assert {k: r["value"] for k, r in _latest(after).items()} == {k: r["value"] for k, r in _latest(before).items()}
    assert len(after) < len(before), "nothing was compacted"
    # The cleaner position is a recorded first dirty offset: everything below it was cleaned.
    state = partition_state(mount)
    position = state["cleaner_position"]
    assert 0 < position <= state["log_end_offset"]
    _assert_compacted_below(after, position)
    assert 0.0 <= state["dirty_ratio"] <= 1.0
    assert state["uncleanable"] is False
    last = state["last_cleaning"]
    assert last["records_read"] > last["records_written"] > 0
    assert last["bytes_read"] > last["bytes_written"] > 0
    assert last["end_offset"] <= position
    assert last["elapsed_ms"] >= 0
    # The text view agrees with the JSON view, record for record.
    text = (mount / "t/0/records").read_bytes().splitlines()
    assert text == [r["value"].encode() for r in _rows(mount)]

    stats = mount_stats(mount)
    cleaner = stats["cleaner"]
    assert cleaner["threads"] == 1
    assert cleaner["running"] is True
    assert cleaner["totals"]["runs"] >= 1
    assert cleaner["totals"]["records_dropped"] > 0
    assert cleaner["last_run"]["0"]["topic_partition"] == "t-0"
    assert stats["tasks"]["kafka-log-cleaner-thread-0"]["runs"] >= 1
    assert stats["topics"]["t"]["partitions"]["0"]["cleaner_position"] == position
    metrics = (mount / ".logfs/metrics").read_text()
    assert _metric(metrics, "logfs_cleaner_runs_total") >= 1
    assert _metric(metrics, "logfs_cleaner_records_dropped_total") > 0
    assert 0 <= _metric(metrics, "kafka_log_LogCleanerManager_max_dirty_percent") <= 100
    assert _metric(metrics, 'logfs_log_cleaner_position{partition="0",topic="t"}') == position

    final = _rows(mount)
    assert mount.stop() == 0
    on_disk = kafka_records(mount.partition_dir("t", 0))   # asserts every batch's CRC
    assert [(r.offset, _text(r.key), _text(r.value)) for r in on_disk] == \
        [(r["offset"], r["key"], r["value"]) for r in final]
    assert [r.timestamp for r in on_disk] == [r["timestamp"] for r in final]
    check = _logfs_check(mount.data)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.mount_options(CLEANER_OPTIONS)
def test_unkeyed_record_on_compacted_topic_is_refused_with_einval(mount):
    (mount / "plain").mkdir()
    add_config(mount / "plain/config", "cleanup.policy=compact\n")
    _create_compacted_topic(mount, "keyed")
    for path, line in (("plain/0/append", b"no key\n"), ("plain/append", b"no key\n"),
                       ("keyed/0/append", b"NULL\tvalue of a null key\n")):
        fd = os.open(mount / path, os.O_WRONLY)
        try:
            with pytest.raises(OSError) as exc:
                os.write(fd, line)
            assert exc.value.errno == errno.EINVAL, path
        finally:
            os.close(fd)
    assert partition_state(mount, "plain")["log_end_offset"] == 0
    assert partition_state(mount, "keyed")["log_end_offset"] == 0
    assert "Compacted topic cannot accept message without key" in mount.log()
    # A keyed record is accepted, and the refused ones left nothing behind.
    _append(mount, ["k\tv"], "keyed")
    assert [(r["offset"], r["key"], r["value"]) for r in _rows(mount, "keyed")] == [(0, "k", "v")]


@pytest.mark.mount_options(CLEANER_OPTIONS)
def test_tombstones_remove_keys_and_are_dropped_after_delete_retention(mount):
    retention_ms = 1500
    # Two generations of tombstones.  The first is written under an hour of delete.retention.ms: the
    # cleans past it must keep it, however long they take.  A clean stamps a tombstone batch with its
    # delete horizon once (KIP-534), so the first generation stays when delete.retention.ms is then
    # lowered to retention_ms; the second, written after that, is dropped once retention_ms has passed.
    _create_compacted_topic(mount, config=COMPACTED_TOPIC + "delete.retention.ms=3600000\n")
    for batch in _keyed_rounds(5, 20):
        _append(mount, batch)
    (mount / "t/0/delete").write_bytes(b"key k3\n")       # the delete file's tombstone marker
    _append(mount, ["k5\tNULL"])                          # null.marker: a null value
    tombstones = {r["offset"] for r in _rows(mount) if r["key"] in ("k3", "k5") and r["value"] is None}
    assert len(tombstones) == 2
    expected = {k: r["value"] for k, r in _latest(_rows(mount)).items() if k not in ("k3", "k5")}

    # Filler with new keys: the cleaned section grows past one segment, so the tombstones' segment
    # stops being regrouped with (and taking the modification time of) newer ones.  With only
    # repeated keys it would be, and a tombstone could survive forever (KAFKA-8522, the pre-KIP-534
    # delete horizon this cleaner shares with Kafka before 3.1).
    filler = (batch for r in range(1000) for batch in _keyed_rounds(1, 20, prefix=f"f{r}_"))
    # Cleaned past the tombstones: the keys' values are gone, the tombstones themselves remain.
    def cleaned_past_tombstones() -> bool:
        _append(mount, next(filler))
        position: int | None = partition_state(mount)["cleaner_position"]
        return position is not None and position > max(tombstones)
    wait_for(cleaned_past_tombstones, "a clean past the tombstones", interval=0.1)
    # ... and whole cleans after that one (each rewrites the cleaned section too) keep them as well.
    cleans = cleaner_runs(mount)
    def cleaned_twice_more() -> bool:
        _append(mount, next(filler))
        return cleaner_runs(mount) >= cleans + 2
    wait_for(cleaned_twice_more, "two more cleans", interval=0.1)
    rows = _rows(mount)
    assert {r["offset"] for r in rows if r["key"] in ("k3", "k5")} == tombstones
    assert all(r["value"] is None for r in rows if r["key"] in ("k3", "k5"))
    tombstoned: dict[str, str | None] = {k: None for k in ("k3", "k5") if k in _latest(rows)}
    assert {k: v for k, v in ((k, r["value"]) for k, r in _latest(rows).items()) if k.startswith("k")} == \
        {**expected, **tombstoned}

    # The second generation: once a clean is delete.retention.ms past its horizon, it is dropped.
    add_config(mount / "t/config", f"delete.retention.ms={retention_ms}\n")
    (mount / "t/0/delete").write_bytes(b"key k7\n")
    _append(mount, ["k9\tNULL"])
    second_at = time.monotonic()
    assert len({r["offset"] for r in _rows(mount) if r["key"] in ("k7", "k9") and r["value"] is None}) == 2
    def second_generation_gone() -> bool:
        _append(mount, next(filler))
        return not any(r["key"] in ("k7", "k9") for r in _rows(mount))
    wait_for(second_generation_gone, "the tombstones to be dropped", timeout=30, interval=0.2)
    assert time.monotonic() - second_at >= retention_ms / 1000, "tombstones dropped before delete.retention.ms"
    rows = _rows(mount)
    assert {r["offset"] for r in rows if r["key"] in ("k3", "k5")} == tombstones   # their horizon: an hour
    assert {k: r["value"] for k, r in _latest(rows).items() if k.startswith("k")} == \
        {**{k: v for k, v in expected.items() if k not in ("k7", "k9")}, "k3": None, "k5": None}
    final = _rows(mount)
    assert mount.stop() == 0
    assert [(r.offset, r.value) for r in kafka_records(mount.partition_dir("t", 0))] == \
        [(r["offset"], None if r["value"] is None else r["value"].encode()) for r in final]


@pytest.mark.mount_options(CLEANER_OPTIONS)
def test_readers_across_cleanings_see_a_consistent_stream(mount):
    _create_compacted_topic(mount)
    for batch in _keyed_rounds(5, 20):
        _append(mount, batch)
    # tail -f from the first line, and a Python loop reading sequentially with plain read()s.
    tail = subprocess.Popen(["tail", "-s", "0.1", "-n", "+1", "-f", str(mount / "t/0/records.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stop = threading.Event()
    loop_data = bytearray()

    def sequential_reader() -> None:
        fd = os.open(mount / "t/0/records.jsonl", os.O_RDONLY)
        try:
            while True:
                chunk = os.read(fd, 1000)       # odd size: reads end inside lines
                if chunk:
                    loop_data.extend(chunk)
                elif stop.is_set():
                    return
                else:
                    time.sleep(0.02)
        finally:
            os.close(fd)

    tail_out = bytearray()

    tail_stdout = tail.stdout
    assert isinstance(tail_stdout, io.BufferedReader)      # a pipe, read as bytes

    def drain_tail() -> None:
        # Drained from the start: a full pipe would stall tail itself, not the mount.
        while chunk := tail_stdout.read1(65536):
            tail_out.extend(chunk)

    reader = threading.Thread(target=sequential_reader, name="records.jsonl-reader")
    drainer = threading.Thread(target=drain_tail, name="tail-drainer")
    reader.start()
    drainer.start()
    runs_before = cleaner_runs(mount)
    try:
        for round_, batch in enumerate(_keyed_rounds(40, 20, start=5)):
            _append(mount, batch)
            if round_ in (10, 30):       # cleans happen while the readers read, twice over
                runs_before = wait_for(_more_cleaner_runs(mount, runs_before), "a clean while the readers read")
            time.sleep(0.03)             # a steady producer: the readers interleave with the appends
        end = partition_state(mount)["log_end_offset"]
        wait_for(lambda: loop_data.endswith(b"\n") and json.loads(bytes(loop_data).splitlines()[-1])["offset"]
                  == end - 1, "the sequential reader to reach the log end")
        wait_for(lambda: tail_out.endswith(b"\n") and json.loads(bytes(tail_out).splitlines()[-1])["offset"]
                  == end - 1, "tail -f to reach the log end")
    finally:
        stop.set()
        reader.join(10)
        tail.kill()
        drainer.join(10)
        _, err = tail.communicate()     # stdout drained by the drainer; the pipes closed
    tail_data = bytes(tail_out)
    assert b"truncated" not in err, err
    for name, data in (("sequential read()", bytes(loop_data)), ("tail -f", tail_data)):
        rows = [json.loads(line) for line in data.splitlines()]    # a torn line fails to parse
        offsets = [r["offset"] for r in rows]
        assert all(a < b for a, b in itertools.pairwise(offsets)), f"{name}: offsets not strictly increasing"
        assert offsets[-1] == end - 1, (f"{name} stopped at offset {offsets[-1]} of {end}; the file's size is "
                                        f"{os.stat(mount / 't/0/records.jsonl').st_size}; tail said {err!r}")
        for row in rows:   # values encode their round and key: k<i> -> v<round>-<i>-...
            assert row["value"].split("-")[1] == row["key"][1:], f"{name}: record {row} is not what was written"
        # Latest records are never cleaned away, so every key's last value reached both readers.
        assert {r["key"]: r["value"] for r in rows} == {k: r["value"] for k, r in _latest(_rows(mount)).items()}


# ------------------------------------------------------------------------------------ crashes

#: Runs in a separate process: ``python -c HELPER <stage> <data dir>``.  Wraps the cleaner step
#: ``stage`` so that the process dies with exit status 137 right after (or before) it.
CRASH_HELPER = r"""
import os, sys
sys.path.insert(0, sys.argv[3])
from engine.cleaner import Cleaner
from engine.cleaner.cleaner_manager import LogCleanerManager
from engine.config import BrokerConfig
from engine.local_log import LocalLog
from engine.log import Log
from engine.manager import LogManager
from engine.files import SWAP_FILE_SUFFIX
from engine.segment import LogSegment

stage, data_dir = sys.argv[1], sys.argv[2]

def crash():
    os._exit(137)

def crash_after(cls, name, when=lambda *args: True):
    original = getattr(cls, name)
    def wrapper(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if when(*args):
            crash()
        return result
    setattr(cls, name, wrapper)

def crash_before(cls, name):
    setattr(cls, name, lambda self, *args, **kwargs: crash())

if stage == "map_built":
    crash_after(Cleaner, "build_offset_map")
elif stage == "cleaned_written":          # .cleaned flushed, replace_segments not begun
    crash_before(Log, "replace_segments")
elif stage == "swap_renamed":             # .cleaned -> .swap, old segments untouched
    crash_after(LogSegment, "change_file_suffixes", when=lambda old, new: new == SWAP_FILE_SUFFIX)
elif stage == "old_deleted":              # old segments renamed .deleted, .swap not yet renamed
    crash_after(LocalLog, "_schedule_deletion")
elif stage == "swapped_in":               # every group swapped in, cleaner checkpoint not written
    crash_before(LogCleanerManager, "done_cleaning")
else:
    raise SystemExit(f"unknown stage {stage}")

manager = LogManager(BrokerConfig.from_props({"log.dirs": data_dir}))
manager.startup()
stats = manager.cleaner.clean_once()
print(f"clean_once returned {stats!r} without reaching stage {stage}")
sys.exit(3)
"""

CRASH_STAGES = ["map_built", "cleaned_written", "swap_renamed", "old_deleted", "swapped_in"]


@pytest.fixture(scope="module")
def uncleaned_data(tmp_path_factory) -> tuple[Path, list[JsonObject]]:
    """A data dir with a compacted, never-cleaned topic ``c`` (12+ segments), and its records."""
    base = tmp_path_factory.mktemp("uncleaned")
    mount = Mount(base, {**CLEANER_OPTIONS, "log.cleaner.enable": "false"}).start()
    try:
        _create_compacted_topic(mount, "c")
        for batch in _keyed_rounds(30, 25):
            _append(mount, batch, "c")
        rows = _rows(mount, "c")
        assert len(partition_state(mount, "c")["segments"]) >= 10
    finally:
        assert mount.stop() == 0, mount.log()
    return mount.data, rows


def _suffixes(partition_dir: Path) -> set[str]:
    return {name.split(".", 1)[1] for name in os.listdir(partition_dir) if "." in name}


@pytest.mark.parametrize("stage", CRASH_STAGES)
def test_crash_during_cleaning_then_remount_recovers_a_correct_log(stage, uncleaned_data, logfs_mount):
    source, written = uncleaned_data
    mount = logfs_mount(CLEANER_OPTIONS, start=False)
    shutil.rmtree(mount.data)
    shutil.copytree(source, mount.data)
    pdir = mount.partition_dir("c", 0)

    helper = subprocess.run([sys.executable, "-c", CRASH_HELPER, stage, str(mount.data), str(ROOT)],
                            capture_output=True, text=True, timeout=120)
    assert helper.returncode == 137, f"the helper did not crash at {stage}:\n{helper.stdout}{helper.stderr}"
    # The files show the crash happened where intended.
    suffixes = _suffixes(pdir)
    checkpoint = mount.data / "cleaner-offset-checkpoint"
    checkpointed = checkpoint.exists() and "c 0 " in checkpoint.read_text()
    assert not checkpointed, "the first dirty offset was checkpointed before the crash"
    expected_files = {
        "map_built": lambda s: not {"log.cleaned", "log.swap", "log.deleted"} & s,
        "cleaned_written": lambda s: "log.cleaned" in s and "log.swap" not in s,
        "swap_renamed": lambda s: "log.swap" in s and "log.deleted" not in s,
        "old_deleted": lambda s: "log.swap" in s and "log.deleted" in s,
        "swapped_in": lambda s: "log.swap" not in s and "log.cleaned" not in s and "log.deleted" in s,
    }[stage]
    assert expected_files(suffixes), f"{stage}: unexpected files {sorted(suffixes)}"

    # First the recovered log as it is: no cleaner, so nothing but recovery has touched it.
    original = {row["offset"]: row for row in written}
    mount.options["log.cleaner.enable"] = "false"
    mount.start()
    recovered = _rows(mount, "c")
    _assert_consistent_subset(recovered, original)
    _assert_latest_present_once(recovered, written)
    assert partition_state(mount, "c")["log_end_offset"] == len(written)
    assert not {"log.cleaned", "log.swap"} & _suffixes(pdir), "recovery left .cleaned or .swap files"
    assert mount.stop() == 0, mount.log()
    check = _logfs_check(mount.data)
    assert check.returncode == 0, check.stdout + check.stderr

    # Then the mount's own cleaner finishes the job on the recovered log.
    mount.options["log.cleaner.enable"] = "true"
    mount.start()
    state = wait_for(lambda: (s := partition_state(mount, "c"))["last_cleaning"] and s, "the clean after recovery")
    cleaned = _rows(mount, "c")
    _assert_consistent_subset(cleaned, original)
    _assert_latest_present_once(cleaned, written)
    _assert_compacted_below(cleaned, state["cleaner_position"])
    assert mount.stop() == 0, mount.log()

    check = _logfs_check(mount.data)
    assert check.returncode == 0, check.stdout + check.stderr
    on_disk = kafka_records(pdir)
    assert [(r.offset, _text(r.key), _text(r.value)) for r in on_disk] == \
        [(r["offset"], r["key"], r["value"]) for r in cleaned]
