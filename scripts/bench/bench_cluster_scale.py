#!/usr/bin/env python3
"""What a cluster mount costs with many partitions (issue 25): mount ready, disk, RSS, open files.

A 3-node KRaft cluster (devtools/kafka.py) gets ``--partitions`` partitions
(default 5,000): topic ``sel`` with 10 partitions and ``bulk-<i>`` topics with
the rest, ``--records`` records of 100 bytes in every partition (replication
factor ``--replication``, default 1 to spare a small machine).  Then, one
fresh mount (own data dir) per row:

* ``--topics sel``: the 10 partitions of ``sel`` listed, then read (``cat``);
* ``--from latest``: every topic listed, the 10 partitions of ``sel`` read
  (each replica starts at the end: nothing to fetch);
* everything: every topic listed and every partition read.

For each: seconds until the mount answers, seconds to read what is selected,
the local replica's bytes on disk (``du``), the mount process's RSS and
open descriptors (``/proc/<pid>``) after the reads, and beside it Kafka's own
``ConsumerPerformance`` (kafka-consumer-perf-test.sh) reading the same
records: its seconds and peak RSS (``/usr/bin/time``).

    .venv/bin/python scripts/bench/bench_cluster_scale.py [--partitions 5000] [--records 20] [--glob]

With ``--glob`` each topic is read as ``cat TOPIC/*/records | wc -l`` (the
shell looks every ``records`` up before ``cat`` opens the first), and the
count must equal the records produced, every partition's high watermark.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import wait_mounted  # noqa: E402
from devtools.jvm import JVM_OPTS, java_command, write_log4j  # noqa: E402

LOGFS = ROOT / ".venv" / "bin" / "logfs"
SELECTED = 10
BULK_TOPIC_PARTITIONS = 50


def _create(bootstrap: str, total: int, replication: int) -> list[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = {"sel": SELECTED}
    left, i = total - SELECTED, 0
    while left > 0:
        topics[f"bulk-{i}"] = min(BULK_TOPIC_PARTITIONS, left)
        left -= topics[f"bulk-{i}"]
        i += 1
    names = list(topics)
    for start in range(0, len(names), 20):      # a few CreateTopics at a time: the controller is small
        futures = admin.create_topics([NewTopic(n, topics[n], replication) for n in names[start:start + 20]],
                                      request_timeout=300)
        for future in futures.values():
            future.result(timeout=600)
    deadline = time.monotonic() + 600
    while True:
        md = admin.list_topics(timeout=60)
        led = sum(1 for n in names if n in md.topics for p in md.topics[n].partitions.values() if p.leader >= 0)
        if led == total:
            return names
        if time.monotonic() > deadline:
            raise SystemExit(f"only {led} of {total} partitions have a leader")
        time.sleep(1)


def _produce(bootstrap: str, topics: list[str], per_partition: int) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "acks": "all"})
    value = b"x" * 100
    count = 0
    for topic in topics:
        for p in md.topics[topic].partitions:
            for _ in range(per_partition):
                while True:
                    try:
                        producer.produce(topic, value, partition=p)
                        break
                    except BufferError:
                        producer.poll(0.1)
                count += 1
        producer.poll(0)
    if producer.flush(300) != 0:
        raise SystemExit("records left unacknowledged")
    return count


def _mount(bootstrap: str, base: Path, args: list[str],
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path, float]:
    mnt, data = base / "mnt", base / "data"
    mnt.mkdir(parents=True)
    data.mkdir()
    log = open(base / "logfs.log", "wb")
    started = time.perf_counter()
    proc = subprocess.Popen([str(LOGFS), "mount", str(mnt), "--data-dir", str(data), "--bootstrap-server",
                             bootstrap, *args], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    log.close()
    wait_mounted(mnt, proc, base / "logfs.log", 600, "logfs mount", interval=0.02)
    return proc, mnt, time.perf_counter() - started


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_figures(pid: int) -> tuple[float, float, int]:
    """(RSS MB, peak RSS MB, open descriptors) of a process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    return rss, hwm, len(os.listdir(f"/proc/{pid}/fd"))


def _du_mb(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, check=True).stdout
    return int(out.split()[0]) / 1024


def _logfs_row(bootstrap: str, base: Path, args: list[str], read_topics: list[str] | None,
               expected: int, glob: bool = False, env: dict[str, str] | None = None) -> dict[str, float]:
    proc, mnt, ready = _mount(bootstrap, base, args, env)
    try:
        topics = read_topics if read_topics is not None else sorted(t for t in os.listdir(mnt) if t != ".logfs")
        files = [str(mnt / t / p / "records") for t in topics for p in os.listdir(mnt / t) if p.isdigit()]
        started, cpu_before = time.perf_counter(), _cpu_s(proc.pid)
        lines = 0
        if glob:        # the shell looks every records up first, then cat opens them one by one
            for start in range(0, len(topics), 20):
                patterns = " ".join(f"'{t}'/*/records" for t in topics[start:start + 20])
                out = subprocess.run(["bash", "-o", "pipefail", "-c", f"cat {patterns} | wc -l"], cwd=mnt,
                                     capture_output=True, check=True).stdout
                lines += int(out)
        else:
            for start in range(0, len(files), 200):
                out = subprocess.run(["cat", *files[start:start + 200]], capture_output=True, check=True).stdout
                lines += out.count(b"\n")
        read, cpu = time.perf_counter() - started, _cpu_s(proc.pid) - cpu_before
        if lines != expected:
            raise SystemExit(f"read {lines} records through the mount, expected {expected}")
        rss, hwm, fds = _proc_figures(proc.pid)
        disk = _du_mb(base / "data")
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        proc.wait(timeout=300)
    return {"ready": ready, "read": read, "cpu": cpu, "disk": disk, "rss": rss, "hwm": hwm, "fds": fds,
            "records": lines, "partitions": len(files)}


