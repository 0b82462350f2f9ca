"""Per-open-file append state: lines in, record batches out, for ``append`` and ``append.jsonl`` alike.

One :class:`AppendHandle` lives for each open of an append file.  It turns the
byte stream of ``write()`` calls into records the way kafka-console-producer
turns stdin lines into records, with the mount's own guarantees (SPEC.md
"Writing").  What a line means is the handle's :class:`LineFormat` (the
strategy): :data:`TEXT_LINES` for ``append`` (``engine.text_in``: the line is
the value, or ``key<key.separator>value`` with ``parse.key``) and
:data:`JSON_LINES` for ``append.jsonl`` (``engine.jsonl_in``: the lines
``records.jsonl`` gives out).  Everything else is the handle's, the same for
both:

* every complete line is one record, the newline not part of it; a line split
  across writes is joined here (the partial last line is buffered per open
  file) and a last line without a newline is appended when the file is closed
  by a writer that ended normally.  It is dropped (logged, and listed in
  ``.logfs/errors`` with its size), never a torn record, when the close comes
  from a writer killed by a signal (``logfs.writers``) or when a ``write()``
  failed while it was buffered and no later write ended it;
* the records of one ``write()`` are one batch per partition, appended all or
  nothing: a failure leaves both the log and this handle's buffer as they were,
  so the writer's retry is safe; a bad line fails the write with EINVAL and one
  log line naming its line number in the stream written through that opening;
* the topic config is read at each write, so altering it takes effect on open
  handles at once;
* on a topic-level file, a record naming its partition (JSON's ``partition``)
  goes there, a keyed one where Kafka's default partitioner (murmur2) puts it,
  and the unkeyed records of one write go to one partition chosen round-robin
  per write; an oversized record or a partition out of range refuses the write
  before any partition is appended to (the batches of different partitions
  cannot be atomic together);
* a line over ``max.message.bytes`` is refused with EMSGSIZE and dropped whole,
  with the retry protocol of :meth:`AppendHandle.write`;
* reading the handle returns one ``<first offset> <last offset>`` line per
  batch it appended (``<partition> <first> <last>`` on a topic-level file,
  where the offsets alone would not say which log they are in).

Line splitting is the hot path of ``cat file >> append``: it is one
``bytes.split`` per write and, without keys, no per-line Python work at all.
The append itself runs on the calling (trio) thread: encoding a 1 MiB batch is
pure Python holding the GIL, so a worker thread would buy no parallelism and
cost a ``trio.to_thread.run_sync`` round trip per write (docs/performance.md,
"Figures behind the code").  Only a topic with ``flush.messages`` set, whose appends may fsync,
appends from a worker thread (see ``blocking``); a lock keeps such writes and
a close of the same opening from interleaving.

Kafka counterpart: the console producer's ``LineMessageReader`` feeding a
``KafkaProducer`` (``DefaultPartitioner``) with ``acks=all``.
"""

from __future__ import annotations

import errno
import logging
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from engine.errors import InvalidPartitionError, LogfsError, RecordTooLargeError, UnknownTopicOrPartitionError
from engine.jsonl_in import JsonRecord, parse_jsonl_lines
from engine.partitioner import partition_for_key
from engine.text_in import parse_text_lines
from engine.topic import TopicPartition
from logfs.handles import Handle
from logfs.writers import killed_writer

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from engine.config import LogConfig
    from logfs.backend import Backend
    from logfs.stats import MountStats

log = logging.getLogger(__name__)

__all__ = ["AppendHandle", "JSON_LINES", "LineFormat", "OffsetReplies", "ParsedLines", "TEXT_LINES",
           "TopicRouter"]

_NEWLINE = b"\n"
#: Bytes of a refused request kept to recognise the writer's retry of it.
_RETRY_PREFIX = 64 * 1024
#: Most framing one unkeyed record adds to its value: the 61-byte batch header and the record's varints.
_BATCH_OVERHEAD = 128
#: The kernel splits a write(2) into requests of 1 MiB (less the offset in its first page of an unaligned
#: buffer): a request after a shorter one starts a write(2), whose caller gets a refusal of it as its error.
_SPLIT_REQUEST = (1 << 20) - 4096


