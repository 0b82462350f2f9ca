#!/usr/bin/env python3
"""An append's cost against the number of partitions the mount serves.

    .venv/bin/python scripts/bench/bench_topic_count.py [--partitions 10,1000,10000] [--writes 2000]

For each count a fresh data dir (under --dir, /dev/shm by default: creating
the partitions is not what is measured) gets that many one-partition topics,
then --writes one-line appends go through the embedded backend as a FUSE
``write()`` on ``t/0/append`` does: the config of the write
(``produce_config``), then ``append_text_lines``.  The table prints the
CPU seconds of those writes (best of --repeat) and their ratio to the first
row: flat means no write does work that grows with the number of topics.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from engine.config import BrokerConfig
from engine.manager import LogManager
from engine.topic import TopicPartition
from logfs.backend import EmbeddedBackend


def _writes(backend: EmbeddedBackend, topic: str, writes: int) -> float:
    tp = TopicPartition(topic, 0)
    start = time.process_time()
    for _ in range(writes):
        backend.produce_config(topic, None)
        backend.produce_config(topic, 0)
        backend.append_text_lines(tp, b"x\n")
    return time.process_time() - start


def measure(count: int, writes: int, repeat: int, parent: str) -> tuple[float, float]:
    data = tempfile.mkdtemp(prefix="bench-topics-", dir=parent)
    try:
        props = {"log.dirs": data, "num.partitions": "1", "log.flush.interval.messages": str(2**62),
                 "log.segment.bytes": str(1 << 20), "log.index.size.max.bytes": "4096",
                 "log.cleaner.enable": "false"}
        manager = LogManager(BrokerConfig.from_props(props))
        manager.startup()
        try:
            start = time.monotonic()
            for i in range(count):
                manager.create_topic(f"t{i:06d}", 1)
            created = time.monotonic() - start
            backend = EmbeddedBackend(manager)
            best = min(_writes(backend, f"t{count // 2:06d}", writes) for _ in range(repeat))
        finally:
            manager.shutdown()
        return best, created
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="10,1000,10000")
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    args = parser.parse_args()
    counts = [int(c) for c in args.partitions.split(",")]
    print(f"| partitions | {args.writes} one-line appends (CPU s) | per append (us) | vs first row | created in (s) |")
    print("|---|---|---|---|---|")
    first = None
    for count in counts:
        seconds, created = measure(count, args.writes, args.repeat, args.dir)
        first = first or seconds
        print(f"| {count:,} | {seconds:.3f} | {seconds / args.writes * 1e6:.1f} | {seconds / first:.2f} |"
              f" {created:.1f} |", flush=True)


if __name__ == "__main__":
    main()
