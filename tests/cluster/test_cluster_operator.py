"""A cluster mount through an operator's routine work on the cluster (issue 33, second half).

Its own 3-node cluster (tests/kafka_cluster.py: KRaft, replication factor 3,
``min.insync.replicas=2``); the cluster is changed with Kafka's own tools
(ConfigCommand, DeleteRecordsCommand) and other users of the host are real
processes of another uid (``setpriv``).  The test that stops every broker runs
last and leaves the cluster whole again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Mount
from tests.kafka_cluster import KafkaCluster
from tests.mount.test_mount_shared_host import check_group_acts_as_owner, check_others_read_only

pytestmark = [pytest.mark.cluster, pytest.mark.kafka, pytest.mark.mount]


@pytest.fixture
def cluster_mount(kafka_cluster: KafkaCluster, logfs_mount):
    """Factory: a started mount of the module's cluster (``options``: more ``-o`` settings)."""
    def make(options: dict[str, str] | None = None, name: str = "c", args: list[str] | None = None) -> Mount:
        return logfs_mount(options, name=name,
                           extra_args=["--bootstrap-server", kafka_cluster.bootstrap, *(args or [])])
    return make


@pytest.fixture
def shared_cluster_mount(kafka_cluster: KafkaCluster) -> Iterator:
    """Factory: a mount of the cluster other users can walk into (pytest's tmp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="logfs-shared-"))
    os.chmod(base, 0o755)
    mounts: list[Mount] = []

    def make(args: list[str], name: str) -> Mount:
        m = Mount(base / name, None, extra_args=["--bootstrap-server", kafka_cluster.bootstrap, *args])
        os.chmod(m.base, 0o755)
        os.chmod(m.path, 0o755)
        mounts.append(m)
        return m.start()

    yield make
    for m in mounts:
        assert m.stop() == 0, m.log_tail()
    shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- shared hosts


def test_other_users_of_a_cluster_mount_commit_nothing(shared_cluster_mount, kafka_cluster: KafkaCluster) -> None:
    """``setpriv --reuid=65534 cat MNT/kh/0/consume/g-nobody`` committed offsets under the mount's principal:
    now refused by the mode bits, and a group allowed at mount time commits as the owner does."""
    m = shared_cluster_mount(["--allow-other"], "others")
    (m / "kh").mkdir()
    (m / "kh/0/append").write_bytes(b"a\nb\n")
    check_others_read_only(m, "kh")
    groups = kafka_cluster.tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                                "--bootstrap-server", kafka_cluster.bootstrap, "--list")
    assert "g-nobody" not in groups.split()
    m.stop()
    team = shared_cluster_mount(["--allow-other", "--allow-group", "nogroup"], "team")
    check_group_acts_as_owner(team, "kh")
