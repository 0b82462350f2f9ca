"""Registering the source and giving Spark's Python workers an interpreter that imports logfs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from logfs.spark.source import LogfsDataSource

if TYPE_CHECKING:  # pragma: no cover - imported lazily where used
    from collections.abc import Mapping

    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_WORKER_IMPORTS = "import logfs.spark, engine.records, cramjam, crc32c, pyarrow"


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("logfs")`` and ``readStream.format("logfs")`` available.

    The source runs in Spark's Python workers, which Spark starts with the
    interpreter it was given (``PYSPARK_PYTHON``/``spark.pyspark.python``,
    default ``python3``); that interpreter must import logfs and its
    dependencies (cramjam, crc32c, pyarrow).  When it cannot and the session
    runs locally, its workers are switched to this interpreter (the one that
    imported logfs); otherwise this fails at once saying what to set, rather
    than failing later in every task with ModuleNotFoundError.
    """
    _ensure_worker_python(spark.sparkContext)
    spark.dataSource.register(LogfsDataSource)


def _worker_python_ok(executable: str) -> bool:
    if os.path.realpath(executable) == os.path.realpath(sys.executable):
        return True
    try:
        result = subprocess.run([executable, "-c", _WORKER_IMPORTS], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _ensure_worker_python(sc: Any) -> None:     # Any: a SparkContext
    current = getattr(sc, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON", "python3")
    if _worker_python_ok(current):
        return
    if str(sc.master).startswith("local"):
        log.info("Spark's Python workers would run %s, which cannot import logfs; "
                    "using %s for them (set PYSPARK_PYTHON to choose)", current, sys.executable)
        # Functions registered from now on (this data source included) carry the
        # interpreter of sc.pythonExec; later SparkContexts read PYSPARK_PYTHON.
        sc.pythonExec = sys.executable
        sc.pythonVer = "%d.%d" % sys.version_info[:2]
        os.environ["PYSPARK_PYTHON"] = sys.executable
        return
    raise RuntimeError(
        f"Spark's Python workers run {current!r}, which cannot import logfs and its dependencies "
        f"({_WORKER_IMPORTS[len('import '):]}). Start the SparkSession with PYSPARK_PYTHON (or "
        f"spark.pyspark.python) set to an interpreter where logfs is installed, e.g. {sys.executable}, "
        "on every worker, then call logfs.spark.register(spark) again.")


def spark_session(master: str = "local[2]", app_name: str = "logfs",
                  config: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession whose Python workers can import logfs, with the source registered.

    Spark starts its Python workers with ``PYSPARK_PYTHON`` (default ``python3``),
    which must be the interpreter logfs and pyarrow are installed in; unless the
    caller chose one, this is the interpreter running this code.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC"))
    for name, value in (config or {}).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
