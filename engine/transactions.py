"""Aborted transactions, for ``isolation.level=read_committed`` views.

A transactional producer's records are stored in transactional batches tagged
with its producer id; the transaction ends with a control batch (a marker) of
that producer: COMMIT or ABORT.  A read_committed consumer skips the batches of
aborted transactions.  Kafka's broker hands it the list of aborted
transactions of the fetched range (from the ``.txnindex`` files the producer
state manager writes), and the consumer drops a producer's transactional
batches from the transaction's first offset up to its ABORT marker
(``AbortedTxn``: producer id, first offset, last offset).

Here the same list is built per log from the log itself, as Kafka's
``ProducerStateManager`` builds it while appending: walking the batch headers
in offset order, a producer's first transactional batch after its previous
marker opens its ongoing transaction; its next marker ends it, and an ABORT
marker makes ``[first offset, marker offset]`` an aborted range.  The walk is
incremental: the state remembers the next offset and the position it reached
and continues there when the log grew.  logfs writes no ``.txnindex`` or
``.snapshot`` beside its local segments; tiered storage makes both for each
copy (:class:`ProducerStateWalk` over the segment, from the producers at its
start), and the walk takes a copy's index and snapshot instead of fetching its
batches (:class:`TransactionIndexed`).

A transaction still open at the end of the log depends on whether a broker
will ever finish it:

* a log no broker will finish (a stopped broker's data, a copy): the open
  transaction is treated as aborted, and later records are shown; with no
  broker behind the data its marker never comes;
* a log that is a live replica (its leader's coordinator will write the marker,
  and the replica fetcher will bring it): *stable offset bounded*, as Kafka's
  read_committed fetch is.  Views end at the last stable offset (LSO, Kafka's
  ``UnifiedLog.lastStableOffset``: the first offset of the earliest open
  transaction, the log end when none is open); records at and after it are held
  back until the marker arrives, then the committed ones appear and the aborted
  ones are skipped.  A rendering so only ever grows at its end.

How the views of a log read it is the log's own ``read_isolation`` (a
:class:`ReadIsolation`, which its LogManager sets from the mount's
``isolation.level``; read_uncommitted for a log opened on its own), and the
state of the walk is the log's ``transaction_state``, made on first use:
:func:`read_committed_state` gives the views that state under read_committed
(None under read_uncommitted, the default); :func:`visible_end_offset` is the
end a read_committed consumer sees.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

from crc32c import crc32c

from engine import records as _records
from engine.errors import CorruptRecordError
from engine.records import compiled
from engine.records.framing import read_header

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable

    from sortedcontainers import SortedDict

    from engine.records import BatchHeader
    from engine.records.format import RecordBuffer
    from engine.segment import LogSegment

logger = logging.getLogger(__name__)

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)

#: ControlRecordType of a marker's key (version int16, type int16).
ABORT = 0
COMMIT = 1

#: what the transaction walk reads at a time (engine.records.kernels.transactional_batches)
_SKIM_BYTES = 1 << 20
#: serialises making or replacing a log's ``transaction_state`` (held for no I/O)
_states_lock = threading.Lock()


@dataclass(frozen=True)
class ReadIsolation:
    """How the views of a log read it: the consumer's ``isolation.level``, and whether the log is a live
    replica whose leader finishes its open transactions (``stable_offset_bounded``: read_committed views
    then end at the last stable offset, see the module doc, instead of treating an open transaction as
    aborted)."""

    level: str = READ_UNCOMMITTED
    stable_offset_bounded: bool = False

    def __post_init__(self) -> None:
        if self.level not in ISOLATION_LEVELS:
            raise ValueError(f"Unknown isolation level {self.level!r}")


READ_UNCOMMITTED_ISOLATION = ReadIsolation()


class TransactionalLog(Protocol):
    """What the transaction walk needs of ``engine.log.Log``, which owns the walk's state."""

    truncations: int
    read_isolation: ReadIsolation
    transaction_state: TransactionState | None

    @property
    def segments(self) -> SortedDict: ...

    def reader_segments(self) -> SortedDict:
        """The segments readers see (tiered storage's remote ones below the local log start too)."""

    @property
    def log_end_offset(self) -> int: ...


