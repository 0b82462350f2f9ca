"""What the torture harness knows and how it judges it after each remount (tests/harness/torture.py).

The partitions it wrote (``Partition``: acknowledged records, unacknowledged
batches, the log start it saw), the consumer group commits (``GroupCommits``),
the counts it reports (``Totals``), and ``Checks``: the reads through the
mount and the checks of the views, the group offsets and, after a clean
shutdown, the disk (kafka-python over every batch, ``logfs check``).  The
harness's cycle (mount, traffic, crash, remount) is ``torture.Torture``,
which is a ``Checks``.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

ROOT = Path(__file__).resolve().parents[2]
#: ``python -m logfs`` with this interpreter: the work tree's code, whatever the venv's entry script is
LOGFS = [sys.executable, "-m", "logfs"]

BATCH_HEADER = 61


def _varint_size(n: int) -> int:
    zigzag, size = n << 1, 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def batch_size(values: list[str]) -> int:
    """The bytes of the batch the mount encodes for an unkeyed write of ``values`` (the v2 record format):
    a write larger than ``segment.bytes`` is appended as several batches."""
    size = BATCH_HEADER
    for i, value in enumerate(values):
        n = len(value.encode())
        body = 4 + _varint_size(i) + _varint_size(n) + n        # attributes, timestamp, key, headers: 1 each
        size += _varint_size(body) + body
    return size



@dataclass
class Partition:
    """What the harness knows of one partition."""

    name: str                                            # "p/0"
    #: offset -> value, acknowledged by fsync (a cluster mount: by write(), the cluster acknowledged it)
    acked: dict[int, str] = field(default_factory=dict)
    unacked: list[list[str]] = field(default_factory=list)   # batches written, never acknowledged
    max_start: int = 0                                   # highest log start offset ever observed
    deleted_before: int = 0                              # highest acknowledged `before N`
    keys: dict[str, str] = field(default_factory=dict)   # value -> key (compacted topic)
    #: offsets of `acked` that were never fsynced: unacknowledged batches found whole after a recovery
    #: (a kill -9 keeps them in the page cache; a power loss may still take them, until an fsync covers them)
    promoted: set[int] = field(default_factory=set)
    gone: bool = False                                   # its directory vanished (reported once)
    #: neither retention nor `before N` may move its log start (--tiered's topic t): a record below the log
    #: start is lost, not retained
    fixed_start: bool = False
    tiered: bool = False                                 # remote.storage.enable=true (--tiered)
    local_start: int = 0                                 # its local log start offset at the last check
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def compacted(self) -> bool:
        return self.name.startswith("c/")


@dataclass
class GroupCommits:
    """One consumer group's commits on ``p`` partition 0, written to ``p/groups/<group>``."""

    group: str
    #: the last commit whose fsync() returned (None: none yet): a power loss must keep it
    synced: int | None = None
    #: the last commit whose close() returned: a kill -9 must keep it
    closed: int | None = None
    #: commits written since ``synced``/``closed`` whose fate is open (not fsynced, or cut by the crash):
    #: any of them may be what a remount shows, as a flush for another group may have covered them
    since_synced: list[int] = field(default_factory=list)
    since_closed: list[int] = field(default_factory=list)


