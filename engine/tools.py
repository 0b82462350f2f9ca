"""Offline tools behind ``logfs dump-log`` and ``logfs check``.

``dump_log`` prints what Kafka's ``kafka-dump-log.sh`` (``DumpLogSegments``)
prints for ``.log``, ``.index`` and ``.timeindex`` files, and for a broker's
``.txnindex`` (aborted transactions) and ``.snapshot`` (producer state) files,
line for line, so an operator can diff our segments against a broker's.  ``check_dirs`` is the
verification a broker does implicitly at startup, made explicit and read-only:
every batch's framing and CRC, offsets that only grow, index entries that point
at batch starts, time indexes that only grow, and checkpoints that parse and
name partitions and offsets that exist.  Neither tool changes a byte on disk, so
both read the files directly (indexes as their raw 8- and 12-byte entries)
instead of opening them through the live classes, which may resize or truncate.
"""

from __future__ import annotations

import codecs
import errno as _errno
import logging
import os
import struct
import sys
from typing import NamedTuple, TextIO

from crc32c import crc32c

from engine.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
)
from engine.errors import CorruptCheckpointError, CorruptRecordError, InvalidTopicError
from engine.files import (
    DELETE_DIR_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    offset_from_file_name,
    parse_segment_file_name,
)
from engine.index import OFFSET_INDEX_ENTRY as _OFFSET_ENTRY
from engine.index import TIME_INDEX_ENTRY as _TIME_ENTRY
from engine.log_dirs import REMOTE_LOG_DIR
from engine.records import (
    HEADER_SIZE,
    BatchColumns,
    BatchHeader,
    TimestampType,
    decode_batch,
    decode_columns,
    decode_values,
    read_header,
    validate_batch,
)
from engine.records.reader import read_batches
from engine.topic import TopicPartition, parse_topic_partition_dir
from engine.transactions import SNAPSHOT_ENTRY, SNAPSHOT_HEADER, TXN_INDEX_ENTRY

logger = logging.getLogger(__name__)

#: Read size of the index dumps' walk of a segment's batches (the shared chunked reader).
_TOOL_READ_CHUNK = 4 << 20

CHECKPOINT_FILES = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT)

_TXN_ENTRY = TXN_INDEX_ENTRY             # version, producer id, first, last, last stable offset
#: ProducerStateManager's snapshot: version, CRC32C, then an array of producer entries
_SNAPSHOT_HEADER = SNAPSHOT_HEADER
_SNAPSHOT_ENTRY = SNAPSHOT_ENTRY           # id, epoch, last seq, last offset, delta, time, coord epoch, txn first
_CONTROL_KEY = struct.Struct(">hh")       # version, type
_END_TXN_VALUE = struct.Struct(">hi")     # version, coordinator epoch
_TIMESTAMP_TYPE_NAMES = {TimestampType.CREATE_TIME: "CreateTime",
                         TimestampType.LOG_APPEND_TIME: "LogAppendTime"}


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _java_bool(flag: bool) -> str:
    return "true" if flag else "false"


def _java_replace(exc: UnicodeError) -> tuple[str, int]:
    """Replace malformed UTF-8 as Java's decoder does (``new String(bytes, UTF_8)``).

    Java and Python both put one U+FFFD per maximal malformed subpart, except
    for UTF-8-encoded surrogates (lead byte ED, second byte A0-BF), which
    Python splits byte by byte and Java takes as one unit: three bytes when
    complete, else the lead and its continuation byte.
    """
    assert isinstance(exc, UnicodeDecodeError)      # registered for decoding only
    data, start = exc.object, exc.start
    if data[start] == 0xED and start + 1 < len(data) and 0xA0 <= data[start + 1] <= 0xBF:
        if start + 2 < len(data) and 0x80 <= data[start + 2] <= 0xBF:
            return "\ufffd", start + 3
        return "\ufffd", start + 2
    return "\ufffd", exc.end


codecs.register_error("logfs-java-replace", _java_replace)