class AbortedTxn(NamedTuple):
    """Kafka's AbortedTxn: a producer's aborted transaction, first offset to its ABORT marker."""

    producer_id: int
    first_offset: int
    last_offset: int


def read_committed_state(log: TransactionalLog) -> TransactionState | None:
    """The aborted-transaction state of ``log`` when its views are read_committed, else None."""
    isolation = log.read_isolation
    if isolation.level != READ_COMMITTED:
        return None
    with _states_lock:
        state = log.transaction_state
        if state is None or state.truncations != log.truncations:
            # new, or the log was truncated (a replica to its leader) below what the walk saw: walk it again
            state = log.transaction_state = TransactionState(
                log, stable_offset_bounded=isolation.stable_offset_bounded)
        return state


def visible_end_offset(log: TransactionalLog) -> int:
    """The end offset the views of ``log`` show up to: the last stable offset when stable offset bounded
    (Kafka's ``lastFetchableOffset`` of a read_committed fetch), else the log end offset."""
    state = read_committed_state(log)
    if state is None or not state.stable_offset_bounded:
        return log.log_end_offset
    return state.last_stable_offset()


def marker_of(buf: RecordBuffer, off: int, header: BatchHeader) -> tuple[int, int]:
    """(COMMIT or ABORT, the coordinator epoch) of a control batch: its record's key and value
    (Kafka's ``EndTransactionMarker``; the epoch is -1 when the value does not hold it)."""
    records = _records.decode_batch(buf, off, header, include_control=True)
    if not records or records[0].key is None or len(records[0].key) < 4:
        raise CorruptRecordError(f"Control batch at offset {header.base_offset} has no valid marker key")
    kind: int = struct.unpack_from(">hh", records[0].key)[1]
    value = records[0].value
    epoch: int = struct.unpack_from(">hi", value)[1] if value is not None and len(value) >= 6 else -1
    return kind, epoch


# ------------------------------------------------------------------ Kafka's files of a segment's transactions

#: a ``.txnindex`` entry: version (0), producer id, first offset, last offset (the ABORT marker), last stable offset
TXN_INDEX_ENTRY = struct.Struct(">hqqqq")
#: a producer snapshot's header: version, CRC-32C of what follows it, producer count
SNAPSHOT_HEADER = struct.Struct(">hIi")
#: a producer snapshot's entry: id, epoch, last sequence, last offset, offset delta, timestamp, coordinator
#: epoch, first offset of the ongoing transaction (-1: none)
SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
SNAPSHOT_VERSION = 1
#: Kafka's ``producer.id.expiration.ms`` default: a producer with no open transaction whose last batch is older
#: than this (in the log's own timestamps) is left out of the next snapshot
PRODUCER_ID_EXPIRATION_MS = 86_400_000


class TxnIndexEntry(NamedTuple):
    """One entry of Kafka's ``.txnindex``: an aborted transaction and the last stable offset when it ended."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_txn_index(entries: Iterable[TxnIndexEntry]) -> bytes:
    """Kafka's ``.txnindex`` file of ``entries`` (version 0, 34 bytes each)."""
    return b"".join(TXN_INDEX_ENTRY.pack(0, *entry) for entry in entries)


def decode_txn_index(data: bytes, where: str) -> list[TxnIndexEntry]:
    """The entries of a ``.txnindex``; CorruptRecordError (naming ``where``) for trailing bytes or a version
    Kafka never wrote."""
    if len(data) % TXN_INDEX_ENTRY.size:
        raise CorruptRecordError(f"Transaction index {where} has {len(data) % TXN_INDEX_ENTRY.size} trailing bytes")
    out = []
    for version, producer_id, first, last, stable in TXN_INDEX_ENTRY.iter_unpack(data):
        if version != 0 or first > last:
            raise CorruptRecordError(f"Transaction index {where} has an invalid entry (version {version}, "
                                     f"producer {producer_id}, offsets {first} to {last})")
        out.append(TxnIndexEntry(producer_id, first, last, stable))
    return out


