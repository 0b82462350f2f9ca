#!/usr/bin/env python3
"""Every producer's batches beside logfs's own: one run, one broker, the same values read five ways.

A single-node Kafka broker (scripts/kafka-broker.sh, the jars scripts/setup-kafka.sh fetched) gets one
topic per (compression, value size), written by Kafka's ``ProducerPerformance`` (``acks=1 linger.ms=5
batch.size=65536``), and one topic of keyed records with headers written by librdkafka (``kcat -P -K: -H``).
Each topic is then read whole, and timed, by:

* ``kcat -C -e -f '%s\\n'`` (librdkafka; and ``-J``, its JSON, beside ``records.jsonl``);
* Kafka's ``ConsumerPerformance`` (its rebalance + fetch time, as it reports them);
* the cluster mount (``logfs mount --bootstrap-server``): ``cat MNT/t/0/records`` from the first open to the
  last line, then ``records.jsonl``;
* the broker's log dir mounted ``--read-only`` (a fresh mount for each first read: ``records``, then
  ``records.jsonl``);
* logfs's own batches of the same values (``cat values >> t/0/append`` on a mount of their own, the topic's
  ``compression.type`` the producer's codec, the ``.viewindex`` files removed, then the same first reads on
  a ``--read-only`` mount).

    .venv/bin/python scripts/bench/bench_producers.py [--records 1000000] [--records-1k 200000]
                                                      [--codecs none,lz4,zstd] [--keyed 200000]

It prints one table (seconds, best of ``--repeat``) with the ratios the issue asks for: the read-only
mount against logfs's own batches, the cluster mount against kcat.  The load average is printed before
and after (the machine may be shared).  Nothing of tests/ is imported: the broker is the script's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devtools.bench import wait_mounted  # noqa: E402

LOGFS = ROOT / ".venv" / "bin" / "logfs"
BROKER = ROOT / "scripts" / "kafka-broker.sh"
PRODUCER = ["acks=1", "linger.ms=5", "batch.size=65536"]


def _kafka_libs() -> Path:
    version = re.search(r"<kafka.version>(.*)</kafka.version>", (ROOT / "scripts/kafka/pom.xml").read_text())
    assert version is not None
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    libs = Path(os.environ.get("LOGFS_KAFKA_LIBS", cache / "logfs" / f"kafka-{version.group(1)}" / "libs"))
    if not libs.is_dir():
        raise SystemExit(f"Apache Kafka's jars are not in {libs}: run scripts/setup-kafka.sh")
    return libs


def _java(tool: str, *args: str) -> str:
    command = ["java", "-Xmx512m", "-Djava.awt.headless=true", "-Dlog4j2.level=WARN", "-cp",
               f"{_kafka_libs()}/*", tool, *args]
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=1800).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: what the mounts run: this checkout, or another one's code (``--code``, for a before/after)
CODE = ROOT


def _timed(command: str, cwd: Path | None = None, expect: int | None = None) -> float:
    """Seconds ``command`` (a pipeline ending in ``wc -c``) took; ``expect``: the byte count it must print."""
    start = time.perf_counter()
    out = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, check=True, capture_output=True,
                         text=True).stdout
    elapsed = time.perf_counter() - start
    if expect is not None and int(out.split()[0]) != expect:
        raise SystemExit(f"{command} printed {out.strip()} bytes, {expect} expected")
    return elapsed


def _best(command: str, repeat: int, cwd: Path | None = None) -> float:
    return min(_timed(command, cwd) for _ in range(repeat))


class Mount:
    """``logfs mount MNT ARGS...`` of this checkout, until ``stop``."""

    def __init__(self, mnt: Path, args: list[str], log: Path) -> None:
        mnt.mkdir(parents=True, exist_ok=True)
        self.mnt = mnt
        env = dict(os.environ, PYTHONPATH=str(CODE))
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([str(LOGFS), "mount", str(mnt), *args], stdout=out,
                                         stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        wait_mounted(mnt, self.proc, log, 120, f"logfs mount {mnt}")

    def rss_mb(self) -> float:
        """The mount's resident memory (VmRSS), MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        subprocess.run(["fusermount3", "-u", str(self.mnt)], check=False)
        self.proc.wait(timeout=300)


def _first_read(view: str, args: list[str], base: Path, repeat: int, expect: int | None = None) -> float:
    """The best of ``repeat`` first reads of ``view`` (a path under the mount), each on a fresh mount."""
    times = []
    for _ in range(repeat):
        mount = Mount(base / "ro", args, base / "ro.log")
        try:
            times.append(_timed(f"cat {view} | wc -c", mount.mnt, expect))
        finally:
            mount.stop()
    return min(times)


