#!/usr/bin/env python3
"""Reads of a view beside reads of a plain file holding the same bytes, in one run.

Appends ``--mb`` MB of 100-byte lines to ``t/0``, copies ``records`` to a plain
file next to the data directory, then for each mode (``--modes``: the mount's
own default, through the page cache, and ``--no-page-cache``, direct I/O)
mounts the same data and times, side by side:

* ``cat records`` first read (the view's cached pages dropped with ``posix_fadvise``) and re-read;
* ``dd bs=4K`` and ``dd bs=1M`` of ``records`` (after a first read: the re-read state);

against ``cat`` / ``dd`` of the plain file (in the page cache, as the segment
files under the mount are), and the mount process's CPU seconds for a first
read.  Each figure is the best of ``--repeat`` runs (the machine may be
loaded: compare the ratios of one run).  Ratios: plain time / mount time for ``cat``
(1.0 = the plain file's speed), and ``dd bs=4K`` time / ``dd bs=1M`` time.
``--floor`` adds ``fuse_floor.py``'s rows: the same bytes from memory through
a pyfuse3 file system that does nothing else, the best any pyfuse3 mount
could do on this machine.

    .venv/bin/python scripts/bench/bench_reads.py [--mb 200] [--modes default,--no-page-cache] [--repeat 3] [--floor]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import wait_mounted  # noqa: E402

LOGFS = ROOT / ".venv" / "bin" / "logfs"
LINE = 100


def _timed(cmd: str) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _serve(command: list[str], mnt: Path, log: Path) -> subprocess.Popen:
    """Start ``command`` (a FUSE server of ``mnt``) with this checkout's code and wait until ``mnt`` is mounted."""
    out = open(log, "ab")
    # this checkout's code, not the one the shared venv's editable install points at
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    wait_mounted(mnt, proc, log, 60, f"{command[1]} of {mnt}")
    return proc


def _mount(mnt: Path, data: Path, extra: list[str], log: Path) -> subprocess.Popen:
    return _serve([str(LOGFS), "mount", str(mnt), "--data-dir", str(data), *extra], mnt, log)


def _floor(mnt: Path, source: Path, extra: list[str], log: Path) -> subprocess.Popen:
    """``fuse_floor.py`` serving ``source`` at ``mnt`` (see its docstring)."""
    return _serve([sys.executable, str(Path(__file__).with_name("fuse_floor.py")), str(mnt), str(source), *extra],
                  mnt, log)


def _umount(mnt: Path, proc: subprocess.Popen) -> None:
    subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
    proc.wait(timeout=120)


def _drop_cached(path: Path) -> None:
    """Drop the pages the kernel cached of ``path`` (the mount's for a view): the next read is a first read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _best(cmd: str, repeat: int, before: Path | None = None, cpu_of: int | None = None,
          cpu: list[float] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if before is not None:
            _drop_cached(before)
        spent = _cpu_s(cpu_of) if cpu_of is not None else 0.0
        times.append(_timed(cmd))
        if cpu_of is not None and cpu is not None:
            cpu.append(_cpu_s(cpu_of) - spent)
    return min(times)


def _measure(records: Path, plain: Path, repeat: int, pid: int) -> dict[str, float]:
    m: dict[str, float] = {}
    m["cat plain"] = _best(f"cat {plain} > /dev/null", repeat)
    cpu: list[float] = []
    m["cat first"] = _best(f"cat {records} > /dev/null", repeat, before=records, cpu_of=pid, cpu=cpu)
    m["cpu first"] = min(cpu)
    _timed(f"cat {records} > /dev/null")
    m["cat re-read"] = _best(f"cat {records} > /dev/null", repeat)
    m["dd 1M"] = _best(f"dd if={records} of=/dev/null bs=1M", repeat)
    m["dd 4K"] = _best(f"dd if={records} of=/dev/null bs=4K", repeat)
    m["dd plain 1M"] = _best(f"dd if={plain} of=/dev/null bs=1M", repeat)
    m["dd plain 4K"] = _best(f"dd if={plain} of=/dev/null bs=4K", repeat)
    return m


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="size of the partition in MB")
    parser.add_argument("--modes", default="default,--no-page-cache",
                        help="comma-separated mount argument sets to compare ('default' = no argument)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs of each command")
    parser.add_argument("--dir", default=None, help="work directory (default: a new temp dir in $TMPDIR)")
    parser.add_argument("--floor", action="store_true",
                        help="also mount scripts/bench/fuse_floor.py (the same bytes served from memory by a "
                             "pyfuse3 file system that does nothing else): what FUSE and pyfuse3 cost alone")
    args = parser.parse_args()

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="logfs-bench-reads-"))
    mnt, data = base / "mnt", base / "data"
    for d in (mnt, data):
        d.mkdir(parents=True, exist_ok=True)
    log = base / "logfs.log"
    src, plain = base / "input.txt", base / "records.plain"
    body = b"x" * (LINE - 1 - 12)
    chunk = b"".join(b"%011d " % i + body + b"\n" for i in range(10_000))
    with open(src, "wb") as f:
        for _ in range(args.mb * 1_000_000 // len(chunk)):
            f.write(chunk)
    try:
        proc = _mount(mnt, data, [], log)
        try:
            os.mkdir(mnt / "t")
            subprocess.run(["bash", "-c", f"cat {src} >> {mnt}/t/0/append"], check=True)
            shutil.copyfile(mnt / "t/0/records", plain)
        finally:
            _umount(mnt, proc)
        size_mb = plain.stat().st_size / 1e6
        results = []
        for mode in args.modes.split(","):
            extra = [] if mode == "default" else mode.split()
            proc = _mount(mnt, data, extra, log)
            try:
                results.append((mode, _measure(mnt / "t/0/records", plain, args.repeat, proc.pid)))
            finally:
                _umount(mnt, proc)
        if args.floor:
            for mode, extra in (("pyfuse3 floor", []), ("floor, direct", ["--direct-io"])):
                proc = _floor(mnt, plain, extra, log)
                try:
                    results.append((mode, _measure(mnt / "records", plain, args.repeat, proc.pid)))
                finally:
                    _umount(mnt, proc)
        print(f"\n`records` of {size_mb:.0f} MB; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
        print(f"{'mount mode':14} {'cat 1st':>8} {'re-read':>8} {'plain':>8} {'1st/pl':>7} {'re/pl':>7}"
              f" {'dd 4K':>7} {'dd 1M':>7} {'4K/1M':>6} {'plain 4K/1M':>12} {'CPU 1st':>8}")
        for mode, m in results:
            anchor = m["cat plain"]
            print(f"{mode:14} {m['cat first']:8.2f} {m['cat re-read']:8.2f} {anchor:8.3f}"
                  f" {anchor / m['cat first']:7.2f} {anchor / m['cat re-read']:7.2f}"
                  f" {m['dd 4K']:7.2f} {m['dd 1M']:7.2f} {m['dd 4K'] / m['dd 1M']:6.1f}"
                  f" {m['dd plain 4K'] / m['dd plain 1M']:12.1f} {m['cpu first']:8.2f}")
        print("(seconds; 1st/pl and re/pl = plain cat time / mount cat time, 1.0 = a plain file's speed;\n"
              " CPU 1st = the mount process's user + system seconds for a first cat, least of the runs:\n"
              " steadier than the times on a loaded machine)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