@dataclass
class Totals:
    cycles: int = 0
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0
    misplaced: int = 0
    partial_batches: int = 0
    split_prefixes: int = 0     # unacknowledged writes over segment.bytes found cut after a batch
    start_went_back: int = 0
    retention_undone_by_power_loss: int = 0
    recovered_unflushed_dropped: int = 0
    reader_errors: int = 0
    follower_errors: int = 0
    disk_errors: int = 0
    check_problems: int = 0
    retained: int = 0
    unacked_present: int = 0
    unacked_absent: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    recovery_s: list[float] = field(default_factory=list)
    #: crash kind ("kill-9", "power-loss") -> [(seconds until the mount answered, the mount's own load ms,
    #: index files it found corrupt and rebuilt, 1 if it skipped recovery on a clean-shutdown marker)]
    remounts: dict[str, list[tuple[float, int, int, int]]] = field(
        default_factory=lambda: collections.defaultdict(list))
    context: str = ""                       # what the failures found now follow ("after power-loss")
    peak_rss_kb: int = 0
    commits_synced: int = 0     # group commits acknowledged by fsync()
    commits_lost: int = 0
    #: --tiered: records read back through the views from the store (below the local log start)
    read_from_store: int = 0
    store_checks: int = 0       # quiescent comparisons of the store with the metadata log
    store_orphans: int = 0      # objects of no finished copy, temporary files (after the mount's first round)
    store_missing: int = 0      # finished copies missing an object, or with a .log of another size
    #: what a crash left in the store and the data dir, found before the remount (the mount must clean it)
    crash_leftovers: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        if self.context:
            message = f"{message} [{self.context}]"
        if len(self.failures) < 50:
            self.failures.append(message)
        print(f"  FAIL {message}", file=sys.stderr, flush=True)


