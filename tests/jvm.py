"""The tests' names for devtools/jvm.py (Apache Kafka's JVMs, shared with the benchmarks).

A test that builds a ``java`` command line must be marked ``kafka``: tests/markers.py installs that check
as ``devtools.jvm.java_guard``.
"""

from __future__ import annotations

from devtools.jvm import (
    CLUSTER_JVM_OPTS,
    JVM_OPTS,
    TOOL_JVM_OPTS,
    KafkaProcess,
    brokers_registered,
    free_port,
    java_command,
    kafka_libs,
    kafka_version,
    kraft_properties,
    new_cluster_id,
    run_tool,
    wait_for_kafka,
    write_log4j,
)
from tests.markers import require_kafka_marker

__all__ = ["CLUSTER_JVM_OPTS", "JVM_OPTS", "TOOL_JVM_OPTS", "KafkaProcess", "brokers_registered", "free_port",
           "java_command", "kafka_libs", "kafka_version", "kraft_properties", "new_cluster_id",
           "require_kafka_marker", "run_tool", "wait_for_kafka", "write_log4j"]