def _consumer_perf(bootstrap: str, base: Path, pattern: str, records: int) -> dict[str, float]:
    """ConsumerPerformance reading ``records`` from the topics matching ``pattern``: seconds, peak RSS."""
    log4j = base / "tool-log4j2.properties"
    write_log4j(log4j, base / "tool.log", "WARN")
    cmd = java_command("org.apache.kafka.tools.ConsumerPerformance", "--include", pattern,
                       "--messages", str(max(records, 1)), "--bootstrap-server", bootstrap, "--timeout", "120000",
                       "--command-property", "auto.offset.reset=earliest",
                       jvm_opts=JVM_OPTS, log4j_config=log4j)
    started = time.perf_counter()
    result = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", *cmd], capture_output=True, timeout=900)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"ConsumerPerformance failed:\n{result.stderr.decode()[-3000:]}")
    lines = [line for line in result.stdout.decode().splitlines() if line.strip()]
    header = [h.strip() for h in lines[-2].split(",")]
    values = dict(zip(header, (v.strip() for v in lines[-1].split(","))))
    consumed = int(values["data.consumed.in.nMsg"])
    rss_kb = int(re.search(r"maxrss_kb=(\d+)", result.stderr.decode()).group(1))
    return {"wall": elapsed, "consume": consumed / float(values["nMsg.sec"]) if consumed else 0.0,
            "rss": rss_kb / 1024, "records": consumed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=5000)
    parser.add_argument("--records", type=int, default=20, help="records of 100 bytes per partition")
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--glob", action="store_true",
                        help="read each topic as `cat TOPIC/*/records | wc -l` (the shell's lookups first)")
    parser.add_argument("--everything-only", action="store_true", help="only the row that reads every partition")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the rows, side by side")
    parser.add_argument("--untuned", action="store_true",
                        help="beside each mount, one with kafka-python's own receive path "
                             "(LOGFS_KAFKA_PYTHON_TUNING=0, logfs/cluster/kafka_python_tuning.py)")
    args = parser.parse_args()
    from devtools.kafka import KafkaCluster

    base = Path(tempfile.mkdtemp(prefix="bench-cluster-scale-"))
    cluster = KafkaCluster(base / "kafka", {"num.partitions": "1"}).start()
    try:
        began = time.perf_counter()
        topics = _create(cluster.bootstrap, args.partitions, args.replication)
        total = _produce(cluster.bootstrap, topics, args.records)
        print(f"{args.partitions} partitions in {len(topics)} topics, {total} records of 100 bytes, "
              f"replication factor {args.replication}: made in {time.perf_counter() - began:.0f} s", flush=True)
        selected = SELECTED * args.records
        rows = [
            ("--topics sel (10 partitions read)", ["--topics", "sel"], ["sel"], selected, "sel", selected),
            ("--from latest (10 partitions read)", ["--from", "latest"], ["sel"], 0, "sel", selected),
            ("everything (every partition read)", [], None, total, "sel|bulk-.*", total),
        ][2 if args.everything_only else 0:]
        variants: list[tuple[str, dict[str, str]]] = [("", {})]
        if args.untuned:
            variants.append((", kafka-python's own receive path", {"LOGFS_KAFKA_PYTHON_TUNING": "0"}))
        results = []
        runs = [(f"{name}{suffix}", *rest, env) for _ in range(args.rounds)
                for (name, *rest) in rows for suffix, env in variants]
        for i, (name, mount_args, read_topics, expected, pattern, kafka_records, env) in enumerate(runs):
            try:
                row = _logfs_row(cluster.bootstrap, base / f"logfs-{i}", mount_args, read_topics, expected,
                                 args.glob, env)
                perf = _consumer_perf(cluster.bootstrap, base / f"logfs-{i}", pattern, kafka_records)
            except (SystemExit, Exception) as exc:      # say it, and measure the other rows
                print(f"{name}: failed: {exc}", flush=True)
                continue
            print(name, row, perf, flush=True)
            results.append((name, row, perf))
    finally:
        cluster.stop()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(base)], check=False)
    print()
    print(f"| {args.partitions} partitions, {args.records} records each | mount ready s | read s (mount's CPU s) "
          "| partitions read "
          "| disk MB | RSS MB (peak) | open files | ConsumerPerformance s (consume) | its peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row, perf in results:
        print(f"| {name} | {row['ready']:.2f} | {row['read']:.2f} ({row['cpu']:.2f}) | {row['partitions']:.0f} "
              f"| {row['disk']:.1f} "
              f"| {row['rss']:.0f} ({row['hwm']:.0f}) | {row['fds']:.0f} | {perf['wall']:.1f} ({perf['consume']:.2f}) "
              f"| {perf['rss']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
