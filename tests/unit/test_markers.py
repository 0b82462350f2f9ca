"""The fast loop ``pytest -m "not mount and not kafka and not spark"`` starts no JVM.

Every test that starts one is marked (``kafka``: a broker, Kafka's tools, Java
itself; ``spark``: a SparkSession), and tests/kafka_broker.py enforces it: the
one function building a ``java`` command line, and tests/spark_util.new_spark,
fail a test that lacks the marker.  This test is unmarked, so it must be refused.
"""

from __future__ import annotations

import pytest

from tests.kafka_broker import java_command
from tests.spark_util import new_spark


def test_an_unmarked_test_cannot_start_a_kafka_jvm():
    with pytest.raises(RuntimeError, match="not marked @pytest.mark.kafka"):
        java_command("kafka.Kafka")


def test_an_unmarked_test_cannot_start_spark():
    with pytest.raises(RuntimeError, match="not marked @pytest.mark.spark"):
        new_spark("unmarked")


@pytest.mark.kafka
def test_a_marked_test_may():
    assert java_command("kafka.Kafka")[0] == "java"
