#!/usr/bin/env python3
"""Apache Kafka as the speed anchor: Kafka's own perf tools beside a logfs mount, one run, one machine.

* Kafka: a single-node KRaft broker (the released jars scripts/setup.sh
  fetched, started as the tests start it: devtools/kafka.py), a one-partition topic;
  ``ProducerPerformance`` (kafka-producer-perf-test.sh: N records of 100 bytes,
  one producer, no compression, acks=1, no throttle), then
  ``ConsumerPerformance`` (kafka-consumer-perf-test.sh) reading them back.
* logfs: a fresh mount; ``cat FILE >> MOUNT/t/0/append`` with a file of the same
  N records (100-byte values, one per line), then ``cat MOUNT/t/0/records``.

It prints records/s and MB/s (of record values) for each and the ratio
logfs/Kafka.  Both sides run on the same machine at the same time of day; the
broker's JVM has -Xmx512m, as in the tests.

    .venv/bin/python scripts/bench/bench_kafka.py [--records 2000000] [--keep]

``--cluster`` (issue 20): a 3-node KRaft cluster (devtools/kafka.py,
replication factor 3, ``min.insync.replicas=2``) instead of one broker;
ProducerPerformance with ``acks=all`` and ConsumerPerformance on it, beside a
cluster mount (``logfs mount --bootstrap-server``) of the same cluster:
``cat file >> t/0/append``, ``cat t/0/records``, the latency from the start
of a one-line ``write()`` to ``append`` until ``tail -f`` of ``records``
prints it (p50/p99), and, for the choice of a local replica over rendering
views from fetched records, a random ``offset/<N>`` read on the mount against
a Kafka consumer's assign-seek-poll of the same one record.

    .venv/bin/python scripts/bench/bench_kafka.py --cluster [--records 200000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import add_work_dir_options, wait_mounted, work_dir  # noqa: E402
from devtools.jvm import JVM_OPTS, kafka_version, run_tool  # noqa: E402
from devtools.kafka import KafkaBroker  # noqa: E402

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


def _write_input(src: Path, records: int) -> Path:
    """``records`` lines of RECORD_SIZE bytes (a number and x's) in ``src``, what ``cat`` appends."""
    value = b"x" * (RECORD_SIZE - 12)
    chunk = b"".join(b"%011d " % i + value + b"\n" for i in range(10_000))
    with open(src, "wb") as f:
        for _ in range(records // 10_000):
            f.write(chunk)
    return src


def _append_and_read(mnt: Path, src: Path, records: int, what: str) -> tuple[float, float]:
    """Seconds of ``cat src >> t/0/append`` into the new topic t, and of reading t/0/records back; the
    mount (``what``) must then hold ``records`` records."""
    subprocess.run(["mkdir", str(mnt / "t")], check=True)
    append = _timed(f"cat {src} >> t/0/append", mnt)
    read = _timed("cat t/0/records > /dev/null", mnt)
    count = int(subprocess.run(["bash", "-c", "wc -l < t/0/records"], cwd=mnt, capture_output=True,
                               check=True).stdout)
    if count != records:
        raise SystemExit(f"{what} holds {count} records, expected {records}")
    return append, read


def _logfs(records: int, base: Path) -> tuple[float, float]:
    mnt, data = base / "mnt", base / "data"
    mnt.mkdir(parents=True)
    data.mkdir()
    src = _write_input(base / "input.txt", records)
    log = open(base / "logfs.log", "wb")
    proc = subprocess.Popen([str(LOGFS), "mount", str(mnt), "--data-dir", str(data)], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_mounted(mnt, proc, base / "logfs.log", 30, "logfs mount")
        append, read = _append_and_read(mnt, src, records, "logfs")
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        proc.wait(timeout=120)
        log.close()
    return append, read


def _mount_cluster(bootstrap: str, base: Path) -> tuple[subprocess.Popen, Path]:
    mnt, data = base / "mnt", base / "data"
    mnt.mkdir(parents=True)
    data.mkdir()
    log = open(base / "logfs.log", "wb")
    proc = subprocess.Popen([str(LOGFS), "mount", str(mnt), "--data-dir", str(data), "--bootstrap-server",
                             bootstrap], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    log.close()
    wait_mounted(mnt, proc, base / "logfs.log", 60, "logfs mount")
    return proc, mnt


def _tail_latencies(mnt: Path, count: int) -> list[float]:
    """Seconds from the start of a one-line write() to ``append`` until ``tail -f records`` prints the line."""
    (mnt / "lat").mkdir()
    tail = subprocess.Popen(["tail", "-f", "---disable-inotify", "-s", "0.001", "-n", "+1", str(mnt / "lat/0/records")],
                            stdout=subprocess.PIPE)
    latencies = []
    try:
        with open(mnt / "lat/0/append", "ab", buffering=0) as f:
            for i in range(count):
                line = b"latency-%06d\n" % i
                start = time.perf_counter()
                f.write(line)
                got = tail.stdout.readline()
                latencies.append(time.perf_counter() - start)
                if got != line:
                    raise SystemExit(f"tail -f printed {got!r}, expected {line!r}")
    finally:
        tail.kill()
        tail.wait()
    return latencies


def _random_reads(mnt: Path, bootstrap: str, records: int, samples: int) -> tuple[list[float], list[float]]:
    """One record by offset: offset/<N> on the mount, and a Kafka consumer's assign-seek-poll."""
    import random

    from confluent_kafka import Consumer, TopicPartition
    rng = random.Random(7)
    offsets = [rng.randrange(records) for _ in range(samples)]
    mount_s = []
    for n in offsets:
        start = time.perf_counter()
        (mnt / f"t/0/offset/{n}").read_bytes()
        mount_s.append(time.perf_counter() - start)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-random", "enable.auto.commit": False,
                         "max.partition.fetch.bytes": 1 << 16})
    client_s = []
    try:
        for n in offsets:
            start = time.perf_counter()
            consumer.assign([TopicPartition("t", 0, n)])
            msg = consumer.poll(30)
            client_s.append(time.perf_counter() - start)
            if msg is None or msg.offset() != n:
                raise SystemExit(f"consumer read {msg and msg.offset()} for offset {n}")
    finally:
        consumer.close()
    return mount_s, client_s


def _size_of_records(mnt: Path, bootstrap: str, records: int) -> tuple[float, float]:
    """Seconds to know ``records``' size: ``stat`` on the mount, and a consumer reading every record
    (what a mount rendering views from fetched records must do to answer ``st_size``)."""
    from confluent_kafka import Consumer, TopicPartition
    start = time.perf_counter()
    size = os.stat(mnt / "t/0/records").st_size
    stat_s = time.perf_counter() - start
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-size", "enable.auto.commit": False})
    start = time.perf_counter()
    try:
        consumer.assign([TopicPartition("t", 0, 0)])
        total, seen = 0, 0
        while seen < records:
            for msg in consumer.consume(10_000, timeout=30):
                total += len(msg.value() or b"") + 1
                seen += 1
    finally:
        consumer.close()
    client_s = time.perf_counter() - start
    if total != size:
        raise SystemExit(f"stat says {size} bytes, the consumer counted {total}")
    return stat_s, client_s


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000


def _print_comparison(records: int, mb: float, setup: str, logfs_label: str, producer_name: str,
                      produce: float, append: float, consume: float, read: float, produce_line: str,
                      consume_line: str, *, mb_columns: bool) -> None:
    """The perf tools' own lines, then the table of Kafka's write and read against the mount's (``setup``
    says what ran), with MB/s columns if ``mb_columns``."""
    print(f"ProducerPerformance: {produce_line}")
    print(f"ConsumerPerformance: {consume_line}")
    print()
    print(f"{records:,} records of {RECORD_SIZE} bytes ({mb:.0f} MB), {setup}, one run each")
    print()
    mb_head = " MB/s |" if mb_columns else ""
    print(f"| | Kafka (perf tool) | s | records/s |{mb_head} {logfs_label} | s | records/s |{mb_head} logfs / Kafka |")
    print("|---|---|---|---|" + ("---|" if mb_columns else "") + "---|---|---|" + ("---|" if mb_columns else "")
          + "---|")
    rows = [("write", producer_name, produce, "`cat file >> t/0/append`", append),
            ("read", "ConsumerPerformance", consume, "`cat t/0/records`", read)]
    for what, kafka_name, kafka_s, logfs_name, logfs_s in rows:
        kafka_mb = f" {mb / kafka_s:.0f} |" if mb_columns else ""
        logfs_mb = f" {mb / logfs_s:.0f} |" if mb_columns else ""
        print(f"| {what} | {kafka_name} | {kafka_s:.2f} | {records / kafka_s / 1e3:,.0f}K |{kafka_mb} {logfs_name} | "
              f"{logfs_s:.2f} | {records / logfs_s / 1e3:,.0f}K |{logfs_mb} {kafka_s / logfs_s:.2f} |")


def cluster_main(records: int, base: Path) -> int:
    from devtools.kafka import KafkaCluster

    mb = records * RECORD_SIZE / 1e6
    cluster = KafkaCluster(base / "kafka").start()
    proc = None
    try:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("perf", 1)])["perf"].result()
        result = run_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", "perf",
                          "--num-records", str(records), "--record-size", str(RECORD_SIZE), "--throughput", "-1",
                          "--bootstrap-server", cluster.bootstrap, "--command-property", "acks=all",
                          "--command-property", "compression.type=none", base=base, timeout=900, jvm_opts=JVM_OPTS)
        produce_line = [line for line in result.stdout.decode().splitlines() if " records sent, " in line][-1]
        produce = records / float(re.search(r"records sent, ([\d.]+) records/sec", produce_line).group(1))
        fake = KafkaBroker.__new__(KafkaBroker)
        fake.bootstrap = cluster.bootstrap
        consume, fetch, consume_line = _consumer_perf(fake, records, base)

        src = _write_input(base / "input.txt", records)
        proc, mnt = _mount_cluster(cluster.bootstrap, base / "logfs")
        append, read = _append_and_read(mnt, src, records, "the cluster mount")
        latencies = _tail_latencies(mnt, 300)
        mount_reads, client_reads = _random_reads(mnt, cluster.bootstrap, records, 200)
        stat_s, count_s = _size_of_records(mnt, cluster.bootstrap, records)
        disk = sum(p.stat().st_size for p in (base / "logfs" / "data" / "t-0").glob("*.log"))
    finally:
        if proc is not None:
            subprocess.run(["fusermount3", "-u", str(base / "logfs" / "mnt")], check=False)
            proc.wait(timeout=120)
        cluster.stop()

    _print_comparison(records, mb, f"Apache Kafka {kafka_version()}, 3-node KRaft cluster on loopback (replication "
                      "factor 3, min.insync.replicas=2, -Xmx256m each)", "logfs cluster mount",
                      "ProducerPerformance, acks=all", produce, append, consume, read, produce_line, consume_line,
                      mb_columns=False)
    print()
    print(f"(ConsumerPerformance fetching alone, without the group join: {fetch:.2f} s)")
    print()
    print("| latency (ms) | p50 | p99 | max |")
    print("|---|---|---|---|")
    print(f"| one-line write() to `append` until `tail -f records` prints it (300) | {_pct(latencies, 0.5):.1f} | "
          f"{_pct(latencies, 0.99):.1f} | {max(latencies) * 1000:.1f} |")
    print(f"| `cat t/0/offset/<N>`, random N, local replica (200) | {_pct(mount_reads, 0.5):.2f} | "
          f"{_pct(mount_reads, 0.99):.2f} | {max(mount_reads) * 1000:.2f} |")
    print(f"| Kafka consumer assign+seek+poll of the same records (200) | {_pct(client_reads, 0.5):.2f} | "
          f"{_pct(client_reads, 0.99):.2f} | {max(client_reads) * 1000:.2f} |")
    print()
    print(f"size of t/0/records: `stat` on the mount {stat_s * 1000:.2f} ms; a Kafka consumer reading every record "
          f"to count it (what a client design needs for st_size) {count_s * 1000:.0f} ms")
    print()
    print(f"local replica of t-0 on disk: {disk / 1e6:.1f} MB of .log for {mb:.0f} MB of values")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000, help="records per side (a multiple of 10000)")
    add_work_dir_options(parser)
    parser.add_argument("--cluster", action="store_true",
                        help="a 3-node cluster and a cluster mount (logfs mount --bootstrap-server)")
    args = parser.parse_args()
    records = args.records // 10_000 * 10_000
    if args.cluster:
        with work_dir(args, "logfs-bench-kafka-") as base:
            return cluster_main(records, base)
    mb = records * RECORD_SIZE / 1e6
    with work_dir(args, "logfs-bench-kafka-") as base:
        broker = KafkaBroker(base / "kafka").start()
        try:
            broker.create_topic("perf", 1)
            produce, produce_line = _producer_perf(broker, records, base)
            consume, fetch, consume_line = _consumer_perf(broker, records, base)
        finally:
            broker.stop()
        append, read = _logfs(records, base / "logfs")

    _print_comparison(records, mb, f"Apache Kafka {kafka_version()} (single-node KRaft, -Xmx512m) and logfs on the "
                      "same machine", "logfs", "ProducerPerformance, acks=1", produce, append, consume, read,
                      produce_line, consume_line, mb_columns=True)
    print()
    print(f"(ConsumerPerformance fetching alone, without the group join: {fetch:.2f} s, "
          f"{records / fetch / 1e3:,.0f}K records/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
