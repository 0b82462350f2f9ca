#!/usr/bin/env python3
"""Torture harness: crash a live logfs mount over and over and check that nothing acknowledged is lost.

Each cycle mounts the data dir, runs concurrent writers (each appends batches
of unique lines through its own ``append`` fd opened read-write, fsyncs, and
reads back the ``<first> <last>`` offsets of its batches: only then are those
records *acknowledged*), followers tailing ``records.jsonl``, random readers
of ``offset/N``, and DeleteRecords (``before N``), while retention and the
log cleaner work on small segments.  Then it crashes the mount with SIGKILL at
a random moment (sometimes during startup, i.e. during recovery, or during a
clean shutdown), remounts, and checks through the views:

* every acknowledged record at or above the log start is present, once, at its
  offset (compacted topic: the newest acknowledged record of each key is);
* batches written but never acknowledged are all there or not at all;
* offsets increase, no value appears twice, the log start never goes back
  (and never below an acknowledged ``before N``);
* followers never saw an offset twice or out of order, random readers never
  read a wrong value.

Killed writers (``--killed-writers``) append to topic ``k`` all along, each a
real process that writes a whole line and the head of another, then dies by
SIGINT or SIGKILL mid-line (a shell that kills itself, or ``cat`` killed from
outside): no record of ``k`` may hold such a head (a torn record).

A committer writes consumer group commits to ``p/groups/<group>`` all along,
most of them fsynced before the close: after a kill -9 each group's committed
offset is its last closed commit (or a later one cut by the crash), after a
power loss its last fsynced commit or a later one.

With ``--power-loss`` the data dir is the mount point of
``tests/harness/powerloss_fs.py``, a FUSE layer over ``<work dir>/backing`` that
holds data writes and namespace changes in memory until their ``fsync`` (of
the file, of the directory).  A crash cycle is then a power loss (``kill -9``
of the mount, then the layer drops everything not durable, and restarts over
what a disk would hold), or with ``--power-loss-rate`` below 1 sometimes a
plain ``kill -9`` with the layer kept, so the remount times of the two can be
compared; ``--torn-writes`` writes a random half of the dirty pages at each
power loss.  The same checks follow.

With ``--bootstrap-server HOST:PORT,...`` (a cluster without topics ``p``,
``r``, ``c``) or ``--cluster`` (a 3-node KRaft cluster started in the work
dir from devtools/kafka.py) the mount is a cluster mount (SPEC.md
section 10): the writers' records are acknowledged by the cluster
(``acks=all``), the data dir is the mount's local replica, and the crashes
(kill -9, power losses with ``--power-loss``) hit the replica.  The same
checks follow with no allowance for a power loss: what the cluster
acknowledged must be served after every remount, however the replica was
torn, and the log start is the cluster's.

With ``--tiered`` the store is in the loop (docs/tiering.md): the mount has
``remote.log.storage.system.enable=true`` and the store's settings in a
``--config`` properties file, and ``remote.log.manager.task.interval.ms=200``
(``--copy-interval-ms``; the first round comes ``log.initial.task.delay.ms``,
100 ms here, after each mount).  The store is a ``file://`` directory in the
work dir, or with ``--store seaweedfs`` a SeaweedFS ``weed mini`` started
there (S3 on loopback, tests/seaweedfs.py); either is outside the power-loss
layer, as another machine keeps what it acknowledged.  Topics ``p`` and ``r``
have ``remote.storage.enable=true`` and a ``local.retention.bytes`` of 64 and
32 KiB over 16 KiB segments, so every cycle copies segments, deletes local
ones, moves log starts over copies (their retention) and deletes copies
(``file.delete.delay.ms=2000``: a view a check opened reads on for 2 s once
retention passed its copies); a topic ``t`` is tiered with no retention at
all: its log start must stay 0, so
each of its records is read back from the store or the local segments, never
excused as retained.  Readers of ``offset/N`` read old offsets of the tiered
partitions (from the store) half the time.  Before each remount the durable
data dir and the store are searched for what the crash left mid-way (copies
and deletions of copies under way, objects of no finished copy, local
segments renamed ``.deleted`` but not unlinked yet), counted under
``crash_leftovers``; a finished copy missing an object is a failure at once.
After each remount, once the copy task's first round is over, the store must
hold exactly the finished copies of the metadata log: an independent check
(tests/harness/torture_store.py: the metadata log replayed with kafka-python,
the store listed, temporary files included) between two identical reads of
the metadata log with no copy under way; an orphaned or missing object fails
the run (``store_orphans``, ``store_missing``).  ``logfs check`` after a clean
shutdown gets the store's settings.

Every ``--clean-every`` cycles (and at the end) the mount is instead shut down
cleanly and the disk is checked with kafka-python (every batch's CRC), against
the views read just before, and with ``logfs check`` (no problem allowed).

Prints cycles, acknowledged, lost, duplicated, recovery time, faults injected
by kind and the mount's peak memory; exits 1 if anything was lost, duplicated,
misplaced or inconsistent.  The defaults run in well under a minute (CI);
``--duration 3600`` runs for an hour.

    .venv/bin/python tests/harness/torture.py                  # CI defaults
    .venv/bin/python tests/harness/torture.py --duration 600 --writers 6 --json
    .venv/bin/python tests/harness/torture.py --power-loss --power-loss-rate 0.5
    .venv/bin/python tests/harness/torture.py --cluster --power-loss      # the local replica of a cluster mount
    .venv/bin/python tests/harness/torture.py --power-loss --fd-limit 64  # segment files closed and reopened
    .venv/bin/python tests/harness/torture.py --tiered --cycles 150 --json               # the store in the loop
    .venv/bin/python tests/harness/torture.py --tiered --power-loss --cycles 150 --json
    .venv/bin/python tests/harness/torture.py --tiered --store seaweedfs                 # S3 (weed mini)
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):       # run as a script: the work tree's root on the path, as for a module
    sys.path.insert(0, str(ROOT))
from logfs.fuse_connection import abort_fuse_connection, fuse_connection, waiting_requests  # noqa: E402
from tests.harness.torture_checks import LOGFS, Checks, GroupCommits, Partition, Totals  # noqa: E402
from tests.harness.torture_store import (  # noqa: E402
    StoreLister,
    compare,
    metadata_state,
    quiescent_snapshot,
)

if TYPE_CHECKING:
    from tests.seaweedfs import SeaweedFS

#: the power-loss layer, run under this interpreter
POWERLOSS_FS = [sys.executable, str(ROOT / "tests" / "harness" / "powerloss_fs.py")]

#: topic -> (partitions, topic config lines): retention by size, by time, compaction
TOPICS = {
    "p": (2, b"retention.bytes=262144\n"),
    "r": (1, b"retention.ms=4000\n"),
    "c": (1, b"cleanup.policy=compact\nparse.key=true\nmin.cleanable.dirty.ratio=0.05\ninternal.segment.bytes=8192\n"),
}
#: the same on a cluster mount: the configs are the cluster's (segment.bytes below Kafka's 1 MiB minimum is
#: refused there; retention runs on the brokers' schedule), parse.key is the mount's own
CLUSTER_TOPICS = {
    "p": (2, b"retention.bytes=262144\n"),
    "r": (1, b"retention.ms=4000\n"),
    "c": (1, b"cleanup.policy=compact\nparse.key=true\nmin.cleanable.dirty.ratio=0.05\n"),
}
#: --tiered: the same topics, p and r copied to the store (their local segments trimmed to a few), plus ``t``,
#: copied and never trimmed by retention (its log start must stay 0: every record is there, most in the store);
#: the copies below a log start stay file.delete.delay.ms (2 s here), as long as a check reads a view
TIERED_TOPICS = {
    "p": (2, b"retention.bytes=262144\nremote.storage.enable=true\nlocal.retention.bytes=65536\n"
             b"file.delete.delay.ms=2000\n"),
    "r": (1, b"retention.ms=4000\nremote.storage.enable=true\nlocal.retention.bytes=32768\n"
             b"file.delete.delay.ms=2000\n"),
    "c": (1, b"cleanup.policy=compact\nparse.key=true\nmin.cleanable.dirty.ratio=0.05\ninternal.segment.bytes=8192\n"),
    "t": (1, b"remote.storage.enable=true\nlocal.retention.bytes=32768\n"),
}
#: --tiered: the partitions whose log start nothing may move (no retention, no `before N`)
FIXED_START = {"t/0"}
KEYS = 40                                  # distinct keys of the compacted topic
BROKER = {
    "num.partitions": "1",
    "internal.log.segment.bytes": "16384",
    "log.initial.task.delay.ms": "100",
    "log.retention.check.interval.ms": "250",
    "log.segment.delete.delay.ms": "400",
    "log.flush.offset.checkpoint.interval.ms": "500",
    "log.flush.start.offset.checkpoint.interval.ms": "500",
    "log.cleaner.backoff.ms": "250",
    "log.cleaner.min.compaction.lag.ms": "0",
}

DEAD = {errno.ENOTCONN, errno.ECONNABORTED, errno.ENODEV, errno.EIO, errno.EBADF}
#: the topic of the writers killed mid-line, and the mark of the heads they leave unterminated
KILLED_TOPIC = "k"
TORN_MARK = "-TORN-"


def _is_mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


def _abort_fuse_connection(connection: int | None, what: str) -> None:
    """Abort the FUSE connection of a daemon just killed (logfs.fuse_connection: a SIGKILL can leave it held,
    and every request to the mount, a FLUSH of a child the harness forks included, would wait for good; it
    hung a run for 24 minutes once), before waiting for the process."""
    pending = waiting_requests(connection) if connection is not None else None
    if abort_fuse_connection(connection) and pending:
        print(f"torture: aborted the FUSE connection {connection} of the killed {what} ({pending} requests "
              "were counted waiting on it)", file=sys.stderr, flush=True)


def _unmount(path: Path, timeout: float = 120.0) -> None:
    """``fusermount3 -u`` until it takes (a busy mount refuses while a request is in flight), at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while _is_mounted(path) and time.monotonic() < deadline:
        if subprocess.run(["fusermount3", "-u", str(path)], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)


