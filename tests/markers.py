"""What a test may start, by its markers: the fast loop starts no mount, no JVM and no Spark.

The fast loop is ``pytest -m "not mount and not kafka and not spark and not cluster"``.  A test that
starts one of those things carries its marker (``pyproject.toml`` lists them), and three checks
refuse a test that does not, so a missing marker fails in the fast loop instead of slowing it:

* at collection, a test asking for a fixture that starts one (``mount``, ``logfs_mount``,
  ``kafka_broker``, ``secure_kafka_broker``, ``kafka_cluster``, ``spark``) without its marker is a
  usage error, whatever ``-m`` selects;
* in this process, :func:`require_marker`: ``Mount.start`` (tests/conftest.py), the one function that
  builds a ``java`` command line (devtools/jvm.py, through ``devtools.jvm.java_guard``, which this
  module sets) and ``new_spark`` (tests/spark_util.py) call it;
* in the processes a test starts (a ``logfs mount``, ``scripts/run.sh``, the harness, a shell that
  runs ``java``): while a test without ``mount``, ``kafka`` or ``spark`` runs, ``PYTHONPATH`` starts
  with tests/unmarked, whose ``sitecustomize`` makes ``pyfuse3.init`` (every FUSE mount) and
  PySpark's gateway launch refuse, and ``PATH`` with tests/unmarked/bin, whose ``java`` refuses.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from devtools import jvm
from tests import ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator

#: the fixtures that start a mount, a JVM or Spark, and the markers a test asking for one carries
FIXTURE_MARKERS = {
    "mount": ("mount",),
    "logfs_mount": ("mount",),
    "kafka_broker": ("kafka",),
    "secure_kafka_broker": ("kafka",),
    "kafka_cluster": ("kafka", "cluster"),
    "spark": ("spark",),
}

FAST_LOOP = 'pytest -m "not mount and not kafka and not spark and not cluster"'

UNMARKED = ROOT / "tests" / "unmarked"

#: the test pytest is setting up, running or tearing down (None outside pytest: the benchmarks)
_current_test: pytest.Item | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _current_test
    _current_test = item      # before its fixtures: a module-scoped broker starts in its first test's setup


#: the folders whose tests share a worker (scripts/test.sh: ``pytest -n auto --dist loadgroup``): a 3-node cluster
#: per module in tests/cluster, the worker's one SparkSession in tests/spark; in tests/kafka a module's broker
WORKER_GROUPS = {"tests/cluster/": "cluster", "tests/spark/": "spark"}
#: where a test with each marker may live: the worker groups above are chosen by folder (a ``kafka`` test
#: elsewhere, with no broker of its module's, runs alone)
MARKER_FOLDERS = {"cluster": ("tests/cluster/",), "spark": ("tests/spark/", "tests/cluster/")}


def worker_group(nodeid: str) -> str:
    """The parallel worker group of a test, from its node id: a group runs on one worker, its tests one after
    the other.  All of tests/cluster in one (its modules' 3-node clusters never side by side, its two Spark
    tests share a SparkSession), all of tests/spark in another (one SparkSession for all), each module of
    tests/kafka in its own (one broker for the module, not one per worker); any other test alone."""
    for folder, group in WORKER_GROUPS.items():
        if nodeid.startswith(folder):
            return group
    if nodeid.startswith("tests/kafka/"):
        return nodeid.split("::")[0]
    return nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` by :func:`worker_group`.

    pytest-xdist's own loadgroup reads ``xdist_group`` markers into the node ids, which pytest 9 no longer
    lets it change: every group was ignored (a module's broker started on both workers).  Its scheduler by
    scope takes the groups from here instead; it hands out the groups with the most tests first (the
    cluster's and Spark's), then one test or module at a time to whichever worker is free.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkerGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return WorkerGroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse the run when a test asks for a fixture that starts something its markers do not name, or lives
    outside the folders of its markers."""
    misplaced: list[str] = []
    missing: list[str] = []
    for item in items:
        for marker, folders in MARKER_FOLDERS.items():
            if item.get_closest_marker(marker) is not None and not item.nodeid.startswith(folders):
                misplaced.append(f"{item.nodeid} is marked @pytest.mark.{marker} outside {' or '.join(folders)} "
                                 "(scripts/test.sh's worker groups go by folder)")
        for fixture in getattr(item, "fixturenames", ()):
            missing.extend(f"{item.nodeid} uses the {fixture!r} fixture but is not marked @pytest.mark.{marker}"
                           for marker in FIXTURE_MARKERS.get(fixture, ()) if item.get_closest_marker(marker) is None)
    errors = sorted(set(misplaced))
    if missing:
        errors += [*sorted(set(missing)), f"(the fast loop `{FAST_LOOP}` would run them)"]
    if errors:
        raise pytest.UsageError("\n".join(errors))


def require_marker(marker: str, what: str) -> None:
    """Fail the current test unless it is marked ``marker`` (it is about to start ``what``)."""
    item = _current_test
    if item is not None and item.get_closest_marker(marker) is None:
        raise RuntimeError(f"{item.nodeid} starts {what} but is not marked @pytest.mark.{marker}: "
                           f"the fast loop `{FAST_LOOP}` would run it")


def require_kafka_marker(what: str) -> None:
    """Fail the current test unless it is marked ``kafka`` (a broker, one of Kafka's tools, Java itself)."""
    require_marker("kafka", f"a JVM ({what})")


jvm.java_guard = require_kafka_marker


def _prepend(name: str, path: str) -> str:
    return os.pathsep.join([path] + [p for p in os.environ.get(name, "").split(os.pathsep) if p and p != path])


@pytest.fixture(autouse=True)
def _unmarked_processes_start_nothing(request: pytest.FixtureRequest) -> Iterator[None]:
    """While a test without ``mount``, ``kafka`` or ``spark`` runs, the processes it starts refuse them."""
    refused = [m for m in ("mount", "kafka", "spark") if request.node.get_closest_marker(m) is None]
    if not refused:
        yield
        return
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "PATH", "LOGFS_TEST_REFUSES", "LOGFS_TEST_ID")}
    os.environ["LOGFS_TEST_REFUSES"] = ",".join(refused)
    os.environ["LOGFS_TEST_ID"] = request.node.nodeid
    if "mount" in refused or "spark" in refused:
        os.environ["PYTHONPATH"] = _prepend("PYTHONPATH", str(UNMARKED))
    if "kafka" in refused and "spark" in refused:
        os.environ["PATH"] = _prepend("PATH", str(UNMARKED / "bin"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
