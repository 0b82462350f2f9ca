"""Per-open-file append state: lines in, record batches out.

One ``LineAppender`` lives for each open of an ``append`` file.  It turns the
byte stream of ``write()`` calls into records the way kafka-console-producer
turns stdin lines into records, with the mount's own guarantees (SPEC.md
"Writing"):

* every complete line is one record, the newline not part of it; a line split
  across writes is joined here (the partial last line is buffered per open
  file) and a last line without a newline is appended when the file is closed;
* the records of one ``write()`` are one batch per partition, appended all or
  nothing: a failure leaves both the log and this handle's buffer as they were,
  so the writer's retry is safe;
* ``parse.key``/``key.separator``/``null.marker`` come from the topic config at
  each write, so altering the config takes effect on open handles at once;
* on a topic-level ``append``, keyed records go where Kafka's default
  partitioner (murmur2) puts them, unkeyed writes go round-robin by write;
* reading the handle returns one ``<first offset> <last offset>`` line per
  batch it appended (``<partition> <first> <last>`` on a topic-level file,
  where the offsets alone would not say which log they are in).

Line splitting is the hot path of ``cat file >> append``: it is one
``bytes.split`` per write and, without keys, no per-line Python work at all.
The append itself runs on the calling (trio) thread: encoding a 1 MiB batch is
pure Python holding the GIL, so a worker thread would buy no parallelism and
cost a ``trio.to_thread.run_sync`` round trip (measured ~110 us here) per
write.  Only a topic with ``flush.messages`` set, whose appends may fsync,
appends from a worker thread (see ``blocking``).
"""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING
from collections.abc import Sequence

from engine.errors import InvalidRecordError, LogfsError, RecordTooLargeError, UnknownTopicOrPartitionError
from engine.partitioner import partition_for_key
from engine.topic import TopicPartition
from engine.views import attach as attach_views

if TYPE_CHECKING:  # pragma: no cover
    from engine.config import LogConfig
    from engine.log import Log
    from engine.manager import LogManager
    from logfs.stats import MountStats

log = logging.getLogger(__name__)

__all__ = ["LineAppender"]

_NEWLINE = b"\n"
_LONG_MAX = 2**63 - 1
#: Bytes of a refused request kept to recognise the writer's retry of it.
_RETRY_PREFIX = 64 * 1024
#: Most framing one unkeyed record adds to its value: the 61-byte batch header and the record's varints.
_BATCH_OVERHEAD = 128


class _RetriedRecordTooLarge(RecordTooLargeError):
    """EMSGSIZE for a retry of a refused request: logged at the first refusal only."""

    quiet = True



class TopicRouter:
    """Round-robin partition choice for unkeyed writes to a topic-level ``append``.

    Shared by every handle of a topic so concurrent writers spread too; the
    choice is per write (Kafka's sticky partitioner picks per batch as well).
    """

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def next_partition(self, num_partitions: int) -> int:
        p = self._next % num_partitions
        self._next = p + 1
        return p


class OffsetReplies:
    """The ``first last`` lines an append handle answers with, read as a stream.

    Writes move the file position, so a read returns the replies not read yet
    whatever offset the kernel asks for (``append`` and ``append.jsonl`` alike).
    """

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def add(self, line: bytes) -> None:
        self._buf += line

    def read(self, size: int) -> bytes:
        chunk = bytes(self._buf[self._pos:self._pos + size])
        self._pos += len(chunk)
        return chunk


