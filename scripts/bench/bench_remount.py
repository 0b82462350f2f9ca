#!/usr/bin/env python3
"""Remount cost after a clean shutdown, a kill -9 and a power loss, as the log grows.

The data dir is the mount point of ``tests/harness/powerloss_fs.py`` (see there).  For
each size, a topic of ``--partitions`` partitions is filled to that many MB
(records fsynced), then the mount is stopped three ways in turn and remounted,
and the mount's own load time (its "loaded N logs ... in X ms" line) and the
index files it found corrupt are printed.  Kafka's counterpart: the broker's
log recovery time after an unclean shutdown; the issue asks that a power loss
cost what a kill -9 costs.

    .venv/bin/python scripts/bench/bench_remount.py --sizes 16 64
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOGFS = [sys.executable, "-m", "logfs"]
LAYER = [sys.executable, str(ROOT / "tests" / "harness" / "powerloss_fs.py")]


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


def _wait_mounted(path: Path, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not _mounted(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not mount")
        time.sleep(0.01)


class Bench:
    def __init__(self, work: Path, segment_bytes: int) -> None:
        self.work, self.backing, self.data, self.mnt = work, work / "backing", work / "data", work / "mnt"
        for d in (self.backing, self.data, self.mnt):
            d.mkdir(parents=True, exist_ok=True)
        self.log_path = work / "logfs.log"
        self.segment_bytes = segment_bytes
        self.layer: subprocess.Popen | None = None
        self.logfs: subprocess.Popen | None = None

    def start(self) -> tuple[int, int]:
        """Mount (the layer first if needed); the mount's load ms and the index files it rebuilt."""
        if self.layer is None:
            self.layer = subprocess.Popen([*LAYER, str(self.backing), str(self.data)],
                                          stdout=open(self.work / "layer.log", "ab"), stderr=subprocess.STDOUT)
            _wait_mounted(self.data, self.layer, "powerloss_fs")
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.logfs = subprocess.Popen([*LOGFS, "mount", str(self.mnt), "--data-dir", str(self.data),
                                       "-o", f"log.segment.bytes={self.segment_bytes}"],
                                      stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, env=env)
        _wait_mounted(self.mnt, self.logfs, "logfs")
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            text = f.read()
        load = re.findall(rb"loaded \d+ logs from .* in (\d+) ms", text)
        return int(load[-1]) if load else -1, text.count(b"Found a corrupted index file")

    def kill(self) -> None:
        assert self.logfs is not None
        self.logfs.kill()
        self.logfs.wait()
        self.logfs = None
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True)

    def power_loss(self) -> None:
        self.kill()
        assert self.layer is not None
        self.layer.send_signal(signal.SIGUSR1)
        self.layer.wait()
        self.layer = None

    def clean(self) -> None:
        while _mounted(self.mnt):
            if subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True).returncode:
                time.sleep(0.1)
        assert self.logfs is not None
        self.logfs.wait()
        self.logfs = None

    def fill(self, partitions: int, megabytes: int) -> None:
        """Append 256 KB batches of 1 KB records, each fsynced, until the topic grew by ``megabytes`` MB."""
        batch = b"".join(b"%08d" % i + b"x" * 1015 + b"\n" for i in range(256))       # 256 KB
        for p in range(partitions):
            fd = os.open(self.mnt / "t" / str(p) / "append", os.O_WRONLY)
            for _ in range(megabytes * 4 // partitions):
                os.write(fd, batch)
                os.fsync(fd)                  # as a producer with acks: every batch acknowledged
            os.close(fd)

    def stop(self) -> None:
        if self.logfs is not None:
            self.clean()
        if self.layer is not None:
            subprocess.run(["fusermount3", "-u", str(self.data)], capture_output=True)
            self.layer.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64], help="log sizes in MB (cumulative)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-bytes", type=int, default=1 << 20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="logfs-bench-remount-"))
    bench = Bench(work, args.segment_bytes)
    rows = []
    try:
        bench.start()
        (bench.mnt / "t").mkdir()
        for p in range(1, args.partitions):
            (bench.mnt / "t" / str(p)).mkdir()
        filled = 0
        for size in args.sizes:
            bench.fill(args.partitions, size - filled)
            filled = size
            for name, stop in (("clean shutdown", bench.clean), ("kill -9", bench.kill),
                               ("power loss", bench.power_loss)):
                stop()
                load_ms, rebuilt = bench.start()
                rows.append((size, name, load_ms, rebuilt))
    finally:
        bench.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'log MB':>7} | {'remount after':<15} | {'load ms':>8} | {'indexes rebuilt':>15}")
    print(f"{'-' * 7}-+-{'-' * 15}-+-{'-' * 8}-+-{'-' * 15}")
    for size, name, load_ms, rebuilt in rows:
        print(f"{size:>7} | {name:<15} | {load_ms:>8} | {rebuilt:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
