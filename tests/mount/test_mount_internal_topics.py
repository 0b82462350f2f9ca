"""``__consumer_offsets`` through a real mount: readable, but only the group coordinator writes it.

Kafka refuses produce, DeleteRecords, DeleteTopics (and here CreatePartitions
and a cleanup.policy other than compact) on internal topics; so does the
engine (EPERM, one log line), and every group's commits survive a remount.
"""

from __future__ import annotations

import pytest

from engine.consumer_offsets import partition_for

pytestmark = pytest.mark.mount

PARTITIONS = 5
OPTIONS = {"offsets.topic.num.partitions": str(PARTITIONS)}


def _refused(mount, command: str, reason: str) -> None:
    """``command`` fails with EPERM and the mount logs ``reason`` (once: a repeat within a minute is not
    logged again, logfs.fs)."""
    before = mount.log().count(reason)
    result = mount.sh(command, check=False)
    assert result.returncode != 0, command
    assert b"Operation not permitted" in result.stderr, result.stderr
    after = mount.log().count(reason)
    assert after >= 1, mount.log_tail()
    assert after - before <= 1, mount.log_tail()


@pytest.mark.mount_options(OPTIONS)
def test_writes_that_would_destroy_the_commits_are_refused(mount):
    mount.sh("mkdir t && seq 1 5 > t/0/append && echo '0 3' > t/groups/g")
    p = partition_for("g", PARTITIONS)
    offsets = f"__consumer_offsets/{p}"
    assert mount.sh(f"cat {offsets}/records.jsonl | wc -l").stdout.strip() == b"1"     # readable
    _refused(mount, f"echo 'before 1' > {offsets}/delete", "Cannot delete records of internal topic")
    _refused(mount, f"echo 'key x' > {offsets}/delete", "Cannot delete records of internal topic")
    # a partition holding no commit yet: refused as such, not for an offset beyond its end
    empty = (p + 1) % PARTITIONS
    _refused(mount, f"echo 'before 1' > __consumer_offsets/{empty}/delete", "Cannot delete records of internal topic")
    assert f" __consumer_offsets/{empty}/delete EPERM " in mount.sh("cat .logfs/errors").stdout.decode()
    _refused(mount, f"echo junk >> {offsets}/append", "Cannot append to internal topic")
    _refused(mount, "echo '{\"key\": \"k\", \"value\": \"x\"}' >> __consumer_offsets/append.jsonl",
             "Cannot append to internal topic")
    _refused(mount, "rmdir __consumer_offsets", "Cannot delete internal topic __consumer_offsets")
    _refused(mount, "echo topic > __consumer_offsets/delete", "Cannot delete internal topic __consumer_offsets")
    _refused(mount, f"mkdir __consumer_offsets/{PARTITIONS}", "Cannot add partitions to internal topic")
    _refused(mount, "echo cleanup.policy=delete >> __consumer_offsets/config",
             "Cannot set cleanup.policy=delete on internal topic __consumer_offsets")
    _refused(mount, "echo cleanup.policy=compact,delete >> __consumer_offsets/config",
             "Cannot set cleanup.policy=compact,delete on internal topic")
    # what keeps the store intact is still allowed
    mount.sh("echo min.cleanable.dirty.ratio=0.1 >> __consumer_offsets/config")
    assert b"cleanup.policy=compact" in mount.sh("cat __consumer_offsets/config").stdout
    mount.stop()
    mount.start()
    assert mount.sh("cat t/groups/g").stdout == b"0 3 5 2\n"
    assert mount.sh("cat t/0/consume/g").stdout == b"4\n5\n"
    assert mount.sh(f"cat {offsets}/records.jsonl | wc -l").stdout.strip() == b"2"


@pytest.mark.mount_options({**OPTIONS, "log.cleanup.policy": "delete"})
def test_the_internal_topic_cannot_be_created_by_hand_without_compaction(mount):
    _refused(mount, "mkdir __consumer_offsets", "Cannot set cleanup.policy=delete on internal topic")
    mount.sh("mkdir t && seq 1 3 > t/0/append && head -n 1 t/0/consume/g > /dev/null")
    assert mount.sh("cat __consumer_offsets/config").stdout.count(b"cleanup.policy=compact") == 1
