"""A real 3-node Apache Kafka cluster for the cluster-mount tests (issue 20, SPEC.md section 10).

Three combined broker+controller KRaft nodes on 127.0.0.1, from the released
jars ``scripts/setup-kafka.sh`` fetches (see tests/kafka_broker.py), with
replication factor 3 and ``min.insync.replicas=2`` as defaults, small heaps
(the machine has two cores).  One cluster per test module (``kafka_cluster``
fixture); its JVMs are stopped at the end of the module.  Readiness is
observed, never slept for: every node's listener, then a metadata response
listing all three brokers, then a topic whose partitions all have three
in-sync replicas.
"""

from __future__ import annotations

import base64
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kafka_broker import LOG4J2, _free_port, java_command, run_tool

#: a node's heap: three JVMs share two cores and little memory
CLUSTER_JVM_OPTS = ["-Xmx256m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                    "-Djava.awt.headless=true"]


class ClusterNode:
    """One combined broker+controller process of a :class:`KafkaCluster`."""

    def __init__(self, base: Path, node_id: int, port: int, controller_port: int) -> None:
        self.base = base
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.log_dir = base / "data"
        self.config_file = base / "server.properties"
        self.log_file = base / "broker.log"
        self.proc: subprocess.Popen | None = None
        base.mkdir(parents=True, exist_ok=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        log4j = self.base / "log4j2.properties"
        log4j.write_text(LOG4J2.format(log=self.log_file, level="INFO"))
        cmd = java_command("kafka.Kafka", str(self.config_file), jvm_opts=CLUSTER_JVM_OPTS, log4j_config=log4j)
        out = open(self.base / "broker.out", "ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.base)
        out.close()

    def listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """A crash: SIGKILL."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        try:
            lines = [line for line in self.log_file.read_text(errors="replace").splitlines()
                     if line.startswith("[")]
        except FileNotFoundError:
            lines = []
        try:
            out = (self.base / "broker.out").read_text(errors="replace")[-2000:]
        except FileNotFoundError:
            out = ""
        return out + "\n".join([line for line in lines if "] ERROR " in line][-10:] + lines[-15:])


class KafkaCluster:
    """Three KRaft nodes, each broker and controller, replication factor 3, ``min.insync.replicas=2``."""

    SIZE = 3

    def __init__(self, base: Path, overrides: dict[str, str] | None = None) -> None:
        self.base = base
        ports = [(_free_port(), _free_port()) for _ in range(self.SIZE)]
        self.nodes = [ClusterNode(base / f"node{i + 1}", i + 1, p, c) for i, (p, c) in enumerate(ports)]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        self.bootstrap = ",".join(n.address for n in self.nodes)
        for node in self.nodes:
            props = {
                "process.roles": "broker,controller",
                "node.id": str(node.node_id),
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": str(node.log_dir),
                "num.partitions": "1",
                "default.replication.factor": "3",
                "min.insync.replicas": "2",
                "auto.create.topics.enable": "false",
                "offsets.topic.replication.factor": "3",
                "offsets.topic.num.partitions": "5",
                "transaction.state.log.replication.factor": "3",
                "transaction.state.log.min.isr": "2",
                "transaction.state.log.num.partitions": "2",
                "share.coordinator.state.topic.replication.factor": "3",
                "share.coordinator.state.topic.min.isr": "2",
                "group.initial.rebalance.delay.ms": "0",
                "num.io.threads": "2",
                "num.network.threads": "2",
                "num.replica.fetchers": "1",
                "num.recovery.threads.per.data.dir": "1",
                "background.threads": "2",
                "log.cleaner.threads": "1",
                "log.cleaner.dedupe.buffer.size": str(4 * 1024 * 1024),
                # a dead broker leaves the ISR quickly, so acks=all writes resume within seconds
                "replica.lag.time.max.ms": "5000",
                "broker.session.timeout.ms": "4000",
                "broker.heartbeat.interval.ms": "500",
                "controller.quorum.fetch.timeout.ms": "4000",
                "controller.quorum.election.timeout.ms": "1000",
                "unclean.leader.election.enable": "false",
                **(overrides or {}),
            }
            node.config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def start(self, timeout: float = 240.0) -> KafkaCluster:
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        for node in self.nodes:
            run_tool("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(node.config_file),
                     "--ignore-formatted", base=node.base)
        for node in self.nodes:
            node.start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Every running node listens and the cluster reports all of them as brokers."""
        deadline = time.monotonic() + timeout
        self.wait_for(lambda: all(n.listening() for n in self.running()), "every node's listener",
                      deadline - time.monotonic())
        self.wait_for(lambda: self.broker_count() == len(self.running()), "all brokers registered",
                      deadline - time.monotonic())

    def running(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.proc is not None]

    def _admin(self):
        from confluent_kafka.admin import AdminClient
        return AdminClient({"bootstrap.servers": ",".join(n.address for n in self.running()) or self.bootstrap,
                            "socket.timeout.ms": 5000})

    def broker_count(self) -> int:
        try:
            md = self._admin().list_topics(timeout=5)
        except Exception:
            return -1
        return len(md.brokers)

    def partition_state(self, topic: str, partition: int) -> tuple[int, list[int]]:
        """(leader, isr) of a partition, as the cluster's metadata says."""
        md = self._admin().list_topics(topic, timeout=10)
        p = md.topics[topic].partitions[partition]
        return p.leader, list(p.isrs)

    def node(self, node_id: int) -> ClusterNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def tool(self, main_class: str, *args: str, timeout: float = 120.0) -> str:
        result = run_tool(main_class, *args, timeout=timeout, base=self.base)
        return result.stdout.decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM to every node at once (one by one, the last would wait for a quorum that is gone)."""
        for node in self.running():
            node.proc.send_signal(signal.SIGTERM)   # type: ignore[union-attr]
        for node in self.nodes:
            node.stop()

    def log(self) -> str:
        return "\n".join(f"--- node {n.node_id}\n{n.log()}" for n in self.nodes)

    def wait_for(self, condition, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is not None:
                    raise RuntimeError(f"Kafka node {n.node_id} exited with {n.proc.returncode}:\n{n.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.log()[-6000:]}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One 3-node cluster per test module; its JVMs stop at the end of the module."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
