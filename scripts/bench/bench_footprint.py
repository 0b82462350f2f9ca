#!/usr/bin/env python3
"""A fresh mount's cold start and memory: what issue 26 asks of the record kernels.

One run, on a fresh mount of a new data directory:

* RSS of the idle mount (after ``mkdir`` of a topic);
* ``cat 100MB >> a0/0/append`` (the mount's first write) then the same file
  ``>> a1/0/append`` (and more with ``--appends``): the first / second time
  ratio (goal <= 1.3);
* RSS after those appends, then after a clean (a compacted topic of keyed
  lines over small segments, waited for in ``stats.json``);
* ``--cycles`` create / append / read / delete cycles of a topic, RSS after
  the first 10 and at the end (goal: <= 10 MB apart).

``--root`` runs another checkout's code with this venv (``PYTHONPATH``), to
compare two commits side by side in one session:

    .venv/bin/python scripts/bench/bench_footprint.py [--mb 100] [--cycles 300] [--root /path/to/checkout]
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

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import wait_mounted  # noqa: E402

LINE = 100   # bytes per line, newline included


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(cmd: str) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], check=True)
    return time.perf_counter() - start


def _stats(mnt: Path) -> dict:
    return orjson.loads((mnt / ".logfs/stats.json").read_bytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100, help="size of each timed append in MB")
    parser.add_argument("--cycles", type=int, default=300, help="create/append/read/delete cycles")
    parser.add_argument("--appends", type=int, default=2, help="timed appends of --mb, each to a new topic")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code the mount runs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="logfs-footprint-"))
    mnt, data = base / "mnt", base / "data"
    mnt.mkdir()
    data.mkdir()
    src = base / "input.txt"
    body = b"x" * (LINE - 1 - 12)
    chunk = b"".join(b"%011d " % i + body + b"\n" for i in range(10_000))
    with open(src, "wb") as f:
        for _ in range(args.mb * 1_000_000 // len(chunk)):
            f.write(chunk)
    keyed = base / "keyed.txt"          # 20 MB of key<TAB>value lines over 10,000 keys
    with open(keyed, "wb") as f:
        f.write(b"".join(b"k%05d\t" % (i % 10_000) + b"v" * 90 + b"\n" for i in range(200_000)))
    small = b"".join(b"line %06d\n" % i for i in range(2_000))
    os.sync()       # the inputs' writeback is not left to compete with the first timed append

    env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
    log_file = open(base / "logfs.log", "wb")
    proc = subprocess.Popen([str(ROOT / ".venv/bin/python"), "-m", "logfs", "mount", str(mnt), "--data-dir",
                             str(data), "-o", "log.cleaner.backoff.ms=200"],
                            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=base)   # not this checkout
    result: dict = {"root": str(args.root.resolve())}
    try:
        wait_mounted(mnt, proc, base / "logfs.log", 60)
        for i in range(args.appends):
            os.mkdir(mnt / f"a{i}")
        time.sleep(1)               # the mount's start settles (not timed: an idle figure)
        result["rss_idle_mb"] = _rss_mb(proc.pid)
        result["input_cat_s"] = round(_timed(f"cat {src} > /dev/null"), 3)     # the input read, for scale
        appends, cpu = [], []
        for i in range(args.appends):
            before = _cpu_s(proc.pid)
            appends.append(round(_timed(f"cat {src} >> {mnt}/a{i}/0/append"), 3))
            cpu.append(round(_cpu_s(proc.pid) - before, 2))
        result["append_s"] = appends
        result["first_over_second"] = appends[0] / appends[1]
        result["append_mount_cpu_s"] = cpu          # the mount's CPU seconds: less at the machine's mercy
        result["rss_after_appends_mb"] = _rss_mb(proc.pid)

        os.mkdir(mnt / "c")
        (mnt / "c/config").write_bytes(b"cleanup.policy=compact\nparse.key=true\nsegment.bytes=1048576\n")
        subprocess.run(["bash", "-c", f"cat {keyed} >> {mnt}/c/0/append"], check=True)
        deadline = time.monotonic() + 300
        while (_stats(mnt)["cleaner"] or {}).get("totals", {}).get("runs", 0) < 1:
            if time.monotonic() > deadline:
                raise SystemExit("no clean in 300 s")
            time.sleep(0.2)
        result["rss_after_clean_mb"] = _rss_mb(proc.pid)
        result["kernels"] = _stats(mnt).get("compiled_kernels")
        result["numba_mapped"] = "llvmlite" in Path(f"/proc/{proc.pid}/maps").read_text()
        result["engine_from"] = next((line.split()[-1] for line in Path(f"/proc/{proc.pid}/maps").read_text()
                                      .splitlines() if "_kernels" in line), "(no C extension mapped)")

        samples = []
        for cycle in range(args.cycles):
            topic = mnt / f"cycle{cycle % 7}"
            os.mkdir(topic)
            with open(topic / "0/append", "ab") as f:
                f.write(small)
            assert (topic / "0/records").read_bytes() == small
            os.rmdir(topic)
            if cycle + 1 in (10, args.cycles) or (cycle + 1) % 50 == 0:
                samples.append((cycle + 1, round(_rss_mb(proc.pid), 1)))
        if samples:
            result["rss_over_cycles_mb"] = samples
            result["cycles_growth_mb"] = samples[-1][1] - samples[0][1]
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)])
        proc.wait(timeout=120)
        log_file.close()
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:24} {round(value, 2) if isinstance(value, float) else value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