class LineAppender:
    """Append state of one open ``append`` file (see the module docstring)."""

    direct_io = True
    offload_reads_from = None   # offset replies are tiny: always read inline

    @property
    def blocking(self) -> bool:
        """Whether an append may fsync (``flush.messages`` set): then it leaves the trio thread.

        Kafka flushes inside the append when ``flush.messages`` is reached; done
        inline, that fsync would stall every other request of the mount.  The
        kernel serialises writes to one inode, so moving them to a worker thread
        does not reorder a writer's batches.
        """
        try:
            return self._config().flush_messages < _LONG_MAX
        except LogfsError:
            return False

    def __init__(self, manager: LogManager, topic: str, partition: int | None,
                 router: TopicRouter, stats: MountStats) -> None:
        self._manager = manager
        self._topic = topic
        self._partition = partition
        self._router = router
        self._stats = stats
        self._partial = b""
        # the first bytes of the request refused for an oversized record, to know its retry
        self._rejected: bytes | None = None
        self._retries_refused = 0
        self._skip_to_newline = False
        self._replies = OffsetReplies()
        self._written: dict[int, Log] = {}   # partition -> log, for fsync

    # ------------------------------------------------------------------ FUSE-facing

    def write(self, offset: int, data: bytes) -> int:
        """Append the complete lines of ``partial + data``; the offset is ignored.

        A record over ``max.message.bytes`` fails the request that reveals it
        with EMSGSIZE and appends nothing of that request.  The kernel splits a
        ``write(2)`` into requests of at most 1 MiB, so a long line usually
        spans requests: its head is buffered (the limit is 1 MiB + 12 by
        default) and the request carrying the rest fails.  The kernel then
        reports the bytes before that request as written, and writers retry
        the rest (stdio, coreutils' full_write, Python's buffered files): that
        retry, recognised by its bytes, fails with EMSGSIZE too, which is the
        error the writer sees.  A writer that keeps the refused bytes and sends
        them once more (Python's buffered file does, at close) has seen the
        error: that second retry drops the rest of the oversized line and
        appends what follows it.  The oversized record is dropped whole (its
        buffered head included) and nothing else; a write that is not a retry
        starts afresh, so the descriptor stays usable.
        """
        total = len(data)
        if self._skip_to_newline:
            data = self._skip_line_rest(data)
        if data and self._rejected is not None:
            data = self._check_retry(data)
        if not data:
            return total
        partial = self._partial
        buf = partial + data if partial else data
        lines = buf.split(_NEWLINE)
        rest = lines.pop()
        limit = self._config().max_message_bytes
        if partial and lines and len(lines[0]) > limit:
            self._reject(data, len(lines[0]), limit, drop_partial=True)
        if len(rest) > limit:
            # A line that can never fit: refuse it now rather than buffer without bound.
            self._reject(data, len(rest), limit, drop_partial=not lines)
        if lines:
            try:
                # the bytes of the lines appended, a partial line carried over from earlier requests included
                self._append_lines(lines, len(buf) - len(rest))
            except RecordTooLargeError:
                # Framing overhead can push a line just under the limit over it;
                # if that line began in an earlier request, drop its head with it.
                if partial and len(lines[0]) > limit - _BATCH_OVERHEAD:
                    self._partial = b""
                    self._rejected = bytes(data[:_RETRY_PREFIX])
                raise
        self._partial = rest
        return total

    def _reject(self, data: bytes, length: int, limit: int, *, drop_partial: bool) -> None:
        if drop_partial:
            self._partial = b""
        self._rejected = bytes(data[:_RETRY_PREFIX])
        raise RecordTooLargeError(
            f"A line of at least {length} bytes written to {self._describe()} exceeds max.message.bytes="
            f"{limit} of topic {self._topic}; the line is dropped, nothing else")

    def _check_retry(self, data: bytes) -> bytes:
        """The writer's retry of the request that carried an oversized record: refused once, then dropped.

        Returns what of ``data`` is left to append (all of it when it is not a retry).
        """
        rejected, self._rejected = self._rejected, None
        n = min(len(rejected), len(data))   # type: ignore[arg-type]
        if not n or data[:n] != rejected[:n]:  # type: ignore[index]
            self._retries_refused = 0
            return data
        if self._retries_refused == 0:
            self._rejected = rejected
            self._retries_refused = 1
            raise _RetriedRecordTooLarge(
                f"The rest of an oversized line written to {self._describe()} was refused again")
        self._retries_refused = 0
        self._skip_to_newline = True
        return self._skip_line_rest(data)

    def _skip_line_rest(self, data: bytes) -> bytes:
        """Drop the rest of a refused line: ``data`` up to and including its first newline."""
        end = data.find(_NEWLINE)
        if end < 0:
            return b""
        self._skip_to_newline = False
        return data[end + 1:]

    def read(self, offset: int, size: int) -> bytes:
        """The offset replies, read as a stream (writes move the file position)."""
        return self._replies.read(size)

    def flush(self) -> None:
        """close(): the last line without a newline becomes a record."""
        if self._partial:
            # Taken out first: refused, it is dropped here and close() says why, once
            # (release() must not try it again and log it a second time).
            rest, self._partial = self._partial, b""
            self._append_lines([rest], len(rest))

    def release(self) -> None:
        size = len(self._partial)
        try:
            self.flush()
        except Exception as exc:  # no client left to tell: say it in the log
            # bad input is a WARNING (SPEC: one line naming the cause); a failing disk an ERROR
            level = logging.WARNING if getattr(exc, "errno", None) == errno.EINVAL else logging.ERROR
            log.log(level, "Dropped the unterminated last line (%d bytes) written to %s: %s",
                    size, self._describe(), exc)

    def fsync(self) -> None:
        """Kafka's flush of every log this handle appended to (or its partition's)."""
        logs = list(self._written.values())
        if not logs and self._partition is not None:
            target = self._manager.get_log(TopicPartition(self._topic, self._partition))
            logs = [target] if target is not None else []
        for target in logs:
            target.flush()

    # ------------------------------------------------------------------ internals

    def _describe(self) -> str:
        if self._partition is None:
            return f"{self._topic}/append"
        return f"{self._topic}/{self._partition}/append"

    def _config(self) -> LogConfig:
        if self._partition is None:
            return self._manager.topic_config(self._topic)
        return self._log(self._partition).config

    def _log(self, partition: int) -> Log:
        target = self._manager.get_log(TopicPartition(self._topic, partition))
        if target is None:
            raise UnknownTopicOrPartitionError(f"No partition {self._topic}-{partition}")
        attach_views(target)        # the mount's appends keep the view indexes exact, no rescan
        return target

    def _append_lines(self, lines: list[bytes], nbytes: int) -> None:
        config = self._config()
        keys: list[bytes | None] | None = None
        values: list[bytes | None] = lines  # type: ignore[assignment]
        if config.parse_key:
            keys, values = _split_keys(lines, config.key_separator.encode())
        marker = config.null_marker
        if marker is not None:
            m = marker.encode()
            values = [None if v == m else v for v in values]
            if keys is not None:
                keys = [None if k == m else k for k in keys]
        if self._partition is not None:
            self._append(self._partition, values, keys, None)
        else:
            self._append_to_topic(values, keys, config)
        self._stats.record_append(len(values), nbytes)

    def _append(self, partition: int, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None,
                tag: str | None) -> None:
        target = self._log(partition)
        first, last = target.append_values(values, keys)
        self._written[partition] = target
        if tag is None:
            self._replies.add(b"%d %d\n" % (first, last))
        else:
            self._replies.add(b"%s %d %d\n" % (tag.encode(), first, last))

    def _append_to_topic(self, values: list[bytes | None], keys: list[bytes | None] | None,
                         config: LogConfig) -> None:
        num_partitions = len(self._manager.partitions(self._topic))
        if num_partitions == 0:
            raise UnknownTopicOrPartitionError(f"No topic {self._topic!r}")
        if keys is None:
            p = self._router.next_partition(num_partitions)
            self._append(p, values, None, str(p))
            return
        # Keyed: one batch per partition, each keeping the lines' order.  The
        # batches cannot be atomic together, so refuse an oversized record
        # before any of them is appended.
        limit = config.max_message_bytes
        for v in values:
            if v is not None and len(v) > limit:
                raise RecordTooLargeError(
                    f"A record of {len(v)} bytes exceeds max.message.bytes={limit} of topic {self._topic}")
        groups: dict[int, tuple[list, list]] = {}
        unkeyed_partition = None
        for k, v in zip(keys, values):
            if k is None:
                if unkeyed_partition is None:
                    unkeyed_partition = self._router.next_partition(num_partitions)
                p = unkeyed_partition
            else:
                p = partition_for_key(k, num_partitions)
            group = groups.get(p)
            if group is None:
                group = groups[p] = ([], [])
            group[0].append(v)
            group[1].append(k)
        for p, (vs, ks) in groups.items():
            self._append(p, vs, ks, str(p))


def _split_keys(lines: list[bytes], separator: bytes) -> tuple[list[bytes | None], list[bytes | None]]:
    """kafka-console-producer's parse.key: ``key<sep>value``; a line without a separator is refused."""
    pairs = [line.split(separator, 1) for line in lines]
    for n, pair in enumerate(pairs):
        if len(pair) != 2:
            raise InvalidRecordError(
                f"No key separator {separator!r} found on line {n + 1} of the write: {lines[n][:80]!r}")
    return [p[0] for p in pairs], [p[1] for p in pairs]
