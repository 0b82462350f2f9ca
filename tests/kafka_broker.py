"""A real Apache Kafka broker for the tests: single-node KRaft (broker and controller in one JVM).

Built on tests/jvm.py (the jars, the JVM, the ``java`` command, ports, formatting, stopping).  The
broker listens on 127.0.0.1 on free ports, keeps its ``log.dirs`` in a temporary directory, and
stops cleanly (SIGTERM, which writes ``.kafka_cleanshutdown``) or crashes (SIGKILL).

The ``kafka_broker`` fixture is registered for every test module by ``pytest_plugins`` in
``tests/conftest.py``; a module asks for it by name and gets its own broker (module scope: a JVM
start costs seconds on this machine).  Every test that starts a JVM is marked ``kafka``
(tests/markers.py refuses one that is not).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jvm import KafkaProcess, brokers_registered, free_port, kraft_properties, new_cluster_id, wait_for_kafka


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

    def format(self, *extra: str) -> None:  # type: ignore[override]
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

    def wait_for(self, condition, what: str, timeout: float = 60.0) -> None:
        wait_for_kafka(condition, what, timeout, [self], self.log)


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
    """A records.jsonl row of the mount, decoded back to bytes (docs/usage.md: base64 for non-UTF-8)."""
    def field(value, encoding):
        if value is None:
            return None
        return base64.b64decode(value) if encoding == "base64" else value.encode()

    headers = tuple((h["key"], field(h["value"], h.get("valueEncoding"))) for h in row.get("headers", ()))
    return Seen(row["offset"], row["timestamp"], row["timestampType"], field(row["key"], row.get("keyEncoding")),
                field(row["value"], row.get("valueEncoding")), headers)
