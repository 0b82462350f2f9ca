"""Spark's own Kafka source (spark-sql-kafka-0-10), for side-by-side runs against a broker."""

from __future__ import annotations

import os
import re

from engine.errors import StorageError


def spark_kafka_jars() -> list[str]:
    """The jars of Spark's ``kafka`` source (spark-sql-kafka-0-10) that ``scripts/setup-kafka.sh`` fetched.

    For ``spark.jars`` when a job (a test, ``scripts/bench/bench_spark.py``) reads a
    Kafka broker with ``format("kafka")`` beside the mount.  They live in a
    cache outside the repo (``$LOGFS_SPARK_KAFKA_JARS``, else
    ``~/.cache/logfs/spark-sql-kafka-<version>/jars``); a missing install is an
    error naming the set-up step.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "scripts", "spark-kafka", "pom.xml"), encoding="utf-8") as f:
        match = re.search(r"<spark.kafka.version>([^<]+)</spark.kafka.version>", f.read())
    if match is None:
        raise StorageError("scripts/spark-kafka/pom.xml names no spark.kafka.version")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    jars = os.environ.get("LOGFS_SPARK_KAFKA_JARS") or os.path.join(
        cache, "logfs", f"spark-sql-kafka-{match.group(1)}", "jars")
    if not os.path.exists(os.path.join(jars, ".complete")):
        raise StorageError(f"Spark's Kafka source is not in {jars}: run scripts/setup-kafka.sh")
    return sorted(os.path.join(jars, name) for name in os.listdir(jars) if name.endswith(".jar"))
