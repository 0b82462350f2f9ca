#!/usr/bin/env bash
# Installs what only the tests and the Kafka benchmarks need: Apache Kafka's
# released jars and Spark's Kafka source, from Maven Central with mvn (and
# maven and a JDK with apt when missing).  scripts/test.sh runs it after
# scripts/setup.sh; scripts/run.sh does not need it.  Safe to run again: each
# step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/apt-install.sh

# --- kcat (librdkafka's console client): the producer-batches test (tests/kafka/test_producer_batches.py)
# writes keys and headers with it, and scripts/bench/bench_producers.py reads with it beside the mount.
command -v kcat >/dev/null 2>&1 || apt_install kcat

# --- Apache Kafka, for the tests against a real broker and scripts/bench/bench_kafka.py.
# The released jars (broker, KRaft storage tool, DumpLogSegments, the perf tools)
# come from Maven Central through our recipe scripts/kafka/pom.xml, once, into a
# cache outside the repo; devtools/jvm.py finds them there (or in
# $LOGFS_KAFKA_LIBS).
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/kafka/pom.xml)
kafka_libs=${LOGFS_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/logfs/kafka-$kafka_version/libs}
if [ ! -f "$kafka_libs/.complete" ]; then
    need_apt=()
    command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
    command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
    apt_install "${need_apt[@]}"
    echo "setup: fetching Apache Kafka $kafka_version from Maven Central into $kafka_libs"
    mkdir -p "$kafka_libs"
    # quiet mvn still prints colour resets: show its output only when it fails
    if ! mvn_out=$(mvn -q -B -f scripts/kafka/pom.xml dependency:copy-dependencies \
            -DincludeScope=runtime -DoutputDirectory="$kafka_libs" 2>&1); then
        echo "$mvn_out" >&2
        echo "setup: could not fetch Apache Kafka from Maven Central" >&2
        exit 1
    fi
    touch "$kafka_libs/.complete"
fi

# --- Spark's own Kafka source (spark-sql-kafka-0-10), for the side-by-side tests of
# the logfs source and scripts/bench/bench_spark.py: its jars (without what PySpark ships)
# come from Maven Central through scripts/spark-kafka/pom.xml, once, into a cache
# outside the repo; logfs.spark.kafka_jars finds them there (or in $LOGFS_SPARK_KAFKA_JARS).
spark_kafka_version=$(sed -n 's:.*<spark.kafka.version>\(.*\)</spark.kafka.version>.*:\1:p' scripts/spark-kafka/pom.xml)
spark_kafka_jars=${LOGFS_SPARK_KAFKA_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/logfs/spark-sql-kafka-$spark_kafka_version/jars}
if [ ! -f "$spark_kafka_jars/.complete" ]; then
    command -v mvn >/dev/null 2>&1 || apt_install maven
    echo "setup: fetching spark-sql-kafka-0-10 $spark_kafka_version from Maven Central into $spark_kafka_jars"
    mkdir -p "$spark_kafka_jars"
    mvn -q -B -f scripts/spark-kafka/pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$spark_kafka_jars"
    touch "$spark_kafka_jars/.complete"
fi