@dataclass
class ProducerEntry:
    """A producer as Kafka's producer snapshot holds it (``ProducerStateEntry``): its last batch, and the first
    offset of its ongoing transaction (-1: none)."""

    producer_id: int
    producer_epoch: int = -1
    last_sequence: int = -1
    last_offset: int = -1
    offset_delta: int = 0
    timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1


def encode_producer_snapshot(entries: Iterable[ProducerEntry]) -> bytes:
    """Kafka's producer snapshot file (``ProducerStateManager.writeSnapshot``, version 1, CRC-32C)."""
    listed = sorted(entries, key=lambda e: e.producer_id)
    body = struct.pack(">i", len(listed)) + b"".join(
        SNAPSHOT_ENTRY.pack(e.producer_id, e.producer_epoch, e.last_sequence, e.last_offset, e.offset_delta,
                            e.timestamp, e.coordinator_epoch, e.current_txn_first_offset) for e in listed)
    return struct.pack(">hI", SNAPSHOT_VERSION, crc32c(body)) + body


def decode_producer_snapshot(data: bytes, where: str) -> list[ProducerEntry]:
    """The producers of a snapshot; CorruptRecordError (naming ``where``) unless it is whole and its CRC holds."""
    if len(data) < SNAPSHOT_HEADER.size:
        raise CorruptRecordError(f"Producer snapshot {where} is too short ({len(data)} bytes)")
    version, crc, count = SNAPSHOT_HEADER.unpack_from(data)
    if version != SNAPSHOT_VERSION or crc32c(data[6:]) != crc or count < 0 \
            or len(data) != SNAPSHOT_HEADER.size + count * SNAPSHOT_ENTRY.size:
        raise CorruptRecordError(f"Producer snapshot {where} is corrupt (version {version}, CRC mismatch or "
                                 "wrong length)")
    return [ProducerEntry(*SNAPSHOT_ENTRY.unpack_from(data, SNAPSHOT_HEADER.size + i * SNAPSHOT_ENTRY.size))
            for i in range(count)]


class TransactionIndexed(Protocol):
    """A segment that carries its transaction index and producer snapshot (a copy in remote storage): the walk
    takes them instead of reading its batches."""

    next_offset: int
    #: False for a copy made before logfs copied them (its batches are walked)
    has_transaction_index: bool

    def transaction_index(self) -> list[TxnIndexEntry] | None:
        """The aborted transactions whose marker is in the segment; None when the segment has no index."""

    def producer_snapshot(self) -> list[ProducerEntry] | None:
        """The producers at the segment's end (its next offset); None when the segment has no snapshot."""


def _indexed(segment: object) -> TransactionIndexed | None:
    """``segment`` when it carries its transaction index and snapshot (a copy), else None.  An attribute, not
    ``isinstance`` of a runtime Protocol, which would read a local segment's ``next_offset`` to answer."""
    if getattr(segment, "has_transaction_index", False):
        return cast("TransactionIndexed", segment)
    return None


