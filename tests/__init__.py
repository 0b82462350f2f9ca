"""The suite, a package: tests/unit, tests/mount, tests/kafka, tests/cluster, tests/spark by what a test needs.

Its shared fixtures and helpers import as ``tests.*`` (tests/conftest.py, tests/helpers.py, the Kafka
fixtures), the test harness as ``tests.harness.*``.
"""

from pathlib import Path

#: the work tree under test (its engine, logfs and scripts)
ROOT = Path(__file__).resolve().parent.parent
