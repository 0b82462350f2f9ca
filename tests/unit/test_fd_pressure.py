"""All or nothing when file descriptors run out, and deleted segments that hold one each (issue 18).

Each scenario runs in a child Python with a low ``RLIMIT_NOFILE`` (the
``prlimit --nofile=300`` of the issue, scaled to what one log needs), so the
test process itself is never starved.  The child prints one JSON line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

from tests import ROOT
from tests.helpers import JsonObject, json_object

if TYPE_CHECKING:
    from pathlib import Path


def run_child(code: str, tmp_path: Path) -> JsonObject:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path)], capture_output=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return json_object(result.stdout.decode().strip().splitlines()[-1])


PRELUDE = """
    import errno, json, os, resource, sys
    from engine.config import LogConfig
    from engine.log import Log

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    def state(log):
        return {"end": log.log_end_offset, "start": log.log_start_offset,
                "values": [r.value.decode() for r in log.read_records(0)]}

    path = os.path.join(sys.argv[1], "a-0")
    os.mkdir(path)
"""


def test_a_roll_that_runs_out_of_descriptors_leaves_the_log_as_it_was(tmp_path):
    out = run_child(PRELUDE + """
    log = Log.load(path, LogConfig.from_props({"internal.segment.bytes": "100", "file.delete.delay.ms": "60000"}))
    log.append_values([b"before-0", b"before-1"])
    before = state(log)
    limit = open_fds() + 30
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    try:
        log.append_values([b"%d" % i for i in range(1, 201)])     # seq 200 > append: a roll per few records
        failure = None
    except OSError as exc:
        failure = errno.errorcode.get(exc.errno, str(exc.errno))
    after = state(log)
    files = sorted(n for n in os.listdir(path) if not n.endswith(".deleted"))
    next_offset = log.append_values([b"next"])[0]                  # not 60 s later: at once
    print(json.dumps({"failure": failure, "before": before, "after": after, "next": next_offset,
                      "files": files}))
    """, tmp_path)
    assert out["failure"] == "EMFILE"
    assert out["after"] == out["before"] == {"end": 2, "start": 0, "values": ["before-0", "before-1"]}
    assert out["next"] == 2
    # the segments rolled by the failed write went (the one at its first offset stays, empty,
    # as Kafka's truncateTo leaves it), and no file of the roll that failed is left behind
    assert out["files"] == [f"{base:020d}{suffix}" for base in (0, 2) for suffix in (".index", ".log", ".timeindex")]


def test_segments_waiting_for_deletion_hold_only_their_log_descriptor(tmp_path):
    out = run_child(PRELUDE + """
    log = Log.load(path, LogConfig.from_props({"internal.segment.bytes": "200", "file.delete.delay.ms": "60000"}))
    for i in range(100):
        log.append_values([b"record-%03d" % i])
    segments = len(log.segments)
    held = open_fds()
    log.maybe_increment_log_start_offset(95)
    log.delete_old_segments()
    released = open_fds()
    print(json.dumps({"segments": segments, "pending": log.pending_deletion_segments, "held": held,
                      "released": released, "deleted_files": sum(n.endswith(".deleted") for n in os.listdir(path)),
                      "values": [r.value.decode() for r in log.read_records(95)]}))
    """, tmp_path)
    assert out["segments"] > 20
    assert out["pending"] >= out["segments"] - 3
    assert out["deleted_files"] == 3 * out["pending"]          # on disk until file.delete.delay.ms
    assert out["held"] - out["released"] >= out["pending"]      # but their index maps are gone now
    assert out["values"] == ["record-%03d" % i for i in range(95, 100)]


def test_a_topic_created_without_descriptors_left_is_emfile_and_leaves_nothing(tmp_path):
    """mkdir of a topic when the mount has no descriptor left: EMFILE naming the cause (EIO would say the disk
    failed), no partition directory left behind, and the same mkdir works once descriptors are free."""
    out = run_child("""
    import errno, json, os, resource, sys
    from engine.config import BrokerConfig
    from engine.errors import LogfsError
    from engine.manager import LogManager

    data = os.path.join(sys.argv[1], "data")
    manager = LogManager(BrokerConfig.from_props({"log.dirs": data}))
    manager.startup()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 4, hard))
    try:
        while True:                                     # use up what is left
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        manager.create_topic("t", 1)
        failure = None
    except LogfsError as exc:
        failure = {"errno": errno.errorcode[exc.errno], "message": str(exc)}
    for fd in held:
        os.close(fd)
    left = sorted(n for n in os.listdir(data) if n.startswith("t-"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    manager.create_topic("t", 1)
    print(json.dumps({"failure": failure, "left": left, "after": sorted(manager.topics())}))
    """, tmp_path)
    assert out["failure"]["errno"] == "EMFILE", out
    assert "Too many open files" in out["failure"]["message"]
    assert out["left"] == []
    assert out["after"] == ["t"]