def _text(data: bytes) -> str:
    """What Kafka's StringDecoder prints: UTF-8, malformed bytes replaced as Java replaces them."""
    return data.decode("utf-8", "logfs-java-replace")


# ---------------------------------------------------------------------------
# dump-log
# ---------------------------------------------------------------------------

def _record_sequence(header: BatchHeader, offset: int) -> int:
    if header.base_sequence < 0:
        return -1
    return (header.base_sequence + offset - header.base_offset) & 0x7FFFFFFF


def _control_description(key: bytes | None, value: bytes | None) -> str:
    if key is None or len(key) < _CONTROL_KEY.size:
        return " controlType: UNKNOWN(-1)"
    _, type_id = _CONTROL_KEY.unpack_from(key)
    if type_id in (0, 1) and value is not None and len(value) >= _END_TXN_VALUE.size:
        _, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
        return f" endTxnMarker: {'ABORT' if type_id == 0 else 'COMMIT'} coordinatorEpoch: {coordinator_epoch}"
    return f" controlType: UNKNOWN({type_id})"


def _batch_columns(data: bytes, position: int, header: BatchHeader) -> BatchColumns:
    """The records of a batch as columns: the compiled walk of every producer's layout
    (``decode_columns``); a control batch's markers, which the views skip, decoded one by one."""
    if not header.is_control:
        return decode_columns(data, position, header)
    records = decode_batch(data, position, header, include_control=True)
    return BatchColumns([r.offset for r in records], [r.timestamp for r in records], [r.key for r in records],
                        [r.value for r in records], [tuple(r.headers) for r in records])


def _dump_log_file(path: str, print_data_log: bool, out: TextIO, err: TextIO) -> int:
    out.write(f"Log starting offset: {offset_from_file_name(path)}\n")
    data = _read_file(path)
    position = 0
    problems = 0
    last_offset = -1
    non_consecutive: list[tuple[int, int]] = []
    while position + HEADER_SIZE <= len(data):
        header = read_header(data, position)
        if header.batch_length < HEADER_SIZE - 12 or position + header.size > len(data):
            break
        try:
            validate_batch(data, position)
            valid = True
        except CorruptRecordError:
            valid = False
            problems += 1
        horizon = header.delete_horizon_ms
        timestamp_type = _TIMESTAMP_TYPE_NAMES[header.timestamp_type]
        out.write(
            f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} count: {header.records_count} "
            f"baseSequence: {header.base_sequence} lastSequence: {header.last_sequence} "
            f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
            f"partitionLeaderEpoch: {header.partition_leader_epoch} "
            f"isTransactional: {_java_bool(header.is_transactional)} isControl: {_java_bool(header.is_control)} "
            f"deleteHorizonMs: {'OptionalLong.empty' if horizon is None else f'OptionalLong[{horizon}]'} "
            f"position: {position} {timestamp_type}: {header.max_timestamp} size: {header.size} "
            f"magic: {header.magic} compresscodec: {header.compression.codec_name} crc: {header.crc} "
            f"isvalid: {_java_bool(valid)}\n")
        if print_data_log:
            try:
                columns = _batch_columns(data, position, header)
            except CorruptRecordError as exc:
                err.write(f"Failed to read the records of the batch at position {position} of {path}: {exc}\n")
                problems += 1
                columns = BatchColumns(range(0), [], None, [], None)
            keys, headers = columns.keys, columns.headers
            for i, offset in enumerate(columns.offsets):
                # As DumpLogSegments: the first record is compared with -1 too, so a
                # segment that does not start at offset 0 reports "-1 is followed by N".
                if offset != last_offset + 1:
                    non_consecutive.append((last_offset, offset))
                last_offset = offset
                key = None if keys is None else keys[i]
                value = columns.values[i]
                names = "" if headers is None else ",".join(name for name, _ in headers[i])
                line = [f"| offset: {offset} {timestamp_type}: {columns.timestamps[i]} "
                        f"keySize: {-1 if key is None else len(key)} "
                        f"valueSize: {-1 if value is None else len(value)} "
                        f"sequence: {_record_sequence(header, offset)} "
                        f"headerKeys: [{names}]"]
                if header.is_control:
                    line.append(_control_description(key, value))
                else:
                    if key is not None:
                        line.append(f" key: {_text(key)}")
                    if value is not None:
                        line.append(f" payload: {_text(value)}")
                out.write("".join(line) + "\n")
        position += header.size
    trailing = len(data) - position
    if trailing > 0:
        out.write(f"Found {trailing} invalid bytes at the end of {os.path.basename(path)}\n")
        problems += 1
    if non_consecutive:
        err.write(f"Non-consecutive offsets in {os.path.abspath(path)}\n")
        for first, second in non_consecutive:
            err.write(f"  {first} is followed by {second}\n")
    return problems


