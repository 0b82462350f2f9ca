"""``partition.metadata``: the topic ID a partition directory belongs to (Kafka's ``PartitionMetadataFile``).

Kafka writes ``version: 0`` and ``topic_id: <base64 UUID>`` lines into every
partition directory, so a directory left from a deleted topic is never taken
for a new topic of the same name.  logfs writes it for the partitions a
cluster mount replicates (logfs.cluster), with the same purpose: a topic
recreated on the cluster gets a new ID, and the replica of the old one is
dropped instead of being served as the new topic's data.  The loader leaves
the file alone (engine.log_loader skips files it does not know).
"""

from __future__ import annotations

import os

from engine.files import atomic_write

PARTITION_METADATA_FILE = "partition.metadata"


def read_topic_id(partition_dir: str) -> str | None:
    """The topic ID recorded in ``partition_dir``, or None when there is no (readable) file."""
    try:
        with open(os.path.join(partition_dir, PARTITION_METADATA_FILE), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "topic_id" and value.strip():
            return value.strip()
    return None


def write_topic_id(partition_dir: str, topic_id: str) -> None:
    """Record ``topic_id`` in ``partition_dir`` (atomically, durable once this returns)."""
    atomic_write(os.path.join(partition_dir, PARTITION_METADATA_FILE),
                 f"version: 0\ntopic_id: {topic_id}\n".encode())
