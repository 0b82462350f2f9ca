"""The Spark examples of the docs (docs/spark.md) run as written: the data source snippet and the pipeline
console block.

The snippet runs in a fresh Python process whose ``spark`` is what a user has:
``SparkSession.builder.getOrCreate()`` with no ``PYSPARK_PYTHON``, so Spark's
workers would start the system ``python3``; ``logfs.spark.register(spark)``
must make the snippet work anyway (or fail at once saying what to do).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, Mount
from tests.docs import console_blocks, doc_files
from tests.mount.test_readme import _run_block

pytestmark = [pytest.mark.mount, pytest.mark.spark]


def _python_blocks() -> list[str]:
    return [b for path in doc_files() for b in re.findall(r"```python\n(.*?)```", path.read_text(), re.S)]


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    m = Mount(root, {}).start()
    (root / ".venv").symlink_to(ROOT / ".venv")
    (root / "scripts").symlink_to(ROOT / "scripts")
    os.mkdir(m / "events")
    with open(m / "events/0/append", "wb") as f:
        f.write(b"".join(b'{"type": "t%d", "amount": %d}\n' % (i % 3, i) for i in range(300)))
    yield root, m
    assert m.stop() == 0, m.log()


def test_readme_data_source_snippet_runs_as_shown(project):
    root, _m = project
    snippet = next(b for b in _python_blocks() if "logfs.spark.register(spark)" in b)
    program = "\n".join([
        "from pyspark.sql import SparkSession",
        "spark = (SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
        ".getOrCreate())",
        "assert spark.sparkContext.pythonExec == 'python3'   # what Spark starts workers with by default",
        snippet,
        "rows = df.collect()",
        "print('ROWS', len(rows), sorted({r.offset for r in rows}) == list(range(300)))",
        "print('STREAMING', stream.isStreaming)",
        "spark.stop()",
    ])
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    result = subprocess.run([sys.executable, "-c", program], cwd=root, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "ROWS 300 True" in result.stdout
    assert "STREAMING True" in result.stdout


def test_readme_pipeline_console_block_runs_as_written(project):
    root, m = project
    block = next(b for path in doc_files() for b in console_blocks(path.read_text())
                 if any("pipeline.py" in c for c, _ in b))
    env_home = root / "home"
    env_home.mkdir()
    os.environ["XDG_STATE_HOME"] = str(env_home)     # the stream's default checkpoint
    try:
        _run_block(root, block)
    finally:
        del os.environ["XDG_STATE_HOME"]
    assert not (root / "checkpoints").exists()
    assert (m / "windows/0/records").read_bytes()
    assert (m / "events-by-type/0/records").read_bytes()
