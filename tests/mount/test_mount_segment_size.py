"""``segment.bytes`` below Kafka 4's 1 MiB minimum is refused (EINVAL naming it), through a real mount.

Before, ``segment.bytes=100`` was taken and ``seq 2000 >> append`` rolled a
segment per record (5.7 s); tiny segments are a test setup, which Kafka 4
names ``internal.segment.bytes``.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import LOGFS

pytestmark = pytest.mark.mount


def test_a_topic_segment_bytes_below_one_mib_is_einval_and_changes_nothing(mount):
    mount.sh("mkdir t && echo retention.ms=5000 >> t/config")
    mount.sh_refused("echo segment.bytes=100 >> t/config")
    assert "Invalid value 100 for configuration segment.bytes: Value must be at least 1048576" in mount.log()
    config = mount.sh("cat t/config").stdout.decode()
    assert "retention.ms=5000\n" in config
    assert "\nsegment.bytes=" not in config                                         # still the default
    mount.sh("seq 2000 >> t/0/append")
    assert len(list(mount.partition_dir("t", 0).glob("*.log"))) == 1                 # one segment, not 2000
    mount.sh("echo segment.bytes=1048576 >> t/config")                                 # the minimum is taken
    assert "\nsegment.bytes=1048576\n" in mount.sh("cat t/config").stdout.decode()


def test_the_internal_setting_gives_tiny_segments(mount):
    mount.sh("mkdir t && echo internal.segment.bytes=200 >> t/config && seq 30 >> t/0/append")
    assert len(list(mount.partition_dir("t", 0).glob("*.log"))) > 1
    assert mount.sh("wc -l < t/0/records").stdout.strip() == b"30"


@pytest.mark.parametrize("option", ["log.segment.bytes=4096", "offsets.topic.segment.bytes=160"])
def test_a_broker_default_below_one_mib_keeps_the_mount_from_starting(tmp_path, option):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = subprocess.run([str(LOGFS), "mount", str(mnt), "--data-dir", str(tmp_path / "d"), "-o", option],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        name, value = option.split("=")
        assert f"Invalid value {value} for configuration {name}: Value must be at least 1048576" in result.stderr
    finally:   # had a mount started by mistake, do not leave it behind
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
