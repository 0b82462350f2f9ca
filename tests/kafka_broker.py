"""A real Apache Kafka broker for the tests: single-node KRaft (broker and controller in one JVM).

The jars are the released ones ``scripts/setup-kafka.sh`` fetches from Maven Central
into ``~/.cache/logfs/kafka-<version>/libs`` (or ``$LOGFS_KAFKA_LIBS``).  The
broker listens on 127.0.0.1 on free ports, keeps its ``log.dirs`` in a temporary
directory, and stops cleanly (SIGTERM, which writes ``.kafka_cleanshutdown``) or
crashes (SIGKILL).  A missing install is an error, never a skip: the tests must
fail when Kafka is not there.

The ``kafka_broker`` fixture is registered for every test module by
``pytest_plugins`` in ``tests/conftest.py``; a module asks for it by name and
gets its own broker (module scope: a JVM start costs seconds on this machine).

Every test that starts a JVM is marked ``kafka``, so the fast loop
``pytest -m "not mount and not kafka and not spark"`` starts none:
:func:`java_command`, the one way the tests build a ``java`` command line,
fails a test that is not marked (see :func:`require_kafka_marker`).
"""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ROOT

POM = ROOT / "scripts" / "kafka" / "pom.xml"

#: Small heap: the machine has two cores and little to spare for a JVM.
JVM_OPTS = ["-Xmx512m", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


def kafka_version() -> str:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    assert match, f"no kafka.version in {POM}"
    return match.group(1)


def kafka_libs() -> Path:
    """The directory of Kafka's jars; fails (never skips) when scripts/setup-kafka.sh has not fetched them."""
    env = os.environ.get("LOGFS_KAFKA_LIBS")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    libs = Path(env) if env else cache / "logfs" / f"kafka-{kafka_version()}" / "libs"
    if not (libs / ".complete").exists():
        raise RuntimeError(f"Apache Kafka's jars are not in {libs}: run scripts/setup-kafka.sh")
    return libs


#: the test pytest is setting up, running or tearing down (None outside pytest: scripts/bench_kafka.py)
_current_test: pytest.Item | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _current_test
    _current_test = item      # before its fixtures: a module-scoped broker starts in its first test's setup


def require_marker(marker: str, what: str) -> None:
    """Fail the current test unless it is marked ``marker`` (it is about to start a JVM: ``kafka``, ``spark``)."""
    item = _current_test
    if item is not None and item.get_closest_marker(marker) is None:
        raise RuntimeError(f"{item.nodeid} starts a JVM ({what}) but is not marked @pytest.mark.{marker}: "
                           "the fast loop `pytest -m \"not mount and not kafka and not spark\"` would run it")


def require_kafka_marker(what: str) -> None:
    """Fail the current test unless it is marked ``kafka`` (a broker, one of Kafka's tools, Java itself)."""
    require_marker("kafka", what)


def java_command(main_class: str, *args: str, jvm_opts: list[str] | None = None,
                 log4j_config: Path | None = None) -> list[str]:
    """``java -cp LIBS/* MAIN ARGS``: a class of the released Kafka jars, run as kafka-run-class.sh would."""
    require_kafka_marker(main_class)
    cmd = ["java", *(jvm_opts if jvm_opts is not None else JVM_OPTS)]
    if log4j_config is not None:
        cmd.append(f"-Dlog4j2.configurationFile={log4j_config}")
    return [*cmd, "-cp", str(kafka_libs() / "*"), main_class, *args]


#: A short-lived tool starts fastest with the client compiler only and a small serial heap.
TOOL_JVM_OPTS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


def run_tool(main_class: str, *args: str, timeout: float = 300.0, check: bool = True,
             base: Path | None = None, jvm_opts: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run one of Kafka's command-line tools (DumpLogSegments, ProducerPerformance, ...) to completion.

    ``jvm_opts`` defaults to TOOL_JVM_OPTS; a benchmark passes JVM_OPTS (full JIT).
    """
    log4j = None
    if base is not None:   # tools log to stderr by default; keep only warnings, in a file
        log4j = base / "tool-log4j2.properties"
        log4j.write_text(LOG4J2.format(log=base / "tool.log", level="WARN"))
    cmd = java_command(main_class, *args, jvm_opts=TOOL_JVM_OPTS if jvm_opts is None else jvm_opts,
                       log4j_config=log4j)
    result = subprocess.run(cmd, capture_output=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{main_class} exited {result.returncode}:\n"
                             f"{result.stderr.decode(errors='replace')[-5000:]}")
    return result


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaBroker:
    """One single-node KRaft broker process over ``base/data`` (its only entry of ``log.dirs``)."""

    def __init__(self, base: Path, overrides: dict[str, str] | None = None) -> None:
        self.base = base
        self.log_dir = base / "data"
        self.config_file = base / "server.properties"
        self.log_file = base / "broker.log"
        self.port = _free_port()
        self.controller_port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        base.mkdir(parents=True, exist_ok=True)
        self.properties = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            # one node: internal topics cannot have more replicas than brokers
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "2",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.io.threads": "2",
            "num.network.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "background.threads": "2",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            "log.cleaner.backoff.ms": "500",
            **(overrides or {}),
        }

    # ---- lifecycle

    def format(self) -> None:
        """``kafka-storage.sh format``: meta.properties and the bootstrap metadata in the log dir."""
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in self.properties.items()))
        cluster_id = "-"
        while cluster_id.startswith("-"):   # as Kafka's Uuid.randomUuid: "-..." would parse as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        run_tool("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_file),
                 "--ignore-formatted", base=self.base)

    def start(self, timeout: float = 120.0) -> KafkaBroker:
        if not (self.log_dir / "meta.properties").exists():
            self.format()
        log4j = self.base / "log4j2.properties"
        log4j.write_text(LOG4J2.format(log=self.log_file, level="INFO"))
        cmd = java_command("kafka.Kafka", str(self.config_file), log4j_config=log4j)
        out = open(self.base / "broker.out", "ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.base)
        out.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"Kafka broker exited with {self.proc and self.proc.returncode}:\n{self.log()}")
            try:
                # the listener first (cheap), so kafka-python's reconnect backoff never delays the start
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
                try:
                    admin.describe_cluster()
                    return
                finally:
                    admin.close()
            except (KafkaError, OSError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"Kafka broker not ready after {timeout}s:\n{self.log()}")
            time.sleep(0.5)

    def stop(self, timeout: float = 120.0) -> int:
        """Clean shutdown (SIGTERM): the broker flushes, checkpoints and writes ``.kafka_cleanshutdown``."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.proc = None
        return code

    def kill(self) -> None:
        """A crash: SIGKILL, no flush, no checkpoints, no clean-shutdown marker."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def log(self) -> str:
        """The JVM's own output, the broker's warnings and errors, and the last lines of its log."""
        parts = []
        try:
            parts.append((self.base / "broker.out").read_text(errors="replace")[-4000:])
        except FileNotFoundError:
            pass
        try:
            lines = [line for line in self.log_file.read_text(errors="replace").splitlines()
                     if line.startswith("[")]   # skip the multi-line config dumps
        except FileNotFoundError:
            lines = []
        parts += [line for line in lines if "] WARN " in line or "] ERROR " in line][-30:]
        parts += lines[-30:]
        return "\n".join(parts)

    # ---- conveniences

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config or {})])
        finally:
            admin.close()
        self.wait_for(lambda: all((self.log_dir / f"{name}-{p}").is_dir() for p in range(partitions)),
                      f"partition directories of {name}")

    def wait_for(self, condition, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.log()[-3000:]}")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def kafka_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One broker per test module. Options: a module-level ``KAFKA_BROKER_OPTIONS`` dict of server.properties."""
    overrides = getattr(request.module, "KAFKA_BROKER_OPTIONS", None)
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), overrides)
    broker.start()
    try:
        yield broker
    finally:
        if broker.proc is not None:
            broker.stop()


