"""logfs -> Kafka with consumer groups: offsets committed through a mount reach a Kafka consumer.

Offsets committed through ``MOUNT/<topic>/groups/<group>`` live in
``__consumer_offsets`` in Kafka's record format, so the documented procedure
(``logfs to-kafka plan`` / ``adopt``) carries them like any topic, and the
broker's group coordinator loads them.
"""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tests.helpers import append_lines
from tests.jvm import java_command
from tests.kafka.test_to_kafka import _logfs

pytestmark = [pytest.mark.mount, pytest.mark.kafka]


def test_group_commits_made_in_logfs_are_what_a_kafka_consumer_gets(kafka_broker, logfs_mount, tmp_path):
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    mount = logfs_mount({"num.partitions": "2"})
    (mount / "orders").mkdir()
    append_lines(mount / "orders/0/append", [b"a%d" % i for i in range(10)])
    append_lines(mount / "orders/1/append", [b"b%d" % i for i in range(7)])
    (mount / "orders/groups/billing").write_text("0 4\n1 6\n")
    (mount / "orders/groups/audit").write_text("0 10\n")
    assert mount.stop() == 0

    kafka_topics = shlex.join(java_command("org.apache.kafka.tools.TopicCommand",
                                           jvm_opts=["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]))
    plan = _logfs("to-kafka", "plan", str(mount.data), "--bootstrap-server", kafka_broker.bootstrap,
                  "--kafka-topics", kafka_topics).stdout.decode()
    assert "offsets.topic.num.partitions must be 50" in plan
    script = tmp_path / "create-topics.sh"
    script.write_text(plan)
    run = subprocess.run(["sh", str(script)], capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
    kafka_broker.wait_for(lambda: all((kafka_broker.log_dir / f"__consumer_offsets-{p}" / "partition.metadata")
                                      .exists() for p in range(50)), "the broker to create __consumer_offsets")
    kafka_broker.stop()
    _logfs("to-kafka", "adopt", str(mount.data), "--broker-log-dir", str(kafka_broker.log_dir))
    kafka_broker.start()

    committed = {}
    for group in ("billing", "audit"):
        consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False)
        try:
            committed[group] = {p: consumer.committed(TopicPartition("orders", p)) for p in (0, 1)}
        finally:
            consumer.close()
    assert committed == {"billing": {0: 4, 1: 6}, "audit": {0: 10, 1: None}}
