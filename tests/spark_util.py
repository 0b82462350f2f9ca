"""Helpers for the Spark tests: the one local SparkSession of a test process and appends through a mount.

Everything here goes through the mount's files, as a user's program would:
records are appended by writing lines to ``append`` files and read back through
``state`` and the views.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
from typing import TYPE_CHECKING

import orjson
import pytest

from tests import ROOT
from tests.helpers import JsonObject, wait_for
from tests.markers import require_marker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from types import ModuleType

    from pyspark.sql import SparkSession


def new_spark(app_name: str):
    """A small local[2] SparkSession with the logfs source registered (the ``spark`` fixture's)."""
    from logfs.spark import spark_session

    require_marker("spark", "a local SparkSession")
    return spark_session("local[2]", app_name, {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    })


@pytest.fixture(scope="session", name="spark")
def spark_session() -> Iterator[SparkSession]:
    """The one local SparkSession of a test process (an xdist worker), for every test that asks for ``spark``.

    A Spark application costs a JVM start and seconds of set-up; the modules that used one each now share
    it (scripts/test.sh keeps every ``spark`` test on one worker, see tests/markers.py).  It logs errors
    only, and stops when the process's last test is done.  Registered by ``pytest_plugins`` in conftest.
    """
    session = new_spark("logfs-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def append_lines(mount: str, topic: str, lines: Sequence[bytes], partition: int | None = None,
                 chunk: int = 1000) -> None:
    """Append ``lines`` through ``MOUNT/<topic>[/<p>]/append``, ``chunk`` lines per write()."""
    parts = [mount, topic] + ([str(partition)] if partition is not None else []) + ["append"]
    fd = os.open(os.path.join(*parts), os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(0, len(lines), chunk):
            data = memoryview(b"".join(line + b"\n" for line in lines[i:i + chunk]))
            while data:
                data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def create_topic(mount: str, topic: str, partitions: int, config: str | None = None) -> None:
    """mkdir a topic (num.partitions partitions), mkdir the next numbers up to ``partitions``,
    then write ``config`` (name=value lines) to its config file."""
    os.mkdir(os.path.join(mount, topic))
    have = len([n for n in os.listdir(os.path.join(mount, topic)) if n.isdigit()])
    for p in range(have, partitions):
        os.mkdir(os.path.join(mount, topic, str(p)))
    assert len([n for n in os.listdir(os.path.join(mount, topic)) if n.isdigit()]) == partitions
    if config:
        with open(os.path.join(mount, topic, "config"), "w") as f:
            f.write(config)


def state(mount: str, topic: str, partition: int) -> JsonObject:
    with open(os.path.join(mount, topic, str(partition), "state"), "rb") as f:
        doc = orjson.loads(f.read())
    assert isinstance(doc, dict), doc
    return doc


def end_offsets(mount: str, topic: str) -> dict[int, int]:
    parts = sorted(int(n) for n in os.listdir(os.path.join(mount, topic)) if n.isdigit())
    return {p: state(mount, topic, p)["log_end_offset"] for p in parts}


def records_jsonl(mount: str, topic: str) -> list[JsonObject]:
    """Every record of a topic as the mount renders it (records.jsonl of each partition)."""
    out: list[JsonObject] = []
    for p in end_offsets(mount, topic):
        with open(os.path.join(mount, topic, str(p), "records.jsonl"), "rb") as f:
            out.extend(orjson.loads(line) for line in f.read().splitlines())
    return out


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """tests.helpers.wait_for with the argument order and the longer defaults of the Spark tests."""
    wait_for(predicate, what, timeout=timeout, interval=0.2)


@functools.cache
def _load_pipeline() -> ModuleType:
    """scripts/pipeline.py as a module (scripts/ is not a package), loaded once."""
    spec = importlib.util.spec_from_file_location("logfs_pipeline_script", ROOT / "scripts" / "pipeline.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_pipeline(spark, mount: str, *args: str) -> str:
    """scripts/pipeline.py's command line on the shared session (its ``main`` takes a running one, saving the
    25 s of a Spark application's start); what it printed.  docs/spark.md's pipeline block runs the script as a
    command (tests/spark/test_readme_spark.py)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = _load_pipeline().main(["--mount", mount, *args], spark=spark)
    assert status == 0, out.getvalue()
    return out.getvalue()