class ProducerStateWalk:
    """The producers' transactions after a prefix of a log, as Kafka's ``ProducerStateManager`` follows them.

    Fed the transactional batches in offset order (:meth:`observe`), it keeps
    each producer's last batch and the first offset of its open transaction;
    an ABORT marker completes an aborted transaction, handed to
    ``on_aborted`` as the ``.txnindex`` entry Kafka writes for it.  Only
    transactional producers are followed (logfs deduplicates nothing, so an
    idempotent producer's state has no use).  ``keep_completed=False`` forgets
    a producer at its marker (what read_committed needs); a snapshot keeps it,
    as Kafka does until it expires.  Not thread-safe.
    """

    def __init__(self, producers: Iterable[ProducerEntry] = (), next_offset: int = 0, *,
                 keep_completed: bool = True,
                 on_aborted: Callable[[TxnIndexEntry], None] | None = None) -> None:
        #: the walk has seen every batch below this offset
        self.next_offset = next_offset
        self.keep_completed = keep_completed
        self.on_aborted = on_aborted
        self.producers: dict[int, ProducerEntry] = {}
        self.restore(producers, next_offset)

    def restore(self, producers: Iterable[ProducerEntry], next_offset: int) -> None:
        """Start again from a snapshot taken at ``next_offset``."""
        self.producers = {e.producer_id: replace(e) for e in producers
                          if self.keep_completed or e.current_txn_first_offset >= 0}
        self.next_offset = next_offset

    def open_transactions(self) -> dict[int, int]:
        """Producer id -> the first offset of its open transaction."""
        return {pid: e.current_txn_first_offset for pid, e in self.producers.items()
                if e.current_txn_first_offset >= 0}

    def first_unstable_offset(self) -> int | None:
        return min((e.current_txn_first_offset for e in self.producers.values()
                    if e.current_txn_first_offset >= 0), default=None)

    def observe(self, header: BatchHeader, buf: RecordBuffer, off: int) -> None:
        """One batch at or after ``next_offset`` (a batch below it was seen already and is skipped)."""
        if header.next_offset <= self.next_offset:
            return
        self.next_offset = header.next_offset
        if not header.is_transactional:
            return
        pid = header.producer_id
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid)
        entry.producer_epoch = header.producer_epoch
        entry.last_offset = header.last_offset
        entry.offset_delta = header.last_offset_delta
        entry.timestamp = header.max_timestamp
        if header.is_control:
            kind, entry.coordinator_epoch = marker_of(buf, off, header)
            first = entry.current_txn_first_offset if entry.current_txn_first_offset >= 0 else header.base_offset
            entry.current_txn_first_offset = -1
            if not self.keep_completed:
                del self.producers[pid]
            if kind == ABORT and self.on_aborted is not None:
                unstable = self.first_unstable_offset()
                self.on_aborted(TxnIndexEntry(pid, first, header.base_offset,
                                              header.base_offset + 1 if unstable is None else unstable))
            return
        if header.base_sequence >= 0:
            entry.last_sequence = header.base_sequence + header.last_offset_delta
        if entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = header.base_offset

    def skip_to(self, next_offset: int) -> None:
        """Every batch below ``next_offset`` was seen (a run of batches without any transactional one)."""
        self.next_offset = max(self.next_offset, next_offset)

    def expire(self, before_timestamp: int) -> None:
        """Forget the producers with no open transaction whose last batch is older than ``before_timestamp``."""
        for pid in [pid for pid, e in self.producers.items()
                    if e.current_txn_first_offset < 0 and e.timestamp < before_timestamp]:
            del self.producers[pid]

    def walk(self, segment: LogSegment, position: int = 0,
             progress: Callable[[LogSegment, int], None] | None = None) -> None:
        """Observe the batches of ``segment`` from ``position`` to its end, skimmed a MiB at a time when the
        kernels are compiled (only its transactional batches are decoded).

        ``progress(segment, position)`` is told where the walk is after each step, so a walk cut by an error
        (a remote read) goes on from there.  A log without transactions costs no Python per batch
        (1,000,000 records in batches of 10: 0.9 s batch by batch, 0.05 s skimmed).
        """
        kernels = compiled.KERNELS
        end = segment.size
        while kernels is not None and position < end:
            data = segment.read_bytes(position, min(_SKIM_BYTES, end - position))
            found, last, walked = kernels.transactional_batches(data)
            if last < 0:
                break       # a batch that does not fit in a read (or is torn or damaged): the walk below says so
            for at in found:
                self.observe(read_header(data, at), data, at)
            self.skip_to(read_header(data, last).next_offset)
            position += walked
            if progress is not None:
                progress(segment, position)
        for pos, header, buf, off in segment.batches_with_bytes(position):
            self.observe(header, buf, off)
            if progress is not None:
                progress(segment, pos + header.size)