def _segment_log_path(index_path: str) -> str:
    directory, name = os.path.split(os.path.abspath(index_path))
    return os.path.join(directory, name.split(".")[0] + LOG_FILE_SUFFIX)


def _batches_by_position(log_path: str) -> dict[int, BatchHeader]:
    """Batch starts of a segment, shallow (as FileRecords.slice(...).batches)."""
    found: dict[int, BatchHeader] = {}
    if not os.path.exists(log_path):
        return found
    with open(log_path, "rb") as f:
        fd = f.fileno()
        try:
            for position, header, _, _ in read_batches(lambda pos, size: os.pread(fd, size, pos), 0, None,
                                                       _TOOL_READ_CHUNK, path=log_path, strict=False):
                # a loop, not a comprehension: what was found before the damage stays in `found`
                found[position] = header  # noqa: PERF403
        except CorruptRecordError:
            pass                # what is found up to the damage; `logfs check` reports the damage itself
    return found


def _dump_index_file(path: str, out: TextIO, err: TextIO) -> int:
    base_offset = offset_from_file_name(path)
    raw = _read_file(path)
    entries = len(raw) // _OFFSET_ENTRY.size
    if entries == 0:
        out.write(f"{path} is empty.\n")
        return 0
    batches = _batches_by_position(_segment_log_path(path))
    mismatches: list[tuple[int, int]] = []
    for i in range(entries):
        relative, position = _OFFSET_ENTRY.unpack_from(raw, i * _OFFSET_ENTRY.size)
        offset = base_offset + relative
        # A preallocated index is zero-filled past its last entry: stop there.
        if offset == base_offset and i > 0:
            break
        batch = batches.get(position)
        batch_last = batch.last_offset if batch is not None else -1
        if batch_last != offset:
            mismatches.append((offset, batch_last))
        out.write(f"offset: {offset} position: {position}\n")
    if mismatches:
        err.write(f"Mismatches in :{os.path.abspath(path)}\n")
        for index_offset, log_offset in mismatches:
            err.write(f"  Index offset: {index_offset}, log offset: {log_offset}\n")
    return len(mismatches)


