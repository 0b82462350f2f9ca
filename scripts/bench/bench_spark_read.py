#!/usr/bin/env python3
"""CPU of the Spark ``logfs`` source's read path, without Spark or a mount: ``read_range`` of one offset range.

::

    .venv/bin/python scripts/bench/bench_spark_read.py [--records 1000000] [--value-bytes 100]
        [--layout own|producer] [--headers] [--repeat 5] [--against ../main]

writes the records once into a directory laid out as the mount serves a
partition (``t/0/state``, ``t/0/segments/00000000000000000000.log``), then times
``logfs.spark.read_segments.read_range`` over all of them (the Arrow batches
the source hands to Spark), best of ``--repeat``, in CPU seconds of the process
(``time.process_time``).  ``--layout own`` writes logfs's own batches (what
``append`` writes: 1 MiB of values per batch, null keys, no headers);
``producer`` writes what a Java producer does with ``batch.size=65536``: keyed
records with a header each, lz4-compressed batches of 64 KiB of values.

``--against DIR`` also times the same read with the code of another checkout
(for instance the main branch's) on the same files, in a child process, and
prints the two side by side with their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def write_partition(root: str, records: int, value_bytes: int, layout: str) -> None:
    import orjson

    from engine.files import segment_file_name
    from engine.records import Compression, Record, encode_records, encode_values
    directory = os.path.join(root, "t", "0")
    os.makedirs(os.path.join(directory, "segments"), exist_ok=True)
    pad = b"x" * max(0, value_bytes - 10)
    per_batch = max(1, (1 << 20) // value_bytes) if layout == "own" else max(1, 65536 // value_bytes)
    timestamp = 1_700_000_000_000
    with open(os.path.join(directory, "segments", segment_file_name(0, ".log")), "wb") as f:
        for first in range(0, records, per_batch):
            last = min(records, first + per_batch)
            values = [b"%010d%s" % (i, pad) for i in range(first, last)]
            if layout == "own":
                f.write(encode_values(first, values, timestamp))
            else:
                f.write(encode_records([Record(first + i, timestamp + i // 100, b"key-%d" % ((first + i) % 1000),
                                               value, (("trace", b"%016x" % (first + i)),))
                                        for i, value in enumerate(values)], compression=Compression.LZ4))
    with open(os.path.join(directory, "state"), "wb") as f:
        f.write(orjson.dumps({"log_start_offset": 0, "log_end_offset": records, "segments": [{"base_offset": 0}]}))


def time_read(root: str, records: int, headers: bool, repeat: int) -> dict[str, float | int]:
    from logfs.spark.options import SourceOptions
    from logfs.spark.planning import OffsetRangePartition
    from logfs.spark.read_segments import read_range
    opts = SourceOptions.parse({"path": root, "assign": '{"t":[0]}', "includeHeaders": str(headers).lower()})
    best_cpu = best_wall = float("inf")
    rows = value_bytes = 0
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        rows = value_bytes = 0
        for batch in read_range(opts, OffsetRangePartition("t", 0, 0, records)):
            rows += batch.num_rows
            value_bytes += batch.column("value").buffers()[2].size
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    if rows != records:
        raise SystemExit(f"read {rows} rows, expected {records}")
    return {"cpu": best_cpu, "wall": best_wall, "rows": rows, "value_bytes": value_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--layout", choices=("own", "producer"), default="own")
    parser.add_argument("--headers", action="store_true", help="includeHeaders=true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", metavar="DIR", help="also time the code of this checkout, on the same files")
    parser.add_argument("--code", metavar="DIR", help=argparse.SUPPRESS)        # the child's checkout
    parser.add_argument("--data", metavar="DIR", help=argparse.SUPPRESS)        # the child's files
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.code or os.path.join(HERE, "..", "..")))
    if args.data:                                       # the child of --against: one timing, as JSON
        print(json.dumps(time_read(args.data, args.records, args.headers, args.repeat)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-spark-read-") as root:
        write_partition(root, args.records, args.value_bytes, args.layout)
        size = os.path.getsize(os.path.join(root, "t", "0", "segments", "00000000000000000000.log"))
        print(f"{args.records} records of {args.value_bytes} bytes, layout {args.layout}, "
              f"includeHeaders={str(args.headers).lower()}: a {size / 1e6:.1f} MB segment; best of {args.repeat}")
        runs: list[tuple[str, dict[str, float | int]]] = []
        if args.against:
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--code", args.against, "--data", root,
                                    "--records", str(args.records), "--repeat", str(args.repeat),
                                    *(["--headers"] if args.headers else [])],
                                   check=True, capture_output=True, text=True, cwd=args.against,
                                   env={**os.environ, "PYTHONPATH": os.path.abspath(args.against)})
            runs.append((os.path.abspath(args.against), json.loads(child.stdout.splitlines()[-1])))
        runs.append(("this checkout", time_read(root, args.records, args.headers, args.repeat)))
        print("| code | CPU s | wall s | records/s (CPU) |")
        print("|---|---|---|---|")
        for name, run in runs:
            print(f"| {name} | {run['cpu']:.3f} | {run['wall']:.3f} | {run['rows'] / run['cpu'] / 1e6:.2f}M |")
        if len(runs) == 2:
            print(f"CPU ratio (other / this): {runs[0][1]['cpu'] / runs[1][1]['cpu']:.2f}x")


if __name__ == "__main__":
    main()