def producer_state_at(segments: SortedDict, offset: int) -> ProducerStateWalk:
    """The producers at ``offset`` (a segment boundary) of the log whose segments (base offset -> segment, the
    remote ones too) are ``segments``: from the snapshot of the last segment below it that has one (a copy in
    remote storage), then a walk of the segments after it, as Kafka rebuilds its producer state."""
    below = [s for s in segments.values() if s.base_offset < offset]
    walk = ProducerStateWalk()
    start = 0
    for i in range(len(below) - 1, -1, -1):
        indexed = _indexed(below[i])
        if indexed is not None:
            try:
                snapshot = indexed.producer_snapshot()
            except CorruptRecordError as exc:
                logger.warning("%s; the producers are found from an earlier snapshot and the batches after it",
                               exc)
                continue
            if snapshot is not None:
                walk.restore(snapshot, indexed.next_offset)
                start = i + 1
                break
    for segment in below[start:]:
        walk.walk(segment)
    return walk


class TransactionState:
    """Aborted transactions of one log: the walk of its transactional batches and markers.

    A producer's transactional data batches from the first offset of one of its
    aborted transactions to the transaction's ABORT marker are hidden, as a
    read_committed consumer drops them (Kafka's ``AbortedTxn`` ranges).  A
    segment that carries its transaction index and producer snapshot (a copy in
    remote storage: :class:`TransactionIndexed`) is not read: its index gives the
    aborted transactions whose marker it holds, and the snapshot of the last of
    a run of such segments the open transactions at its end.

    Thread-safe: views of one log are read from several threads.
    """

    def __init__(self, log: TransactionalLog, *, stable_offset_bounded: bool = False) -> None:
        self._log = weakref.ref(log)
        #: the log's truncation count the walk started at (read_committed_state replaces a stale state)
        self.truncations = log.truncations
        #: views end at the last stable offset (a live replica) instead of hiding open transactions
        self.stable_offset_bounded = stable_offset_bounded
        #: serialises the walk; a reader that needs several answers from one state of the walk holds it across
        #: them (the read_committed view index's catch-up, engine.views.index)
        self.lock = threading.RLock()
        self._walk = ProducerStateWalk(keep_completed=False, on_aborted=self._add_aborted)
        self._segment: weakref.ref[LogSegment] | None = None
        self._position = 0                      # where the walk goes on in self._segment
        self.aborted: list[AbortedTxn] = []
        # producer id -> (first offsets, last offsets) of its aborted transactions, sorted
        self._aborted_ranges: dict[int, tuple[list[int], list[int]]] = {}

    @property
    def _next_offset(self) -> int:
        return self._walk.next_offset

    # ------------------------------------------------------------------ the walk

    def _add_aborted(self, entry: TxnIndexEntry) -> None:
        self.aborted.append(AbortedTxn(entry.producer_id, entry.first_offset, entry.last_offset))
        firsts, lasts = self._aborted_ranges.setdefault(entry.producer_id, ([], []))
        i = bisect.bisect_left(firsts, entry.first_offset)
        firsts.insert(i, entry.first_offset)
        lasts.insert(i, entry.last_offset)

    def _progress(self, segment: LogSegment, position: int) -> None:
        self._position = position
        self._segment = weakref.ref(segment)

    def _catch_up(self) -> None:
        log = self._log()
        if log is None:
            return
        segments = log.reader_segments()        # the transactions of remote log segments too (tiered storage)
        values = segments.values()
        first = max(segments.bisect_right(self._next_offset) - 1, 0)
        current = self._segment() if self._segment is not None else None
        pending = list(values[first:])
        while pending:
            if getattr(pending[0], "remote", False) and pending[0].next_offset <= self._next_offset:
                del pending[0]          # a copy walked already (it never grows): nothing to fetch again
                continue
            jumped = self._jump(self._indexed_run(pending))
            if jumped:
                del pending[:jumped]
                current = None
                continue
            segment = pending.pop(0)
            self._walk.walk(segment, self._position if segment is current else 0, self._progress)
            current = None

    def _indexed_run(self, segments: list[LogSegment]) -> list[TransactionIndexed]:
        """The segments at the front of ``segments`` that carry their transaction index and snapshot."""
        run: list[TransactionIndexed] = []
        for segment in segments:
            indexed = _indexed(segment)
            if indexed is None:
                break
            run.append(indexed)
        return run

    def _jump(self, run: list[TransactionIndexed]) -> int:
        """Past a run of segments with transaction indexes: their aborted transactions, then the producers of
        the last one's snapshot; returns how many it passed.  Everything is fetched before anything changes
        (a failed fetch, the store down, leaves the walk where it was).  An index or snapshot that does not
        read back ends the run before its segment, whose batches are then walked (with a warning)."""
        while run:
            indexes = []
            try:
                for segment in run:
                    indexes.append(segment.transaction_index() or [])  # noqa: PERF401 (its length: where it failed)
                snapshot = run[-1].producer_snapshot() or []
            except CorruptRecordError as exc:
                logger.warning("%s; the walk of aborted transactions reads the batches of that copy instead", exc)
                run = run[:len(indexes)] if len(indexes) < len(run) else run[:-1]
                continue
            for entries in indexes:
                for entry in entries:
                    if entry.last_offset >= self._next_offset:
                        self._add_aborted(entry)
            self._walk.restore(snapshot, max(self._next_offset, run[-1].next_offset))
            self._segment = None
            self._position = 0
            return len(run)
        return 0

    # ------------------------------------------------------------------ queries

    def _hidden(self, header: BatchHeader) -> bool:
        pid = header.producer_id
        ranges = self._aborted_ranges.get(pid)
        if ranges is not None:
            firsts, lasts = ranges
            i = bisect.bisect_right(firsts, header.base_offset) - 1
            if i >= 0 and header.base_offset <= lasts[i]:
                return True
        if self.stable_offset_bounded:
            # a batch of a transaction without a marker yet is at or after the last stable offset, which views
            # never pass (see the module doc)
            return False
        entry = self._walk.producers.get(pid)
        return entry is not None and 0 <= entry.current_txn_first_offset <= header.base_offset

    def hides(self, header: BatchHeader) -> bool:
        """True when a read_committed consumer does not see the records of this batch."""
        if not header.is_transactional or header.is_control:
            return False
        with self.lock:
            if header.next_offset > self._next_offset:
                self._catch_up()
            return self._hidden(header)

    def hides_offset(self, offset: int) -> bool:
        """True when the record at ``offset`` belongs to an aborted (or unfinished) transaction.

        Stable offset bounded: also for any record at or after the last stable offset (not fetchable yet).
        """
        with self.lock:
            if offset >= self._next_offset:
                self._catch_up()
            if self.stable_offset_bounded and offset >= self._stable_offset():
                return True
            header = self._header_at(offset)
            return (header is not None and header.is_transactional and not header.is_control
                    and self._hidden(header))

    def _header_at(self, offset: int) -> BatchHeader | None:
        """The header of the batch holding ``offset``."""
        log = self._log()
        if log is None:
            return None
        segments = log.reader_segments()
        i = segments.bisect_right(offset) - 1
        if i < 0:
            return None
        segment = segments.values()[i]
        mapping = segment.translate_offset(offset)
        if mapping is None:
            return None
        for _, header in segment.batches(mapping.position):
            return header if header.base_offset <= offset <= header.last_offset else None
        return None

    def last_stable_offset(self) -> int:
        """Kafka's ``lastStableOffset``: the first offset of the earliest open transaction, else the log end.

        Only grows as the log grows (a marker closes a transaction; a new one opens after the end).
        """
        with self.lock:
            self._catch_up()
            return self._stable_offset()

    def _stable_offset(self) -> int:
        unstable = self._walk.first_unstable_offset()
        return self._next_offset if unstable is None else unstable

    def aborted_transactions(self) -> list[AbortedTxn]:
        """Every aborted transaction of the log, in marker order (what ``.txnindex`` files list)."""
        with self.lock:
            self._catch_up()
            return list(self.aborted)
