#!/usr/bin/env python3
"""The cost of a roll: appends to a topic whose every record fills a segment (issue 18).

Mounts logfs on a temporary data dir, sets ``internal.segment.bytes`` (tiny segments: below segment.bytes's 1 MiB
minimum) on a topic and
times, through the mount:

* ``seq N > t/0/append``        (one write of N lines: N segments)
* ``for i in ...; do echo $i > t/0/append; done``   (one write per record)

and prints a table of milliseconds per record.  The code that runs is the one
on ``PYTHONPATH`` (this checkout by default), so two checkouts compare as
``PYTHONPATH=/other/checkout .venv/bin/python scripts/bench/bench_tiny_segments.py``.

    .venv/bin/python scripts/bench/bench_tiny_segments.py [--records 500] [--segment-bytes 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOGFS = ROOT / ".venv" / "bin" / "logfs"


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


def _timed(cmd: str, cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], cwd=cwd, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--segment-bytes", type=int, default=100)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="logfs-roll-"))
    mnt, data = base / "mnt", base / "data"
    mnt.mkdir()
    data.mkdir()
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))}
    log = open(base / "logfs.log", "wb")
    proc = subprocess.Popen([str(LOGFS), "mount", str(mnt), "--data-dir", str(data)], stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while not _mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                print((base / "logfs.log").read_text(), file=sys.stderr)
                return 1
            time.sleep(0.05)
        n = args.records
        rows = []
        for name, cmd in (("one write (seq N > append)", f"seq {n} > t/0/append"),
                          ("one write per record", f"for i in $(seq {n}); do echo $i > t/0/append; done")):
            subprocess.run(["bash", "-c", "rmdir t 2>/dev/null; mkdir t && "
                            f"echo internal.segment.bytes={args.segment_bytes} > t/config"], cwd=mnt, check=True)
            seconds = _timed(cmd, mnt)
            segments = len(json.loads((mnt / "t/0/state").read_bytes())["segments"])
            rows.append((name, n, segments, seconds))
        print(f"code: {env['PYTHONPATH']}  internal.segment.bytes={args.segment_bytes}")
        print(f"{'workload':<28} {'records':>8} {'segments':>9} {'seconds':>8} {'ms/record':>10}")
        for name, records, segments, seconds in rows:
            print(f"{name:<28} {records:>8} {segments:>9} {seconds:>8.2f} {seconds * 1000 / records:>10.2f}")
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
