"""What the tests and the benchmarks share for developing logfs: real Apache Kafka JVMs (``devtools.jvm``,
``devtools.kafka``) and the child processes they run (``devtools.process``).

It imports nothing of tests/ (the benchmarks import no test module) and nothing of logfs; tests/jvm.py,
tests/kafka_broker.py and tests/kafka_cluster.py add the suite's fixtures and marker checks on top.
"""

from pathlib import Path

#: the work tree (its scripts/kafka/pom.xml names the Kafka version)
ROOT = Path(__file__).resolve().parent.parent
