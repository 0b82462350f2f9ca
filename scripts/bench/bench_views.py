#!/usr/bin/env python3
"""Throughput of the mount's view files (``records``, ``records.jsonl``) on a real Log.

    .venv/bin/python scripts/bench/bench_views.py [--records N] [--batch B] [--value-size S] [--repeat R]
    .venv/bin/python scripts/bench/bench_views.py --mixed [--records N] [--batch B] [--repeat R]

Builds a Log of N records of S-byte printable ASCII values (B per append, as
the line appender writes one batch per write()), closes it, and measures:

* rebuild: loading the log again and building each segment's view index by
  its catch-up scan (what the first read after a remount pays), separately
  for the text column (``records``) and both columns (``records.jsonl``);
* text / jsonl: a LogView read sequentially in 1 MiB reads, as ``cat`` and
  the FUSE layer issue them, on the already built index.

``--mixed``: JSON object values of 40 to 200 bytes (uniformly spread, mean
120) against JSON object values of exactly 100 bytes, the same number of
records, side by side: CPU nanoseconds per byte of value to append
(``Log.append_values``), to read ``records`` and to read ``records.jsonl``,
and mixed / uniform (issue 19's goal: at most 1.5).

Seconds are CPU seconds of this process (time.process_time), best of
--repeat runs: the machine is shared, so wall time measures the neighbours.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from devtools.bench import best_of
from engine.config import LogConfig
from engine.log import Log
from engine.views import LogView, ViewFormat, view_index

READ_SIZE = 1 << 20


def build(directory: str, records: int, batch: int, size: int) -> LogConfig:
    config = LogConfig.from_props({"segment.bytes": str(1 << 30)})
    log = Log.load(directory, config)
    base = b"0123456789abcdefghijklmnopqrstuvwxyz" * (size // 36 + 1)
    values = [b"%08d" % i + base[8:size] for i in range(batch)]
    for _ in range(records // batch):
        log.append_values(values)
    log.close()
    return config


def json_values(count: int, low: int, high: int, seed: int = 19) -> list[bytes]:
    """JSON objects of ``low`` .. ``high`` bytes (each size equally likely)."""
    import random
    rng = random.Random(seed)
    out = []
    for i in range(count):
        size = rng.randint(low, high)
        head = b'{"id":%d,"user":"u%d","pad":"' % (i, i % 997)
        out.append(head + b"x" * max(0, size - len(head) - 2) + b'"}')
    return out


def bench_mixed(records: int, batch: int, repeat: int) -> None:
    """Mixed 40-200 B against uniform 100 B JSON values: CPU ns per value byte, side by side."""
    shapes = {"uniform 100 B": json_values(batch, 100, 100), "mixed 40-200 B": json_values(batch, 40, 200)}
    results: dict[str, dict[str, float]] = {}
    for name, values in shapes.items():
        root = tempfile.mkdtemp(prefix="bench-views-mixed-")
        try:
            directory = os.path.join(root, "bench-0")
            config = LogConfig.from_props({"segment.bytes": str(1 << 30)})
            value_bytes = sum(map(len, values)) * (records // batch)

            def append(directory=directory, config=config, values=values) -> None:
                shutil.rmtree(directory, ignore_errors=True)
                log = Log.load(directory, config)
                for _ in range(records // batch):
                    log.append_values(values)
                log.close()
            seconds = {"append": best_of(append, repeat, time.process_time)[0]}
            log = Log.load(directory, config, had_clean_shutdown=True)
            try:
                for fmt in ViewFormat:
                    read_view(log, fmt)
                    seconds[fmt.value] = best_of(lambda fmt=fmt, log=log: read_view(log, fmt), repeat,
                                                 time.process_time)[0]
            finally:
                log.close()
            results[name] = {k: v * 1e9 / value_bytes for k, v in seconds.items()}
        finally:
            shutil.rmtree(root, ignore_errors=True)
    uniform, mixed = results["uniform 100 B"], results["mixed 40-200 B"]
    print(f"{records // batch * batch} JSON values per shape, {batch} per batch; CPU ns per value byte")
    print(f"{'path':16s} {'uniform 100 B':>14s} {'mixed 40-200 B':>15s} {'mixed/uniform':>14s}")
    for path in uniform:
        print(f"{path:16s} {uniform[path]:14.2f} {mixed[path]:15.2f} {mixed[path] / uniform[path]:14.2f}")


def read_view(log: Log, fmt: ViewFormat) -> int:
    view = LogView(log, fmt)
    position = 0
    while True:
        piece = view.read(position, READ_SIZE)
        if not piece:
            break
        position += len(piece)
    view.close()
    return position


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mixed", action="store_true", help="mixed 40-200 B against uniform 100 B JSON values")
    args = parser.parse_args()
    # the compiled kernels (a C extension): refuse to time the Python paths by mistake
    from engine.records import compiled
    if compiled.KERNELS is None:
        raise SystemExit("the compiled record kernels are not built: run scripts/setup.sh")
    if args.mixed:
        bench_mixed(args.records, args.batch, args.repeat)
        return

    root = tempfile.mkdtemp(prefix="bench-views-")
    directory = os.path.join(root, "bench-0")
    try:
        config = build(directory, args.records, args.batch, args.value_size)
        n = args.records // args.batch * args.batch

        def rebuild(columns: str):
            def run():
                log = Log.load(directory, config, had_clean_shutdown=True)
                try:
                    for segment in log.segments.values():
                        index = view_index(segment)
                        # touch the column(s) this rendering needs
                        _ = index.json_size if columns == "json" else index.text_size
                finally:
                    log.close()
            return run

        rows = []
        for name, columns in (("rebuild text index", "text"), ("rebuild text+json index", "json")):
            seconds, _ = best_of(rebuild(columns), args.repeat, time.process_time)
            rows.append((name, seconds))
        log = Log.load(directory, config, had_clean_shutdown=True)
        try:
            for fmt in ViewFormat:
                read_view(log, fmt)         # builds the view index once
                seconds, size = best_of(lambda fmt=fmt: read_view(log, fmt), args.repeat, time.process_time)
                rows.append((f"read {fmt.value} view ({size / 1e6:.0f} MB)", seconds))
        finally:
            log.close()
        print(f"{n} records of {args.value_size} bytes, {args.batch} per batch")
        for name, seconds in rows:
            print(f"{name:34s} {seconds:7.3f} s  {n / seconds / 1e6:7.2f} M records/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
