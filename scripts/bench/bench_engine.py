#!/usr/bin/env python3
"""Throughput of the engine's hot paths against kafka-python, in one run.

    .venv/bin/python scripts/bench/bench_engine.py [--records N] [--batch B] [--value-size S] [--mixed-sizes]

Each row is one function returning (records, seconds); the table prints
records/s, MB/s of value bytes and the ratio to the kafka-python row it is
compared with.  The Log rows run only when engine.log is importable.

Values are all --value-size bytes (fixed-width lines: the decoders' column-checked
path) unless --mixed-sizes spreads them over half to one and a half times that
(their record-by-record path).  Seconds are CPU seconds of this process
(time.process_time), best of --repeat runs: on a machine shared with other
work, wall time measures the neighbours.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from devtools.bench import best_of
from engine.records import decode_batch, decode_text, decode_values, encode_values, read_header

if TYPE_CHECKING:
    from collections.abc import Callable

TIMESTAMP = 1_700_000_000_000


class Row(NamedTuple):
    name: str
    records: int
    seconds: float
    value_bytes: int
    baseline: str | None = None       # name of the row this one is compared with
    note: str = ""


REPEAT = 3


def make_batches_of_values(total: int, batch: int, size: int, mixed: bool = False) -> list[list[bytes]]:
    # Distinct printable values, as lines written to an append file would be.
    base = (b"0123456789abcdefghijklmnopqrstuvwxyz" * (size // 18 + 1))
    if mixed:       # mean size kept: size/2 .. 3*size/2
        values = [b"%08d" % i + base[8:size // 2 + (i * 7919) % (size + 1)] for i in range(batch)]
    else:
        values = [b"%08d" % i + base[8:size] for i in range(batch)]
    return [values] * (total // batch)


def timed(fn: Callable[[], int], repeat: int | None = None) -> tuple[int, float]:
    """(what ``fn`` returned, its fewest CPU seconds of ``repeat`` runs, default REPEAT)."""
    seconds, count = best_of(fn, REPEAT if repeat is None else repeat, time.process_time)
    return count, seconds


#: the kafka-python rows the engine's are compared with
KP_BUILDER = "kafka-python DefaultRecordBatchBuilder"
KP_BATCH = "kafka-python DefaultRecordBatch"


def timed_row(name: str, run: Callable[[], int], size: int, baseline: str | None = None) -> Row:
    """The row of ``run`` (which returns the records it handled) timed by :func:`timed`; values of ``size`` bytes."""
    n, s = timed(run)
    return Row(name, n, s, n * size, baseline)


def encode_ours(batches: list[list[bytes]]) -> int:
    offset = 0
    for values in batches:
        encode_values(offset, values, TIMESTAMP)
        offset += len(values)
    return offset


def encode_kafka_python(batches: list[list[bytes]]) -> int:
    count = 0
    for values in batches:
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
        for i, value in enumerate(values):
            builder.append(i, timestamp=TIMESTAMP, key=None, value=value, headers=[])
        builder.build()
        count += len(values)
    return count


def decode_values_of(encoded: list[bytes]) -> int:
    return sum(len(decode_values(batch)) for batch in encoded)


def decode_text_of(encoded: list[bytes]) -> int:
    count = 0
    for batch in encoded:
        header = read_header(batch)
        decode_text(batch, 0, header)
        count += header.records_count
    return count


def decode_batch_of(encoded: list[bytes]) -> int:
    return sum(len(decode_batch(batch)) for batch in encoded)


def decode_kafka_python(encoded: list[bytes]) -> int:
    count = 0
    for batch in encoded:
        for record in DefaultRecordBatch(batch):
            _ = record.value
            count += 1
    return count


def log_rows(batches, size) -> list[Row]:
    """Log.append_values in batches, then Log.read + decode_values of everything."""
    try:
        from engine.config import LogConfig
        from engine.log import Log
    except ImportError as exc:
        return [Row("Log.append_values", 0, 0.0, 0, note=f"skipped: {exc}"),
                Row("Log.read + decode_values", 0, 0.0, 0, note="skipped")]
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as root:
        log_dir = os.path.join(root, "bench-0")
        os.makedirs(log_dir)
        log = Log.load(log_dir, LogConfig.from_props({}))
        try:
            from engine.views import attach  # as the mount does: view sizes computed as values are appended
        except ImportError:                     # a tree from before engine/views/ computed them in Log itself
            pass
        else:
            attach(log)
        try:
            def append() -> int:
                count = 0
                for values in batches:
                    log.append_values(values)
                    count += len(values)
                return count
            appended, append_seconds = timed(append, 1)    # the log keeps what it got

            def read() -> int:
                from engine.records import iter_batches
                count = 0
                offset = log.log_start_offset
                while offset < log.log_end_offset:
                    info = log.read(offset, 1 << 20)
                    records = info.records
                    last = offset
                    for pos, header in iter_batches(records):
                        count += len(decode_values(records, pos, header))
                        last = header.next_offset
                    if last == offset:
                        break
                    offset = last
                return count
            read_count, read_seconds = timed(read, 1)
        finally:
            log.close()
    return [Row("Log.append_values", appended, append_seconds, appended * size),
            Row("Log.read + decode_values", read_count, read_seconds, read_count * size)]


def print_table(rows: list[Row]) -> None:
    by_name = {row.name: row for row in rows}
    print(f"{'path':<40} {'records':>10} {'seconds':>8} {'records/s':>12} {'MB/s':>8} {'ratio':>7}")
    for row in rows:
        if not row.records:
            print(f"{row.name:<40} {row.note}")
            continue
        rate = row.records / row.seconds
        ratio = ""
        base = by_name.get(row.baseline) if row.baseline else None
        if base is not None and base.records:
            ratio = f"{rate / (base.records / base.seconds):6.1f}x"
        print(f"{row.name:<40} {row.records:>10} {row.seconds:>8.3f} {rate:>12,.0f} "
              f"{row.value_bytes / row.seconds / 1e6:>8.1f} {ratio:>7}")


def main(argv: list[str] | None = None) -> int:
    global REPEAT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--mixed-sizes", action="store_true", help="values of varying sizes, same mean")
    parser.add_argument("--repeat", type=int, default=REPEAT, help="runs per row; the best one counts")
    args = parser.parse_args(argv)
    REPEAT = args.repeat
    # the compiled kernels (a C extension): refuse to time the Python paths by mistake
    from engine.records import compiled
    if compiled.KERNELS is None:
        raise SystemExit("the compiled record kernels are not built: run scripts/setup.sh")
    batches = make_batches_of_values(args.records, args.batch, args.value_size, args.mixed_sizes)
    # kafka-python is ~10x slower: a tenth of the records keeps the run short
    # without changing its per-record rate.
    baseline_batches = batches[:max(1, len(batches) // 10)]
    encoded = [encode_values(i * args.batch, values, TIMESTAMP) for i, values in enumerate(batches)]
    size = args.value_size
    baseline_encoded = encoded[:len(baseline_batches)]
    rows = [
        timed_row("encode_values", lambda: encode_ours(batches), size, KP_BUILDER),
        timed_row(KP_BUILDER, lambda: encode_kafka_python(baseline_batches), size),
        timed_row("decode_values", lambda: decode_values_of(encoded), size, KP_BATCH),
        timed_row("decode_text", lambda: decode_text_of(encoded), size, KP_BATCH),
        timed_row("decode_batch", lambda: decode_batch_of(encoded), size, KP_BATCH),
        timed_row(KP_BATCH, lambda: decode_kafka_python(baseline_encoded), size),
    ]
    rows += log_rows(batches, size)
    print(f"{args.records} records of {'~' if args.mixed_sizes else ''}{args.value_size} bytes, "
          f"batches of {args.batch}, Python {sys.version.split()[0]}, CPU seconds, best of {REPEAT}")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
