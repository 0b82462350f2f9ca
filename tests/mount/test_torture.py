"""The torture harness (tests/harness/torture.py) with its CI defaults, and a self-test that its checks bite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers import JsonObject, json_object

pytestmark = pytest.mark.mount

TORTURE = ROOT / "tests" / "harness" / "torture.py"


def _run(*args: str, timeout: float = 170) -> tuple[int, JsonObject, str]:
    result = subprocess.run([sys.executable, str(TORTURE), "--json", *args], capture_output=True, text=True,
                            timeout=timeout)
    out = result.stdout
    summary = json_object(out[out.index("{"):]) if "{" in out else {}
    return result.returncode, summary, out + result.stderr


def test_torture_ci_defaults_lose_nothing():
    code, summary, output = _run()
    assert summary, output
    assert summary["lost"] == 0, output
    assert summary["duplicated"] == 0, output
    assert code == 0, output
    assert summary["cycles"] >= 10, output
    assert summary["acknowledged"] > 1000, output
    assert summary["group_commits_fsynced"] > 0, output
    assert summary["group_commits_lost"] == 0, output
    faults = summary["faults"]
    assert faults.get("kill-9", 0) + faults.get("kill-9-during-shutdown", 0) >= 6, output
    assert faults["clean-shutdown"] >= 3, output
    # writers killed mid-line by SIGINT and SIGKILL, none of whose unterminated lines became a record
    assert faults.get("writer-killed-mid-line-SIGINT", 0) >= 3, output
    assert faults.get("writer-killed-mid-line-SIGKILL", 0) >= 3, output
    assert summary["torn_records"] == 0, output
    assert summary["killed_writers_lines_dropped"] >= 6, output


def test_torture_detects_acknowledged_records_lost_behind_its_back():
    # every crash a kill -9 in the middle of the traffic, so the first one with a record acknowledged cuts it
    code, summary, output = _run("--cycles", "3", "--clean-every", "100", "--damage", "--startup-kill-rate", "0",
                                 "--shutdown-kill-rate", "0")
    assert code == 1, output
    assert summary["lost"] > 0, output
    assert summary["faults"]["damage-truncated-segment"] == 1


def test_power_loss_round_loses_nothing(tmp_path):
    """A short --power-loss round: every crash a power loss of tests/harness/powerloss_fs.py, a new topic before each;
    the mount under ``ulimit -n 128`` (a descriptor budget of 96) with 4 KiB segments, so that segment files
    and index maps are closed and reopened all along."""
    code, summary, output = _run("--power-loss", "--cycles", "8", "--cycle-seconds", "1.2", "--new-topic-rate", "1",
                                 "--shutdown-kill-rate", "0.1", "--seed", "18", "--fd-limit", "128",
                                 "--segment-bytes", "4096", "--work-dir", str(tmp_path))
    assert summary, output
    assert summary["lost"] == 0, output
    assert summary["duplicated"] == 0, output
    assert summary["misplaced"] == 0, output
    assert code == 0, output
    faults = summary["faults"]
    assert sum(n for kind, n in faults.items() if kind.startswith("power-loss")) >= 3, output
    assert summary["acknowledged"] > 1000, output
    remounts = summary["remount_after"]
    assert sum(r["count"] for kind, r in remounts.items() if kind.startswith("power-loss")) >= 3, output
    assert faults["new-topic"] >= 1, output
    assert summary["group_commits_fsynced"] > 0, output
    assert summary["group_commits_lost"] == 0, output
    segment_files = [f for f in (tmp_path / "backing").glob("*/*") if f.suffix in (".log", ".index", ".timeindex")]
    assert len(segment_files) > 96, "the run never held more segment files than its descriptor budget"


def test_power_loss_round_detects_a_disk_that_lies_about_fsync():
    """Self-test of the mode: when fsync makes nothing durable, a power loss must show acknowledged records lost."""
    code, summary, output = _run("--power-loss", "--lying-fsync", "--cycles", "2", "--clean-every", "100",
                                 "--startup-kill-rate", "0", "--shutdown-kill-rate", "0", "--seed", "18")
    assert code == 1, output
    assert summary["lost"] > 0, output
    assert summary["faults"]["power-loss"] == 2, output


def test_tiered_round_loses_nothing_and_leaves_no_orphan(tmp_path):
    """A short --tiered round (docs/tiering.md): copies, local deletions and reads from a file:// store in every
    cycle, kill -9 and power losses among them; nothing acknowledged lost, the store holding exactly the finished
    copies after every remount."""
    code, summary, output = _run("--tiered", "--power-loss", "--power-loss-rate", "0.5", "--cycles", "6",
                                 "--seed", "37", "--work-dir", str(tmp_path), timeout=300)
    assert summary, output
    assert summary["lost"] == 0, output
    assert summary["duplicated"] == 0, output
    assert summary["store_orphans"] == 0, output
    assert summary["store_missing"] == 0, output
    assert code == 0, output
    assert summary["store_checks"] >= 6, output
    tiered = summary["tiered"]
    assert tiered["copies"] > 0, output
    assert tiered["local_deletions_of_copied_segments"] > 0, output
    assert summary["read_from_store"] > 0, output
    assert summary["faults"].get("power-loss", 0) + summary["faults"].get("kill-9", 0) >= 3, output
