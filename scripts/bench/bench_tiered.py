#!/usr/bin/env python3
"""Tiered storage against a real S3 server (issue 37): copy speed, the local bound, remote reads.

A SeaweedFS ``weed mini`` on loopback (devtools/seaweedfs.py) is the store.  One
embedded mount with ``remote.log.storage.system.enable=true`` (copy and
retention tasks every ``--interval-ms``) gets two topics of ``--segment-mb``
segments:

* ``tiered``: ``remote.storage.enable=true``, ``local.retention.bytes`` of
  ``--local-mb``;
* ``plain``: the same lines, no tiering (the local anchor).

``--mb`` megabytes of 100-byte lines are appended to each with ``cat FILE >>
TOPIC/0/append``, in 16 MiB writes.  Printed, side by side:

* **copy**: the appends' MB/s, and the copies' (the bytes of the closed
  segments over the seconds from the first write until the copy lag is 0);
* **local bound**: the peak of the partition's local ``.log`` bytes, sampled
  every 50 ms, against ``local.retention.bytes`` + 2 segments;
* **byte-identical**: ``records`` of both topics hashed against the source,
  ``records.jsonl`` lines counted;
* **first reads** on a new mount (the chunk cache starts empty): the bytes of
  ``tiered``'s ``records`` held only in the store, against the same bytes of
  ``plain``'s ``records`` (its local segments) and ``cat`` of the source file,
  best of ``--repeat`` fresh mounts each.

    .venv/bin/python scripts/bench/bench_tiered.py [--mb 2048] [--local-mb 100] [--segment-mb 16] [--rate 50]

With ``--rate`` the tiered topic is appended at that many MB/s (a producer
at the store's pace): appends never wait for the store (as in Kafka), so the
local bound holds while the copies keep up with the appends.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import add_work_dir_options, wait_mounted, work_dir  # noqa: E402
from devtools.seaweedfs import SeaweedFS  # noqa: E402

LOGFS = ROOT / ".venv" / "bin" / "logfs"
LINE = 100
READ = 1 << 20


def _source(path: Path, mb: int) -> int:
    """``mb`` MiB of distinct 100-byte lines in ``path``; its size."""
    count = (mb << 20) // LINE
    with open(path, "wb") as f:
        for start in range(0, count, 100_000):
            stop = min(count, start + 100_000)
            f.write(b"".join(b"%012d-%s\n" % (i, b"v" * (LINE - 14)) for i in range(start, stop)))
    return path.stat().st_size


class Mount:
    """One embedded logfs mount over ``data``, with the tiered settings."""

    def __init__(self, base: Path, data: Path, settings: dict[str, str], name: str) -> None:
        self.mnt = base / f"mnt-{name}"
        self.mnt.mkdir()
        self.log = base / f"logfs-{name}.log"
        options = [f"-o{k}={v}" for k, v in settings.items()]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([str(LOGFS), "mount", str(self.mnt), "--data-dir", str(data), *options],
                                         stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         env={**os.environ, "PYTHONPATH": str(ROOT)})
        wait_mounted(self.mnt, self.proc, self.log, 120)

    def sh(self, command: str) -> None:
        subprocess.run(["bash", "-c", command], cwd=self.mnt, check=True)

    def state(self, topic: str) -> dict[str, Any]:     # Any: the state file's JSON
        state: dict[str, Any] = json.loads((self.mnt / topic / "0" / "state").read_bytes())
        return state

    def stop(self) -> None:
        subprocess.run(["fusermount3", "-u", str(self.mnt)], check=False)
        self.proc.wait(timeout=600)


def _local_log_bytes(partition_dir: Path) -> int:
    total = 0
    for entry in os.scandir(partition_dir):
        if entry.name.endswith(".log"):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:
                pass                # deleted between the scan and the stat
    return total


def _read(path: Path, limit: int) -> tuple[float, bytes]:
    """Seconds to read the first ``limit`` bytes of ``path`` in 1 MiB reads, and their sha256."""
    digest = hashlib.sha256()
    started = time.perf_counter()
    left = limit
    with open(path, "rb", buffering=0) as f:
        while left > 0:
            chunk = f.read(min(READ, left))
            if not chunk:
                raise SystemExit(f"{path} ended {left} bytes before {limit}")
            digest.update(chunk)
            left -= len(chunk)
    return time.perf_counter() - started, digest.digest()


def _paced_append(source: Path, append: Path, mb_per_s: float) -> None:
    """``source`` appended in 16 MiB writes at no more than ``mb_per_s`` MB/s (a producer at that rate)."""
    block = 16 << 20
    started = time.perf_counter()
    done = 0
    with open(source, "rb") as src, open(append, "ab", buffering=0) as out:
        while chunk := src.read(block):
            out.write(chunk)
            done += len(chunk)
            ahead = started + done / (mb_per_s * 1e6) - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)       # pacing, not a wait for a condition


def _sha(path: Path, limit: int) -> bytes:
    return _read(path, limit)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=2048, help="MiB appended to each topic")
    parser.add_argument("--local-mb", type=int, default=100, help="local.retention.bytes of the tiered topic, MiB")
    parser.add_argument("--segment-mb", type=int, default=16)
    parser.add_argument("--interval-ms", type=int, default=1000, help="the copy and retention tasks' period")
    parser.add_argument("--repeat", type=int, default=2, help="fresh mounts per first read")
    parser.add_argument("--outage", type=float, default=0.0,
                        help="then kill the store for this many seconds while appends and reads run")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="append the tiered topic at this many MB/s (default: as fast as dd writes)")
    add_work_dir_options(parser)
    args = parser.parse_args()
    segment = args.segment_mb << 20
    with work_dir(args, "bench-tiered-") as base:
        store = SeaweedFS(base / "weed").start()
        data = base / "data"
        data.mkdir()
        settings = {"remote.log.storage.system.enable": "true", "log.initial.task.delay.ms": "0",
                    "remote.log.manager.task.interval.ms": str(args.interval_ms),
                    "log.retention.check.interval.ms": str(args.interval_ms), **store.settings(prefix="bench")}
        try:
            source = base / "source"
            size = _source(source, args.mb)
            mount = Mount(base, data, settings, "write")
            try:
                mount.sh(f"mkdir tiered plain && for t in tiered plain; do echo segment.bytes={segment} >> $t/config;"
                         f" done && echo remote.storage.enable=true >> tiered/config && "
                         f"echo local.retention.bytes={args.local_mb << 20} >> tiered/config")
                peak = [0]
                done = threading.Event()

                def sample() -> None:
                    partition = data / "tiered-0"
                    while not done.is_set():
                        if partition.exists():
                            peak[0] = max(peak[0], _local_log_bytes(partition))
                        time.sleep(0.05)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                started = time.perf_counter()
                if args.rate:
                    _paced_append(source, mount.mnt / "tiered" / "0" / "append", args.rate)
                else:
                    mount.sh(f"dd if={source} bs=16M status=none >> tiered/0/append")
                appended = time.perf_counter() - started
                while True:
                    state = mount.state("tiered")
                    remote = state["remote_storage"]
                    if remote["copy_lag_segments"] == 0 and remote["segments"] >= len(state["segments"]) - 1:
                        break
                    time.sleep(0.05)
                copied_s = time.perf_counter() - started
                copied_bytes = remote["size_bytes"]
                # local retention runs after the copies: wait for it to bring the partition within its bound
                bound = (args.local_mb << 20) + 2 * segment
                while _local_log_bytes(data / "tiered-0") > (args.local_mb << 20) + segment:
                    time.sleep(0.05)
                done.set()
                sampler.join()
                mount.sh(f"dd if={source} bs=16M status=none >> plain/0/append")
                state = mount.state("tiered")
                local_start = state["local_log_start_offset"]
                remote_bytes = local_start * LINE
                print(f"appended {size / 1e6:.0f} MB: {size / appended / 1e6:.0f} MB/s; copied "
                      f"{copied_bytes / 1e6:.0f} MB in {copied_s:.1f} s from the first write: "
                      f"{copied_bytes / copied_s / 1e6:.0f} MB/s; local .log peak {peak[0] / 2**20:.0f} MiB against "
                      f"{bound / 2**20:.0f} MiB (local.retention.bytes + 2 segments); {local_start} records "
                      f"({remote_bytes / 1e6:.0f} MB) only in the store", flush=True)
                want = _sha(source, size)
                for topic in ("tiered", "plain"):
                    got = _sha(mount.mnt / topic / "0" / "records", size)
                    if got != want:
                        raise SystemExit(f"{topic}/0/records differs from what was appended")
                    out = subprocess.run(["wc", "-l"], stdin=open(mount.mnt / topic / "0" / "records.jsonl", "rb"),
                                         capture_output=True, check=True).stdout
                    if int(out) != size // LINE:
                        raise SystemExit(f"{topic}/0/records.jsonl has {int(out)} rows, not {size // LINE}")
                print("records of both topics byte-identical to the source; records.jsonl every row", flush=True)
            finally:
                mount.stop()
            rows: dict[str, list[float]] = {"cat of the source file": [], "plain: records, local segments": [],
                                             "tiered: records, only in the store": []}
            for i in range(args.repeat):
                rows["cat of the source file"].append(_read(source, remote_bytes)[0])
                for topic, row in (("plain", "plain: records, local segments"),
                                   ("tiered", "tiered: records, only in the store")):
                    mount = Mount(base, data, settings, f"read-{topic}-{i}")
                    try:
                        seconds, digest = _read(mount.mnt / topic / "0" / "records", remote_bytes)
                        if digest != _sha(source, remote_bytes):
                            raise SystemExit(f"{topic}/0/records differs from the source")
                        rows[row].append(seconds)
                    finally:
                        mount.stop()
            print()
            print(f"| first read of {remote_bytes / 1e6:.0f} MB | best s | MB/s | of local |")
            print("|---|---|---|---|")
            local = min(rows["plain: records, local segments"])
            for name, times in rows.items():
                best = min(times)
                print(f"| {name} | {best:.2f} | {remote_bytes / best / 1e6:.0f} | {local / best:.2f} |")
            if args.outage:
                _outage(base, data, settings, store, source, size, args.outage)
        finally:
            store.stop()
    return 0


def _outage(base: Path, data: Path, settings: dict[str, str], store: SeaweedFS, source: Path, size: int,
            seconds: float) -> None:
    """The store killed (kill -9) for ``seconds`` while a writer appends to the tiered topic, a reader reads its
    local records and another its records only in the store; then the store back, the copies caught up, every
    record read back, and ``logfs check`` of the data dir against the store."""
    mount = Mount(base, data, settings, "outage")
    appended: list[bytes] = []
    local_reads, remote_reads = [0, 0], []          # local: [served, failed]; remote: (seconds, rc, stderr)
    stop = threading.Event()
    tiered = mount.mnt / "tiered" / "0"

    def writer() -> None:
        i = 0
        with open(tiered / "append", "ab", buffering=0) as out:
            while not stop.is_set():
                block = b"".join(b"outage-%09d-%s\n" % (n, b"w" * (LINE - 18)) for n in range(i, i + 1000))
                out.write(block)
                appended.append(block)
                i += 1000
                stop.wait(0.1)

    def local_reader() -> None:
        while not stop.is_set():
            done = subprocess.run(["bash", "-c", f"tail -c 1000000 {tiered / 'records'} | wc -l"],
                                  capture_output=True, timeout=60)
            local_reads[0 if done.returncode == 0 and int(done.stdout or 0) > 0 else 1] += 1
            stop.wait(1)

    def remote_reader() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            done = subprocess.run(["cat", str(tiered / "offset" / "5")], capture_output=True, timeout=120)
            remote_reads.append((time.perf_counter() - started, done.returncode, done.stderr.decode().strip()))
            stop.wait(2)

    try:
        store.kill()
        down = time.perf_counter()
        threads = [threading.Thread(target=t, daemon=True) for t in (writer, local_reader, remote_reader)]
        for t in threads:
            t.start()
        time.sleep(seconds)             # the outage lasts this long, whatever happens meanwhile
        stop.set()
        for t in threads:
            t.join()
        store.start()
        back = time.perf_counter()
        outage_s = back - down
        while True:                     # the copies resume: every closed segment copied again
            remote = mount.state("tiered")["remote_storage"]
            if remote["copy_lag_segments"] == 0:
                break
            time.sleep(0.2)
        resumed_s = time.perf_counter() - back
        extra = b"".join(appended)
        want = hashlib.sha256()
        want.update(source.read_bytes())
        want.update(extra)
        if _sha(tiered / "records", size + len(extra)) != want.digest():
            raise SystemExit("after the outage, tiered/0/records differs from what was appended")
        if (tiered / "records").stat().st_size != size + len(extra):
            raise SystemExit("after the outage, tiered/0/records holds more than what was appended")
    finally:
        mount.stop()
    args = [f"-o{k}={v}" for k, v in settings.items() if k.startswith("rsm.config.")]
    checked = subprocess.run([str(LOGFS), "check", str(data), *args], capture_output=True, text=True, timeout=600)
    failed = [r for r in remote_reads if r[1] != 0]
    print(f"\nstore killed for {outage_s:.0f} s: {len(extra) // LINE} records appended meanwhile "
          f"({len(extra) / outage_s / 1e6:.1f} MB/s), local reads {local_reads[0]} served / {local_reads[1]} failed, "
          f"remote reads {len(failed)} of {len(remote_reads)} failed, the slowest in "
          f"{max((r[0] for r in failed), default=0):.1f} s ({failed[0][2] if failed else '-'}); copies caught up "
          f"{resumed_s:.1f} s after the store returned; every record read back, none lost or repeated; "
          f"logfs check exit {checked.returncode}", flush=True)
    if checked.returncode != 0:
        print(checked.stdout[-3000:], checked.stderr[-3000:])


if __name__ == "__main__":
    sys.exit(main())
