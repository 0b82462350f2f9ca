"""tests/watchdog.py ends a test that no signal can stop, and a process that lingers after its session, with
its threads' stacks written where scripts/test.sh prints them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests import ROOT

HANGS = textwrap.dedent('''
    import signal, threading, time
    import pytest

    @pytest.mark.timeout(1)
    def test_stuck_where_no_signal_reaches():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})   # as a read() of a silent FUSE mount
        time.sleep(600)

    def test_leaves_a_thread_the_exit_waits_for():
        threading.Thread(target=time.sleep, args=(600,), name="left-behind").start()
''')


def _pythonpath() -> str:
    """This process's path (tests/unmarked first, which keeps an unmarked test's children from mounting) and
    the project, for ``-p tests.watchdog``."""
    return os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))


def _run(tmp_path, test: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    hangs = tmp_path / "hangs"
    env = {**os.environ, "LOGFS_TEST_HANG_DIR": str(hangs), "LOGFS_TEST_HANG_GRACE": "1",
           "PYTHONPATH": _pythonpath()}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.watchdog", "-p", "no:cacheprovider",
                             f"test_hangs.py::{test}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    return result, {p.name: p.read_text() for p in hangs.iterdir()} if hangs.exists() else {}


def test_a_test_no_signal_stops_is_ended_with_its_stacks(tmp_path):
    result, files = _run(tmp_path, "test_stuck_where_no_signal_reaches")
    assert result.returncode != 0
    [(_name, text)] = files.items()
    assert "test_stuck_where_no_signal_reaches ran over its timeout of 1 s" in text, text
    assert "in test_stuck_where_no_signal_reaches" in text, text     # the stuck frame


def test_a_process_left_waiting_for_a_thread_exits_with_its_stacks(tmp_path):
    result, files = _run(tmp_path, "test_leaves_a_thread_the_exit_waits_for")
    # The test passed (its progress dot); the summary line may be lost: it is written after the session
    # finished, into a buffer the watchdog's exit does not flush when it comes first (a loaded machine).
    assert result.stdout.lstrip().startswith("."), result.stdout + result.stderr
    assert "F" not in result.stdout, result.stdout + result.stderr
    [(name, text)] = files.items()
    assert name.endswith("-exit.txt"), text
    assert "still running 2 s after its session finished" in text, text


def test_a_process_that_exits_in_time_leaves_nothing(tmp_path):
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    pass\n")
    hangs = tmp_path / "hangs"
    env = {**os.environ, "LOGFS_TEST_HANG_DIR": str(hangs), "PYTHONPATH": _pythonpath()}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.watchdog", "-p", "no:cacheprovider",
                             "test_fine.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(hangs.iterdir()) == []
