"""Issue 18: acknowledged records that went missing, and the durability of what a restart relies on."""

from __future__ import annotations

import errno
import json
import os

import pytest

from tests.helpers import append_lines

pytestmark = pytest.mark.mount

#: checkpoints only at shutdown or when a deletion writes them: the periodic write must not hide a stale entry
SLOW_CHECKPOINTS = {"log.flush.offset.checkpoint.interval.ms": "600000",
                    "log.flush.start.offset.checkpoint.interval.ms": "600000"}


@pytest.mark.mount_options(SLOW_CHECKPOINTS)
def test_recreated_topic_does_not_inherit_the_deleted_topics_log_start(mount):
    mount.sh("mkdir t && seq 1 10 > t/0/append && echo 'before 5' > t/0/delete && rmdir t && mkdir t")
    new = [b"new-%d" % i for i in range(20)]
    append_lines(mount / "t/0/append", new, sync=True)
    mount.kill()
    mount.start()
    assert (mount / "t/0/records").read_bytes().splitlines() == new
    state = json.loads((mount / "t/0/state").read_bytes())
    assert (state["log_start_offset"], state["log_end_offset"]) == (0, 20)
    assert "ERROR" not in mount.log()


@pytest.mark.mount_options(SLOW_CHECKPOINTS)
def test_recreated_topic_shorter_than_the_deleted_log_start_logs_no_error(mount):
    mount.sh("mkdir t && seq 1 700 > t/0/append && echo 'before 653' > t/0/delete && rmdir t && mkdir t")
    append_lines(mount / "t/0/append", [b"a", b"b"], sync=True)
    mount.kill()
    mount.start()
    assert (mount / "t/0/records").read_bytes() == b"a\nb\n"
    assert "beyond the log end" not in mount.log()
    assert "ERROR" not in mount.log()


@pytest.mark.mount_options(SLOW_CHECKPOINTS)
def test_recreated_topic_partition_dir_carries_a_new_topic_id(mount):
    (mount / "t").mkdir()
    first = (mount.partition_dir("t", 0) / "partition.metadata").read_text()
    os.rmdir(mount / "t")
    (mount / "t").mkdir()
    second = (mount.partition_dir("t", 0) / "partition.metadata").read_text()
    assert first.startswith("version: 0\ntopic_id: ")
    assert first.endswith("\n")
    assert second.startswith("version: 0\ntopic_id: ")
    assert first != second


def test_a_refused_unterminated_last_line_logs_one_warning_and_no_error(mount):
    mount.sh("for t in c d; do mkdir $t && echo cleanup.policy=compact > $t/config; done")
    for path, line in (("c/0/append", b"no-key-here"), ("d/0/append.jsonl", b'{"value": "no key"}')):
        fd = os.open(mount / path, os.O_WRONLY)
        os.write(fd, line)                  # no newline: the line is only complete at close()
        with pytest.raises(OSError) as refused:
            os.close(fd)
        assert refused.value.errno == errno.EINVAL, path
    log = mount.log()
    assert "ERROR" not in log
    lines = [line for line in log.splitlines() if "without key" in line]
    assert len(lines) == 2, lines
    assert all(" WARNING " in line for line in lines), lines
    assert (mount / "c/0/records").read_bytes() == (mount / "d/0/records").read_bytes() == b""
