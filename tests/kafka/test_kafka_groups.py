"""Consumer groups between a real Apache Kafka broker and logfs, in both directions.

A KRaft broker (tests/kafka_broker.py) holds a topic and groups whose offsets
were committed by kafka-python clients: a plain commit, a transactional commit
(``send_offsets_to_transaction``, committed) next to an aborted one, and a
group deleted through the admin API (tombstones).  Its stopped ``log.dirs``,
mounted read-only by logfs, shows those groups as the broker reported them.
Then logfs, mounted read-write on that directory, moves the groups; the broker,
started again on it, hands a Kafka consumer the offsets logfs committed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.structs import OffsetAndMetadata, TopicPartition

from tests.conftest import Mount

if TYPE_CHECKING:
    from tests.kafka_broker import KafkaBroker

pytestmark = [pytest.mark.mount, pytest.mark.kafka]

TOPIC = "orders"
PER_PARTITION = 30


def _committed(broker: KafkaBroker, group: str) -> dict[int, int | None]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(TOPIC, p)) for p in range(3)}
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def broker_with_groups(kafka_broker: KafkaBroker) -> KafkaBroker:
    broker = kafka_broker
    broker.create_topic(TOPIC, 3)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for p in range(3):
        for i in range(PER_PARTITION):
            producer.send(TOPIC, value=b"p%d-%d" % (p, i), partition=p)
    producer.flush()
    producer.close()

    def commit(group: str, offsets: dict[int, int]) -> None:
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
        consumer.commit({TopicPartition(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
        consumer.close()

    commit("kafka-app", {0: 10, 1: 20})
    commit("gone", {0: 3})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.delete_groups(["gone"])
    admin.close()

    # offsets committed inside transactions: one committed, one aborted
    group_consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="txn-app", enable_auto_commit=False)
    txn = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="groups-test")
    txn.init_transactions()
    txn.begin_transaction()
    txn.send_offsets_to_transaction({TopicPartition(TOPIC, 2): OffsetAndMetadata(7, "", -1)},
                                    group_consumer.group_metadata())
    txn.commit_transaction()
    txn.begin_transaction()
    txn.send_offsets_to_transaction({TopicPartition(TOPIC, 2): OffsetAndMetadata(9, "", -1)},
                                    group_consumer.group_metadata())
    txn.abort_transaction()
    txn.close()
    group_consumer.close()

    assert _committed(broker, "kafka-app") == {0: 10, 1: 20, 2: None}
    assert _committed(broker, "txn-app") == {0: None, 1: None, 2: 7}
    assert broker.stop() in (0, 143)
    return broker


def _mount(broker: KafkaBroker, name: str, *, read_only: bool) -> Mount:
    m = Mount(broker.base, None, read_only=read_only)     # Mount's data dir is base/data: the broker's log dir
    m.path = broker.base / name
    m.path.mkdir(exist_ok=True)
    m.log_file = broker.base / f"{name}.log"
    return m.start()


def _rows(m: Mount, group: str) -> list[list[int]]:
    return [[int(x) for x in line.split()] for line in m.sh(f"cat {TOPIC}/groups/{group}").stdout.splitlines()]


def test_a_brokers_group_commits_show_up_and_logfs_commits_reach_the_broker(broker_with_groups: KafkaBroker):
    broker = broker_with_groups
    m = _mount(broker, "mnt-ro", read_only=True)
    try:
        assert m.sh(f"ls {TOPIC}/groups").stdout.split() == [b"kafka-app", b"txn-app"]
        assert _rows(m, "kafka-app") == [[0, 10, 30, 20], [1, 20, 30, 10], [2, -1, 30, 30]]
        assert _rows(m, "txn-app") == [[0, -1, 30, 30], [1, -1, 30, 30], [2, 7, 30, 23]]
        assert m.sh(f"head -n 2 {TOPIC}/0/consume/kafka-app").stdout == b"p0-10\np0-11\n"
        assert _rows(m, "kafka-app")[0] == [0, 10, 30, 20]            # read-only: nothing committed
    finally:
        assert m.stop() == 0, m.log()

    m = _mount(broker, "mnt-rw", read_only=False)
    try:
        assert m.sh(f"wc -l < {TOPIC}/1/consume/kafka-app").stdout.strip() == b"10"   # commits 30
        m.sh(f"echo '2 25' > {TOPIC}/groups/kafka-app")
        m.sh(f"echo 'reset earliest' > {TOPIC}/groups/txn-app")
        assert _rows(m, "kafka-app") == [[0, 10, 30, 20], [1, 30, 30, 0], [2, 25, 30, 5]]
    finally:
        assert m.stop() == 0, m.log()

    broker.start()
    try:
        assert _committed(broker, "kafka-app") == {0: 10, 1: 30, 2: 25}
        assert _committed(broker, "txn-app") == {0: 0, 1: 0, 2: 0}
        consumer = KafkaConsumer(TOPIC, bootstrap_servers=broker.bootstrap, group_id="kafka-app",
                                 enable_auto_commit=False, auto_offset_reset="none", consumer_timeout_ms=10000)
        got = sorted((r.partition, r.offset) for r in consumer)
        consumer.close()
        assert got == [(0, o) for o in range(10, 30)] + [(2, o) for o in range(25, 30)]
    finally:
        assert broker.stop() in (0, 143)