class _RetriedRecordTooLarge(RecordTooLargeError):
    """EMSGSIZE for a retry of a refused request: logged at the first refusal only."""

    quiet = True


class TopicRouter:
    """Round-robin partition choice for unkeyed writes to a topic-level append file.

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
    whatever offset the kernel asks for.
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


class ParsedLines(NamedTuple):
    """The records of some lines: what the format appends, and what routing needs of each."""

    #: per record, what :meth:`LineFormat.append` takes (a value for text, a ``JsonRecord`` for JSON)
    items: list[Any]
    #: per record its key, or None when no record of the lines has one
    keys: list[bytes | None] | None
    #: per record the partition it names, or None when no record names one
    partitions: list[int | None] | None
    #: per record its line number in the stream, or None: numbered from ``first`` on
    numbers: list[int] | None
    first: int

    def number(self, i: int) -> int:
        return self.numbers[i] if self.numbers is not None else self.first + i

    def select(self, indices: list[int]) -> ParsedLines:
        return ParsedLines([self.items[i] for i in indices],
                           None if self.keys is None else [self.keys[i] for i in indices],
                           None, [self.number(i) for i in indices], 0)


class LineFormat:
    """How complete lines become records: the strategy of an :class:`AppendHandle`."""

    #: the append file's name in its directory
    file_name = ""

    def parse(self, lines: list[bytes], first_number: int, what: str, config: LogConfig) -> ParsedLines:
        """The records of ``lines`` (the first being line ``first_number`` of ``what``); InvalidRecordError."""
        raise NotImplementedError

    def append(self, backend: Backend, tp: TopicPartition, parsed: ParsedLines) -> tuple[int, int]:
        """Append ``parsed`` to ``tp`` as one batch (or consecutive batches), all or nothing, through the
        mount's backend (logfs.backend: the log itself, or a Kafka cluster)."""
        raise NotImplementedError

    def record_size(self, parsed: ParsedLines, i: int) -> int:
        """A lower bound of record ``i``'s size, to refuse an oversized one before any partition is touched."""
        raise NotImplementedError

    def line_limit(self, config: LogConfig) -> int:
        """The longest line that can hold a record within ``max.message.bytes``."""
        return config.max_message_bytes

    def plain_values(self, config: LogConfig) -> bool:
        """Whether each line is the value of a record without key, byte for byte (``append_text_lines``)."""
        return False

    def describe_limit(self, config: LogConfig, topic: str) -> str:
        return f"max.message.bytes={config.max_message_bytes} of topic {topic}"


class _TextLines(LineFormat):
    """``append``: kafka-console-producer's lines (``engine.text_in``)."""

    file_name = "append"

    def parse(self, lines: list[bytes], first_number: int, what: str, config: LogConfig) -> ParsedLines:
        keys, values = parse_text_lines(lines, parse_key=config.parse_key, key_separator=config.key_separator,
                                        null_marker=config.null_marker, first_line_number=first_number,
                                        what=what)
        return ParsedLines(values, keys, None, None, first_number)

    def append(self, backend: Backend, tp: TopicPartition, parsed: ParsedLines) -> tuple[int, int]:
        return backend.append_values(tp, parsed.items, parsed.keys)

    def plain_values(self, config: LogConfig) -> bool:
        return not config.parse_key and config.null_marker is None

    def record_size(self, parsed: ParsedLines, i: int) -> int:
        value = parsed.items[i]
        return 0 if value is None else len(value)


