"""The fast loop ``pytest -m "not mount and not kafka and not spark and not cluster"`` starts no mount and no JVM.

Every test that starts one is marked (``mount``: a FUSE mount; ``kafka``: a broker, Kafka's tools, Java
itself; ``spark``: a SparkSession), and tests/markers.py enforces it: at collection for the fixtures that
start them, in this process for ``Mount.start``, ``java_command`` and ``new_spark``, and in the processes a
test starts.  These tests are unmarked, so each start must be refused.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import ROOT
from tests.conftest import LOGFS, Mount
from tests.jvm import java_command
from tests.spark_util import new_spark


def test_an_unmarked_test_cannot_start_a_kafka_jvm():
    with pytest.raises(RuntimeError, match=r"not marked @pytest\.mark\.kafka"):
        java_command("kafka.Kafka")


def test_an_unmarked_test_cannot_start_spark():
    with pytest.raises(RuntimeError, match=r"not marked @pytest\.mark\.spark"):
        new_spark("unmarked")


def test_an_unmarked_test_cannot_start_a_mount(tmp_path):
    with pytest.raises(RuntimeError, match=r"not marked @pytest\.mark\.mount"):
        Mount(tmp_path).start()


def _mounted(path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


def test_a_logfs_mount_started_by_an_unmarked_test_refuses(tmp_path):
    (tmp_path / "mnt").mkdir()
    result = subprocess.run([str(LOGFS), "mount", str(tmp_path / "mnt"), "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 97, result.stderr
    assert "test_a_logfs_mount_started_by_an_unmarked_test_refuses starts pyfuse3.init but is not marked " \
           "@pytest.mark.mount" in result.stderr
    assert not _mounted(tmp_path / "mnt")


def test_java_and_pyspark_started_by_an_unmarked_test_refuse():
    java = subprocess.run(["sh", "-c", "java -version"], capture_output=True, text=True, timeout=60)
    assert java.returncode == 97, java.stderr
    assert "not marked @pytest.mark.kafka" in java.stderr, java.stderr
    spark = subprocess.run([sys.executable, "-c", "from pyspark.java_gateway import launch_gateway; launch_gateway()"],
                           capture_output=True, text=True, timeout=120)
    assert spark.returncode == 97, spark.stderr
    assert "not marked @pytest.mark.spark" in spark.stderr, spark.stderr


def test_a_test_asking_for_a_mount_without_the_marker_is_refused_at_collection(tmp_path):
    (tmp_path / "test_unmarked.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef mount():\n    return None\n\n"
        "def test_uses_a_mount(mount):\n    pass\n\n@pytest.mark.mount\ndef test_marked(mount):\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.markers", "-c", "/dev/null",
                             "--rootdir", str(tmp_path), "--collect-only", "-q", str(tmp_path / "test_unmarked.py")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "test_uses_a_mount uses the 'mount' fixture but is not marked @pytest.mark.mount" in result.stderr
    assert "test_marked" not in result.stderr


@pytest.mark.kafka
def test_a_marked_test_may():
    assert java_command("kafka.Kafka")[0] == "java"