# --------------------------------------------------------------------------- reading and comparing


class Seen(tuple):
    """One record as a consumer sees it: (offset, timestamp, timestamp_type, key, value, headers)."""

    __slots__ = ()

    def __new__(cls, offset: int, timestamp: int, timestamp_type: int, key: bytes | None,
                value: bytes | None, headers: tuple[tuple[str, bytes | None], ...]) -> Seen:
        return tuple.__new__(cls, (offset, timestamp, timestamp_type, key, value, tuple(headers)))

    offset = property(lambda self: self[0])
    value = property(lambda self: self[4])


def consume_all(bootstrap: str, topic: str, *, isolation_level: str = "read_uncommitted",
                timeout: float = 60.0) -> dict[int, list[Seen]]:
    """Every record of every partition of ``topic``, read by a kafka-python consumer from the broker.

    Reads from the log start to the end offsets the broker reports for this
    isolation level (the last stable offset for read_committed).
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level,
                             enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        out: dict[int, list[Seen]] = {tp.partition: [] for tp in partitions}
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                raise AssertionError(f"consumer did not reach the end offsets {ends} of {topic}")
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition] += [Seen(r.offset, r.timestamp, r.timestamp_type, r.key, r.value,
                                           tuple((k, v) for k, v in (r.headers or ()))) for r in records]
        return out
    finally:
        consumer.close()


def hash_tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: (kind, size, mtime, SHA-256 of a file's bytes). Any write changes it."""
    import hashlib

    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if path.is_file():
                out[rel] = ("f", st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                out[rel] = ("d", st.st_mtime_ns)
    return out


def seen_from_json(row: dict) -> Seen:
    """A records.jsonl row of the mount, decoded back to bytes (README: base64 for non-UTF-8)."""
    def field(value, encoding):
        if value is None:
            return None
        return base64.b64decode(value) if encoding == "base64" else value.encode()

    headers = tuple((h["key"], field(h["value"], h.get("valueEncoding"))) for h in row.get("headers", ()))
    return Seen(row["offset"], row["timestamp"], row["timestampType"], field(row["key"], row.get("keyEncoding")),
                field(row["value"], row.get("valueEncoding")), headers)
