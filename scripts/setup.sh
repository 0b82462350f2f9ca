#!/usr/bin/env bash
# Installs whatever is missing for logfs on a fresh Debian machine: the FUSE 3
# library and headers pyfuse3 builds against, a Java runtime for Spark, and the
# Python packages in .venv; and Apache Kafka's jars for the Kafka tests (below).
# Safe to run again: each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_apt+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mountpoint >/dev/null 2>&1 || need_apt+=(util-linux)
command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)      # the conformance tests run the everyday tools
command -v less >/dev/null 2>&1 || need_apt+=(less)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing system packages: ${need_apt[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.logfs-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing Python packages into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[test,spark]"
    touch "$stamp"
fi

# --- Apache Kafka, for the tests against a real broker and scripts/bench_kafka.py.
# The released jars (broker, KRaft storage tool, DumpLogSegments, the perf tools)
# come from Maven Central through our recipe scripts/kafka/pom.xml, once, into a
# cache outside the repo; tests/kafka_broker.py finds them there (or in
# $LOGFS_KAFKA_LIBS).
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/kafka/pom.xml)
kafka_libs=${LOGFS_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/logfs/kafka-$kafka_version/libs}
if [ ! -f "$kafka_libs/.complete" ]; then
    need_apt=()
    command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
    command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
    if [ ${#need_apt[@]} -gt 0 ]; then
        echo "setup: installing system packages: ${need_apt[*]}"
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
    fi
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
# the logfs source and scripts/bench_spark.py: its jars (without what PySpark ships)
# come from Maven Central through scripts/spark-kafka/pom.xml, once, into a cache
# outside the repo; logfs.spark_kafka finds them there (or in $LOGFS_SPARK_KAFKA_JARS).
spark_kafka_version=$(sed -n 's:.*<spark.kafka.version>\(.*\)</spark.kafka.version>.*:\1:p' scripts/spark-kafka/pom.xml)
spark_kafka_jars=${LOGFS_SPARK_KAFKA_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/logfs/spark-sql-kafka-$spark_kafka_version/jars}
if [ ! -f "$spark_kafka_jars/.complete" ]; then
    command -v mvn >/dev/null 2>&1 || {
        SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq maven >/dev/null
    }
    echo "setup: fetching spark-sql-kafka-0-10 $spark_kafka_version from Maven Central into $spark_kafka_jars"
    mkdir -p "$spark_kafka_jars"
    mvn -q -B -f scripts/spark-kafka/pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$spark_kafka_jars"
    touch "$spark_kafka_jars/.complete"
fi