class _JsonLines(LineFormat):
    """``append.jsonl``: the lines ``records.jsonl`` gives out (``engine.jsonl_in``); blank lines are skipped."""

    file_name = "append.jsonl"

    def parse(self, lines: list[bytes], first_number: int, what: str, config: LogConfig) -> ParsedLines:
        numbers: list[int] | None = None
        if all(lines):
            items = parse_jsonl_lines(lines, first_number, what)
        else:       # per line, so an error names its number in the stream
            items, numbers = [], []
            for n, line in enumerate(lines):
                if line.strip():
                    items.extend(parse_jsonl_lines([line], first_number + n, what))
                    numbers.append(first_number + n)
        keys = [r.key for r in items]
        partitions = [r.partition for r in items]
        return ParsedLines(items, keys if any(k is not None for k in keys) else None,
                           partitions if any(p is not None for p in partitions) else None, numbers, first_number)

    def append(self, backend: Backend, tp: TopicPartition, parsed: ParsedLines) -> tuple[int, int]:
        return backend.append_json_records(tp, parsed.items)

    def record_size(self, parsed: ParsedLines, i: int) -> int:
        record: JsonRecord = parsed.items[i]
        return (len(record.value) if record.value is not None else 0) + \
            (len(record.key) if record.key is not None else 0)

    def line_limit(self, config: LogConfig) -> int:
        # a JSON line carries a record in at most ~4/3 of its size (base64), escapes aside
        return 4 * config.max_message_bytes + 4096

    def describe_limit(self, config: LogConfig, topic: str) -> str:
        return (f"the longest JSON line that can hold a record within max.message.bytes="
                f"{config.max_message_bytes} of topic {topic}")


#: the strategy of ``append``
TEXT_LINES: LineFormat = _TextLines()
#: the strategy of ``append.jsonl``
JSON_LINES: LineFormat = _JsonLines()


