"""The Spark ``logfs`` source on a mount of a Kafka cluster (issue 20, SPEC.md section 10).

The source reads the mount's raw ``segments/`` files, which on a cluster
mount are the local replica's: the leader's batches byte for byte.  It returns
what it returns on an embedded mount holding the same records, timestamps
aside (README, "Mounting a Kafka cluster": the broker stamps LogAppendTime).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.kafka_cluster import KafkaCluster
from tests.spark_util import append_lines, new_spark, records_jsonl

pytestmark = [pytest.mark.cluster, pytest.mark.kafka, pytest.mark.mount, pytest.mark.spark]

_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestampType"]


@pytest.fixture(scope="module")
def spark():
    session = new_spark("logfs-test-cluster-spark")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_spark_source_reads_a_cluster_mount_as_an_embedded_one(spark, kafka_cluster: KafkaCluster,
                                                                logfs_mount) -> None:
    options = {"num.partitions": "2"}
    embedded = logfs_mount(options, name="e")
    cluster = logfs_mount(options, name="c", extra_args=["--bootstrap-server", kafka_cluster.bootstrap])
    rows = {}
    for name, m in (("embedded", embedded), ("cluster", cluster)):
        (m / "sp").mkdir()
        for p in range(2):
            append_lines(str(m.path), "sp", [b"v-%d-%04d" % (p, i) for i in range(300)], partition=p, chunk=50)
        df = spark.read.format("logfs").option("path", str(m.path)).option("subscribe", "sp").load()
        rows[name] = sorted(tuple(r) for r in df.select(*_COLUMNS).collect())
    assert len(rows["cluster"]) == 600
    assert rows["cluster"] == rows["embedded"]


@pytest.mark.timeout(600)  # two Spark applications start one after the other
def test_pipeline_script_runs_unchanged_on_a_cluster_mount(kafka_cluster: KafkaCluster, logfs_mount,
                                                           tmp_path) -> None:
    """scripts/pipeline.py, as the README runs it, with --mount pointing at a mount of the cluster."""
    m = logfs_mount(name="pipe", extra_args=["--bootstrap-server", kafka_cluster.bootstrap])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def run(*args: str) -> str:
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "pipeline.py"), "--mount", str(m.path),
                                 "--master", "local[2]", *args], capture_output=True, text=True, env=env,
                                cwd=str(tmp_path), timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr + m.log()[-3000:]
        return result.stdout

    out = run("--source", "cevents", "--sink", "ctotals", "--generate", "400")
    assert "Appended 400 events to topic cevents" in out and "Read 400 events from topic cevents" in out
    events = [json.loads(r["value"]) for r in records_jsonl(str(m.path), "cevents")]
    assert len(events) == 400
    counts = collections.Counter(e["type"] for e in events)
    totals = [json.loads(r["value"]) for r in records_jsonl(str(m.path), "ctotals")]
    assert {t["type"]: t["count"] for t in totals} == counts
    # the sink is on the cluster: a Kafka consumer reads the same aggregates
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "pipeline-check",
                         "enable.auto.commit": False})
    try:
        got = 0
        partitions = sorted(int(n) for n in os.listdir(m / "ctotals") if n.isdigit())
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition("ctotals", p), timeout=30)
            got += high - low
        assert got == len(totals)
    finally:
        consumer.close()
    # stream mode, to the end of what is there and stop (resumable from its checkpoint)
    checkpoint = str(tmp_path / "cp")
    run("--source", "cevents", "--sink", "cwindows", "--stream", "--available-now", "--checkpoint", checkpoint)
    windows = [json.loads(r["value"]) for r in records_jsonl(str(m.path), "cwindows")]
    assert sum(w["count"] for w in windows) == 400
