#!/usr/bin/env python3
"""The cost of opening a file of the mount: per-line shell appends and ``stat``.

What a shell script or a per-line writer pays (issue 16): each
``echo $i >> t/0/append`` walks the path, opens, writes and closes, and each
``stat`` walks the path; the kernel caches the stable names and attributes
(``STABLE_TIMEOUT_S`` in logfs/nodes.py), so those reach the mount only for
the open, write, flush and release.  Printed beside the same operations on
the data directory's own filesystem.

    .venv/bin/python scripts/bench/bench_open.py [--lines 5000] [--stats 20000] [--keep] [--floor]

``--floor`` adds the same rows for ``fuse_floor.py``'s ``append``: a pyfuse3
file system whose open, write, flush and release do nothing, the least a
pyfuse3 mount's request costs on this machine.

Goals: the shell loop at 2,000 lines/s or more, ``stat`` of ``append`` at
0.1 ms or less.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import add_work_dir_options, wait_mounted, work_dir  # noqa: E402

PYTHON = ROOT / ".venv" / "bin" / "python"


def _shell_loop(directory: Path, lines: int) -> float:
    """Seconds for ``for i in 1..lines; do echo $i >> DIR/append; done`` in one bash."""
    script = f"for ((i = 0; i < {lines}; i++)); do echo $i >> {directory}/append; done"
    start = time.perf_counter()
    subprocess.run(["bash", "-c", script], check=True)
    return time.perf_counter() - start


def _stats(path: Path, count: int) -> float:
    """Mean seconds of one ``os.stat(path)`` (a path walk and a getattr)."""
    start = time.perf_counter()
    for _ in range(count):
        os.stat(path)
    return (time.perf_counter() - start) / count


def _open_close(path: Path, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    return (time.perf_counter() - start) / count


def _serve(command: list[str], mnt: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start ``command`` (a FUSE server of ``mnt``), output to ``log``, and wait until ``mnt`` is mounted."""
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    wait_mounted(mnt, proc, log, 30, f"mount of {mnt}")
    return proc


def _rows(name: str, where: Path, args: argparse.Namespace) -> list[tuple[str, str]]:
    """The shell loop, ``stat`` and open + close of ``where/append``, as table rows."""
    seconds = _shell_loop(where, args.lines)
    return [(f"{name}: echo $i >> append, {args.lines} times", f"{args.lines / seconds:,.0f} lines/s"),
            (f"{name}: stat append", f"{_stats(where / 'append', args.stats) * 1e3:.4f} ms"),
            (f"{name}: open + close append", f"{_open_close(where / 'append', 2000) * 1e3:.4f} ms")]


def _floor_rows(base: Path, env: dict[str, str], args: argparse.Namespace) -> list[tuple[str, str]]:
    """:func:`_rows` of ``fuse_floor.py``'s ``append`` (writes taken and dropped)."""
    mnt, source = base / "floor-mnt", base / "floor-source"
    mnt.mkdir()
    source.write_bytes(b"\n")
    proc = _serve([str(PYTHON), str(Path(__file__).with_name("fuse_floor.py")), str(mnt), str(source)], mnt,
                  base / "floor.log", env)
    try:
        return _rows("pyfuse3 floor", mnt, args)
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)])
        proc.wait(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=5000, help="lines the shell loop appends")
    parser.add_argument("--stats", type=int, default=20000, help="stat calls measured")
    add_work_dir_options(parser)
    parser.add_argument("--floor", action="store_true",
                        help="also time scripts/bench/fuse_floor.py's append (a pyfuse3 mount doing nothing)")
    args = parser.parse_args()

    with work_dir(args, "logfs-bench-open-") as base:
        mnt, data, disk = base / "mnt", base / "data", base / "disk"
        for d in (mnt, data, disk):
            d.mkdir(parents=True, exist_ok=True)
        (disk / "append").touch()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}     # this checkout's logfs, whatever the venv has installed
        proc = _serve([str(PYTHON), "-m", "logfs", "mount", str(mnt), "--data-dir", str(data)], mnt,
                      base / "logfs.log", env)
        try:
            os.mkdir(mnt / "t")
            target = mnt / "t" / "0"
            rows = _rows("disk", disk, args) + _rows("mount", target, args)
            appended = int(subprocess.run(["bash", "-c", f"wc -l < {target}/records"], capture_output=True,
                                          check=True).stdout)
            assert appended == args.lines, (appended, args.lines)
            if args.floor:
                rows += _floor_rows(base, env, args)
            print(f"\ncpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
            print(f"{'operation':44} {'figure':>18}")
            for name, figure in rows:
                print(f"{name:44} {figure:>18}")
            print("(goals: the mount's shell loop >= 2,000 lines/s, its stat <= 0.1 ms)")
        finally:
            subprocess.run(["fusermount3", "-u", str(mnt)])
            proc.wait(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
