"""The torture harness (scripts/torture.py) with its CI defaults, and a self-test that its checks bite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.mount

TORTURE = ROOT / "scripts" / "torture.py"


def _run(*args: str, timeout: float = 170) -> tuple[int, dict, str]:
    result = subprocess.run([sys.executable, str(TORTURE), "--json", *args], capture_output=True, text=True,
                            timeout=timeout)
    out = result.stdout
    summary = json.loads(out[out.index("{"):]) if "{" in out else {}
    return result.returncode, summary, out + result.stderr


def test_torture_ci_defaults_lose_nothing():
    code, summary, output = _run()
    assert summary, output
    assert summary["lost"] == 0 and summary["duplicated"] == 0, output
    assert code == 0, output
    assert summary["cycles"] >= 10 and summary["acknowledged"] > 1000, output
    faults = summary["faults"]
    assert faults.get("kill-9", 0) + faults.get("kill-9-during-shutdown", 0) >= 6, output
    assert faults["clean-shutdown"] >= 3, output


def test_torture_detects_acknowledged_records_lost_behind_its_back():
    code, summary, output = _run("--cycles", "3", "--clean-every", "100", "--damage", "--startup-kill-rate", "0")
    assert code == 1, output
    assert summary["lost"] > 0, output
    assert summary["faults"]["damage-truncated-segment"] == 1
