"""Apache Kafka's JVMs for the tests and the benchmarks: one home for each fact of their set-up.

The jars are the released ones ``scripts/setup-kafka.sh`` fetches from Maven Central into
``~/.cache/logfs/kafka-<version>/libs`` (or ``$LOGFS_KAFKA_LIBS``); a missing install is an error,
never a skip.  Here are the JVM options, the log4j2 configuration, the ``java`` command line (the
one way the tests and benchmarks build one: it calls :data:`java_guard` first, which the test suite
sets so that a test not marked ``kafka`` is refused, see tests/markers.py), Kafka's command-line
tools, free ports, ``kafka-storage format``, the server.properties of a KRaft node, and
:class:`KafkaProcess`, one broker+controller JVM: started, waited for, stopped (SIGTERM, which
writes ``.kafka_cleanshutdown``) or crashed (SIGKILL).  devtools/kafka.py (one node, three) builds
on it.
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
from pathlib import Path
from typing import TYPE_CHECKING

from devtools import ROOT
from devtools.process import ChildProcess

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

POM = ROOT / "scripts" / "kafka" / "pom.xml"

#: A broker's JVM: a small heap, the machine has two cores and little to spare (benchmarks' tools use it too).
JVM_OPTS = ["-Xmx512m", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]

#: A short-lived tool starts fastest with the client compiler only and a small serial heap.
TOOL_JVM_OPTS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]

#: A node of a 3-node cluster: three JVMs share two cores and little memory.
CLUSTER_JVM_OPTS = ["-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                    "-Djava.awt.headless=true"]

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


def write_log4j(config: Path, log: Path, level: str) -> Path:
    """A log4j2 configuration at ``config`` sending the JVM's log at ``level`` and above to the file ``log``."""
    config.write_text(LOG4J2.format(log=log, level=level))
    return config


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


#: called with the main class before every ``java`` command line is built, and may refuse it: the test suite
#: sets it (tests/markers.py: a test not marked ``kafka`` starts no JVM); None for the benchmarks
java_guard: Callable[[str], None] | None = None


def java_command(main_class: str, *args: str, jvm_opts: list[str] | None = None,
                 log4j_config: Path | None = None) -> list[str]:
    """``java -cp LIBS/* MAIN ARGS``: a class of the released Kafka jars, run as kafka-run-class.sh would."""
    if java_guard is not None:
        java_guard(main_class)
    cmd = ["java", *(jvm_opts if jvm_opts is not None else JVM_OPTS)]
    if log4j_config is not None:
        cmd.append(f"-Dlog4j2.configurationFile={log4j_config}")
    return [*cmd, "-cp", str(kafka_libs() / "*"), main_class, *args]


def run_tool(main_class: str, *args: str, timeout: float = 300.0, check: bool = True,
             base: Path | None = None, jvm_opts: list[str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run one of Kafka's command-line tools (DumpLogSegments, ProducerPerformance, ...) to completion.

    ``jvm_opts`` defaults to TOOL_JVM_OPTS; a benchmark passes JVM_OPTS (full JIT).
    """
    log4j = None
    if base is not None:   # tools log to stderr by default; keep only warnings, in a file
        log4j = write_log4j(base / "tool-log4j2.properties", base / "tool.log", "WARN")
    cmd = java_command(main_class, *args, jvm_opts=TOOL_JVM_OPTS if jvm_opts is None else jvm_opts,
                       log4j_config=log4j)
    result = subprocess.run(cmd, capture_output=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{main_class} exited {result.returncode}:\n"
                             f"{result.stderr.decode(errors='replace')[-5000:]}")
    return result


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: the kernel's pick, never a fixed number, so
    parallel workers (and other runs) get different ones."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_cluster_id() -> str:
    """A random cluster id as Kafka's ``Uuid.randomUuid`` makes one (never starting with ``-``: an option)."""
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    return cluster_id


def kraft_properties(node_id: int, port: int, controller_port: int, voters: str, log_dir: Path,
                     replicas: int) -> dict[str, str]:
    """server.properties of a combined broker+controller KRaft node on 127.0.0.1, small for this machine.

    ``replicas``: the replication factor of the internal topics (1 for a single node, 3 for the cluster).
    """
    min_isr = str(min(2, replicas))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "2",
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        "num.io.threads": "2",
        "num.network.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "background.threads": "2",
        "log.cleaner.threads": "1",
    }


def brokers_registered(bootstrap: str) -> int:
    """How many brokers the cluster's metadata lists (-1 while no broker answers)."""
    from confluent_kafka.admin import AdminClient

    try:
        md = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000}).list_topics(timeout=5)
    except Exception:
        return -1
    return len(md.brokers)


class KafkaProcess(ChildProcess):
    """One combined broker+controller JVM over ``base``: ``server.properties``, ``broker.log``, ``data/``."""

    def __init__(self, base: Path, port: int, controller_port: int) -> None:
        self.base = base
        self.port = port
        self.controller_port = controller_port
        self.log_dir = base / "data"
        self.config_file = base / "server.properties"
        self.log_file = base / "broker.log"
        base.mkdir(parents=True, exist_ok=True)

    def write_config(self, properties: dict[str, str]) -> None:
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))

    def format(self, cluster_id: str, *extra: str) -> None:
        """``kafka-storage.sh format``: meta.properties and the bootstrap metadata in the log dir."""
        run_tool("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_file), *extra,
                 "--ignore-formatted", base=self.base)

    def launch(self, jvm_opts: list[str] | None = None) -> None:
        """Start the JVM (not waiting for it: see :func:`wait_for_kafka`)."""
        log4j = write_log4j(self.base / "log4j2.properties", self.log_file, "INFO")
        cmd = java_command("kafka.Kafka", str(self.config_file), jvm_opts=jvm_opts, log4j_config=log4j)
        with open(self.base / "broker.out", "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.base)

    def listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def exited(self) -> int | None:
        """The exit code of a JVM that was started and has ended (None: running, or never started)."""
        return None if self.proc is None else self.proc.poll()

    def signal_stop(self) -> None:
        """SIGTERM: the clean shutdown begins (flush, checkpoints, ``.kafka_cleanshutdown``)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 120.0) -> int:
        """Clean shutdown and its exit code; past ``timeout`` the JVM is killed (a crash: SIGKILL, no flush,
        no checkpoints, no clean-shutdown marker) and TimeoutExpired raised."""
        self.signal_stop()
        return self.wait_stopped(timeout)

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


def wait_for_kafka(condition: Callable[[], object], what: str, timeout: float,
                   processes: Iterable[KafkaProcess], log: Callable[[], str]) -> None:
    """Poll ``condition`` until true; fail at once when one of ``processes`` exits, and after ``timeout`` s."""
    processes = list(processes)
    deadline = time.monotonic() + timeout
    while not condition():
        for p in processes:
            if (code := p.exited()) is not None:
                raise RuntimeError(f"Kafka JVM in {p.base} exited with {code} while waiting for {what}:\n{p.log()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}:\n{log()[-6000:]}")
        time.sleep(0.2)