def _dump_time_index_file(path: str, out: TextIO, err: TextIO) -> int:
    base_offset = offset_from_file_name(path)
    raw = _read_file(path)
    log_path = _segment_log_path(path)
    batches = sorted(_batches_by_position(log_path).items())
    log_data = _read_file(log_path) if batches else b""
    problems: list[str] = []
    previous = -1
    for i in range(len(raw) // _TIME_ENTRY.size):
        timestamp, relative = _TIME_ENTRY.unpack_from(raw, i * _TIME_ENTRY.size)
        offset = base_offset + relative
        if offset == base_offset and i > 0:
            break
        batch = next(((p, h) for p, h in batches if h.last_offset >= offset), None)
        if batch is None or batch[1].last_offset != offset:
            problems.append(f"Indexed offset: {offset}, found log offset: "
                            f"{-1 if batch is None else batch[1].last_offset}")
        else:
            records = decode_batch(log_data, batch[0], batch[1])
            max_timestamp = max((r.timestamp for r in records), default=-1)
            if max_timestamp != timestamp:
                problems.append(f"Index timestamp: {timestamp}, log timestamp: {max_timestamp}")
            if previous >= timestamp:
                problems.append(f"Index timestamp: {timestamp}, Previously indexed timestamp: {previous}")
        out.write(f"timestamp: {timestamp} offset: {offset}\n")
        previous = timestamp
    if problems:
        err.write(f"Found time index problems in :{os.path.abspath(path)}\n")
        for problem in problems:
            err.write(f"  {problem}\n")
    return len(problems)


def _dump_txn_index_file(path: str, out: TextIO, err: TextIO) -> int:
    """A ``.txnindex``: the aborted transactions Kafka's producer state manager recorded."""
    raw = _read_file(path)
    for i in range(len(raw) // _TXN_ENTRY.size):
        version, producer_id, first, last, last_stable = _TXN_ENTRY.unpack_from(raw, i * _TXN_ENTRY.size)
        out.write(f"version: {version} producerId: {producer_id} firstOffset: {first} "
                  f"lastOffset: {last} lastStableOffset: {last_stable}\n")
    if len(raw) % _TXN_ENTRY.size:
        err.write(f"Found {len(raw) % _TXN_ENTRY.size} trailing bytes in {path}\n")
        return 1
    return 0


def _dump_producer_snapshot(path: str, out: TextIO, err: TextIO) -> int:
    """A ``.snapshot``: Kafka's producer state (one line per producer), CRC-checked first."""
    raw = _read_file(path)
    if len(raw) < _SNAPSHOT_HEADER.size:
        err.write(f"Snapshot {path} is too short ({len(raw)} bytes)\n")
        return 1
    _version, crc, count = _SNAPSHOT_HEADER.unpack_from(raw)
    if crc32c(raw[6:]) != crc:
        err.write(f"Snapshot is corrupt: CRC mismatch in {path}\n")
        return 1
    position = _SNAPSHOT_HEADER.size
    for _ in range(count):
        (producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp, coordinator_epoch,
         txn_first) = _SNAPSHOT_ENTRY.unpack_from(raw, position)
        position += _SNAPSHOT_ENTRY.size
        first_txn = "OptionalLong.empty" if txn_first < 0 else f"OptionalLong[{txn_first}]"
        out.write(f"producerId: {producer_id} producerEpoch: {epoch} coordinatorEpoch: {coordinator_epoch} "
                  f"currentTxnFirstOffset: {first_txn} lastTimestamp: {timestamp} "
                  f"firstSequence: {last_sequence - offset_delta} lastSequence: {last_sequence} "
                  f"lastOffset: {last_offset} offsetDelta: {offset_delta} timestamp: {timestamp}\n")
    return 0


def dump_log(paths: list[str], print_data_log: bool, out: TextIO, err: TextIO | None = None) -> int:
    """Print each file as kafka-dump-log.sh does; returns the number of problems seen.

    Problems are invalid CRCs, undecodable batches, trailing bytes, index entries
    that do not match the log, and files that cannot be read.  As in Kafka, the
    listing goes to ``out`` and the mismatch reports to ``err`` (stderr).
    """
    err = sys.stderr if err is None else err
    problems = 0
    for path in paths:
        out.write(f"Dumping {path}\n")
        try:
            if not os.path.exists(path):      # before the name is parsed: say what is wrong first
                raise FileNotFoundError(_errno.ENOENT, "No such file or directory", path)
            if path.endswith(LOG_FILE_SUFFIX):
                problems += _dump_log_file(path, print_data_log, out, err)
            elif path.endswith(INDEX_FILE_SUFFIX):
                problems += _dump_index_file(path, out, err)
            elif path.endswith(TIME_INDEX_FILE_SUFFIX):
                problems += _dump_time_index_file(path, out, err)
            elif path.endswith(TXN_INDEX_FILE_SUFFIX):
                problems += _dump_txn_index_file(path, out, err)
            elif path.endswith(".snapshot"):
                problems += _dump_producer_snapshot(path, out, err)
            else:
                err.write(f"Ignoring unknown file {path}\n")
        except BrokenPipeError:
            raise                      # the reader went away (`| head`): not a problem of the file
        except (OSError, ValueError, CorruptRecordError) as exc:
            err.write(f"Failed to dump {path}: {exc}\n")
            problems += 1
    return problems


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------

class SegmentSummary(NamedTuple):
    base_offset: int
    next_offset: int          # one past the last offset in the segment (base if empty)


class _Checker:
    """Collects problems, one printed line each, naming file and position."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.problems = 0

    def problem(self, path: str, message: str, position: int | None = None) -> None:
        where = f"{path}" if position is None else f"{path}, position {position}"
        self.out.write(f"{where}: {message}\n")
        self.problems += 1

    # -- one segment -----------------------------------------------------------

    def check_segment(self, log_path: str, expected_min_offset: int, *, swap: bool = False
                      ) -> tuple[SegmentSummary, dict[int, BatchHeader], int]:
        """Check one segment file; returns its summary, batches by position and readable length.

        A batch that fails its CRC (or does not decode) but whose framing holds
        -- the next batch starts where its length says and is itself valid, or
        it is the last one -- is one problem, and the check goes on after it.
        Only a broken framing makes the rest of the file unreadable, reported
        once; index entries pointing into that rest are not judged.
        """
        base_offset = offset_from_file_name(log_path)
        data = _read_file(log_path)
        batches: dict[int, BatchHeader] = {}
        next_offset = base_offset
        position = 0
        if base_offset < expected_min_offset:
            self.problem(log_path, f"segment base offset {base_offset} is below the end of the previous "
                                   f"segment ({expected_min_offset})")
        while position < len(data):
            try:
                header = validate_batch(data, position, path=log_path)
                decode_values(data, position, header)
            except CorruptRecordError as exc:
                framed = _framed_header(data, position)
                if framed is None:
                    self.problem(log_path, f"{exc}; the {len(data) - position} bytes from here cannot be framed "
                                           "as record batches", position)
                    break
                header = framed
                self.problem(log_path, f"{exc} (batch of {header.size} bytes, offsets "
                                       f"{header.base_offset}..{header.last_offset})", position)
            if position == 0 and swap and header.base_offset < base_offset:
                self.problem(log_path, f"first batch offset {header.base_offset} is below the base offset "
                                       f"{base_offset} in the file name: this .swap holds another segment",
                             position)
            if header.base_offset < next_offset:
                self.problem(log_path, f"batch base offset {header.base_offset} does not follow the "
                                       f"previous batch's last offset {next_offset - 1}", position)
            batches[position] = header
            next_offset = max(next_offset, header.next_offset)
            position += header.size
        return SegmentSummary(base_offset, next_offset), batches, min(position, len(data))

    def _sealed_tail(self, path: str, entries: int, size: int, entry_size: int) -> None:
        """A zero-filled preallocated tail in a sealed index: the trim at its roll (or close) was lost.

        The loader finds the same index corrupt and rebuilds it (a WARNING and
        the cost of a scan at every load until then), so it is reported here too.
        """
        self.problem(path, f"sealed index has a zero-filled preallocated tail of {size - entries * entry_size} "
                           f"bytes after its {entries} entries (its trim was lost, e.g. by a power loss); "
                           "the next mount rebuilds it", entries * entry_size)

    def check_offset_index(self, path: str, base_offset: int, batches: dict[int, BatchHeader],
                           next_offset: int, readable: int | None = None, sealed: bool = False) -> None:
        raw = _read_file(path)
        if len(raw) % _OFFSET_ENTRY.size:
            self.problem(path, f"index file size {len(raw)} is not a multiple of {_OFFSET_ENTRY.size}")
        previous = -1
        for i in range(len(raw) // _OFFSET_ENTRY.size):
            relative, position = _OFFSET_ENTRY.unpack_from(raw, i * _OFFSET_ENTRY.size)
            if relative == 0 and position == 0 and (i > 0 or not batches):
                # the zero-filled preallocated tail (all of it: an empty segment): normal while active
                if sealed:
                    self._sealed_tail(path, i, len(raw), _OFFSET_ENTRY.size)
                break
            offset = base_offset + relative
            where = i * _OFFSET_ENTRY.size
            if readable is not None and position >= readable:
                continue                    # into the part of the log that cannot be framed: reported once
            if offset <= previous:
                self.problem(path, f"index entry {i} offset {offset} is not larger than the previous "
                                   f"entry's {previous}", where)
            previous = offset
            batch = batches.get(position)
            if batch is None:
                self.problem(path, f"index entry {i} (offset {offset}) points at log position {position}, "
                                   "which is not the start of a batch", where)
            elif not batch.base_offset <= offset < next_offset:
                self.problem(path, f"index entry {i} offset {offset} does not match the batch at log "
                                   f"position {position} (offsets {batch.base_offset}..{batch.last_offset})",
                             where)

    def check_time_index(self, path: str, base_offset: int, next_offset: int, max_timestamp: int,
                         complete: bool = True, sealed: bool = False) -> None:
        raw = _read_file(path)
        if len(raw) % _TIME_ENTRY.size:
            self.problem(path, f"time index file size {len(raw)} is not a multiple of {_TIME_ENTRY.size}")
        previous_timestamp = -1
        previous_offset = base_offset
        for i in range(len(raw) // _TIME_ENTRY.size):
            timestamp, relative = _TIME_ENTRY.unpack_from(raw, i * _TIME_ENTRY.size)
            if timestamp == 0 and relative == 0 and (i > 0 or max_timestamp < 0):
                # the zero-filled preallocated tail (all of it: an empty segment): normal while active
                if sealed:
                    self._sealed_tail(path, i, len(raw), _TIME_ENTRY.size)
                break
            offset = base_offset + relative
            if not complete and offset >= next_offset:
                continue                    # indexes the part of the log that cannot be framed
            where = i * _TIME_ENTRY.size
            if timestamp <= previous_timestamp:
                self.problem(path, f"time index entry {i} timestamp {timestamp} is not larger than the "
                                   f"previous entry's {previous_timestamp}", where)
            if offset < previous_offset:
                self.problem(path, f"time index entry {i} offset {offset} is below the previous "
                                   f"entry's {previous_offset}", where)
            if not base_offset <= offset < max(next_offset, base_offset + 1):
                self.problem(path, f"time index entry {i} offset {offset} is outside the segment "
                                   f"[{base_offset}, {next_offset})", where)
            if timestamp > max_timestamp:
                self.problem(path, f"time index entry {i} timestamp {timestamp} is later than every "
                                   f"record of the segment (max {max_timestamp})", where)
            previous_timestamp = timestamp
            previous_offset = offset

    # -- one partition -----------------------------------------------------------

    def check_partition(self, partition_dir: str, clean_shutdown: bool = False) -> tuple[int, int | None]:
        """Check every segment and every ``.swap``; returns (first segment base offset, log end offset).

        The log end offset is None when part of a segment cannot be framed:
        checkpoints can then not be judged against it.  Every segment but the
        last is sealed (its indexes trimmed at the roll); after a clean
        shutdown (``clean_shutdown``: the log dir has the marker) the last one
        is too.
        """
        names = os.listdir(partition_dir)
        parsed = {name: parse_segment_file_name(name) for name in names}
        logs = [name for base, name in sorted((p[0], name) for name, p in parsed.items()
                                              if p is not None and p[1] == LOG_FILE_SUFFIX)]
        end_offset = 0
        first_offset = None
        unframed = False
        for name in logs:
            log_path = os.path.join(partition_dir, name)
            summary, batches, readable = self.check_segment(log_path, end_offset)
            complete = readable >= os.path.getsize(log_path)
            unframed = unframed or not complete
            if first_offset is None:
                first_offset = summary.base_offset
            stem = log_path[:-len(LOG_FILE_SUFFIX)]
            sealed = clean_shutdown or name != logs[-1]
            if os.path.exists(stem + INDEX_FILE_SUFFIX):
                self.check_offset_index(stem + INDEX_FILE_SUFFIX, summary.base_offset, batches,
                                        summary.next_offset, readable, sealed)
            if os.path.exists(stem + TIME_INDEX_FILE_SUFFIX):
                max_timestamp = max((h.max_timestamp for h in batches.values()), default=-1)
                self.check_time_index(stem + TIME_INDEX_FILE_SUFFIX, summary.base_offset,
                                      summary.next_offset, max_timestamp, complete, sealed)
            end_offset = max(end_offset, summary.next_offset)
        # A .swap is what the next mount installs in place of segments (the
        # cleaner's crash-interrupted swap): it must be a sound segment.
        swap_suffix = LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX
        for name in sorted(n for n, p in parsed.items() if p is not None and p[1] == swap_suffix):
            path = os.path.join(partition_dir, name)
            before = self.problems
            summary, _, _ = self.check_segment(path, 0, swap=True)
            if self.problems == before and summary.next_offset == summary.base_offset:
                self.problem(path, "holds no record batch")
        return (first_offset or 0), (None if unframed else end_offset)

    # -- one log dir -----------------------------------------------------------

    def check_log_dir(self, log_dir: str) -> None:
        if not os.path.isdir(log_dir):
            self.problem(log_dir, "is not a directory")
            return
        ranges: dict[TopicPartition, tuple[int, int | None]] = {}
        for name in sorted(os.listdir(log_dir)):
            path = os.path.join(log_dir, name)
            if not os.path.isdir(path) or name.endswith(DELETE_DIR_SUFFIX) or name == REMOTE_LOG_DIR:
                continue
            try:
                tp = parse_topic_partition_dir(name)     # topics may start with '.' (".internal-0")
            except InvalidTopicError as exc:
                if not name.startswith("."):             # hidden non-topic dirs (.snapshot, ...) are not ours
                    self.problem(path, str(exc))
                continue
            ranges[tp] = self.check_partition(path, os.path.exists(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE)))
        for checkpoint_name in CHECKPOINT_FILES:
            self.check_checkpoint(os.path.join(log_dir, checkpoint_name), ranges)

    def check_checkpoint(self, path: str, ranges: dict[TopicPartition, tuple[int, int | None]]) -> None:
        if not os.path.exists(path):
            return
        try:
            offsets = _read_checkpoint(path)
        except (CorruptCheckpointError, OSError) as exc:
            self.problem(path, f"cannot be parsed: {exc}")
            return
        for tp, offset in sorted(offsets.items()):
            if tp not in ranges:
                self.problem(path, f"names partition {tp}, which has no directory in {os.path.dirname(path)}")
                continue
            _, end_offset = ranges[tp]
            if end_offset is None:
                continue                      # its log end is unknown: the damage was reported already
            if not 0 <= offset <= end_offset:
                self.problem(path, f"offset {offset} of {tp} is outside the log [0, {end_offset}]")


def _read_checkpoint(path: str) -> dict[TopicPartition, int]:
    """Read with engine.checkpoint when it is there (the parser the broker uses)."""
    from engine.checkpoint import OffsetCheckpointFile
    return OffsetCheckpointFile(path).read()


def _framed_header(data: bytes, position: int) -> BatchHeader | None:
    """The header at ``position`` if its length frames a batch: the file ends, or a valid batch follows."""
    try:
        header = read_header(data, position)
    except CorruptRecordError:
        return None
    end = position + header.size
    if header.batch_length < HEADER_SIZE - 12 or end > len(data) or header.records_count < 0:
        return None
    if end == len(data):
        return header
    try:
        validate_batch(data, end)
    except CorruptRecordError:
        return None
    return header


def check_dirs(dirs: list[str], out: TextIO) -> int:
    """Verify log dirs offline; prints one line per problem and returns how many."""
    checker = _Checker(out)
    for log_dir in dirs:
        try:
            checker.check_log_dir(log_dir)
        except OSError as exc:
            checker.problem(log_dir, f"cannot be read: {exc}")
    logger.info("Checked %d log dirs: %d problems", len(dirs), checker.problems)
    return checker.problems
