#!/usr/bin/env python3
"""Outage rounds: every broker of a cluster mount's cluster killed for a minute, then back, again and again.

Starts a 3-node KRaft cluster (devtools/kafka.py) and a cluster mount of
it in a work dir, makes topic ``t`` and group ``g``, then repeats a round:

* readers keep reading ``t/config``, ``t/groups/g``, ``t/groups/`` and
  ``t/0/records`` (ETIMEDOUT while the cluster is away, as documented);
* admin calls go on: a group commit (``echo '0 N' > t/groups/g``), a
  DeleteRecords that deletes nothing (``before 0``), a config change;
* a write to ``t/0/append`` is in flight when every broker is killed
  (SIGKILL), and writes are tried throughout;
* after ``--down-seconds`` (60) the brokers start again; the round measures
  how long until a write succeeds, and keeps reading for ``--after-seconds``
  (30: the abort this guards against came 4 to 28 s after the return).

A round fails if the mount exits, a write does not succeed within 60 s of
the return, or the mount logs more than ``--max-log-lines`` lines at INFO or
above (or any traceback) during the round, the one line each of the load's
own successful changes (a commit, a config change) left out.  Prints one line per round
(``--json``: a summary object at the end); exits 1 if a round failed.

    .venv/bin/python tests/harness/outage_round.py --rounds 10
    .venv/bin/python tests/harness/outage_round.py --rounds 1 --down-seconds 20 --json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a write succeeds within this many seconds of the cluster's return
WRITE_BACK_WITHIN_S = 60.0
#: the log lines of the load's own successful changes (one per change, as on any day): not the outage's
OWN_CHANGES = re.compile(r"committed offsets .* on the cluster|Altered the config of topic|DeleteRecords before offset")


@dataclass
class Round:
    number: int
    alive: bool = True
    write_back_s: float | None = None
    log_lines: int = 0
    tracebacks: int = 0
    levels: dict[str, int] = field(default_factory=dict)
    reads: dict[str, int] = field(default_factory=dict)     # result -> count
    ok: bool = False


class Load:
    """The readers, admin calls and writes that run against the mount during a round."""

    def __init__(self, mnt: Path) -> None:
        self.mnt = mnt
        self.stop = threading.Event()
        self.results: dict[str, int] = {}
        self.lock = threading.Lock()
        self.writes_ok = 0
        self.commit = 0
        self.threads = [threading.Thread(target=self._reads, daemon=True),
                        threading.Thread(target=self._admin, daemon=True),
                        threading.Thread(target=self._writes, daemon=True)]

    def _sh(self, what: str, command: str, timeout: float = 120.0) -> bool:
        try:
            result = subprocess.run(["bash", "-c", command], cwd=self.mnt, capture_output=True, timeout=timeout)
            outcome = "ok" if result.returncode == 0 else (result.stderr.decode(errors="replace").strip()
                                                           .rsplit(":", 1)[-1].strip() or "failed")
        except subprocess.TimeoutExpired:
            outcome = "hung"
        except OSError as exc:      # the mount is gone (ENOTCONN): the round reports it
            outcome = exc.strerror or "failed"
        with self.lock:
            key = f"{what}: {outcome}"
            self.results[key] = self.results.get(key, 0) + 1
        return outcome == "ok"

    def _reads(self) -> None:
        while not self.stop.is_set():
            for what, command in (("config", "cat t/config"), ("group", "cat t/groups/g"),
                                  ("groups", "ls t/groups"), ("records", "tail -c 100 t/0/records")):
                self._sh(what, f"{command} > /dev/null")
            self.stop.wait(0.3)

    def _admin(self) -> None:
        while not self.stop.is_set():
            self.commit += 1
            self._sh("commit", f"echo '0 {self.commit % 3}' > t/groups/g")
            self._sh("delete", "echo 'before 0' > t/0/delete")
            self._sh("alter", f"echo 'retention.ms={86_400_000 + self.commit}' >> t/config")
            self.stop.wait(1.0)

    def _writes(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            if self._sh("write", f"echo line-{n} >> t/0/append"):
                self.writes_ok += 1
            self.stop.wait(0.5)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)


def write_once(mnt: Path, text: str) -> bool:
    return subprocess.run(["bash", "-c", f"echo {text} >> t/0/append"], cwd=mnt, capture_output=True,
                          timeout=120).returncode == 0


def log_figures(text: str) -> tuple[int, int, dict[str, int]]:
    """(lines at INFO or above, tracebacks, lines by level) of a slice of the mount's log, the lines of the
    load's own successful changes (OWN_CHANGES) left out."""
    levels: dict[str, int] = {}
    lines = 0
    for line in text.splitlines():
        if line.startswith("[") and "] " in line and not OWN_CHANGES.search(line):
            level = line.split("] ", 1)[1].split(" ", 1)[0]
            levels[level] = levels.get(level, 0) + 1
            if level in ("INFO", "WARNING", "ERROR", "CRITICAL"):
                lines += 1
    return lines, text.count("Traceback (most recent call last)"), levels


