"""scripts/setup.sh: what mounting needs (scripts/run.sh), and the rest only with --test (scripts/test.sh).

The script runs for real on a copy of scripts/, with every everyday tool
missing from its PATH; its two ways out are recorded: the Debian packages it
asks apt for (scripts/apt-install.sh) and the commands of the venv's Python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

#: what the script itself runs, found on the machine; everything else is missing from its PATH
TOOLS = ("bash", "dirname", "touch", "cat", "id", "pkg-config", "gcc", "fusermount3")
TEST_ONLY = {"vim", "emacs-nox", "rsync", "less", "openjdk-17-jre-headless", "util-linux"}


def _run(tmp_path: Path, *args: str) -> tuple[list[str], list[str]]:
    """(apt packages asked for, the venv Python's command lines with their PYTHONWARNINGS) of one run."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / "engine" / "records").mkdir(parents=True)
    (root / "engine" / "records" / "_kernels.c").write_text("")
    apt_log, python_log = tmp_path / "apt.log", tmp_path / "python.log"
    (root / "scripts" / "apt-install.sh").write_text(f'apt_install() {{ echo "$@" >> {apt_log}; }}\n')
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(f'#!/bin/sh\necho "PYTHONWARNINGS=$PYTHONWARNINGS $*" >> {python_log}\n')
    (venv_bin / "python").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is part of the machine scripts/setup.sh runs on"
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(sys.executable)
    result = subprocess.run(["bash", str(root / "scripts" / "setup.sh"), *args], cwd=root, capture_output=True,
                            text=True, env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stderr
    apt = apt_log.read_text().split() if apt_log.exists() else []
    return apt, python_log.read_text().splitlines()


def test_setup_for_mounting_installs_nothing_only_the_tests_use(tmp_path):
    apt, python = _run(tmp_path)
    assert not TEST_ONLY & set(apt), apt
    installs = [line for line in python if " pip install " in line and " -e " in line]
    assert installs, python
    assert all(line.endswith(" -e .") for line in installs), python
    # setuptools' "Editable installation" notice is not shown (pip prints it as a BuildBackendWarning)
    assert all(line.startswith("PYTHONWARNINGS=ignore:Editable installation ") for line in installs), python


def test_setup_for_the_tests_installs_the_rest(tmp_path):
    apt, python = _run(tmp_path, "--test")
    assert set(apt) >= TEST_ONLY, apt
    assert any(line.endswith(' -e .[test,spark]') for line in python), python
    assert (ROOT / "scripts" / "test.sh").read_text().count("bash scripts/setup.sh --test") == 1
    assert "bash scripts/setup.sh\n" in (ROOT / "scripts" / "run.sh").read_text()


def test_setup_refuses_an_unknown_argument(tmp_path):
    with pytest.raises(AssertionError, match=r"usage: scripts/setup\.sh"):
        _run(tmp_path, "--tests")


def test_the_stamps_skip_what_is_done(tmp_path):
    """A second run installs nothing: one stamp for the mount's packages, one for the extras."""
    _run(tmp_path, "--test")
    root = tmp_path / "checkout"
    os.utime(root / "pyproject.toml", (1, 1))
    os.utime(root / "engine" / "records" / "_kernels.c", (1, 1))
    (tmp_path / "python.log").unlink()
    result = subprocess.run(["bash", "scripts/setup.sh", "--test"], cwd=root, capture_output=True, text=True,
                            env={"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert " pip install " not in (tmp_path / "python.log").read_text()