class AppendHandle(Handle):
    """Append state of one open ``append`` or ``append.jsonl`` (see the module docstring)."""

    direct_io = True
    offload_reads_from = None   # offset replies are tiny: always read inline

    def __init__(self, backend: Backend, topic: str, partition: int | None, fmt: LineFormat,
                 router: TopicRouter, stats: MountStats, note: Callable[[int, str], None] | None = None) -> None:
        self._backend = backend      # the one way its records go (logfs.backend): the handle holds no log
        # lists in .logfs/errors what close() drops with no error to return (errno, reason)
        self._note = note
        self._topic = topic
        self._partition = partition
        self._format = fmt
        self._router = router
        self._stats = stats
        self._partial = b""
        self._lines_done = 0          # complete lines taken through this opening (for line numbers)
        # the first bytes of the request refused for an oversized record, to know its retry
        self._rejected: bytes | None = None
        self._rejected_at = 0         # where the refused line starts in those bytes
        self._rejected_counted = False    # the refused line's newline, in those bytes, is counted already
        self._retries_refused = 0
        # the bytes up to the next newline are the rest of a refused line: dropped
        self._skip_to_newline = False
        # a refusal no later write reported (it was a short count of its write(2)): close() reports it
        self._unreported = False
        self._previous_size = 0       # bytes of the previous write request
        self._size = 0                # bytes of the write request being served
        # the errno of a failed write while the partial line was buffered, until a write ends that line:
        # close() then drops it rather than append a line whose writer saw an error
        self._failed: int | None = None
        self._replies = OffsetReplies()
        self._written: set[int] = set()      # the partitions appended to, for fsync
        self._lock = threading.Lock()

    @property
    def blocking(self) -> bool:
        """Whether an append may fsync (``flush.messages`` set): then it leaves the trio thread.

        Kafka flushes inside the append when ``flush.messages`` is reached; done
        inline, that fsync would stall every other request of the mount.  The
        kernel serialises writes to one inode, so moving them to a worker thread
        does not reorder a writer's batches.
        """
        try:
            return self._backend.append_blocks(self._topic)   # flush.messages, or a cluster's round trip
        except LogfsError:
            return False

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
        appends what follows it.

        The oversized line is dropped whole: its buffered head, and everything
        up to its newline however it arrives.  A write that is no retry but
        carries the rest of a refused line (a writer that took the short count
        and went on, as Python's unbuffered text files do) fails with EMSGSIZE
        and appends nothing; a refusal no later write reported is reported by
        close() (flush).  Lines after the refused one's newline append normally.
        """
        with self._lock:
            self._size = len(data)
            try:
                self._write(data)
            except Exception as exc:
                code = getattr(exc, "errno", None)
                self._failed = code if isinstance(code, int) else errno.EIO
                raise
            finally:
                self._previous_size = len(data)
        return len(data)

    def _write(self, data: bytes) -> None:
        if not data:
            return
        self._unreported = False         # this write reports a refusal, or the writer has moved on
        if self._rejected is not None and self._is_retry(data):
            if self._retries_refused == 0:
                self._retries_refused = 1
                raise _RetriedRecordTooLarge(
                    f"The rest of an oversized line written to {self._describe()} was refused again")
            # the second retry: the writer has seen the error; the line's rest goes, what follows is appended
            start, lines_done = self._rejected_at, self._lines_done
            self._rejected, self._retries_refused = None, 0
            self._skip_to_newline = True
            data = data[:start] + self._skip_line_rest(data[start:])
            if self._rejected_counted:      # its newline was counted when the line's rest was refused
                self._lines_done, self._rejected_counted = lines_done, False
        else:
            self._rejected, self._retries_refused, self._rejected_counted = None, 0, False
            if self._skip_to_newline:
                self._refuse_line_rest(data)
        if not data:
            return
        # The lines are those of partial + data (the partial line never holds a newline), built
        # with one copy of the request's bytes: a 1 MiB request of ``cat`` ends inside a line, so
        # nearly every one carries a partial line into the next (concatenating, then cutting off
        # the rest, was two copies: 7% of an append's time).
        partial = self._partial
        data_end = data.rfind(_NEWLINE) + 1           # the complete lines of data are data[:data_end]
        end = len(partial) + data_end if data_end else 0
        rest = data[data_end:] if data_end else partial + data
        config = self._config()
        limit = self._format.line_limit(config)
        # the line the partial one ends
        first_length = len(partial) + data.find(_NEWLINE) if partial and end else 0
        if first_length > limit:
            self._reject(data, 0, first_length, config, drop_partial=True, open_line=False)
        if len(rest) > limit:
            # A line that can never fit: refuse it now rather than buffer without bound.
            self._reject(data, max(0, len(data) - len(rest)), len(rest), config, drop_partial=not end,
                         open_line=True)
        if end:
            self._failed = None      # the line buffered when a write failed ends here: rest is new bytes
            try:
                # the lines appended, a partial line carried over from earlier requests included
                if partial:
                    block = b"".join((partial, memoryview(data)[:data_end]))
                else:
                    block = data if data_end == len(data) else data[:data_end]
                self._append_block(block, config)
            except RecordTooLargeError:
                # Framing overhead can push a line just under the limit over it;
                # if that line began in an earlier request, drop its head with it.
                if first_length > config.max_message_bytes - _BATCH_OVERHEAD:
                    self._partial = b""
                    self._lines_done += 1
                    self._rejected, self._rejected_at = bytes(data[:_RETRY_PREFIX]), 0
                    self._unreported = self._short_count()
                raise
        self._partial = rest

    def _reject(self, data: bytes, at: int, length: int, config: LogConfig, *, drop_partial: bool,
                open_line: bool) -> None:
        """Refuse the request ``data`` whose line starting at ``at`` is too long; ``open_line``: its newline
        is still to come (everything up to it belongs to the refused line)."""
        if drop_partial:
            self._partial = b""
        self._rejected, self._rejected_at = bytes(data[:_RETRY_PREFIX]), min(at, _RETRY_PREFIX)
        self._skip_to_newline = open_line
        self._unreported = self._short_count()
        raise RecordTooLargeError(
            f"A line of at least {length} bytes written to {self._describe()} exceeds "
            f"{self._format.describe_limit(config, self._topic)}; the line is dropped, nothing else")

    def _short_count(self) -> bool:
        """Whether the request being refused may be the last request of a write(2) split in several, whose
        caller then got a short count, not the error, and may close without writing again: the request before
        it was a whole 1 MiB one, and this one is shorter (a whole one is taken as a writer's next 1 MiB
        write(2), as ``cat`` writes: st_blksize is 1 MiB).  A writer that writes again is told then."""
        return self._previous_size > _SPLIT_REQUEST >= self._size

    def _is_retry(self, data: bytes) -> bool:
        """Whether ``data`` is the writer's retry of the request refused for an oversized line (by its bytes)."""
        rejected = self._rejected
        assert rejected is not None
        n = min(len(rejected), len(data))
        return bool(n) and data[:n] == rejected[:n]

    def _refuse_line_rest(self, data: bytes) -> None:
        """A write that is no retry and carries the rest of a refused line: the rest is dropped, the write fails.

        Nothing of ``data`` is appended (a failed write appends nothing); its
        retry is taken as the second retry above: the line's rest dropped, the
        lines after it appended.
        """
        self._partial = b""
        after = self._skip_line_rest(data)
        self._rejected, self._rejected_at, self._retries_refused = bytes(data[:_RETRY_PREFIX]), 0, 1
        self._rejected_counted = not self._skip_to_newline     # the line ended in ``data``
        # logged (and shown in .logfs/errors) at the first refusal of the line
        raise _RetriedRecordTooLarge(f"The rest of an oversized line written to {self._describe()} was dropped "
                                     f"with it ({len(data) - len(after)} bytes); this write appended nothing")

    def _skip_line_rest(self, data: bytes) -> bytes:
        """Drop the rest of a refused line: ``data`` up to and including its first newline."""
        end = data.find(_NEWLINE)
        if end < 0:
            return b""
        self._skip_to_newline = False
        self._lines_done += 1
        return data[end + 1:]

    def read(self, offset: int, size: int) -> bytes:
        """The offset replies, read as a stream (writes move the file position)."""
        return self._replies.read(size)

    def flush(self) -> None:
        """close(): the last line without a newline becomes a record; a refusal not reported yet fails it.

        The line is dropped instead (logged and listed in .logfs/errors, close() returning success: the
        writer was told at its write, or is gone) when a write failed while it was buffered, or when the
        close comes from a writer killed by a signal.
        """
        with self._lock:
            if self._unreported:
                self._unreported = False
                raise _RetriedRecordTooLarge(
                    f"close() of {self._describe()}: a line written through this descriptor was refused "
                    "(EMSGSIZE, logged when it was refused)")
            if self._partial:
                # Taken out first: refused, it is dropped here and close() says why, once
                # (release() must not try it again and log it a second time).
                rest, self._partial = self._partial, b""
                dropped = self._drop_reason()
                if dropped is not None:
                    code, why = dropped
                    message = f"Dropped the unterminated last line ({len(rest)} bytes) written to " \
                              f"{self._describe()}: {why}"
                    log.warning("%s", message)
                    if self._note is not None:
                        self._note(code, f"flush: {message}")
                    return
                self._append_lines([rest], len(rest), self._config())

    def _drop_reason(self) -> tuple[int, str] | None:
        """(errno, why) when the unterminated last line must not become a record, else None."""
        if self._failed is not None:
            name = errno.errorcode.get(self._failed, str(self._failed))
            return self._failed, f"a write() failed ({name}) while it was buffered, and no later write ended it"
        killed = killed_writer(self.opener)
        if killed is not None:
            return errno.EINTR, f"the writer, {killed.describe()}, did not end it"
        return None

    def release(self) -> None:
        size = len(self._partial)
        self._unreported = False        # no client left to tell; logged when it was refused
        try:
            self.flush()
        except Exception as exc:  # no client left to tell: say it in the log (and .logfs/errors)
            # bad input is a WARNING (SPEC: one line naming the cause); a failing disk an ERROR
            code = getattr(exc, "errno", None)
            level = logging.WARNING if code == errno.EINVAL else logging.ERROR
            message = f"Dropped the unterminated last line ({size} bytes) written to {self._describe()}: {exc}"
            log.log(level, "%s", message)
            self.refused_at_release = (code if isinstance(code, int) else errno.EIO, message)

    def shutdown(self) -> None:
        """The mount stops while a writer still holds this opening: an unterminated last line is dropped
        (logged and listed in .logfs/errors), never stored as a record, since its writer never ended it nor
        closed the file; the lines it ended are stored already."""
        with self._lock:
            rest, self._partial = self._partial, b""
        if rest:
            message = (f"Dropped the unterminated last line ({len(rest)} bytes) written to {self._describe()}: "
                       "the mount stopped while its writer still had the file open")
            log.warning("%s", message)
            if self._note is not None:
                self._note(errno.ENOTCONN, f"shutdown: {message}")

    def fsync(self) -> None:
        """Kafka's flush of every log this handle appended to (or its partition's)."""
        written = sorted(self._written) if self._written or self._partition is None else [self._partition]
        for partition in written:
            self._backend.flush(TopicPartition(self._topic, partition))

    # ------------------------------------------------------------------ internals

    def _describe(self) -> str:
        if self._partition is None:
            return f"{self._topic}/{self._format.file_name}"
        return f"{self._topic}/{self._partition}/{self._format.file_name}"

    def _config(self) -> LogConfig:
        return self._backend.produce_config(self._topic, self._partition)

    def _append_block(self, block: bytes, config: LogConfig) -> None:
        """Append the lines of ``block``, each ending in a newline."""
        if self._partition is not None and self._format.plain_values(config):
            # The hot path of ``cat file >> append``: the lines are never split here.
            first, last, count = self._backend.append_text_lines(TopicPartition(self._topic, self._partition),
                                                                 block)
            self._written.add(self._partition)
            self._replies.add(b"%d %d\n" % (first, last))
            self._stats.record_append(count, len(block))
            self._lines_done += count
            return
        lines = block.split(_NEWLINE)
        lines.pop()
        self._append_lines(lines, len(block), config)

    def _append_lines(self, lines: list[bytes], nbytes: int, config: LogConfig) -> None:
        parsed = self._format.parse(lines, self._lines_done + 1, self._describe(), config)
        if parsed.items:
            if self._partition is not None:
                self._append(self._partition, parsed, None)
            else:
                self._append_to_topic(parsed, config)
            self._stats.record_append(len(parsed.items), nbytes)
        self._lines_done += len(lines)

    def _append(self, partition: int, parsed: ParsedLines, tag: int | None) -> None:
        first, last = self._format.append(self._backend, TopicPartition(self._topic, partition), parsed)
        self._written.add(partition)
        if tag is None:
            self._replies.add(b"%d %d\n" % (first, last))
        else:
            self._replies.add(b"%d %d %d\n" % (tag, first, last))

    def _append_to_topic(self, parsed: ParsedLines, config: LogConfig) -> None:
        num_partitions = len(self._backend.partitions(self._topic))
        if num_partitions == 0:
            raise UnknownTopicOrPartitionError(f"No topic {self._topic!r}")
        keys, named = parsed.keys, parsed.partitions
        if keys is None and named is None:
            p = self._router.next_partition(num_partitions)
            self._append(p, parsed, p)
            return
        # Routed per record: one batch per partition, each keeping the lines'
        # order.  The batches cannot be atomic together, so refuse an oversized
        # record or a missing partition before any of them is appended.
        limit = config.max_message_bytes
        groups: dict[int, list[int]] = {}
        unkeyed_partition = None
        for i in range(len(parsed.items)):
            size = self._format.record_size(parsed, i)
            if size > limit:
                raise RecordTooLargeError(
                    f"A record of {size} bytes (line {parsed.number(i)} of {self._describe()}) exceeds "
                    f"max.message.bytes={limit} of topic {self._topic}")
            pinned = named[i] if named is not None else None
            key = keys[i] if keys is not None else None
            if pinned is not None:
                if pinned >= num_partitions:
                    raise InvalidPartitionError(
                        f"Line {parsed.number(i)} of {self._describe()} names partition {pinned}, but topic "
                        f"{self._topic} has {num_partitions} partitions")
                p = pinned
            elif key is not None:
                p = partition_for_key(key, num_partitions)
            else:
                if unkeyed_partition is None:
                    unkeyed_partition = self._router.next_partition(num_partitions)
                p = unkeyed_partition
            groups.setdefault(p, []).append(i)
        for p, indices in groups.items():
            self._append(p, parsed if len(groups) == 1 else parsed.select(indices), p)