class Torture(Checks):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="logfs-torture-"))
        self.mnt = self.work / "mnt"
        self.data = Path(args.data_dir) if args.data_dir else self.work / "data"
        self.log_path = self.work / "logfs.log"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(parents=True, exist_ok=True)
        #: --power-loss: the durable state under the data dir (the data dir is the layer's mount point)
        self.backing = self.work / "backing"
        self.layer_log = self.work / "powerloss_fs.log"
        self.layer: subprocess.Popen[bytes] | None = None
        self.lost_power = False               # a power loss since the last check_views()
        self.proc: subprocess.Popen[bytes] | None = None
        self.totals = Totals()
        #: --bootstrap-server/--cluster: a cluster mount, the data dir its local replica
        self.bootstrap: str | None = args.bootstrap_server
        self.topics = CLUSTER_TOPICS if self.bootstrap else TIERED_TOPICS if args.tiered else TOPICS
        self.parts = {f"{t}/{p}": Partition(f"{t}/{p}", fixed_start=args.tiered and f"{t}/{p}" in FIXED_START,
                                            tiered=args.tiered and b"remote.storage.enable=true" in config)
                      for t, (n, config) in self.topics.items() for p in range(n)}
        #: --tiered: the store (outside the power-loss layer: another machine, which keeps what it acknowledged)
        self.store_dir = self.work / "store"
        self.store_config: Path | None = None
        self.store_settings: dict[str, str] = {}
        self.seaweedfs: SeaweedFS | None = None
        self.store_findings: set[str] = set()     # each orphaned or missing object, counted once
        self.seq = 0
        self.seq_lock = threading.Lock()
        #: consumer groups committing on p/0 (an embedded mount: its own coordinator writes __consumer_offsets)
        self.groups = [] if self.bootstrap else [GroupCommits(f"g{i}") for i in range(3)]
        self.groups_lock = threading.Lock()
        self.torn_records = 0                 # records of KILLED_TOPIC holding a killed writer's head

    # ------------------------------------------------------------------ mount process

    def _spawn(self) -> None:
        cmd = [*LOGFS, "mount", str(self.mnt), "--data-dir", str(self.data)]
        if self.bootstrap:
            # the broker settings below configure the local replica (small segments: many rolls to tear)
            cmd += ["--bootstrap-server", self.bootstrap]
        broker = {**BROKER, "internal.log.segment.bytes": str(self.args.segment_bytes)}
        if self.args.power_loss:
            # Kafka's default checkpoint intervals: a checkpoint's fsync of the data dir must not be
            # what makes a missing fsync harmless
            broker["log.flush.offset.checkpoint.interval.ms"] = str(self.args.checkpoint_ms)
            broker["log.flush.start.offset.checkpoint.interval.ms"] = str(self.args.checkpoint_ms)
        if self.args.tiered:
            # the first round of the copy task comes log.initial.task.delay.ms (100 here) after the mount
            broker["remote.log.manager.task.interval.ms"] = str(self.args.copy_interval_ms)
        for name, value in broker.items():
            cmd += ["-o", f"{name}={value}"]
        if self.store_config is not None:
            cmd += ["--config", str(self.store_config)]   # remote.log.storage.system.enable and the store
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        limit = None
        if self.args.fd_limit:
            # the mount's descriptor budget is three quarters of it (engine.file_cache): segment files and
            # index maps are closed and reopened all the time
            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (self.args.fd_limit, self.args.fd_limit))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=limit)

    @property
    def running(self) -> subprocess.Popen[bytes]:
        """The mount's process, from a spawn until its kill or stop."""
        assert self.proc is not None, "the mount is not running"
        return self.proc

    def start(self, timeout: float = 120.0) -> float:
        """Mount; returns the seconds until the mount answered (recovery included).

        ``self.last_load_ms`` is then the mount's own figure for loading the logs (its summary line).
        """
        if self.args.power_loss and self.layer is None:
            self.start_layer()
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        started = time.monotonic()
        self._spawn()
        while not _is_mounted(self.mnt):
            if self.running.poll() is not None:
                raise RuntimeError(f"logfs mount exited with {self.running.returncode}; see {self.log_path}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"logfs mount not ready after {timeout}s; see {self.log_path}")
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        with open(self.log_path, "rb") as log:
            log.seek(log_start)
            text = log.read()
        found = re.findall(rb"loaded \d+ logs from .* in (\d+) ms", text)
        self.last_load_ms = int(found[-1]) if found else -1
        self.last_index_rebuilds = text.count(b"Found a corrupted index file")
        self.last_skipped_recovery = int(b"since clean shutdown file was found" in text)
        return elapsed

    # ------------------------------------------------------------------ the power-loss layer

    def start_layer(self, timeout: float = 60.0) -> None:
        """Mount tests/harness/powerloss_fs.py on the data dir, over the backing dir (what the disk holds)."""
        self.backing.mkdir(parents=True, exist_ok=True)
        cmd = [*POWERLOSS_FS, str(self.backing), str(self.data)]
        if self.args.torn_writes:
            cmd += ["--torn-writes", "--seed", str(self.rng.randrange(1 << 30))]
        if self.args.lying_fsync:
            cmd.append("--lying-fsync")
        with open(self.layer_log, "ab") as log:
            self.layer = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        started = time.monotonic()
        while not _is_mounted(self.data):
            if self.layer.poll() is not None:
                raise RuntimeError(f"powerloss_fs exited with {self.layer.returncode}; see {self.layer_log}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"powerloss_fs not mounted after {timeout}s; see {self.layer_log}")
            time.sleep(0.01)

    def power_loss(self) -> None:
        """The machine loses power: the mount dies (kill -9), then the layer drops all that is not durable."""
        self.kill()
        if self.layer is None:
            return
        self.layer.send_signal(signal.SIGUSR1)
        code = self.layer.wait(timeout=120)
        self.layer = None
        if code != 0:
            self.totals.fail(f"powerloss_fs exited with {code} at a power loss; see {self.layer_log}")
        subprocess.run(["fusermount3", "-uz", str(self.data)], capture_output=True)

    def stop_layer(self) -> None:
        """An orderly power-off of the layer: everything made durable, then unmounted."""
        if self.layer is None:
            return
        _unmount(self.data)
        code = self.layer.wait(timeout=120)
        self.layer = None
        if code != 0:
            self.totals.fail(f"powerloss_fs exited with {code} at its shutdown; see {self.layer_log}")

    def crash(self, lose_power: bool) -> None:
        """kill -9 of the mount, or a power loss."""
        if lose_power:
            self.power_loss()
            self.lost_power = True
        else:
            self.kill()

    def _note_memory(self) -> None:
        try:
            for line in Path(f"/proc/{self.running.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.totals.peak_rss_kb = max(self.totals.peak_rss_kb, int(line.split()[1]))
        except OSError:
            pass

    def kill(self) -> None:
        connection = fuse_connection(self.mnt)
        if self.proc is not None:
            self._note_memory()
            self.proc.send_signal(signal.SIGKILL)
            _abort_fuse_connection(connection, "mount")
            self.proc.wait()
            self.proc = None
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True)

    def stop(self) -> None:
        """Clean unmount; the mount flushes, checkpoints and writes its clean-shutdown marker."""
        self._note_memory()
        _unmount(self.mnt)
        code = self.running.wait(timeout=120)
        self.proc = None
        if code != 0:
            self.totals.fail(f"clean shutdown exited with {code}")

    # ------------------------------------------------------------------ the store (--tiered)

    def start_store(self) -> None:
        """The store and the mount's settings for it, in a properties file (mode 600, as the docs say)."""
        if self.args.store == "seaweedfs":
            from tests.seaweedfs import SeaweedFS
            server = self.seaweedfs = SeaweedFS(self.work / "seaweedfs").start()
            settings = server.settings(prefix="torture")
        else:
            self.store_dir.mkdir(parents=True, exist_ok=True)
            settings = {"rsm.config.uri": f"file://{self.store_dir}"}
        self.store_settings = settings
        self.store_config = self.work / "tiered.properties"
        self.store_config.write_text("remote.log.storage.system.enable=true\n"
                                     + "".join(f"{k}={v}\n" for k, v in settings.items()))
        self.store_config.chmod(0o600)

    def stop_store(self) -> None:
        if self.seaweedfs is not None:
            self.seaweedfs.stop()
            self.seaweedfs = None

    def _durable_data(self) -> Path:
        """The data dir as the mount will find it: after a power loss, what the disk holds (the layer is down)."""
        return self.backing if self.args.power_loss and self.layer is None else self.data

    def note_crash_leftovers(self) -> None:
        """Before the remount: what the crash left mid-way, in the store and in the data dir.

        Copies and deletions left unfinished, objects of no finished copy: the mount's first round must clean
        them (check_store); counted to show that crashes land there.  A finished copy missing an object or
        short is a loss whatever the crash did: a failure now.  A local segment renamed ``.deleted`` (local
        retention, not yet unlinked) is a crash in the middle of a local deletion.
        """
        data = self._durable_data()
        lister = StoreLister(self.store_settings)
        try:
            _, copies = metadata_state(data)
            found = compare(copies, lister.list())
        finally:
            lister.close()
        leftovers = self.totals.crash_leftovers
        leftovers["copy-started"] += sum("COPY_SEGMENT_STARTED" in u for u in found.unfinished)
        leftovers["delete-started"] += sum("DELETE_SEGMENT_STARTED" in u for u in found.unfinished)
        leftovers["objects-of-no-finished-copy"] += len(found.orphans)
        deleted = 0
        for part in self.parts.values():
            if part.tiered:
                pdir = data / part.name.replace("/", "-")
                deleted += sum(1 for n in os.listdir(pdir) if n.endswith(".log.deleted")) if pdir.exists() else 0
        leftovers["local-segments-mid-delete"] += deleted
        leftovers["crashes-mid-copy-or-delete"] += bool(found.unfinished or found.orphans or deleted)
        if found.missing:
            self.totals.store_missing += len(found.missing)
            self.totals.fail(f"after the crash, before the remount: {found.missing[:3]}")

    def _copy_task_runs(self) -> int:
        try:
            stats = json.loads((self.mnt / ".logfs" / "stats.json").read_bytes())
        except (OSError, ValueError):
            return 0
        return int(stats.get("tasks", {}).get("kafka-remote-log-manager", {}).get("runs", 0))

    def check_store(self, live: bool = True) -> None:
        """The store holds exactly the finished copies of the metadata log (tests/harness/torture_store.py).

        ``live``: on the mount that just came back, once its copy task's first round (which cleans what a
        crash left) is over, between two identical reads of the metadata log with no copy under way.
        """
        t = self.totals
        if live:
            deadline = time.monotonic() + 120
            while self._copy_task_runs() < 1:
                if time.monotonic() > deadline:
                    t.fail("the copy task did not finish a round within 120 s of the remount")
                    return
                time.sleep(0.02)
        lister = StoreLister(self.store_settings)
        try:
            snapshot = quiescent_snapshot(self.data, lister)
        finally:
            lister.close()
        if snapshot is None:
            t.fail("no quiescent moment of the copy task within 120 s to compare the store with the metadata")
            return
        copies, objects = snapshot
        found = compare(copies, objects)
        t.store_checks += 1
        orphans = [o for o in found.orphans if o not in self.store_findings]
        missing = [m for m in found.missing if m not in self.store_findings]
        self.store_findings.update(orphans + missing)
        if orphans:
            t.store_orphans += len(orphans)
            t.fail(f"{len(orphans)} orphaned objects in the store, e.g. {orphans[:3]}")
        if missing:
            t.store_missing += len(missing)
            t.fail(f"{len(missing)} objects of finished copies missing or short, e.g. {missing[:3]}")

    # ------------------------------------------------------------------ setup

    def create_topics(self) -> None:
        for topic, (partitions, config) in self.topics.items():
            if self.bootstrap and (self.mnt / topic).exists():
                raise RuntimeError(f"the cluster at {self.bootstrap} already has a topic {topic}: the harness "
                                   "needs a cluster without topics p, r and c (or --cluster)")
            if not (self.mnt / topic).exists():
                (self.mnt / topic).mkdir()
                with open(self.mnt / topic / "config", "ab") as f:    # >>: added to what the topic has
                    f.write(config)
            for p in range(1, partitions):
                if not (self.mnt / topic / str(p)).exists():
                    (self.mnt / topic / str(p)).mkdir()
        if self.args.killed_writers and not (self.mnt / KILLED_TOPIC).exists():
            (self.mnt / KILLED_TOPIC).mkdir()

    # ------------------------------------------------------------------ traffic

    def _next_seq(self) -> int:
        with self.seq_lock:
            self.seq += 1
            return self.seq

    def writer(self, wid: int, part: Partition, stop: threading.Event) -> None:
        rng = random.Random(self.rng.random())
        try:
            fd = os.open(self.mnt / part.name / "append", os.O_RDWR)
        except OSError:
            return
        written: list[list[str]] = []
        replies = b""
        try:
            while not stop.is_set():
                # one write in ten is a block of 4 KiB and more: the compiled encoding of whole
                # lines (Log.append_text_lines)
                count = rng.randint(1, 30) if rng.random() < 0.9 else rng.randint(400, 1200)
                values = [f"w{wid}-{self._next_seq()}" for _ in range(count)]
                if part.compacted:
                    keys = [f"k{rng.randrange(KEYS)}" for _ in values]
                    with part.lock:
                        part.keys.update(zip(values, keys))
                    payload = "".join(f"{k}\t{v}\n" for k, v in zip(keys, values)).encode()
                else:
                    payload = "".join(f"{v}\n" for v in values).encode()
                os.write(fd, payload)
                written.append(values)
                if rng.random() < 0.4:
                    if not self.bootstrap:
                        os.fsync(fd)    # a cluster mount's write() returned once the cluster acknowledged
                    while replies.count(b"\n") < len(written):
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            raise RuntimeError(f"{part.name}: {len(written)} batches but fewer offset replies")
                        replies += chunk
                    lines, replies = replies.split(b"\n"), b""
                    acks = [tuple(map(int, line.split())) for line in lines if line]
                    with part.lock:
                        for values_, (first, last) in zip(written, acks):
                            if last - first + 1 != len(values_):
                                self.totals.fail(f"{part.name}: batch of {len(values_)} acknowledged as "
                                                 f"{first}..{last}")
                            for i, value in enumerate(values_):
                                previous = part.acked.get(first + i)
                                if previous is not None and previous != value:
                                    self.totals.duplicated += 1
                                    self.totals.fail(f"{part.name}: offset {first + i} acknowledged twice "
                                                     f"({previous!r}, then {value!r})")
                                part.acked[first + i] = value
                            self.totals.acknowledged += len(values_)
                        if part.promoted and acks:
                            # the fsync flushed the log up to its end: what was found after a recovery too
                            covered = max(last for _, last in acks)
                            part.promoted = {o for o in part.promoted if o > covered}
                    written = []
        except OSError as exc:
            if exc.errno not in DEAD:
                self.totals.fail(f"{part.name}: writer {wid}: {exc}")
        except RuntimeError as exc:
            self.totals.fail(str(exc))
        finally:
            with part.lock:
                part.unacked.extend(written)
            try:
                os.close(fd)
            except OSError:
                pass

    def killed_writer(self, stop: threading.Event) -> None:
        """Writers killed mid-line: each writes ``k-<n>-whole\\n`` and the head of ``k-<n>-TORN-...``, then
        dies by SIGINT or SIGKILL, its own (a shell) or sent from here (``cat``, stdin still open)."""
        rng = random.Random(self.rng.random())
        path = str(self.mnt / KILLED_TOPIC / "0" / "append")
        while not stop.is_set():
            n = self._next_seq()
            sig = rng.choice((signal.SIGINT, signal.SIGKILL))
            payload = f"k-{n}-whole\n{KILLED_TOPIC}-{n}{TORN_MARK}" + "x" * rng.randint(0, 3000)
            try:
                if rng.random() < 0.5:
                    # the shell opens the file, writes with its builtin printf, and kills itself
                    code = subprocess.run(["sh", "-c", f'{{ printf "%s" "$1"; kill -{sig.name[3:]} $$; }} >> "$0"',
                                           path, payload], capture_output=True, timeout=60).returncode
                else:
                    cat = subprocess.Popen(["sh", "-c", 'exec cat >> "$0"', path], stdin=subprocess.PIPE,
                                           stderr=subprocess.DEVNULL)
                    assert cat.stdin is not None
                    try:
                        cat.stdin.write(payload.encode())
                        cat.stdin.flush()
                        time.sleep(rng.uniform(0.0, 0.03))
                        cat.send_signal(sig)            # stdin stays open: cat never ends the line itself
                    except BrokenPipeError:             # the shell could not open the file (the mount is down)
                        pass
                    try:
                        code = cat.wait(timeout=60)
                    finally:
                        try:
                            cat.stdin.close()
                        except BrokenPipeError:
                            pass
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.totals.fail(f"killed writer {n}: {exc}")
                return
            if code == -sig:
                self.totals.faults[f"writer-killed-mid-line-{sig.name}"] += 1
            time.sleep(rng.uniform(0.0, 0.05))

    def check_killed_topic(self) -> None:
        """No record of KILLED_TOPIC holds the head a killed writer left unterminated."""
        if not self.args.killed_writers:
            return
        try:
            data = (self.mnt / KILLED_TOPIC / "0" / "records").read_bytes()
        except OSError as exc:
            self.totals.fail(f"{KILLED_TOPIC}/0/records: {exc}")
            return
        torn = [line for line in data.split(b"\n") if TORN_MARK.encode() in line]
        if torn:
            self.torn_records = max(self.torn_records, len(torn))   # records stay: the most seen at once
            self.totals.fail(f"{KILLED_TOPIC}/0: {len(torn)} torn records of killed writers, the first "
                             f"{torn[0][:60]!r}")

    def check_views(self) -> dict[str, dict[int, str]]:
        views = super().check_views()
        self.check_killed_topic()
        return views

    def committer(self, stop: threading.Event) -> None:
        """Commits of the groups on ``p/0`` through ``p/groups/<group>``: most fsynced before the close.

        A commit whose ``fsync()`` returned must survive a power loss; one whose ``close()`` returned
        must survive a kill -9 (docs/usage.md, "Consumer groups").
        """
        rng = random.Random(self.rng.random())
        part = self.parts["p/0"]
        while not stop.wait(rng.uniform(0.0, 0.03)):
            commits = rng.choice(self.groups)
            with part.lock:
                top = max(part.acked, default=-1) + 1
            offset = rng.randint(0, top)
            sync = rng.random() < 0.7
            with self.groups_lock:
                commits.since_synced.append(offset)
                commits.since_closed.append(offset)
            try:
                fd = os.open(self.mnt / "p" / "groups" / commits.group, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            except OSError:
                return          # the mount is gone (the crash): the traffic ends
            try:
                os.write(fd, b"0 %d\n" % offset)
                if sync:
                    os.fsync(fd)
                    with self.groups_lock:
                        commits.synced, commits.since_synced = offset, []
                        self.totals.commits_synced += 1
            except OSError as exc:
                if exc.errno not in DEAD:
                    self.totals.fail(f"p/groups/{commits.group}: commit of {offset}: {exc}")
                return
            finally:
                try:
                    os.close(fd)
                except OSError:
                    pass
                else:
                    with self.groups_lock:
                        commits.closed, commits.since_closed = offset, []

    def follower(self, part: Partition, stop: threading.Event) -> None:
        try:
            f = open(self.mnt / part.name / "records.jsonl", "rb", buffering=0)
        except OSError:
            return
        last, buffer = -1, b""
        try:
            while not stop.is_set():
                chunk = f.read(1 << 16)
                if not chunk:
                    time.sleep(0.02)
                    continue
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    offset = json.loads(line)["offset"]
                    if offset <= last:
                        self.totals.follower_errors += 1
                        self.totals.fail(f"{part.name}: follower read offset {offset} after {last}")
                    last = offset
        except OSError:
            pass
        finally:
            try:
                f.close()
            except OSError:
                pass

    def reader(self, stop: threading.Event) -> None:
        rng = random.Random(self.rng.random())
        plain = [p for p in self.parts.values() if not p.compacted]
        while not stop.is_set():
            part = rng.choice(plain)
            with part.lock:
                if not part.acked:
                    offset = None
                else:
                    # a tiered partition's older records are in the store: half the reads go anywhere
                    recent = not part.tiered or rng.random() < 0.5
                    offset = rng.choice(list(part.acked)[-2000:] if recent else list(part.acked))
                    expected = part.acked[offset]
            if offset is None:
                time.sleep(0.02)
                continue
            try:
                got = (self.mnt / part.name / "offset" / str(offset)).read_bytes()
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue                 # below the log start now (retention, DeleteRecords)
                if exc.errno in DEAD:
                    return
                self.totals.reader_errors += 1
                self.totals.fail(f"{part.name}: offset/{offset}: {exc}")
                continue
            if got != expected.encode() + b"\n":
                self.totals.reader_errors += 1
                self.totals.fail(f"{part.name}: offset/{offset} read {got[:60]!r}, acknowledged {expected!r}")

    def deleter(self, stop: threading.Event) -> None:
        """DeleteRecords on ``r/0`` now and then: once acknowledged, the log start never goes below it."""
        rng = random.Random(self.rng.random())
        part = self.parts["r/0"]
        while not stop.wait(rng.uniform(0.2, 0.8)):
            try:
                state = json.loads((self.mnt / "r/0/state").read_bytes())
                start, end = state["log_start_offset"], state["log_end_offset"]
                part.max_start = max(part.max_start, start)       # observed: no crash may take it back
                if end <= start:
                    continue
                target = rng.randint(start, start + (end - start) // 3)
                (self.mnt / "r/0/delete").write_bytes(b"before %d\n" % target)
            except OSError:
                return
            part.deleted_before = max(part.deleted_before, target)
            self.totals.faults["delete-records"] += 1

    def new_topic(self, cycle: int) -> Partition | None:
        """A topic created now (``n<cycle>``, one partition), right before a crash (see run()).

        Its first records are acknowledged at once: under --power-loss this checks that a new
        partition directory is durable before its records are acknowledged.
        """
        name = f"n{cycle}"
        try:
            (self.mnt / name).mkdir()
        except OSError as exc:
            self.totals.fail(f"mkdir {name}: {exc}")
            return None
        part = self.parts[f"{name}/0"] = Partition(f"{name}/0")
        self.totals.faults["new-topic"] += 1
        return part

    def write_acked_batch(self, part: Partition) -> None:
        """One batch appended to ``part`` and fsynced; acknowledged once its offsets are read back."""
        values = [f"n-{self._next_seq()}" for _ in range(5)]
        try:
            fd = os.open(self.mnt / part.name / "append", os.O_RDWR)
        except OSError as exc:
            self.totals.fail(f"{part.name}: open append: {exc}")
            return
        try:
            os.write(fd, "".join(f"{v}\n" for v in values).encode())
            if not self.bootstrap:
                os.fsync(fd)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = os.read(fd, 100)
                if not chunk:
                    raise OSError(errno.EIO, "no offset reply")
                reply += chunk
        except OSError as exc:
            with part.lock:
                part.unacked.append(values)
            self.totals.fail(f"{part.name}: acknowledged batch: {exc}")
            return
        finally:
            os.close(fd)
        first, _last = map(int, reply.split())
        with part.lock:
            for i, value in enumerate(values):
                part.acked[first + i] = value
            self.totals.acknowledged += len(values)

    def traffic(self, seconds: float, cycle: int = 0) -> list[threading.Thread]:
        stop = threading.Event()
        targets = [p for p in self.parts.values() if not p.name.startswith("n")]
        writers = self.args.writers if self.args.writers is not None else max(4, len(targets))
        threads = [threading.Thread(target=self.writer, args=(i, targets[i % len(targets)], stop), daemon=True)
                   for i in range(writers)]
        threads += [threading.Thread(target=self.follower, args=(p, stop), daemon=True)
                    for p in list(self.parts.values())[:self.args.followers]]
        threads += [threading.Thread(target=self.reader, args=(stop,), daemon=True)
                    for _ in range(self.args.readers)]
        threads.append(threading.Thread(target=self.deleter, args=(stop,), daemon=True))
        threads += [threading.Thread(target=self.killed_writer, args=(stop,), daemon=True)
                    for _ in range(self.args.killed_writers)]
        if self.groups:
            threads.append(threading.Thread(target=self.committer, args=(stop,), daemon=True))
        for t in threads:
            t.start()
        self._stop_event = stop
        return threads

    def end_traffic(self, threads: list[threading.Thread]) -> None:
        self._stop_event.set()
        for t in threads:
            t.join(timeout=60)
            if t.is_alive():
                self.totals.fail(f"thread {t.name} still blocked 60 s after the traffic stopped")

    # ------------------------------------------------------------------ checks

    def damage(self) -> bool:
        """Self-test of the checks: cut p/0's newest acknowledged record off its segment behind logfs' back.

        Returns False when nothing is acknowledged yet (try again after the next crash).
        """
        part = self.parts["p/0"]
        if not part.acked:
            return False
        target = max(part.acked)
        pdir = self.data / "p-0"
        bases = sorted(int(n[:-4]) for n in os.listdir(pdir) if n.endswith(".log") and n[:-4].isdigit())
        base = max(b for b in bases if b <= target)
        path = pdir / f"{base:020d}.log"
        data = path.read_bytes()
        position = 0
        while position + 61 <= len(data):
            first = int.from_bytes(data[position:position + 8], "big")
            size = 12 + int.from_bytes(data[position + 8:position + 12], "big")
            last = first + int.from_bytes(data[position + 23:position + 27], "big")
            if first <= target <= last:
                os.truncate(path, position)
                self.totals.faults["damage-truncated-segment"] += 1
                return True
            position += size
        return False

    # ------------------------------------------------------------------ the run

    def run(self) -> int:
        args = self.args
        deadline = time.monotonic() + args.duration if args.duration else None
        if args.tiered:
            self.start_store()
        self.start()
        self.create_topics()
        self.check_views()
        cycle = 0
        while True:
            cycle += 1
            if deadline is not None:
                if time.monotonic() >= deadline:
                    break
            elif cycle > args.cycles:
                break
            clean = cycle % args.clean_every == 0
            threads = self.traffic(args.cycle_seconds, cycle)
            time.sleep(self.rng.uniform(0.2, args.cycle_seconds))
            if args.new_topic_rate and not clean and self.rng.random() < args.new_topic_rate:
                fresh = self.new_topic(cycle)      # created and written to, then the crash
                if fresh is not None:
                    self.write_acked_batch(fresh)
            # --power-loss: the crash is a power loss (the layer drops what is not durable), or a kill -9
            lose = args.power_loss and self.rng.random() < args.power_loss_rate
            crash = "power-loss" if lose else "kill-9"
            if clean:
                self.end_traffic(threads)
                views = self.check_views()
                self.stop()
                self.totals.faults["clean-shutdown"] += 1
                self.check_disk(views)
                crash = "clean-shutdown"
            elif self.rng.random() < args.shutdown_kill_rate:
                # SIGTERM starts a clean shutdown (flush, checkpoints, marker); crash in the middle of it
                self.running.send_signal(signal.SIGTERM)
                time.sleep(self.rng.uniform(0.0, 0.3))
                self.crash(lose)
                crash += "-during-shutdown"
                self.totals.faults[crash] += 1
                self.end_traffic(threads)
            else:
                self.crash(lose)                    # in the middle of the traffic
                self.totals.faults[crash] += 1
                self.end_traffic(threads)
            if args.damage and not clean and not lose and not self.totals.faults["damage-truncated-segment"]:
                self.damage()                       # after a kill -9, in or out of a shutdown
            if args.tiered and not clean:
                self.note_crash_leftovers()
            elif args.tiered:
                self.check_store(live=False)        # after the clean shutdown: nothing may be left over
            if self.rng.random() < args.startup_kill_rate:
                # crash again during startup, i.e. during recovery of what the last crash left
                lose = args.power_loss and self.rng.random() < args.power_loss_rate
                crash = ("power-loss" if lose else "kill-9") + "-during-startup"
                if args.power_loss and self.layer is None:
                    self.start_layer()
                self._spawn()
                if lose and self.rng.random() < 0.5:
                    # right after it answered: what it did at startup must be durable by then
                    answer_by = time.monotonic() + 120
                    while not _is_mounted(self.mnt) and self.running.poll() is None and time.monotonic() < answer_by:
                        time.sleep(0.01)
                else:
                    time.sleep(self.rng.uniform(0.0, max(0.05, statistics.median(self.totals.recovery_s or [0.5]))))
                answered = _is_mounted(self.mnt)     # then it had taken its clean-shutdown marker
                self.crash(lose)
                self.totals.faults[crash] += 1
                if answered:
                    crash += "-after-it-answered"
            self.totals.recovery_s.append(self.start())
            self.totals.remounts[crash].append((self.totals.recovery_s[-1], self.last_load_ms,
                                                self.last_index_rebuilds, self.last_skipped_recovery))
            self.totals.context = f"cycle {cycle}, after {crash}"
            if (crash in ("power-loss", "kill-9") or crash.endswith("-after-it-answered")) \
                    and self.last_skipped_recovery:
                # the crashed mount had answered, so it had removed its clean-shutdown marker: it must not
                # come back (a power loss brings it back when its unlink was never made durable)
                self.totals.fail("the mount skipped recovery on a clean-shutdown marker that the crashed "
                                 "mount had removed")
            self.check_views()
            if args.tiered:
                self.check_store()
            self.totals.context = ""
            self.totals.cycles += 1
            if args.verbose:
                print(f"cycle {cycle}: acknowledged {self.totals.acknowledged}, lost {self.totals.lost}, "
                      f"recovery after {crash} {self.totals.recovery_s[-1]:.2f}s "
                      f"(load {self.last_load_ms} ms)", flush=True)
        views = self.check_views()
        self.stop()
        self.totals.faults["clean-shutdown"] += 1
        self.check_disk(views)
        if args.tiered:
            self.check_store(live=False)
        self.stop_layer()
        return self.report()

    def _background_work(self) -> dict[str, Any]:     # Any: counts, and the tiered ones by name
        """What retention and the cleaner did meanwhile, counted from the mounts' log lines."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return {}
        return {"compactions": text.count("Swapping in cleaned segment"),
                "retention_deletions": text.count("Found deletable segments"),
                "recoveries_of_unflushed_segments": text.count("Recovering unflushed segment"),
                "corrupted_index_rebuilds": text.count("Found a corrupted index file"),
                "killed_writers_lines_dropped": text.count("Dropped the unterminated last line"),
                **({"tiered": {
                    "copies": text.count("Copied log segment"),
                    "local_deletions_of_copied_segments": text.count("Deleting local segments with base offsets"),
                    "log_start_moves_over_remote_segments": text.count("Moving the log start offset to"),
                    "remote_deletions_below_log_start": sum(
                        int(n) for n in re.findall(r"Deleted (\d+) remote log segments of .* below its log start",
                                                   text)),
                    "unfinished_copies_deleted_after_crash": text.count("(left by a crash or a failed copy)"),
                    "orphans_deleted_after_crash": text.count("Deleted orphaned remote log segment"),
                }} if self.args.tiered else {})}

    def _layer_figures(self) -> dict[str, int]:
        """What the power losses dropped, summed from the layer's log lines."""
        try:
            text = self.layer_log.read_text(errors="replace")
        except OSError:
            return {}
        totals: collections.Counter[str] = collections.Counter()
        for line in re.findall(r"power loss: (.*)", text):
            for part in line.split(", "):
                name, _, value = part.rpartition(" ")
                if value.isdigit():
                    totals[name] += int(value)
        return dict(totals)

    def report(self) -> int:
        t = self.totals
        rec = sorted(t.recovery_s) or [0.0]
        summary = {
            "cycles": t.cycles, "acknowledged": t.acknowledged, "lost": t.lost, "duplicated": t.duplicated,
            "misplaced": t.misplaced, "partial_batches": t.partial_batches, "torn_records": self.torn_records,
            "split_write_prefixes": t.split_prefixes, "start_went_back": t.start_went_back,
            "retention_undone_by_power_loss": t.retention_undone_by_power_loss,
            "recovered_unflushed_dropped": t.recovered_unflushed_dropped,
            "reader_errors": t.reader_errors, "follower_errors": t.follower_errors, "disk_errors": t.disk_errors,
            "check_problems": t.check_problems, "retained_or_deleted": t.retained,
            "group_commits_fsynced": t.commits_synced, "group_commits_lost": t.commits_lost,
            "unacknowledged_batches_present": t.unacked_present, "unacknowledged_batches_absent": t.unacked_absent,
            "recovery_median_s": round(statistics.median(rec), 3), "recovery_max_s": round(rec[-1], 3),
            "faults": dict(sorted(t.faults.items())), "peak_rss_mib": round(t.peak_rss_kb / 1024, 1),
            "remount_after": {kind: {"count": len(runs),
                                     "median_s": round(statistics.median(r[0] for r in runs), 3),
                                     "max_s": round(max(r[0] for r in runs), 3),
                                     "load_median_ms": statistics.median(r[1] for r in runs),
                                     "load_max_ms": max(r[1] for r in runs),
                                     "corrupted_index_rebuilds": sum(r[2] for r in runs),
                                     "recovery_skipped_on_marker": sum(r[3] for r in runs)}
                              for kind, runs in sorted(t.remounts.items())},
            **({"dropped_at_power_losses": self._layer_figures()} if self.args.power_loss else {}),
            **({"store": self.args.store, "read_from_store": t.read_from_store, "store_checks": t.store_checks,
                "store_orphans": t.store_orphans, "store_missing": t.store_missing,
                "crash_leftovers": dict(sorted(t.crash_leftovers.items()))} if self.args.tiered else {}),
            **self._background_work(),
            "failures": t.failures,
        }
        if self.args.json:
            print(json.dumps(summary, indent=1))
        else:
            for name, value in summary.items():
                if name != "failures":
                    print(f"{name}: {value}")
            for failure in t.failures:
                print(f"failure: {failure}")
        bad = (t.lost or t.commits_lost or t.duplicated or t.misplaced or t.partial_batches or self.torn_records
               or t.start_went_back or t.store_orphans or t.store_missing
               or t.reader_errors or t.follower_errors or t.disk_errors or t.check_problems or t.failures)
        return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    # A shell without job control starts `cmd &` with SIGINT ignored, and an ignored signal stays ignored
    # across exec: the killed writers would survive their SIGINT and end normally later, storing their
    # unterminated line as the record a writer ending normally stores (not a torn record of logfs's).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=12, help="crash cycles (default 12; ignored with --duration)")
    parser.add_argument("--duration", type=float, default=0, help="run for this many seconds instead")
    parser.add_argument("--cycle-seconds", type=float, default=1.5, help="longest traffic phase of a cycle")
    parser.add_argument("--writers", type=int, default=None,
                        help="writer threads, one partition each in turn (default 4, or one per partition)")
    parser.add_argument("--followers", type=int, default=2)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--killed-writers", type=int, default=1,
                        help="processes writing to topic k that are killed mid-line (SIGINT, SIGKILL), in turn")
    parser.add_argument("--clean-every", type=int, default=4, help="every N-th cycle ends in a clean shutdown")
    parser.add_argument("--startup-kill-rate", type=float, default=0.3,
                        help="probability of a second crash during the next startup")
    parser.add_argument("--shutdown-kill-rate", type=float, default=0.2,
                        help="probability that a crash cycle crashes during a clean shutdown instead")
    parser.add_argument("--power-loss", action="store_true",
                        help="run over tests/harness/powerloss_fs.py: crashes are power losses (un-fsynced writes "
                             "and directory entries dropped)")
    parser.add_argument("--power-loss-rate", type=float, default=1.0,
                        help="with --power-loss: the share of crashes that are power losses, the rest kill -9 "
                             "(default 1)")
    parser.add_argument("--checkpoint-ms", type=int, default=60000,
                        help="with --power-loss: the checkpoint intervals (default 60000, Kafka's)")
    parser.add_argument("--torn-writes", action="store_true",
                        help="with --power-loss: a random half of the dirty pages is written at each power loss")
    parser.add_argument("--lying-fsync", action="store_true",
                        help="with --power-loss, self-test: fsync makes nothing durable; the run must report "
                             "lost records")
    parser.add_argument("--new-topic-rate", type=float, default=None,
                        help="probability that a crash cycle creates a topic and acknowledges a batch in it just "
                             "before the crash (default 0.5 with --power-loss, else 0)")
    parser.add_argument("--bootstrap-server", default=None,
                        help="torture a cluster mount of this Kafka cluster (it must not have topics p, r, c): "
                             "the data dir is the mount's local replica")
    parser.add_argument("--cluster", action="store_true",
                        help="start a 3-node KRaft cluster in the work dir (devtools/kafka.py, the jars of "
                             "scripts/setup-kafka.sh) and torture a cluster mount of it")
    parser.add_argument("--fd-limit", type=int, default=None,
                        help="the mount's ulimit -n (its segment files then live under a budget of 3/4 of it)")
    parser.add_argument("--tiered", action="store_true",
                        help="tiered storage on (docs/tiering.md): p and r copied to a store and trimmed locally, "
                             "plus topic t copied and never trimmed by retention; the store is checked against "
                             "the metadata log after every remount")
    parser.add_argument("--store", choices=("file", "seaweedfs"), default="file",
                        help="with --tiered: a file:// directory in the work dir (default), or a SeaweedFS "
                             "`weed mini` started in the work dir (S3 on loopback)")
    parser.add_argument("--copy-interval-ms", type=int, default=200,
                        help="with --tiered: remote.log.manager.task.interval.ms (default 200)")
    parser.add_argument("--segment-bytes", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--work-dir", help="mount point and log live here (default: a new temp dir)")
    parser.add_argument("--data-dir", help="data dir (default: <work dir>/data)")
    parser.add_argument("--keep", action="store_true", help="keep the work dir afterwards")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--damage", action="store_true",
                        help="self-test: truncate acknowledged records off a segment after the first crash; "
                             "the run must then report them lost")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    if args.new_topic_rate is None:
        args.new_topic_rate = 0.5 if args.power_loss else 0.0
    if args.tiered and (args.cluster or args.bootstrap_server):
        parser.error("--tiered: a cluster mount refuses tiered storage (docs/tiering.md)")
    if args.damage and (args.cluster or args.bootstrap_server):
        parser.error("--damage cuts the embedded data dir; a cluster mount's replica would fetch it back")
    print(f"seed: {args.seed}", flush=True)
    torture = Torture(args)
    cluster = None
    try:
        if args.cluster:
            sys.path.insert(0, str(ROOT))
            from tests.kafka_cluster import KafkaCluster
            cluster = KafkaCluster(torture.work / "kafka").start()
            torture.bootstrap = args.bootstrap_server = cluster.bootstrap
            torture.topics = CLUSTER_TOPICS
        return torture.run()
    except Exception as exc:
        import traceback
        traceback.print_exc()
        print(f"torture aborted: {exc!r}; mount log: {torture.log_path}", file=sys.stderr)
        return 2
    finally:
        if torture.proc is not None:
            torture.kill()
        if cluster is not None:
            cluster.stop()
        torture.stop_store()
        if torture.layer is not None:
            torture.layer.kill()
            torture.layer.wait()
            subprocess.run(["fusermount3", "-uz", str(torture.data)], capture_output=True)
        if not args.keep and not args.work_dir:
            shutil.rmtree(torture.work, ignore_errors=True)
        elif args.keep:
            print(f"work dir: {torture.work}")


if __name__ == "__main__":
    sys.exit(main())
