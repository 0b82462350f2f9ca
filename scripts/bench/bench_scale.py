#!/usr/bin/env python3
"""Big data dirs (issue 19): each row of the issue's table beside its goal.

Cases (each builds its data dir with the engine, shuts it down cleanly, then
measures through a real mount, ``logfs mount``, started as a subprocess):

* ``first-tail``: a partition of ``--gb`` GB (default 10) in segments of
  ``--segment-mb`` MB; time of the first ``tail -c 100 t/0/records`` after a
  mount (goal <= 0.3 s at any size), and the same for ``records.jsonl``.
* ``segments``: ``--segments`` segments (default 100,000) across
  ``--partitions`` partitions (default 10,000); the mount runs under
  ``ulimit -n --fd-limit`` (default 20,000), reads the last line of every
  partition's ``records`` and appends to each (goal: it runs, and every read
  and append is correct).
* ``rss``: ``--rss-gb`` GB (default 3) in 4 partitions; the mount's RSS after
  mounting and after reading every view to its end, per GB stored (goal
  <= 10 MB/GB, flat after the reads).

Scaled down for a quick run on a shared machine::

    .venv/bin/python scripts/bench/bench_scale.py first-tail --gb 1 --segment-mb 100
    .venv/bin/python scripts/bench/bench_scale.py segments --segments 5000 --partitions 500 --fd-limit 1000
    .venv/bin/python scripts/bench/bench_scale.py rss --rss-gb 0.5

``--tree DIR`` runs the mount from another checkout (before/after figures).

The issue's other rows come from their own scripts, run and summed up here on
request: ``cleaner`` (``bench_cleaner.py kafka``, 23.5 MB and 118 MB, needs
``scripts/setup-kafka.sh``), ``append`` (``bench_mount.py --mb 200``) and
``mixed`` (``bench_views.py --mixed``)::

    .venv/bin/python scripts/bench/bench_scale.py cleaner append mixed
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import wait_mounted  # noqa: E402

PYTHON = ROOT / ".venv" / "bin" / "python"
VALUE = 100          # bytes per value (the text line is VALUE + 1)
BATCH = 2000         # values per append


def _engine(tree: Path):
    sys.path.insert(0, str(tree))
    from engine.clock import ManualClock  # noqa: F401  (import check)
    from engine.config import BrokerConfig
    from engine.manager import LogManager
    return BrokerConfig, LogManager


def build(data: Path, tree: Path, partitions: int, bytes_per_partition: int, segment_bytes: int,
          topic: str = "t", batch: int = BATCH) -> int:
    """Fill ``partitions`` partitions of ``topic`` with 100-byte values; returns records per partition."""
    BrokerConfig, LogManager = _engine(tree)
    from engine.topic import TopicPartition
    manager = LogManager(BrokerConfig.from_props({"log.dirs": str(data), "log.retention.ms": "-1",
                                                  "log.retention.bytes": "-1"}))
    manager.startup()
    # below Kafka 4's 1 MiB minimum of segment.bytes: the internal setting for tests
    name = "segment.bytes" if segment_bytes >= 1 << 20 else "internal.segment.bytes"
    manager.create_topic(topic, partitions, {name: str(segment_bytes)})
    batch_values = [b"%011d " % i + b"x" * (VALUE - 12) for i in range(BATCH)]
    per_record = VALUE + 10        # on-disk bytes per record, roughly
    records = max(1, bytes_per_partition // per_record)
    try:
        from engine.views import attach  # appends through the mount keep the view indexes exact
    except ImportError:                     # pragma: no cover - an older tree
        attach = None
    for p in range(partitions):
        log = manager.get_log(TopicPartition(topic, p))
        if attach is not None:
            attach(log)
        done = 0
        while done < records:
            n = min(batch, records - done)
            log.append_values(batch_values[:n])
            done += n
    manager.shutdown()
    return records


class Mount:
    def __init__(self, base: Path, data: Path, tree: Path, fd_limit: int | None = None) -> None:
        self.mnt = base / "mnt"
        self.mnt.mkdir(exist_ok=True)
        self.log_path = base / "logfs.log"
        env = dict(os.environ, PYTHONPATH=str(tree))
        limit = None
        if fd_limit is not None:
            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
        self._log = open(self.log_path, "ab")
        start = time.perf_counter()
        self.proc = subprocess.Popen([str(PYTHON), "-m", "logfs", "mount", str(self.mnt), "--data-dir", str(data)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, preexec_fn=limit,
                                     cwd=str(tree))
        wait_mounted(self.mnt, self.proc, self.log_path, 600, interval=0.02)
        self.mount_seconds = time.perf_counter() - start

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def close(self) -> None:
        subprocess.run(["fusermount3", "-u", str(self.mnt)])
        self.proc.wait(timeout=300)
        self._log.close()


def _timed(cmd: list[str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    return time.perf_counter() - start, out


def case_first_tail(args, base: Path, tree: Path) -> list[tuple[str, str, str]]:
    data = base / "data"
    segment_bytes = args.segment_mb << 20
    start = time.perf_counter()
    records = build(data, tree, 1, int(args.gb * 1e9), segment_bytes)
    stored = sum(f.stat().st_size for f in (data / "t-0").glob("*.log"))
    segments = len(list((data / "t-0").glob("*.log")))
    print(f"built {records:,} records, {stored / 1e9:.2f} GB in {segments} segments in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    for round_ in ("first mount", "second mount", "view index files deleted"):
        if round_ == "view index files deleted":
            for f in (data / "t-0").glob("*.viewindex"):
                f.unlink()
        mount = Mount(base, data, tree)
        try:
            t_text, out = _timed(["tail", "-c", "100", str(mount.mnt / "t/0/records")])
            assert out.endswith(b"x\n"), out
            t_json, out = _timed(["tail", "-c", "100", str(mount.mnt / "t/0/records.jsonl")])
            assert out.endswith(b"}\n"), out
        finally:
            mount.close()
        rows.append((f"first `tail -c 100 records` after a mount ({round_}), {stored / 1e9:.2f} GB",
                     f"{t_text:.3f} s", "<= 0.3 s"))
        rows.append((f"first `tail -c 100 records.jsonl` after a mount ({round_})", f"{t_json:.3f} s",
                     "<= 0.3 s"))
        rows.append((f"mount start ({round_})", f"{mount.mount_seconds:.2f} s", ""))
    return rows


def case_segments(args, base: Path, tree: Path) -> list[tuple[str, str, str]]:
    data = base / "data"
    per_partition = max(1, args.segments // args.partitions)
    segment_bytes = 4096
    start = time.perf_counter()
    # each segment holds about one batch: the log rolls before an append that would exceed segment.bytes
    build(data, tree, args.partitions, per_partition * 3300, segment_bytes, batch=30)
    segments = sum(1 for _ in data.glob("t-*/*.log"))
    print(f"built {segments:,} segments in {args.partitions:,} partitions in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    mount = Mount(base, data, tree, fd_limit=args.fd_limit)
    try:
        rows.append((f"mount {segments:,} segments under ulimit -n {args.fd_limit:,}",
                     f"{mount.mount_seconds:.1f} s, {mount.fds():,} fds open", "runs"))
        start = time.perf_counter()
        bad = 0
        for p in range(args.partitions):
            out = subprocess.run(["tail", "-c", "101", str(mount.mnt / f"t/{p}/records")],
                                 capture_output=True).stdout
            bad += not out.endswith(b"x\n")
        rows.append(("read the last line of every partition", f"{time.perf_counter() - start:.1f} s, "
                     f"{bad} failed, {mount.fds():,} fds open", "0 failed"))
        start = time.perf_counter()
        failed = 0
        for p in range(args.partitions):
            try:
                with open(mount.mnt / f"t/{p}/append", "ab") as f:
                    f.write(b"y" * 3000 + b"\n")
            except OSError:
                failed += 1
        rows.append(("append (and roll) in every partition", f"{time.perf_counter() - start:.1f} s, "
                     f"{failed} failed, {mount.fds():,} fds open", "0 failed"))
    finally:
        mount.close()
    return rows


def case_rss(args, base: Path, tree: Path) -> list[tuple[str, str, str]]:
    data = base / "data"
    partitions = 4
    build(data, tree, partitions, int(args.rss_gb * 1e9 / partitions), 256 << 20)
    stored = sum(f.stat().st_size for f in data.glob("t-*/*.log")) / 1e9
    # the process's own size (Python, pyfuse3, trio) on an empty data dir: what storing adds is above it
    empty = base / "empty"
    empty.mkdir(exist_ok=True)
    mount = Mount(base, empty, tree)
    try:
        baseline = mount.rss_mb()
    finally:
        mount.close()
    mount = Mount(base, data, tree)
    rows = [("RSS of a mount of an empty data dir", f"{baseline:.0f} MB", "")]

    def row(what: str, goal: str) -> None:
        rss = mount.rss_mb()
        rows.append((what, f"{(rss - baseline) / stored:.1f} MB/GB above it ({rss:.0f} MB)", goal))
    try:
        row(f"RSS after mounting {stored:.2f} GB", "<= 10 MB/GB")
        for name in ("records", "records.jsonl"):
            for p in range(partitions):
                subprocess.run(["bash", "-c", f"cat {mount.mnt}/t/{p}/{name} > /dev/null"], check=True)
            row(f"RSS after reading every partition's {name}", "<= 10 MB/GB, flat")
    finally:
        mount.close()
    return rows


def _script(args: list[str]) -> str:
    """The output of one of the other benchmark scripts (run from this checkout's venv)."""
    result = subprocess.run([str(PYTHON), *args], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result.stdout


def case_cleaner(args, base: Path, tree: Path) -> list[tuple[str, str, str]]:
    rows = []
    for records, keys in ((200_000, 10_000), (1_000_000, 50_000)):
        out = _script(["scripts/bench/bench_cleaner.py", "kafka", "--records", str(records), "--keys", str(keys)])
        figures = ast.literal_eval(out.strip().splitlines()[-1])
        ours, kafka = figures["logfs_mb_per_sec"], figures["kafka_mb_per_sec"]
        rows.append((f"log cleaner, {figures['dirty_mb']:.0f} MB: logfs beside Kafka's own, same segments",
                     f"{ours:.1f} vs {kafka:.1f} MB/s ({ours / kafka:.2f}x)", ">= Kafka's"))
    return rows


def case_append(args, base: Path, tree: Path) -> list[tuple[str, str, str]]:
    out = _script(["scripts/bench/bench_mount.py", "--mb", "200", "--skip-jsonl"])
    ratio = re.search(r"cp\+sync / cat >> append: ([0-9.]+)", out)
    assert ratio is not None, out
    return [("cp+sync / cat file >> append, 200 MB (steady state)", ratio.group(1), ">= 0.25")]


def case_mixed(args, base: Path, tree: Path) -> list[tuple[str, str, str]]:
    out = _script(["scripts/bench/bench_views.py", "--mixed", "--records", "200000", "--batch", "1000",
                   "--repeat", "2"])
    rows = []
    for path in ("append", "text", "jsonl"):
        line = re.search(rf"^{path}\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", out, re.MULTILINE)
        assert line is not None, out
        rows.append((f"mixed 40-200 B / uniform 100 B, CPU per byte: {path}", line.group(3), "<= 1.5"))
    return rows


CASES = {"first-tail": case_first_tail, "segments": case_segments, "rss": case_rss}
#: the rows measured by the other benchmark scripts, run on request (the cleaner's needs Kafka's jars)
OTHER_CASES = {"cleaner": case_cleaner, "append": case_append, "mixed": case_mixed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=list(CASES), choices=[*CASES, *OTHER_CASES, []])
    parser.add_argument("--gb", type=float, default=10.0, help="first-tail: GB in the partition")
    parser.add_argument("--segment-mb", type=int, default=1024, help="first-tail: segment.bytes in MB")
    parser.add_argument("--segments", type=int, default=100_000, help="segments: how many")
    parser.add_argument("--partitions", type=int, default=10_000, help="segments: across how many partitions")
    parser.add_argument("--fd-limit", type=int, default=20_000, help="segments: the mount's ulimit -n")
    parser.add_argument("--rss-gb", type=float, default=3.0, help="rss: GB stored")
    parser.add_argument("--tree", default=str(ROOT), help="checkout whose engine and mount run")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tree = Path(args.tree).resolve()
    rows: list[tuple[str, str, str]] = []
    for case in args.cases:
        base = Path(args.dir) / case if args.dir else Path(tempfile.mkdtemp(prefix=f"logfs-scale-{case}-"))
        base.mkdir(parents=True, exist_ok=True)
        try:
            rows += {**CASES, **OTHER_CASES}[case](args, base, tree)
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
    print(f"\ntree {tree}, cpus={os.cpu_count()}")
    print(f"{'measured':70} {'now':38} goal")
    for name, value, goal in rows:
        print(f"{name:70} {value:38} {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
