"""Real Apache Kafka for the tests and the benchmarks: a single-node KRaft broker and a 3-node KRaft cluster.

Built on devtools/jvm.py (the jars, the JVM, the ``java`` command, ports, formatting, stopping).

* :class:`KafkaBroker`: one node, broker and controller in one JVM, on free ports of 127.0.0.1, its
  ``log.dirs`` under the directory it is given; stopped cleanly (SIGTERM, which writes
  ``.kafka_cleanshutdown``) or crashed (SIGKILL).
* :class:`KafkaCluster` (issue 20, SPEC.md section 10): three combined broker+controller KRaft nodes
  from the same jars, replication factor 3 and ``min.insync.replicas=2`` as defaults, small heaps (the
  machine has two cores).  Readiness is observed, never slept for: every node's listener, then a
  metadata response listing all three brokers.

The tests' fixtures over them (one broker or cluster per test module) are in tests/kafka_broker.py and
tests/kafka_cluster.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devtools.jvm import (
    CLUSTER_JVM_OPTS,
    KafkaProcess,
    brokers_registered,
    free_port,
    kraft_properties,
    new_cluster_id,
    run_tool,
    wait_for_kafka,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


class KafkaBroker(KafkaProcess):
    """One single-node KRaft broker process over ``base/data`` (its only entry of ``log.dirs``)."""

    def __init__(self, base: Path, overrides: dict[str, str] | None = None) -> None:
        super().__init__(base, free_port(), free_port())
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.properties = {
            **kraft_properties(1, self.port, self.controller_port, f"1@127.0.0.1:{self.controller_port}",
                               self.log_dir, replicas=1),
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            "log.cleaner.backoff.ms": "500",
            **(overrides or {}),
        }

    # ---- lifecycle

    def format(self, *extra: str) -> None:
        """``kafka-storage.sh format`` of this broker's properties (``extra``: more arguments of the tool)."""
        self.write_config(self.properties)
        super().format(new_cluster_id(), *extra)

    def start(self, timeout: float = 120.0) -> KafkaBroker:
        if not (self.log_dir / "meta.properties").exists():
            self.format()
        self.launch()
        try:
            self.wait_for(lambda: self.listening() and brokers_registered(self.bootstrap) == 1,
                          "the broker to answer", timeout)
        except BaseException:
            self.kill()
            raise
        return self

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

    def wait_for(self, condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
        wait_for_kafka(condition, what, timeout, [self], self.log)


class ClusterNode(KafkaProcess):
    """One combined broker+controller process of a :class:`KafkaCluster`."""

    def __init__(self, base: Path, node_id: int, port: int, controller_port: int) -> None:
        super().__init__(base, port, controller_port)
        self.node_id = node_id

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.launch(CLUSTER_JVM_OPTS)


class KafkaCluster:
    """Three KRaft nodes, each broker and controller, replication factor 3, ``min.insync.replicas=2``."""

    SIZE = 3

    def __init__(self, base: Path, overrides: dict[str, str] | None = None) -> None:
        self.base = base
        self.nodes = [ClusterNode(base / f"node{i + 1}", i + 1, free_port(), free_port()) for i in range(self.SIZE)]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        self.bootstrap = ",".join(n.address for n in self.nodes)
        for node in self.nodes:
            node.write_config({
                **kraft_properties(node.node_id, node.port, node.controller_port, voters, node.log_dir, replicas=3),
                "default.replication.factor": "3",
                "min.insync.replicas": "2",
                "offsets.topic.num.partitions": "5",
                "num.replica.fetchers": "1",
                "log.cleaner.dedupe.buffer.size": str(4 * 1024 * 1024),
                # a dead broker leaves the ISR quickly, so acks=all writes resume within seconds
                "replica.lag.time.max.ms": "5000",
                "broker.session.timeout.ms": "4000",
                "broker.heartbeat.interval.ms": "500",
                "controller.quorum.fetch.timeout.ms": "4000",
                "controller.quorum.election.timeout.ms": "1000",
                "unclean.leader.election.enable": "false",
                **(overrides or {}),
            })

    def start(self, timeout: float = 240.0) -> KafkaCluster:
        cluster_id = new_cluster_id()
        for node in self.nodes:
            node.format(cluster_id)
        for node in self.nodes:
            node.start()
        try:
            self.wait_ready(timeout)
        except BaseException:
            for node in self.nodes:
                node.kill()
            raise
        return self

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Every running node listens and the cluster reports all of them as brokers."""
        self.wait_for(lambda: all(n.listening() for n in self.running())
                      and self.broker_count() == len(self.running()), "every node's listener and broker", timeout)

    def running(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.proc is not None]

    def _admin(self) -> Any:     # Any: confluent_kafka's AdminClient (untyped)
        from confluent_kafka.admin import AdminClient
        return AdminClient({"bootstrap.servers": ",".join(n.address for n in self.running()) or self.bootstrap,
                            "socket.timeout.ms": 5000})

    def broker_count(self) -> int:
        """Brokers in the metadata the running nodes give (-1 while none answers)."""
        return brokers_registered(",".join(n.address for n in self.running()) or self.bootstrap)

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

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to every node at once (one by one, the last would wait for a quorum that is gone);
        a node still running after ``timeout`` is killed."""
        for node in self.running():
            node.signal_stop()
        for node in self.nodes:
            node.wait_stopped(timeout, kill=True)

    def log(self) -> str:
        return "\n".join(f"--- node {n.node_id}\n{n.log()}" for n in self.nodes)

    def wait_for(self, condition: Callable[[], object], what: str, timeout: float = 120.0) -> None:
        wait_for_kafka(condition, what, timeout, self.running(), self.log)
