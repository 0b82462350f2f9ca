"""Kafka's ``PartitionMetadataFile``: the topic ID of the topic a partition directory belongs to.

Every partition directory Kafka creates holds ``partition.metadata``::

    version: 0
    topic_id: <the topic's Uuid, base64 url-safe without padding>

The topic ID tells two topics of the same name apart: a topic deleted and
created again gets a new ID.  logfs writes the file when it creates a
partition (so a data dir stays a log dir Kafka recognises, and ``logfs
to-kafka adopt`` replaces it with the broker's ID), and reads it only to give
the next partition of a topic the same ID.  The checkpoints keep Kafka's
``topic partition offset`` format, which has no topic ID: what keeps a deleted
topic's checkpoint entries away from a new topic of the same name is
:meth:`engine.manager.LogManager` dropping them durably before the new
partition exists (see its module docstring, "Deletion and crashes").
"""

from __future__ import annotations

import base64
import os
import uuid

from engine.files import atomic_write, write_cache_file

__all__ = ["PARTITION_METADATA_FILE", "new_topic_id", "read_topic_id", "write_partition_metadata"]

#: Kafka's ``PartitionMetadataFile.PARTITION_METADATA_FILE_NAME``.
PARTITION_METADATA_FILE = "partition.metadata"
_VERSION = 0


def new_topic_id() -> str:
    """Kafka's ``Uuid.randomUuid().toString()``: 16 random bytes, base64 url-safe, no padding.

    As Kafka, never the reserved zero or metadata-topic IDs and never a string
    starting with ``-`` (it would read as an option on a command line).
    """
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
        if not text.startswith("-") and raw not in (bytes(16), bytes(15) + b"\x01"):
            return text


def write_partition_metadata(partition_dir: str, topic_id: str, *, durable: bool = True) -> None:
    """Write ``partition.metadata`` atomically, durably (file fsynced, then the directory) unless not
    ``durable`` (a power loss may then leave it missing or empty: :func:`read_topic_id` gives None); raises
    OSError."""
    data = f"version: {_VERSION}\ntopic_id: {topic_id}\n".encode("ascii")
    (atomic_write if durable else write_cache_file)(os.path.join(partition_dir, PARTITION_METADATA_FILE), data)


def read_topic_id(partition_dir: str) -> str | None:
    """The topic ID in ``partition_dir``'s ``partition.metadata``; None when it is missing or unreadable."""
    try:
        with open(os.path.join(partition_dir, PARTITION_METADATA_FILE), encoding="utf-8") as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return None
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    if fields.get("version") != str(_VERSION):
        return None
    return fields.get("topic_id") or None
