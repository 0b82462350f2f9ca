"""The ``kafka_cluster`` fixture: a real 3-node Apache Kafka cluster (devtools.kafka.KafkaCluster) for the
cluster-mount tests, one per test module; its JVMs are stopped at the end of the module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from devtools.kafka import ClusterNode, KafkaCluster

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["ClusterNode", "KafkaCluster", "kafka_cluster"]


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One 3-node cluster per test module; its JVMs stop at the end of the module."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
