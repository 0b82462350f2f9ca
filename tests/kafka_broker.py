"""The ``kafka_broker`` fixture (a real single-node KRaft broker, devtools.kafka.KafkaBroker) and the helpers
that read and compare what a broker holds.

The fixture is registered for every test module by ``pytest_plugins`` in ``tests/conftest.py``; a module
asks for it by name and gets its own broker (module scope: a JVM start costs seconds on this machine).
Every test that starts a JVM is marked ``kafka`` (tests/markers.py refuses one that is not).
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devtools.kafka import KafkaBroker

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.helpers import JsonObject

__all__ = ["KafkaBroker", "Seen", "consume_all", "hash_tree", "kafka_broker", "seen_from_json"]


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


class Seen(tuple[object, ...]):
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


def hash_tree(root: Path) -> dict[str, tuple[str | int, ...]]:
    """Every entry under ``root``: (kind, size, mtime, SHA-256 of a file's bytes). Any write changes it."""
    import hashlib

    out: dict[str, tuple[str | int, ...]] = {}
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


def seen_from_json(row: JsonObject) -> Seen:
    """A records.jsonl row of the mount, decoded back to bytes (docs/usage.md: base64 for non-UTF-8)."""
    def field(value: str | None, encoding: str | None) -> bytes | None:
        if value is None:
            return None
        return base64.b64decode(value) if encoding == "base64" else value.encode()

    headers = tuple((h["key"], field(h["value"], h.get("valueEncoding"))) for h in row.get("headers", ()))
    return Seen(row["offset"], row["timestamp"], row["timestampType"], field(row["key"], row.get("keyEncoding")),
                field(row["value"], row.get("valueEncoding")), headers)
