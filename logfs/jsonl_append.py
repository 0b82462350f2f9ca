"""``append.jsonl`` files: JSON lines in, in the format ``records.jsonl`` gives out.

``MOUNT/<topic>/<p>/append.jsonl`` appends to partition ``p``;
``MOUNT/<topic>/append.jsonl`` routes each record as a Kafka producer does: a
line with a ``partition`` member goes to that partition (an explicit partition
wins over the partitioner, as in a ``ProducerRecord``), a keyed line without
one to murmur2(key) % partitions, and the unkeyed lines of one write to one
partition chosen round-robin per write.  Lines exported from ``records.jsonl``
carry their partition, so ``cat a/*/records.jsonl >> b/append.jsonl`` keeps
the partitioning; strip it (``jq -c 'del(.partition)'``) to re-partition by key.

As for ``append`` (logfs.appender): one ``write()`` is one batch per partition,
appended all or nothing (and on the topic-level file, refused as a whole
before any partition is appended to when a line is malformed, names a missing
partition or holds an oversized record); a line split across writes is joined
per open file; the last line without a newline is appended at close; blank
lines are skipped; reading the handle gives ``<first> <last>`` (partition
level) or ``<partition> <first> <last>`` (topic level) per batch.  A malformed
line fails the write with EINVAL, and the mount logs one line naming its line
number in the stream written through that open file.
"""

from __future__ import annotations

import errno
import logging
import threading
from typing import TYPE_CHECKING

from engine.errors import InvalidPartitionError, LogfsError, RecordTooLargeError, UnknownTopicOrPartitionError
from engine.jsonl_in import JsonRecord, append_json_records, parse_jsonl_lines
from engine.partitioner import partition_for_key
from engine.topic import TopicPartition
from logfs.appender import OffsetReplies
from logfs.control import AppendTargetFile
from logfs.handles import Handle

if TYPE_CHECKING:  # pragma: no cover
    from engine.log import Log
    from logfs.namespace import Namespace

log = logging.getLogger(__name__)

__all__ = ["JsonlAppendFile", "JsonlAppender"]

_LONG_MAX = 2**63 - 1


class JsonlAppendFile(AppendTargetFile):
    """``append.jsonl`` of a partition (``partition``) or of a topic (``partition`` None)."""

    name = "append.jsonl"

    def handle(self) -> Handle:
        return JsonlAppender(self.ns, self.topic, self.partition, self.describe())


class JsonlAppender(Handle):
    """Append state of one open ``append.jsonl`` (see the module docstring)."""

    offload_reads_from = None

    def __init__(self, ns: Namespace, topic: str, partition: int | None, name: str) -> None:
        self._ns = ns
        self._topic = topic
        self._partition = partition
        self._name = name
        self._partial = b""
        self._lines_done = 0          # complete lines appended through this opening (for error line numbers)
        self._replies = OffsetReplies()
        self._written: dict[int, Log] = {}
        self._lock = threading.Lock()

    @property
    def blocking(self) -> bool:
        """Parsing JSON and encoding batches is CPU work like ``append``'s; only a topic that may fsync
        on append (``flush.messages``) leaves the trio thread."""
        try:
            return self._ns.manager.topic_config(self._topic).flush_messages < _LONG_MAX
        except LogfsError:
            return False

    def write(self, offset: int, data: bytes) -> int:
        with self._lock:
            buf = self._partial + data if self._partial else data
            lines = buf.split(b"\n")
            rest = lines.pop()
            if lines:
                self._append(lines, len(data))
            elif len(rest) > 4 * self._ns.manager.topic_config(self._topic).max_message_bytes + 4096:
                # a JSON line carries a record in at most ~4/3 of its size (base64): one this long never fits
                raise RecordTooLargeError(
                    f"A JSON line of at least {len(rest)} bytes written to {self._name} cannot hold a record "
                    f"within max.message.bytes")
            self._partial = rest
        return len(data)

    def read(self, offset: int, size: int) -> bytes:
        return self._replies.read(size)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                # Taken out first: refused, it is dropped and close() says why, once.
                rest, self._partial = self._partial, b""
                self._append([rest], 0)

    def release(self) -> None:
        size = len(self._partial)
        try:
            self.flush()
        except Exception as exc:   # no caller left: say it in the log
            level = logging.WARNING if getattr(exc, "errno", None) == errno.EINVAL else logging.ERROR
            log.log(level, "Dropped the unterminated last JSON line (%d bytes) written to %s: %s",
                    size, self._name, exc)

    def fsync(self) -> None:
        targets = list(self._written.values())
        if not targets and self._partition is not None:
            targets = [self._ns.log(TopicPartition(self._topic, self._partition))]
        for target in targets:
            target.flush()

    # ------------------------------------------------------------------ internals

    def _append(self, lines: list[bytes], nbytes: int) -> None:
        first_number = self._lines_done + 1
        numbered = [(n, line) for n, line in enumerate(lines) if line.strip()]
        if len(numbered) == len(lines):            # no blank line: numbers follow positions
            parsed = parse_jsonl_lines(lines, first_number, self._name)
        else:                                      # per line, so an error names its number in the stream
            parsed = []
            for n, line in numbered:
                parsed.extend(parse_jsonl_lines([line], first_number + n, self._name))
        if parsed:
            if self._partition is not None:
                self._append_to(self._partition, parsed, None)
            else:
                self._append_routed(parsed, [first_number + n for n, _ in numbered])
            self._ns.stats.record_append(len(parsed), nbytes)
        self._lines_done += len(lines)

    def _append_to(self, partition: int, parsed: list[JsonRecord], tag: int | None) -> None:
        target = self._ns.log(TopicPartition(self._topic, partition))
        first, last = append_json_records(target, parsed)
        self._written[partition] = target
        if tag is None:
            self._replies.add(b"%d %d\n" % (first, last))
        else:
            self._replies.add(b"%d %d %d\n" % (tag, first, last))

    def _append_routed(self, parsed: list[JsonRecord], numbers: list[int]) -> None:
        partitions = self._ns.manager.partitions(self._topic)
        count = len(partitions)
        if count == 0:
            raise UnknownTopicOrPartitionError(f"No topic {self._topic!r}")
        limit = self._ns.manager.topic_config(self._topic).max_message_bytes
        groups: dict[int, list[JsonRecord]] = {}
        unkeyed: int | None = None
        for record, number in zip(parsed, numbers):
            # refuse before any partition is appended to: the batches of different
            # partitions cannot be atomic together
            size = (len(record.value) if record.value is not None else 0) + \
                (len(record.key) if record.key is not None else 0)
            if size > limit:
                raise RecordTooLargeError(
                    f"The record at line {number} of {self._name} is at least {size} bytes, over "
                    f"max.message.bytes={limit} of topic {self._topic}")
            if record.partition is not None:
                if record.partition >= count:
                    raise InvalidPartitionError(
                        f"Line {number} of {self._name} names partition {record.partition}, but topic "
                        f"{self._topic} has {count} partitions")
                p = record.partition
            elif record.key is not None:
                p = partition_for_key(record.key, count)
            else:
                if unkeyed is None:
                    unkeyed = self._ns.router(self._topic).next_partition(count)
                p = unkeyed
            groups.setdefault(p, []).append(record)
        for p, records in groups.items():
            self._append_to(p, records, p)