def _engine_child(partition_dir: Path) -> None:
    """Print (JSON) CPU seconds of a first and a second read of each view of a copy of the partition, in this
    process (the engine alone, no FUSE): the first read builds the view index (the catch-up) and renders."""
    import json
    import logging
    logging.disable(logging.WARNING)
    from engine.config import LogConfig
    from engine.log import Log
    from engine.views import LogView, ViewFormat

    def read(log: Log, fmt: ViewFormat) -> None:
        view, position = LogView(log, fmt), 0
        while piece := view.read(position, 1 << 20):
            position += len(piece)
        view.close()

    best: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-producers-engine-"))
    try:
        for _ in range(3):
            for fmt in ViewFormat:
                copy = work / partition_dir.name
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(partition_dir, copy, ignore=shutil.ignore_patterns("*.viewindex"))
                log = Log.load(str(copy), LogConfig.from_props({}), had_clean_shutdown=True)
                start = time.process_time()
                read(log, fmt)
                middle = time.process_time()
                read(log, fmt)
                end = time.process_time()
                log.close()
                for name, seconds in ((f"first {fmt.value}", middle - start), (f"again {fmt.value}", end - middle)):
                    best[name] = min(best.get(name, seconds), seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(best))


def _codec_of(values: Path) -> str:
    """The codec of the topic whose values ``values`` holds (``perf-zstd-100.values``: zstd)."""
    return values.stem.split("-")[1]


def _build_own(partition_dir: Path, values: Path) -> None:
    """logfs's own batches of the lines of ``values``: 10,000 lines a batch, as ``cat >> append`` writes them,
    compressed with the producer's codec (the topic's ``compression.type``)."""
    from engine.config import LogConfig
    from engine.log import Log
    codec = _codec_of(values)
    log = Log.load(str(partition_dir), LogConfig.from_props({} if codec == "none" else {"compression.type": codec}))
    lines = values.read_bytes().split(b"\n")[:-1]
    for i in range(0, len(lines), 10_000):
        log.append_text_lines(b"\n".join(lines[i:i + 10_000]) + b"\n")
    log.close()


def _engine(partition_dir: Path, code: Path) -> dict[str, float]:
    import json
    # the mount's malloc settings (logfs.cli): without them glibc's dynamic mmap threshold lets a process
    # that freed big blocks before serve later ones from its heap, which times the allocator, not the code
    env = dict(os.environ, PYTHONPATH=str(code), MALLOC_ARENA_MAX="2", MALLOC_MMAP_THRESHOLD_=str(4 << 20),
               MALLOC_TRIM_THRESHOLD_=str(8 << 20))
    out = subprocess.run([sys.executable, __file__, "--engine-child", str(partition_dir)], check=True,
                         capture_output=True, text=True, env=env).stdout
    return dict(json.loads(out.splitlines()[-1]))


