#!/usr/bin/env python3
"""Throughput of a real mount beside the backing disk.

One run: build a file of 100-byte lines (200 MB by default), then

* ``cat file >> MOUNT/t/0/append``   (append throughput)
* ``cat MOUNT/t/0/records``           (text view read)
* ``cat MOUNT/t/0/records.jsonl``     (JSON-lines view read)

beside ``cp file DATA_FS/copy`` and ``cat DATA_FS/copy`` on the data directory's
own filesystem, and print records/s, MB/s and the ratio to the disk.

    .venv/bin/python scripts/bench/bench_mount.py [--mb 200] [--keep] [-- extra logfs mount args]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import add_work_dir_options, wait_mounted, work_dir  # noqa: E402

LOGFS = ROOT / ".venv" / "bin" / "logfs"
LINE = 100   # bytes per line, newline included


def _timed(cmd: str, cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", cmd], cwd=cwd, check=True)
    return time.perf_counter() - start


def _drop_page_cache() -> None:
    subprocess.run(["sync"], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="size of the input file in MB")
    add_work_dir_options(parser)
    parser.add_argument("--profile", metavar="FILE", help="run the mount under cProfile, stats to FILE")
    parser.add_argument("--cold", action="store_true",
                        help="no warm-up: the timed append is the mount's first write")
    parser.add_argument("--skip-jsonl", action="store_true", help="skip the records.jsonl read")
    parser.add_argument("mount_args", nargs=argparse.REMAINDER, help="extra `logfs mount` arguments after --")
    args = parser.parse_args()

    with work_dir(args, "logfs-bench-") as base:
        mnt, data, disk = base / "mnt", base / "data", base / "disk"
        for d in (mnt, data, disk):
            d.mkdir(parents=True, exist_ok=True)

        n_records = args.mb * 1_000_000 // LINE
        src = base / "input.txt"
        line_body = b"x" * (LINE - 1 - 12)
        chunk = b"".join(b"%011d " % i + line_body + b"\n" for i in range(10_000))
        assert len(chunk) == 10_000 * LINE
        with open(src, "wb") as f:
            for _ in range(n_records // 10_000):
                f.write(chunk)
        n_records = (n_records // 10_000) * 10_000
        size_mb = src.stat().st_size / 1e6

        extra = [a for a in args.mount_args if a != "--"]
        log_file = open(base / "logfs.log", "wb")
        command = [str(LOGFS)]
        if args.profile:
            command = [str(ROOT / ".venv" / "bin" / "python"), "-m", "cProfile", "-o", os.path.abspath(args.profile),
                       "-m", "logfs"]
        proc = subprocess.Popen([*command, "mount", str(mnt), "--data-dir", str(data), *extra],
                                stdout=log_file, stderr=subprocess.STDOUT)
        try:
            wait_mounted(mnt, proc, base / "logfs.log", 30)
            os.mkdir(mnt / "t")
            # The compiled kernels (a C extension) load with the mount; without them (not built) every
            # write takes the Python path: say so rather than time it unknowingly.
            if orjson.loads((mnt / ".logfs/stats.json").read_bytes())["compiled_kernels"] != "loaded":
                print("note: the mount's compiled record kernels are not built (scripts/setup.sh): Python paths")
            if not args.cold:           # time the steady state: a 1 MiB warm-up write to another topic first
                os.mkdir(mnt / "warm")
                with open(src, "rb") as f, open(mnt / "warm/0/append", "ab") as out:
                    out.write(f.read(1 << 20))

            rows = []
            _drop_page_cache()
            t_disk_write = _timed(f"cp {src} {disk}/copy && sync {disk}/copy", base)
            t_disk_read = _timed(f"cat {disk}/copy > /dev/null", base)
            t_append = _timed(f"cat {src} >> {mnt}/t/0/append", base)
            t_records = _timed(f"cat {mnt}/t/0/records > /dev/null", base)
            jsonl_size = os.stat(mnt / "t/0/records.jsonl").st_size
            t_jsonl = None if args.skip_jsonl else _timed(f"cat {mnt}/t/0/records.jsonl > /dev/null", base)
            end_offset = int(subprocess.run(["bash", "-c", f"wc -l < {mnt}/t/0/records"], capture_output=True,
                                            check=True).stdout)
            assert end_offset == n_records, (end_offset, n_records)

            rows.append(("disk: cp file to data fs (+sync)", t_disk_write, size_mb, None))
            rows.append(("disk: cat copy", t_disk_read, size_mb, None))
            rows.append(("mount: cat file >> t/0/append", t_append, size_mb, t_disk_write))
            rows.append(("mount: cat t/0/records", t_records, size_mb, t_disk_read))
            if t_jsonl is not None:
                rows.append(("mount: cat t/0/records.jsonl", t_jsonl, jsonl_size / 1e6, t_disk_read))

            print(f"\n{n_records:,} records of {LINE} bytes ({size_mb:.0f} MB), cpus={os.cpu_count()}")
            print(f"{'operation':38} {'seconds':>8} {'records/s':>12} {'MB/s':>8} {'vs disk':>8}")
            for name, secs, mb, ref in rows:
                ratio = f"{secs / ref:7.1f}x" if ref else "      - "
                print(f"{name:38} {secs:8.2f} {n_records / secs:12,.0f} {mb / secs:8.1f} {ratio}")
            print("(vs disk = mount time / disk time for the same bytes in; same data out)")
            print(f"cp+sync / cat >> append: {t_disk_write / t_append:.2f} (issue 26's goal: >= 0.5)"
                  + ("; cold: the append was the mount's first write" if args.cold else ""))
        finally:
            subprocess.run(["fusermount3", "-u", str(mnt)])
            proc.wait(timeout=120)
            log_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