class Checks:
    """The checks after a remount; mixed into ``torture.Torture``, whose state they read."""

    args: argparse.Namespace
    mnt: Path
    data: Path
    parts: dict[str, Partition]
    totals: Totals
    groups: list[GroupCommits]
    groups_lock: threading.Lock
    lost_power: bool
    bootstrap: str | None
    #: --tiered: the properties file of the store's settings (``logfs check --config``), else None
    store_config: Path | None

    def check_groups(self, tolerant: bool) -> None:
        """Each group's committed offset on p/0 after a remount: its last fsynced commit or a later one
        (after a power loss, ``tolerant``), its last closed commit or a later one (after a kill -9)."""
        for commits in self.groups:
            try:
                text = (self.mnt / "p" / "groups" / commits.group).read_text()
            except FileNotFoundError:
                text = ""
            rows = [line.split() for line in text.splitlines()]
            shown = next((int(row[1]) for row in rows if row and row[0] == "0"), -1)
            committed = None if shown < 0 else shown
            with self.groups_lock:
                base, later = ((commits.synced, commits.since_synced) if tolerant
                               else (commits.closed, commits.since_closed))
                allowed = {base, *later}
                if committed not in allowed:
                    self.totals.commits_lost += 1
                    self.totals.fail(f"p/groups/{commits.group}: committed offset {committed}, expected "
                                     f"{base} or a later commit {later} "
                                     f"({'fsynced' if tolerant else 'closed'} before the crash)")
                commits.synced = commits.closed = committed     # what the mount holds now
                commits.since_synced, commits.since_closed = [], []

    def read_view(self, part: Partition) -> tuple[int, list[tuple[int, str | None, str]]]:
        """(log start offset, [(offset, key, value)]) of a partition, through the mount.

        A partition that is gone (a power loss took its directory) reads as empty: its records count as lost.
        """
        if not (self.mnt / part.name).exists():
            if not part.gone:
                self.totals.fail(f"{part.name}: the partition is gone")
            part.gone = True
            return 0, []
        with open(self.mnt / part.name / "records.jsonl", "rb") as f:
            state = json.loads((self.mnt / part.name / "state").read_bytes())   # after the view is anchored
            records = [json.loads(line) for line in f.read().splitlines()]
        part.local_start = state.get("local_log_start_offset", state["log_start_offset"])
        return state["log_start_offset"], [(r["offset"], r.get("key"), r["value"]) for r in records]

    def check_views(self) -> dict[str, dict[int, str]]:
        """The checks after a (re)mount, with no traffic; returns each partition's records by offset."""
        snapshot = {}
        seen_values: set[str] = set()
        for part in self.parts.values():
            start, records = self.read_view(part)
            t = self.totals
            # a cluster mount's replica serves the cluster's log start and records, whatever a power loss took
            tolerant = self.lost_power and not self.bootstrap
            if start < part.max_start and tolerant and start >= part.deleted_before:
                # Retention moved the log start (nobody acknowledged that) and the power loss undid the
                # deletion: counted, not a failure; an acknowledged `before N` must hold (below).
                t.retention_undone_by_power_loss += 1
                print(f"  note: {part.name}: log start {start} went back from {part.max_start} "
                      f"after a power loss [{t.context}]", file=sys.stderr, flush=True)
            elif start < part.max_start:
                t.start_went_back += 1
                t.fail(f"{part.name}: log start {start} went back from {part.max_start}")
            if part.fixed_start and start > part.deleted_before:
                # nothing may have moved it: the records below it are lost (counted below), not retained
                t.fail(f"{part.name}: log start {start} moved with no retention and no `before N` "
                       f"(local log start {part.local_start})")
            if start < part.deleted_before:
                t.start_went_back += 1
                t.fail(f"{part.name}: log start {start} below the acknowledged `before {part.deleted_before}`")
            part.max_start = max(part.max_start, start)
            by_offset: dict[int, str] = {}
            at_value: dict[str, int] = {}
            last = -1
            for offset, _key, value in records:
                if offset <= last:
                    t.misplaced += 1
                    t.fail(f"{part.name}: offset {offset} after {last} in records.jsonl")
                last = offset
                if value in seen_values:
                    t.duplicated += 1
                    t.fail(f"{part.name}: value {value!r} present twice")
                seen_values.add(value)
                by_offset[offset] = value
                at_value[value] = offset
            snapshot[part.name] = by_offset
            if part.tiered:
                t.read_from_store += sum(1 for o in by_offset if o < part.local_start)
            with part.lock:
                if tolerant and part.promoted:
                    # found after an earlier recovery, never fsynced: a power loss may take them (Kafka's
                    # recovery does not flush either); counted, not a failure
                    for offset in sorted(part.promoted):
                        if offset in part.acked and by_offset.get(offset) != part.acked[offset]:
                            del part.acked[offset]
                            part.promoted.discard(offset)
                            t.recovered_unflushed_dropped += 1
                # acknowledged records
                if part.compacted:
                    self._check_compacted(part, by_offset, start)
                else:
                    gone: list[int] = []
                    for offset, value in part.acked.items():
                        if offset < start:
                            continue
                        got = by_offset.get(offset)
                        if got == value:
                            continue
                        if value in at_value:
                            t.misplaced += 1
                            t.fail(f"{part.name}: acknowledged {value!r} at {at_value[value]}, not at {offset}")
                        else:
                            t.lost += 1
                            t.fail(f"{part.name}: acknowledged record {offset} ({value!r}) lost")
                            gone.append(offset)
                    for offset in gone:             # counted once, not again at every later check
                        del part.acked[offset]
                # unacknowledged batches: all or nothing, contiguous
                for batch in part.unacked:
                    present = [at_value[v] for v in batch if v in at_value]
                    if not present:
                        t.unacked_absent += 1
                        continue
                    complete = len(present) == len(batch) and present == list(range(present[0],
                                                                                   present[0] + len(batch)))
                    # `before N` may cut a batch: then its tail is there, from the log start on
                    view_first = min(by_offset) if by_offset else start
                    cut = (present[0] in (start, view_first)
                           and present == list(range(present[0], present[0] + len(present)))
                           and batch[-len(present):] == [by_offset[o] for o in present])
                    # a write over segment.bytes is several batches (docs/usage.md, "Writing"): a crash between
                    # them leaves a prefix of it, in order and contiguous
                    may_split = not self.bootstrap and batch_size(batch) > self.args.segment_bytes
                    prefix = (may_split and present == list(range(present[0], present[0] + len(present)))
                              and [by_offset[o] for o in present] == batch[:len(present)])
                    if prefix and not complete:
                        t.split_prefixes += 1
                    if not complete and not part.compacted and not cut and not prefix:
                        t.partial_batches += 1
                        t.fail(f"{part.name}: unacknowledged batch of {len(batch)} half there: {present}")
                    t.unacked_present += 1
                    for value, offset in zip(batch, present) if complete else ():
                        part.acked[offset] = value          # seen after recovery: held to it from now on
                        part.promoted.add(offset)
                part.unacked = []
                # records below the log start are gone by design (retention, DeleteRecords): stop tracking them
                for offset in [o for o in part.acked if o < start]:
                    del part.acked[offset]
                    if part.fixed_start and offset >= part.deleted_before:
                        t.lost += 1
                    else:
                        t.retained += 1
        self.check_groups(self.lost_power)
        self.lost_power = False
        return snapshot

    def _check_compacted(self, part: Partition, by_offset: dict[int, str], start: int) -> None:
        """Compaction keeps the newest record of each key: the newest acknowledged one, or a later one."""
        t = self.totals
        for offset, value in by_offset.items():
            expected = part.acked.get(offset)
            if expected is not None and expected != value:
                t.misplaced += 1
                t.fail(f"{part.name}: offset {offset} holds {value!r}, acknowledged {expected!r}")
        newest_acked: dict[str, int] = {}
        for offset, value in part.acked.items():
            key = part.keys[value]
            newest_acked[key] = max(newest_acked.get(key, -1), offset)
        newest_present: dict[str, int] = {}
        for offset, value in by_offset.items():
            present = part.keys.get(value)
            if present is not None:
                newest_present[present] = max(newest_present.get(present, -1), offset)
        for key, offset in newest_acked.items():
            if by_offset.get(offset) == part.acked[offset] or newest_present.get(key, -1) > offset or offset < start:
                continue
            t.lost += 1
            t.fail(f"{part.name}: the newest acknowledged record of key {key} ({offset}) is gone")
        # older records of a key may be compacted away: only the newest acknowledged ones stay tracked
        keep = set(newest_acked.values())
        for offset in [o for o in part.acked if o not in keep]:
            del part.acked[offset]
        live = set(part.acked.values()) | set(by_offset.values())
        part.keys = {v: k for v, k in part.keys.items() if v in live}

    def check_disk(self, views: dict[str, dict[int, str]]) -> None:
        """After a clean shutdown: kafka-python decodes every batch (CRC), the disk matches the views."""
        from kafka.record.memory_records import MemoryRecords

        t = self.totals
        for part in self.parts.values():
            topic, p = part.name.split("/")
            pdir = self.data / f"{topic}-{p}"
            disk: dict[int, str] = {}
            for name in sorted(os.listdir(pdir)) if pdir.exists() else ():
                if not name.endswith(".log"):
                    continue
                records = MemoryRecords((pdir / name).read_bytes())
                while (batch := records.next_batch()) is not None:
                    if not batch.validate_crc():
                        t.disk_errors += 1
                        t.fail(f"{pdir / name}: CRC mismatch at offset {batch.base_offset} (kafka-python)")
                        continue
                    for record in batch:
                        disk[record.offset] = record.value.decode()
            view = views[part.name]
            start = min(view) if view else None
            for offset, value in disk.items():
                if start is not None and offset >= start and view.get(offset) != value:
                    t.disk_errors += 1
                    t.fail(f"{part.name}: disk has {value!r} at {offset}, the view had {view.get(offset)!r}")
            if not part.compacted and view:
                disk_start = min(disk) if disk else None
                missing = [o for o in view if disk_start is not None and o >= disk_start and o not in disk]
                if missing:
                    t.disk_errors += 1
                    t.fail(f"{part.name}: {len(missing)} records of the view are not on disk, e.g. {missing[:3]}")
        # --tiered: the store too (engine.remote.check): the metadata log against the store's objects
        store = ["--config", str(self.store_config)] if self.store_config is not None else []
        result = subprocess.run([*LOGFS, "check", str(self.data), *store], capture_output=True, text=True,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        problems = [line for line in result.stdout.splitlines() if line.strip()]
        if result.returncode != 0 or problems:
            t.check_problems += max(1, len(problems))
            t.fail(f"logfs check after a clean shutdown: {problems[:5]}")