def _engine_table(base: Path, codes: list[Path]) -> None:
    """The engine's CPU seconds per partition of the kept broker dir and of logfs's own batches of its values."""
    own_dirs = []
    for values in sorted(base.glob("perf-*.values")):
        own = base / "engine-own" / f"{values.stem}-own-0"
        if not (own / "00000000000000000000.log").exists():
            shutil.rmtree(own, ignore_errors=True)
            subprocess.run([sys.executable, __file__, "--build-own", str(own), str(values)], check=True,
                           env=dict(os.environ, PYTHONPATH=str(codes[-1])))
        own_dirs.append(own)
    dirs = sorted(p for p in (base / "broker").glob("*-0") if not p.name.startswith("__")) + own_dirs
    names = ["first text", "again text", "first jsonl", "again jsonl"]
    print(f"\nengine CPU seconds (best of 3; load average {_loadavg()})\n")
    print("| partition | " + " | ".join(f"{n} [{c.name}]" for c in codes for n in names) + " |")
    print("|---|" + "---:|" * (len(names) * len(codes)))
    for partition in dirs:
        cells = []
        for code in codes:
            found = _engine(partition, code)
            cells += [f"{found[n]:.3f}" for n in names]
        print(f"| {partition.name} | " + " | ".join(cells) + " |", flush=True)


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="records of 100 B per topic")
    parser.add_argument("--records-1k", type=int, default=200_000, help="records of 1 KB per topic (0: none)")
    parser.add_argument("--codecs", default="none,lz4,zstd")
    parser.add_argument("--keyed", type=int, default=200_000, help="keyed records with headers, by kcat (0: none)")
    parser.add_argument("--repeat", type=int, default=2, help="best of N for each timing")
    parser.add_argument("--dir", type=Path, help="where the work dir is made (and kept; default: a temporary "
                                                 "one, removed)")
    parser.add_argument("--reuse", type=Path, help="a work dir kept by --dir: its broker's topics, not written again")
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster mount")
    parser.add_argument("--engine", action="store_true",
                        help="only the engine's CPU seconds of first and second reads of each view (no FUSE, no "
                             "broker: a --reuse dir's partitions and logfs's own batches of the same values)")
    parser.add_argument("--engine-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--build-own", type=Path, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, action="append",
                        help="a checkout whose code the mounts run (its C extension built); given twice, a "
                             "before/after: each mount's row once per checkout (default: this one)")
    args = parser.parse_args()
    if args.engine_child is not None or args.build_own is not None:
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(ROOT)))
        if args.build_own is not None:
            _build_own(*args.build_own)
        else:
            _engine_child(args.engine_child)
        return 0
    global CODE
    codes = [code.resolve() for code in args.code or [ROOT]]
    if shutil.which("kcat") is None:
        subprocess.run(["bash", "-c", f"source {ROOT}/scripts/apt-install.sh && apt_install kcat"], check=True)
    reuse = args.reuse is not None
    base = args.reuse.resolve() if reuse else Path(tempfile.mkdtemp(prefix="bench-producers-", dir=args.dir))
    logdir = base / "broker"
    port = _free_port()
    bootstrap = f"127.0.0.1:{port}"
    print(f"load average before: {_loadavg()}", flush=True)
    if args.engine:
        if not reuse:
            raise SystemExit("--engine reads the partitions of a --reuse dir")
        _engine_table(base, codes)
        return 0
    subprocess.run(["bash", str(BROKER), "--daemon", "--port", str(port), str(logdir)], check=True,
                   stdout=subprocess.DEVNULL)
    rows: dict[str, dict[str, float]] = {}
    topics: list[tuple[str, str, int, int]] = []       # (topic, codec, value size, records)
    try:
        for codec in args.codecs.split(","):
            topics.append((f"perf-{codec}-100", codec, 100, args.records))
            if args.records_1k:
                topics.append((f"perf-{codec}-1000", codec, 1000, args.records_1k))
        for topic, codec, size, records in topics:
            if reuse:
                continue
            _java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--create", "--topic",
                  topic, "--partitions", "1", "--replication-factor", "1")
            props = [p for prop in [*PRODUCER, f"compression.type={codec}"] for p in ("--command-property", prop)]
            _java("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(records),
                  "--record-size", str(size), "--throughput", "-1", "--bootstrap-server", bootstrap, *props)
            print(f"produced {records} records of {size} B to {topic} ({codec})", flush=True)
        if args.keyed:
            keyed = base / "keyed.txt"
            with open(keyed, "w") as out:
                for i in range(args.keyed):
                    out.write(f"user-{i % 5000}:{{\"n\":{i},\"event\":\"click\",\"page\":\"/p/{i % 977}\"}}\n")
            for codec in args.codecs.split(","):
                topic = f"keyed-{codec}-kcat"
                topics.append((topic, codec, 0, args.keyed))
                if reuse:
                    continue
                _java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--create",
                      "--topic", topic, "--partitions", "1", "--replication-factor", "1")
                subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", "0", "-K:", "-H",
                                "traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "-H",
                                "source=bench", "-z", codec, "-X", "linger.ms=5", "-l", str(keyed)], check=True)
                print(f"produced {args.keyed} keyed records with headers to {topic} by kcat ({codec})", flush=True)

        for topic, _codec, _size, records in topics:
            row = rows[topic] = {}
            values = base / f"{topic}.values"
            row["kcat"] = _best(f"kcat -C -e -q -b {bootstrap} -t {topic} -f '%s\\n' | wc -c", args.repeat)
            subprocess.run(["bash", "-c", f"kcat -C -e -q -b {bootstrap} -t {topic} -f '%s\\n' > {values}"],
                           check=True)
            row["kcat -J"] = _best(f"kcat -C -e -q -J -b {bootstrap} -t {topic} | wc -c", args.repeat)
            perf = _java("org.apache.kafka.tools.ConsumerPerformance", "--topic", topic, "--num-records",
                         str(records), "--bootstrap-server", bootstrap, "--timeout", "120000",
                         "--command-property", "auto.offset.reset=earliest")
            lines = [line for line in perf.splitlines() if line.strip()]
            fields = dict(zip([h.strip() for h in lines[-2].split(",")], [v.strip() for v in lines[-1].split(",")]))
            row["ConsumerPerformance"] = (float(fields["rebalance.time.ms"]) + float(fields["fetch.time.ms"])) / 1000
            for CODE in codes:
                if args.no_cluster:
                    break
                label = f" [{CODE.name}]" if len(codes) > 1 else ""
                shutil.rmtree(base / "cluster-data", ignore_errors=True)
                cluster = Mount(base / "cluster", ["--data-dir", str(base / "cluster-data"), "--bootstrap-server",
                                                   bootstrap], base / "cluster.log")
                try:
                    # the view grows as the replica catches up: read until its last line is there
                    size_of = values.stat().st_size
                    idle = cluster.rss_mb()
                    row["cluster records" + label] = _timed(
                        f"(tail -F -s 0.01 -c +1 {topic}/0/records 2>/dev/null || true) | head -c {size_of} | wc -c",
                        cluster.mnt, size_of)
                    row["cluster records.jsonl" + label] = _timed(f"cat {topic}/0/records.jsonl | wc -c",
                                                                  cluster.mnt)
                    row["cluster RSS MB" + label] = cluster.rss_mb() - idle
                finally:
                    cluster.stop()
            print(topic, {k: round(v, 2) for k, v in row.items()}, flush=True)
        # the broker holds its log dir's lock: the read-only mounts come after it stopped
        subprocess.run(["bash", str(BROKER), "--stop", str(logdir)], check=True, stdout=subprocess.DEVNULL)
        for topic, codec, size, _records in topics:
            row = rows[topic]
            ro = ["--data-dir", str(logdir), "--read-only"]
            size_of = (base / f"{topic}.values").stat().st_size
            own = base / "own"
            if size:
                shutil.rmtree(own, ignore_errors=True)
                CODE = codes[-1]
                mount = Mount(base / "own-mnt", ["--data-dir", str(own)], base / "own.log")
                try:
                    (mount.mnt / "t").mkdir()
                    if codec != "none":       # logfs's own batches compressed as the producer's were
                        with open(mount.mnt / "t" / "config", "a") as config:
                            config.write(f"compression.type={codec}\n")
                    subprocess.run(["bash", "-c", f"cat {base / topic}.values >> {mount.mnt}/t/0/append"],
                                   check=True)
                finally:
                    mount.stop()
                for index in own.glob("t-0/*.viewindex"):
                    index.unlink()          # a first read builds the view index, as on the broker's dir
            for CODE in codes:
                label = f" [{CODE.name}]" if len(codes) > 1 else ""
                row["read-only records" + label] = _first_read(f"{topic}/0/records", ro, base, args.repeat, size_of)
                row["read-only records.jsonl" + label] = _first_read(f"{topic}/0/records.jsonl", ro, base,
                                                                     args.repeat)
                if size:
                    ro_own = ["--data-dir", str(own), "--read-only"]
                    row["own records" + label] = _first_read("t/0/records", ro_own, base, args.repeat, size_of)
                    row["own records.jsonl" + label] = _first_read("t/0/records.jsonl", ro_own, base, args.repeat)
            print(topic, {k: round(v, 2) for k, v in row.items()}, flush=True)
    finally:
        subprocess.run(["bash", str(BROKER), "--stop", str(logdir)], check=False, stdout=subprocess.DEVNULL)
        if args.dir is None and not reuse:
            shutil.rmtree(base, ignore_errors=True)

    columns = ["kcat", "kcat -J", "ConsumerPerformance"]
    pairs = []
    for code in codes:
        label = f" [{code.name}]" if len(codes) > 1 else ""
        columns += [name + label for name in ("cluster records", "cluster records.jsonl", "cluster RSS MB",
                                              "read-only records",
                                              "read-only records.jsonl", "own records", "own records.jsonl")]
        pairs += [("read-only records" + label, "own records" + label),
                  ("read-only records.jsonl" + label, "own records.jsonl" + label), ("cluster records" + label, "kcat"),
                  ("cluster records.jsonl" + label, "kcat -J")]
    print(f"\nload average after: {_loadavg()}; seconds, best of {args.repeat} (cluster mount: one read)\n")
    print("| topic | records | " + " | ".join(columns + [f"{a} / {b}" for a, b in pairs]) + " |")
    print("|---|---:|" + "---:|" * (len(columns) + len(pairs)))
    for topic, _codec, _size, records in topics:
        row = rows.get(topic, {})
        cells = [f"{row[name]:.2f}" if name in row else "" for name in columns]
        ratios = [f"{row[a] / row[b]:.2f}" if a in row and b in row and row[b] else "" for a, b in pairs]
        print(f"| {topic} | {records:,} | " + " | ".join(cells + ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