def prepare(cluster, mount) -> None:
    """Topic ``t`` with a record, and group ``g`` committed by a Kafka client (so the group coordinator is
    loaded before the first round, whatever the mount does on a fresh cluster)."""
    from confluent_kafka import Consumer, TopicPartition

    (mount.path / "t").mkdir()
    if not write_once(mount.path, "first"):
        raise RuntimeError(f"the first write failed:\n{mount.log_tail(3000)}")
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "g", "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                consumer.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def run_round(number: int, cluster, mount, args: argparse.Namespace) -> Round:
    result = Round(number)
    mark = len(mount.log())
    load = Load(mount.path)
    load.start()
    try:
        time.sleep(2.0)            # the load is under way (a fixed pace, not a condition: nothing is asserted)
        for node in cluster.nodes:
            node.kill()
        time.sleep(args.down_seconds)
        for node in cluster.nodes:
            node.start()
        cluster.wait_ready()
        back = time.monotonic()
        while time.monotonic() - back < WRITE_BACK_WITHIN_S + 30:
            if mount.proc.poll() is not None:
                break
            if write_once(mount.path, f"round-{number}-back"):
                result.write_back_s = round(time.monotonic() - back, 1)
                break
            time.sleep(0.5)
        end = time.monotonic() + args.after_seconds
        while time.monotonic() < end and mount.proc.poll() is None:
            time.sleep(0.5)
    finally:
        load.join()
    result.alive = mount.proc.poll() is None
    result.log_lines, result.tracebacks, result.levels = log_figures(mount.log()[mark:])
    result.reads = dict(sorted(load.results.items()))
    result.ok = (result.alive and result.write_back_s is not None and result.write_back_s <= WRITE_BACK_WITHIN_S
                 and result.log_lines <= args.max_log_lines and result.tracebacks == 0)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--down-seconds", type=float, default=60.0)
    parser.add_argument("--after-seconds", type=float, default=30.0)
    parser.add_argument("--max-log-lines", type=int, default=10,
                        help="lines at INFO or above the mount may log in one round")
    parser.add_argument("--work-dir", help="where the cluster and the mount live (default: a temporary dir)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.conftest import Mount
    from tests.kafka_cluster import KafkaCluster

    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="logfs-outage-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = KafkaCluster(work / "kafka")
    mount = None
    rounds: list[Round] = []
    try:
        cluster.start()
        mount = Mount(work / "mount", extra_args=["--bootstrap-server", cluster.bootstrap]).start(timeout=60)
        prepare(cluster, mount)
        for number in range(1, args.rounds + 1):
            r = run_round(number, cluster, mount, args)
            rounds.append(r)
            print(f"round {number}: {'ok' if r.ok else 'FAILED'} alive={r.alive} write_back_s={r.write_back_s} "
                  f"log_lines={r.log_lines} tracebacks={r.tracebacks} levels={r.levels}", flush=True)
            if not r.alive:
                print(mount.log_tail(4000), file=sys.stderr)
                break
    finally:
        if mount is not None and mount.proc is not None:
            try:
                mount.stop()
            except Exception:
                mount.kill()
        cluster.stop()
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"rounds": [asdict(r) for r in rounds], "failed": sum(not r.ok for r in rounds)}))
    return 0 if rounds and all(r.ok for r in rounds) and len(rounds) == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
