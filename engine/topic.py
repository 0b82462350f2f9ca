"""Topic and partition names: Kafka's rules and the ``<topic>-<partition>`` directory names."""

from __future__ import annotations

import re
from typing import NamedTuple

from engine.errors import InvalidPartitionError, InvalidTopicError
from engine.files import DELETE_DIR_SUFFIX
from engine.numbers import INT_MAX, parse_canonical_int

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")


#: Kafka's ``Topic.INTERNAL_TOPICS``: the group coordinator's, the transaction coordinator's and the
#: share coordinator's stores.  Clients may read them; only their coordinator writes them.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def is_internal(topic: str) -> bool:
    """Kafka's ``Topic.isInternal``."""
    return topic in INTERNAL_TOPICS


#: Longest file name of common Linux file systems (NAME_MAX).
MAX_FILE_NAME_LENGTH = 255


def delete_dir_name(topic: str, partition: int, unique_id: str) -> str:
    """``<topic>-<partition>.<id>-delete``, the topic cut short so it fits a file name.

    As Kafka's ``UnifiedLog.logDeleteDirName``: a topic of up to 249
    characters plus ``-<partition>.<32 hex digits>-delete`` can pass 255
    bytes, so the topic prefix is cut; the name is only ever parsed as "a
    directory to remove", never for its topic.
    """
    suffix = f"-{partition}.{unique_id}{DELETE_DIR_SUFFIX}"
    return topic[:max(0, MAX_FILE_NAME_LENGTH - len(suffix))] + suffix


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def dir_name(self) -> str:
        """The partition directory's name inside a log dir."""
        return f"{self.topic}-{self.partition}"


def validate_topic_name(name: str) -> str:
    """Return ``name`` if it is a legal Kafka topic name, else raise InvalidTopicError."""
    if not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"Topic name cannot be '.' or '..': {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters: {name!r}")
    if not _LEGAL_TOPIC.match(name):
        raise InvalidTopicError(
            f"Topic name {name!r} is illegal, it contains a character other than "
            "ASCII alphanumerics, '.', '_' and '-'")
    return name


def parse_partition(text: str) -> int:
    """Parse a partition number as it appears in a path or directory name."""
    value = parse_canonical_int(text, maximum=INT_MAX)
    if value is None:   # '03', '٣' (str.isdigit() accepts other scripts' digits), too big
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise InvalidPartitionError(
            f"Invalid partition number {shown!r}: expected 0 to {INT_MAX} in ASCII digits, no leading zero")
    return value


def parse_topic_partition_dir(dir_name: str) -> TopicPartition:
    """Parse ``<topic>-<partition>`` (Kafka's ``Log.parseTopicPartitionName``).

    Topic names may themselves contain '-', so the partition is what follows the
    last dash.  Raises InvalidTopicError for anything else, which is what Kafka
    does for a stray directory in a log dir.
    """
    topic, dash, partition = dir_name.rpartition("-")
    if not dash or not topic or not partition:
        raise InvalidTopicError(f"Found directory {dir_name!r}, which is not in the form of topic-partition")
    try:
        number = parse_partition(partition)
    except InvalidPartitionError as exc:
        raise InvalidTopicError(
            f"Found directory {dir_name!r}, which is not in the form of topic-partition") from exc
    return TopicPartition(validate_topic_name(topic), number)
