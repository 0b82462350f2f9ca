#!/usr/bin/env python3
"""Apache Kafka as the speed anchor: Kafka's own perf tools beside a logfs mount, one run, one machine.

* Kafka: a single-node KRaft broker (the released jars scripts/setup.sh
  fetched, started as tests/kafka_broker.py starts it), a one-partition topic;
  ``ProducerPerformance`` (kafka-producer-perf-test.sh: N records of 100 bytes,
  one producer, no compression, acks=1, no throttle), then
  ``ConsumerPerformance`` (kafka-consumer-perf-test.sh) reading them back.
* logfs: a fresh mount; ``cat FILE >> MOUNT/t/0/append`` with a file of the same
  N records (100-byte values, one per line), then ``cat MOUNT/t/0/records``.

It prints records/s and MB/s (of record values) for each and the ratio
logfs/Kafka.  Both sides run on the same machine at the same time of day; the
broker's JVM has -Xmx512m, as in the tests.

    .venv/bin/python scripts/bench_kafka.py [--records 2000000] [--keep]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.kafka_broker import JVM_OPTS, KafkaBroker, kafka_version, run_tool  # noqa: E402

LOGFS = ROOT / ".venv" / "bin" / "logfs"
RECORD_SIZE = 100


def _producer_perf(broker: KafkaBroker, records: int, base: Path) -> tuple[float, str]:
    result = run_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", "perf",
                      "--num-records", str(records), "--record-size", str(RECORD_SIZE), "--throughput", "-1",
                      "--bootstrap-server", broker.bootstrap,
                      "--command-property", "acks=1", "--command-property", "compression.type=none",
                      base=base, timeout=900, jvm_opts=JVM_OPTS)
    out = result.stdout.decode()
    # the last line: "N records sent, X records/sec (Y MB/sec), ... avg latency, ..."
    final = [line for line in out.splitlines() if " records sent, " in line][-1]
    rate = float(re.search(r"records sent, ([\d.]+) records/sec", final).group(1))
    return records / rate, final


def _consumer_perf(broker: KafkaBroker, records: int, base: Path) -> tuple[float, float, str]:
    result = run_tool("org.apache.kafka.tools.ConsumerPerformance", "--topic", "perf",
                      "--num-records", str(records), "--bootstrap-server", broker.bootstrap,
                      "--timeout", "120000", "--command-property", "auto.offset.reset=earliest",
                      base=base, timeout=900, jvm_opts=JVM_OPTS)
    lines = [line for line in result.stdout.decode().splitlines() if line.strip()]
    header = [h.strip() for h in lines[-2].split(",")]
    values = dict(zip(header, (v.strip() for v in lines[-1].split(","))))
    consumed = int(values["data.consumed.in.nMsg"])
    if consumed < records:
        raise SystemExit(f"ConsumerPerformance read {consumed} of {records} records:\n{lines[-1]}")
    elapsed = consumed / float(values["nMsg.sec"])                    # group join included
    fetch = consumed / float(values["fetch.nMsg.sec"])                # fetching only
    return elapsed, fetch, lines[-1]


def _timed(command: str, cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["bash", "-c", command], cwd=cwd, check=True)
    return time.perf_counter() - start


def _logfs(records: int, base: Path) -> tuple[float, float]:
    mnt, data = base / "mnt", base / "data"
    mnt.mkdir(parents=True)
    data.mkdir()
    src = base / "input.txt"
    value = b"x" * (RECORD_SIZE - 12)
    chunk = b"".join(b"%011d " % i + value + b"\n" for i in range(10_000))
    with open(src, "wb") as f:
        for _ in range(records // 10_000):
            f.write(chunk)
    log = open(base / "logfs.log", "wb")
    proc = subprocess.Popen([str(LOGFS), "mount", str(mnt), "--data-dir", str(data)], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["mountpoint", "-q", str(mnt)]).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"logfs mount failed:\n{(base / 'logfs.log').read_text()}")
            time.sleep(0.05)
        subprocess.run(["mkdir", str(mnt / "t")], check=True)
        append = _timed(f"cat {src} >> t/0/append", mnt)
        read = _timed("cat t/0/records > /dev/null", mnt)
        count = int(subprocess.run(["bash", "-c", "wc -l < t/0/records"], cwd=mnt, capture_output=True,
                                   check=True).stdout)
        if count != records:
            raise SystemExit(f"logfs holds {count} records, expected {records}")
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        proc.wait(timeout=120)
        log.close()
    return append, read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000, help="records per side (a multiple of 10000)")
    parser.add_argument("--dir", default=None, help="work directory (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    records = args.records // 10_000 * 10_000
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="logfs-bench-kafka-"))
    base.mkdir(parents=True, exist_ok=True)
    mb = records * RECORD_SIZE / 1e6
    try:
        broker = KafkaBroker(base / "kafka").start()
        try:
            broker.create_topic("perf", 1)
            produce, produce_line = _producer_perf(broker, records, base)
            consume, fetch, consume_line = _consumer_perf(broker, records, base)
        finally:
            broker.stop()
        append, read = _logfs(records, base / "logfs")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    print(f"ProducerPerformance: {produce_line}")
    print(f"ConsumerPerformance: {consume_line}")
    print()
    print(f"{records:,} records of {RECORD_SIZE} bytes ({mb:.0f} MB), Apache Kafka {kafka_version()} "
          f"(single-node KRaft, -Xmx512m) and logfs on the same machine, one run each")
    print()
    print("| | Kafka (perf tool) | s | records/s | MB/s | logfs | s | records/s | MB/s | logfs / Kafka |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = [("write", "ProducerPerformance, acks=1", produce, "`cat file >> t/0/append`", append),
            ("read", "ConsumerPerformance", consume, "`cat t/0/records`", read)]
    for what, kafka_name, kafka_s, logfs_name, logfs_s in rows:
        print(f"| {what} | {kafka_name} | {kafka_s:.2f} | {records / kafka_s / 1e3:,.0f}K | {mb / kafka_s:.0f} | "
              f"{logfs_name} | {logfs_s:.2f} | {records / logfs_s / 1e3:,.0f}K | {mb / logfs_s:.0f} | "
              f"{kafka_s / logfs_s:.2f} |")
    print()
    print(f"(ConsumerPerformance fetching alone, without the group join: {fetch:.2f} s, "
          f"{records / fetch / 1e3:,.0f}K records/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
