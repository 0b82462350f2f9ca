#!/usr/bin/env python3
"""Benchmarks of the log cleaner.

``engine``: cleaning throughput on an engine-level log (no mount): appends N
keyed records over K keys to a compacted Log, rolls, and times one
``LogCleaner.clean_once`` (offset map build + copy + swap), printing MB/s of
dirty log processed and the split between indexing and cleaning.

``mount``: latency of small appends through a real ``logfs mount`` (one
``write`` + ``flush`` per line on a file opened with ``open(..., "a")``), p50
and p99, with the cleaner disabled and enabled.  The mount schedules the
cleaner itself (``kafka-log-cleaner-thread-<i>`` tasks); with a short
``log.cleaner.backoff.ms`` and a compacted topic being appended to, it keeps
cleaning while the appends are measured, and its cleaning throughput is read
from ``.logfs/stats.json`` (the cleaner's totals over the measured window).

With ``--preload-mb`` (default 4) a second compacted topic is filled with
that much keyed data first, in 1 MiB segments, so that a long, CPU-bound
clean runs while the appends are measured: that is what shows the cleaner
holding the GIL against the mount's trio thread.

``gil``: how long another thread waits for the GIL while a clean runs (what
the mount's trio thread sees): the main thread sleeps 1 ms in a loop during an
engine-level ``clean_once`` in a worker thread and records how late it wakes
up, with the cleaner's per-batch GIL yield (``Cleaner.gil_yield``) on and off.

``kafka``: Kafka 4.3.1's own cleaner beside logfs's on the same segments
(written once by the engine, cleaned by the engine from a copy and by a
single-node broker after ``logfs to-kafka adopt``); Kafka's MB/s from its
cleaner's summary line in the broker log.

``all`` (the default) runs engine and mount and prints one table.

    .venv/bin/python scripts/bench/bench_cleaner.py all
    .venv/bin/python scripts/bench/bench_cleaner.py gil
    .venv/bin/python scripts/bench/bench_cleaner.py engine --records 200000 --keys 10000
    .venv/bin/python scripts/bench/bench_cleaner.py mount --lines 3000
    .venv/bin/python scripts/bench/bench_cleaner.py kafka --records 200000 --keys 10000
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------------------ engine

def _load_kernels() -> None:
    """The compiled kernels the cleaner uses (a C extension, loaded with engine.records): refuse to time the
    Python paths by mistake."""
    from engine.records import compiled
    if compiled.KERNELS is None:
        raise SystemExit("the compiled record kernels are not built: run scripts/setup.sh")


def bench_engine(records: int, keys: int, batch: int, value_size: int, segment_bytes: int,
                 profile: bool) -> dict:
    from engine.cleaner import LogCleaner
    from engine.config import BrokerConfig, LogConfig
    from engine.log import Log

    base = Path(tempfile.mkdtemp(prefix="bench-cleaner-"))
    try:
        broker = BrokerConfig.from_props({"log.dirs": str(base)})
        config = LogConfig.from_props({"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)})
        log = Log.load(str(base / "bench-0"), config)
        value = b"v" * value_size
        started = time.perf_counter()
        for first in range(0, records, batch):
            n = min(batch, records - first)
            log.append_values([value] * n, [b"key-%d" % ((first + i) % keys) for i in range(n)])
        log.roll()
        append_secs = time.perf_counter() - started
        dirty_bytes = log.size
        cleaner = LogCleaner(broker, [str(base)], lambda: [log])
        _load_kernels()
        if profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            prof.enable()
        started = time.perf_counter()
        stats = cleaner.clean_once()
        secs = time.perf_counter() - started
        if profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        assert stats is not None, "nothing was cleaned"
        remaining = len(log.read_records(log.log_start_offset))
        log.close()
        return {
            "records": records, "keys": keys, "batch": batch,
            "append_secs": round(append_secs, 3),
            "dirty_mb": round(dirty_bytes / 2**20, 2),
            "clean_secs": round(secs, 3),
            "mb_per_sec": round(dirty_bytes / 2**20 / secs, 2),
            "records_per_sec": round(records / secs),
            "index_secs": round(stats.elapsed_index_secs, 3),
            "copy_secs": round(stats.elapsed_secs - stats.elapsed_index_secs, 3),
            "bytes_written_mb": round(stats.bytes_written / 2**20, 2),
            "records_after": remaining,
            "map_utilization": round(stats.buffer_utilization, 4),
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------------- kafka

def bench_vs_kafka(records: int, keys: int, batch: int, value_size: int) -> dict:
    """Kafka's own cleaner and logfs's on the same segments, one after the other on this machine.

    The data is written once by the logfs engine (topic ``bench``, compacted,
    1 MiB segments: Kafka 4's minimum) and shut down cleanly.  A copy is
    cleaned by the logfs engine (``LogCleaner.clean_once``); the original is
    handed to a single-node Kafka broker with ``logfs to-kafka adopt`` (topic
    created first, broker stopped, started again with the cleaner on), whose
    cleaner's summary ("N MB of log processed in S seconds (R MB/sec)") is read
    from its log.  Both clean the same dirty bytes from scratch.
    """
    import re

    from devtools.kafka import KafkaBroker
    from engine.cleaner import LogCleaner
    from engine.config import BrokerConfig
    from engine.manager import LogManager
    from engine.topic import TopicPartition
    from logfs.to_kafka import adopt

    base = Path(tempfile.mkdtemp(prefix="bench-cleaner-kafka-"))
    try:
        data = base / "logfs"
        manager = LogManager(BrokerConfig.from_props({"log.dirs": str(data), "log.cleaner.enable": "false"}))
        manager.startup()
        manager.create_topic("bench", 1, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
                                          "min.cleanable.dirty.ratio": "0.01"})
        log = manager.get_log(TopicPartition("bench", 0))
        value = b"v" * value_size
        for first in range(0, records, batch):
            n = min(batch, records - first)
            log.append_values([value] * n, [b"key-%d" % ((first + i) % keys) for i in range(n)])
        log.roll()
        dirty_bytes = log.size
        manager.shutdown()

        # logfs: a copy of the same dirty segments
        copy = base / "logfs-copy"
        shutil.copytree(data, copy)
        broker_config = BrokerConfig.from_props({"log.dirs": str(copy)})
        manager = LogManager(broker_config)
        manager.startup()
        log = manager.get_log(TopicPartition("bench", 0))
        cleaner = LogCleaner(broker_config, [str(copy)], lambda: [log])
        _load_kernels()
        started = time.perf_counter()
        stats = cleaner.clean_once()
        logfs_secs = time.perf_counter() - started
        assert stats is not None, "logfs cleaned nothing"
        logfs_after = len(log.read_records(log.log_start_offset))
        manager.shutdown()

        # Kafka: the topic, then the same segments adopted, then its cleaner
        broker = KafkaBroker(base / "kafka", {"log.cleaner.enable": "false", "log.cleaner.backoff.ms": "200",
                                              "log.cleaner.io.max.bytes.per.second": "1.7976931348623157E308"})
        broker.start()
        try:
            broker.create_topic("bench", 1, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20),
                                             "min.cleanable.dirty.ratio": "0.01"})
        finally:
            broker.stop()
        adopt([str(data)], str(broker.log_dir))
        broker.properties["log.cleaner.enable"] = "true"
        broker.write_config(broker.properties)
        broker.start()
        pattern = re.compile(r"([\d.,]+) MB of log processed in ([\d.,]+) seconds \(([\d.,]+) MB/sec\)")
        try:
            broker.wait_for(lambda: pattern.search(broker.log_file.read_text(errors="replace")),
                            "Kafka's cleaner to clean bench-0", timeout=600)
            text = broker.log_file.read_text(errors="replace")
        finally:
            broker.stop()
        mb, secs, rate = (float(x.replace(",", "")) for x in pattern.search(text).groups())
        indexed = re.search(r"Indexed ([\d.,]+) MB in ([\d.,]+) seconds", text)
        return {
            "records": records, "keys": keys, "batch": batch, "dirty_mb": round(dirty_bytes / 2**20, 2),
            "logfs_secs": round(logfs_secs, 3), "logfs_mb_per_sec": round(dirty_bytes / 2**20 / logfs_secs, 2),
            "logfs_index_secs": round(stats.elapsed_index_secs, 3), "logfs_records_after": logfs_after,
            "kafka_mb_processed": mb, "kafka_secs": secs, "kafka_mb_per_sec": rate,
            "kafka_index_secs": float(indexed.group(2).replace(",", "")) if indexed else None,
            "kafka_dirty_mb_per_sec": round(dirty_bytes / 2**20 / secs, 2) if secs else None,
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------------------- gil

def bench_gil(records: int, keys: int, yield_gil: bool) -> dict:
    """Wake-up delays of a thread sleeping 1 ms in a loop while a clean runs in another thread."""
    import threading

    from engine.cleaner import GilYield, LogCleaner
    from engine.config import BrokerConfig, LogConfig
    from engine.log import Log

    base = Path(tempfile.mkdtemp(prefix="bench-cleaner-gil-"))
    try:
        config = LogConfig.from_props({"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
        log = Log.load(str(base / "bench-0"), config)
        for first in range(0, records, 10):
            log.append_values([b"v" * 100] * 10, [b"key-%d" % ((first + i) % keys) for i in range(10)])
        log.roll()
        cleaner = LogCleaner(BrokerConfig.from_props({"log.dirs": str(base)}), [str(base)], lambda: [log])
        if not yield_gil:
            for worker in cleaner.cleaners:
                worker.gil_yield = GilYield(float("inf"))
        finished = threading.Event()
        elapsed: list[float] = []

        def clean() -> None:
            started = time.perf_counter()
            try:
                cleaner.clean_once()
            finally:
                elapsed.append(time.perf_counter() - started)
                finished.set()

        worker_thread = threading.Thread(target=clean, name="kafka-log-cleaner-thread-0")
        worker_thread.start()
        delays = []
        while not finished.is_set():
            started = time.perf_counter()
            time.sleep(0.001)
            delays.append((time.perf_counter() - started - 0.001) * 1000)
        worker_thread.join()
        log.close()
        return {"gil_yield": yield_gil, "clean_secs": round(elapsed[0], 3), "samples": len(delays),
                "wakeup_delay_p50_ms": round(statistics.median(delays), 3),
                "wakeup_delay_p99_ms": round(_percentile(delays, 0.99), 3),
                "wakeup_delay_max_ms": round(max(delays), 3)}
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------------- mount

def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


def _append_latencies(mnt: Path, topic: str, lines: int, keys: int) -> list[float]:
    """Milliseconds of each write+flush of one keyed line to ``topic``'s partition 0."""
    latencies = []
    with open(mnt / topic / "0" / "append", "a") as f:
        for i in range(lines):
            line = f"key-{i % keys}\tvalue-{i}-{'x' * 40}\n"
            t = time.perf_counter()
            f.write(line)
            f.flush()
            latencies.append((time.perf_counter() - t) * 1000)
    return latencies


def _preload(mnt: Path, topic: str, megabytes: float, keys: int = 2000) -> None:
    """Fill a compacted ``topic`` with ``megabytes`` of keyed lines, written 1 MiB at a time."""
    (mnt / topic).mkdir()
    (mnt / topic / "config").write_text("cleanup.policy=compact\nparse.key=true\nsegment.bytes=1048576\n")
    line_size = len(b"key-0000\t") + 101
    total = int(megabytes * 2**20) // line_size
    with open(mnt / topic / "0" / "append", "ab") as f:
        for first in range(0, total, 8192):
            f.write(b"".join(b"key-%04d\t%s\n" % ((first + i) % keys, b"x" * 100)
                             for i in range(min(8192, total - first))))
            f.flush()


def bench_mount_once(cleaner_enabled: bool, lines: int, keys: int, backoff_ms: int,
                     preload_mb: float = 0.0) -> dict:
    base = Path(tempfile.mkdtemp(prefix="bench-cleaner-mount-"))
    data, mnt = base / "data", base / "mnt"
    data.mkdir()
    mnt.mkdir()
    options = {"log.cleaner.enable": str(cleaner_enabled).lower(), "log.cleaner.backoff.ms": str(backoff_ms),
               "internal.log.segment.bytes": "16384", "log.cleaner.min.cleanable.ratio": "0.1",
               "log.initial.task.delay.ms": "100", "num.partitions": "1"}
    cmd = [str(ROOT / ".venv" / "bin" / "logfs"), "mount", str(mnt), "--data-dir", str(data)]
    for name, value in options.items():
        cmd += ["-o", f"{name}={value}"]
    log_file = open(base / "logfs.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"logfs mount failed:\n{(base / 'logfs.log').read_text()}")
            time.sleep(0.05)
        topic = "bench"
        (mnt / topic).mkdir()
        (mnt / topic / "config").write_text("cleanup.policy=compact\nparse.key=true\n")
        _append_latencies(mnt, topic, min(lines, 500), keys)        # warm-up, makes segments to clean
        if preload_mb > 0:
            _preload(mnt, "bench-preload", preload_mb)
        before = _cleaner_totals(mnt)
        latencies = _append_latencies(mnt, topic, lines, keys)
        after = _cleaner_totals(mnt)
        state = json.loads((mnt / topic / "0" / "state").read_text())
        cleaned_bytes = after["bytes_read"] - before["bytes_read"]
        clean_secs = after["elapsed_secs"] - before["elapsed_secs"]
        return {"cleaner_enabled": cleaner_enabled, "lines": lines, "preload_mb": preload_mb,
                "p50_ms": round(statistics.median(latencies), 3),
                "p99_ms": round(_percentile(latencies, 0.99), 3),
                "max_ms": round(max(latencies), 3),
                "cleans_during": after["runs"] - before["runs"],
                "cleaned_mb": round(cleaned_bytes / 2**20, 3),
                "clean_mb_per_sec": round(cleaned_bytes / 2**20 / clean_secs, 2) if clean_secs > 0 else None,
                "num_segments": state["num_segments"], "size_bytes": state["size_bytes"],
                "cleaner": {k: state.get(k) for k in ("cleaner_position", "dirty_ratio", "last_cleaning")}}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        log_file.close()
        shutil.rmtree(base, ignore_errors=True)


def _cleaner_totals(mnt: Path) -> dict:
    """The cleaner's running sums from .logfs/stats.json (zeros when the mount runs no cleaner)."""
    doc = json.loads((mnt / ".logfs" / "stats.json").read_bytes())
    cleaner = doc.get("cleaner")
    if cleaner is None:
        return {"runs": 0, "bytes_read": 0, "elapsed_secs": 0.0}
    return cleaner["totals"]


def bench_mount(lines: int, keys: int, backoff_ms: int, preload_mb: float) -> list[dict]:
    return [bench_mount_once(False, lines, keys, backoff_ms, preload_mb),
            bench_mount_once(True, lines, keys, backoff_ms, preload_mb)]


# -------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["all", *argv]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    eng = sub.add_parser("engine", help="cleaning throughput of an engine-level log")
    eng.add_argument("--records", type=int, default=200_000)
    eng.add_argument("--keys", type=int, default=10_000)
    eng.add_argument("--batch", type=int, default=10, help="records per append (one batch)")
    eng.add_argument("--value-size", type=int, default=100)
    eng.add_argument("--segment-bytes", type=int, default=1 << 20)
    eng.add_argument("--profile", action="store_true")
    mnt = sub.add_parser("mount", help="append latency through a mount, cleaner off and on")
    mnt.add_argument("--lines", type=int, default=3000)
    mnt.add_argument("--keys", type=int, default=100)
    mnt.add_argument("--backoff-ms", type=int, default=50)
    mnt.add_argument("--preload-mb", type=float, default=4.0,
                     help="MB of keyed data in a second compacted topic, cleaned during the measurement")
    kaf = sub.add_parser("kafka", help="Kafka's own cleaner and logfs's on the same segments")
    kaf.add_argument("--records", type=int, default=200_000)
    kaf.add_argument("--keys", type=int, default=10_000)
    kaf.add_argument("--batch", type=int, default=10, help="records per append (one batch)")
    kaf.add_argument("--value-size", type=int, default=100)
    gil = sub.add_parser("gil", help="another thread's wait for the GIL during a clean, yield on and off")
    gil.add_argument("--records", type=int, default=200_000)
    gil.add_argument("--keys", type=int, default=10_000)
    both = sub.add_parser("all", help="engine and mount, one table")
    both.add_argument("--records", type=int, default=200_000)
    both.add_argument("--keys", type=int, default=10_000)
    both.add_argument("--lines", type=int, default=3000)
    both.add_argument("--mount-keys", type=int, default=100)
    both.add_argument("--backoff-ms", type=int, default=50)
    both.add_argument("--preload-mb", type=float, default=4.0)
    parser.add_argument("-v", "--verbose", action="store_true", help="show the cleaner's log lines")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.what == "engine":
        print(bench_engine(args.records, args.keys, args.batch, args.value_size, args.segment_bytes,
                           args.profile))
    elif args.what == "kafka":
        print(bench_vs_kafka(args.records, args.keys, args.batch, args.value_size))
    elif args.what == "gil":
        for yield_gil in (False, True):
            print(bench_gil(args.records, args.keys, yield_gil))
    elif args.what == "mount":
        for result in bench_mount(args.lines, args.keys, args.backoff_ms, args.preload_mb):
            print(result)
    else:
        engine = bench_engine(args.records, args.keys, 10, 100, 1 << 20, False)
        mount = bench_mount(args.lines, args.mount_keys, args.backoff_ms, args.preload_mb)
        print(_table(engine, mount, args))
    return 0


def _table(engine: dict, mount: list[dict], args: argparse.Namespace) -> str:
    """The figures as a markdown table."""
    rows = [
        ("engine: clean_once of a compacted log",
         f"{engine['dirty_mb']} MB dirty ({engine['records']} records, {engine['keys']} keys)",
         f"{engine['mb_per_sec']} MB/s ({engine['records_per_sec']} records/s; index {engine['index_secs']} s, "
         f"copy {engine['copy_secs']} s)"),
    ]
    for result in mount:
        label = "mount: appends, cleaner " + ("on" if result["cleaner_enabled"] else "off")
        cleaning = (f"{result['cleans_during']} cleans, {result['cleaned_mb']} MB at {result['clean_mb_per_sec']} MB/s"
                    if result["cleaner_enabled"] else "-")
        rows.append((label, f"{result['lines']} single-line writes, {result['preload_mb']} MB compacted preload",
                     f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms; {cleaning}"))
    lines = ["| run | workload | result |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
