"""The Spark ``logfs`` source on a mount of a Kafka cluster (issue 20, SPEC.md section 10).

The source reads the mount's raw ``segments/`` files, which on a cluster
mount are the local replica's: the leader's batches byte for byte.  It returns
what it returns on an embedded mount holding the same records, timestamps
aside (README, "Mounting a Kafka cluster": the broker stamps LogAppendTime).
"""

from __future__ import annotations

import pytest

from tests.kafka_cluster import KafkaCluster
from tests.spark_util import append_lines, new_spark

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
