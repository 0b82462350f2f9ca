"""read_committed views against a model of Kafka's transaction semantics (hypothesis).

Each example is a partition written as a broker would write it: plain batches,
transactional batches of several producers interleaved, and transaction markers
(COMMIT or ABORT control batches), split over several segments.  The batches
are built with kafka-python's record builder, which knows nothing of our codec;
the markers are kafka-python batches with the control attribute set, as
Kafka's ``EndTransactionMarker`` batches are.  A ``LogManager`` loads the
directory with ``isolation.level=read_committed`` and the JSON-lines view must
hold exactly the records the model says a read_committed consumer sees:
every plain record, every record of a committed transaction, none of an
aborted one, and none of a transaction that has no marker.  The
read_uncommitted view (the default) shows them all.
"""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from engine import transactions
from engine.config import BrokerConfig
from engine.errors import OffsetOutOfRangeError
from engine.manager import LogManager
from engine.topic import TopicPartition
from engine.views import LogView, ViewFormat, record_at
from tests.helpers import log_of

if TYPE_CHECKING:
    from pathlib import Path

    from engine.log import Log

ABORT, COMMIT = 0, 1
TP = TopicPartition("t", 0)


def _batch(base_offset: int, values: list[bytes], *, producer_id: int = -1, transactional: bool = False,
           control: bytes | None = None) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=-1, batch_size=1 << 20)
    if control is not None:
        builder.append(0, timestamp=1_700_000_000_000, key=control, value=struct.pack(">hi", 0, 0), headers=[])
    else:
        for i, value in enumerate(values):
            builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)               # outside the CRC
    if control is not None:
        attributes, = struct.unpack_from(">h", data, 21)
        struct.pack_into(">h", data, 21, attributes | 0x20)     # the control bit
        struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


# an operation: ("plain", n) | ("data", producer, n) | ("end", producer, commit) | ("roll",)
operations = st.lists(st.one_of(
    st.tuples(st.just("plain"), st.integers(1, 3)),
    st.tuples(st.just("data"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("end"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("roll")),
), max_size=30)


def _write(log_dir: Path, ops) -> tuple[list[int], list[int]]:
    """Write the partition; return (every data offset, the offsets a read_committed consumer sees)."""
    pdir = log_dir / "t-0"
    pdir.mkdir(parents=True)
    segments: list[tuple[int, list[bytes]]] = [(0, [])]
    offset = 0
    every: list[int] = []
    committed: list[int] = []
    ongoing: dict[int, list[int]] = {}
    for op in ops:
        if op[0] == "roll":
            if segments[-1][1]:
                segments.append((offset, []))
            continue
        if op[0] == "plain":
            n = op[1]
            batch = _batch(offset, [b"plain %d" % (offset + i) for i in range(n)])
            every += range(offset, offset + n)
            committed += range(offset, offset + n)
        elif op[0] == "data":
            producer, n = op[1], op[2]
            batch = _batch(offset, [b"tx%d %d" % (producer, offset + i) for i in range(n)],
                           producer_id=1000 + producer, transactional=True)
            every += range(offset, offset + n)
            ongoing.setdefault(producer, []).extend(range(offset, offset + n))
        else:
            producer, commit = op[1], op[2]
            n = 1
            batch = _batch(offset, [], producer_id=1000 + producer, transactional=True,
                           control=struct.pack(">hh", 0, COMMIT if commit else ABORT))
            if commit:
                committed += ongoing.get(producer, [])
            ongoing.pop(producer, None)
        segments[-1][1].append(batch)
        offset += n
    for base, batches in segments:
        (pdir / f"{base:020d}.log").write_bytes(b"".join(batches))
    return every, sorted(committed)


def _view_offsets(log, fmt=ViewFormat.JSONL) -> list[int]:
    view = LogView(log, fmt)
    try:
        return [json.loads(line)["offset"] for line in view.read(0, view.size()).splitlines()]
    finally:
        view.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_read_committed_views_show_what_a_read_committed_consumer_sees(tmp_path_factory, ops):
    base = tmp_path_factory.mktemp("txn")
    every, committed = _write(base / "data", ops)
    for level, expected in (("read_committed", committed), ("read_uncommitted", every)):
        manager = LogManager(BrokerConfig(log_dirs=[str(base / "data")], isolation_level=level,
                                          log_cleaner_enable=False))
        manager.startup()
        try:
            log = log_of(manager, TP)
            assert _view_offsets(log) == expected, level
            text = LogView(log, ViewFormat.TEXT)
            assert len(text.read(0, text.size()).splitlines()) == len(expected)
            text.close()
            hidden = sorted(set(every) - set(expected))
            for offset in hidden[:3]:
                with pytest.raises(OffsetOutOfRangeError):
                    record_at(log, offset)
            for offset in expected[:3]:
                assert record_at(log, offset).offset == offset
        finally:
            manager.shutdown()


def test_aborted_transactions_are_listed_as_kafka_lists_them(tmp_path):
    """AbortedTxn(producer id, first offset, marker offset), in marker order."""
    ops = [("data", 0, 2), ("plain", 1), ("data", 1, 1), ("end", 0, False), ("data", 1, 2),
           ("end", 1, True), ("data", 0, 1), ("end", 0, False)]
    _write(tmp_path / "data", ops)
    manager = LogManager(BrokerConfig(log_dirs=[str(tmp_path / "data")], isolation_level="read_committed",
                                      log_cleaner_enable=False))
    manager.startup()
    try:
        state = transactions.read_committed_state(log_of(manager, TP))
        assert state is not None
        # offsets: 0-1 tx0, 2 plain, 3 tx1, 4 ABORT(tx0), 5-6 tx1, 7 COMMIT(tx1), 8 tx0, 9 ABORT(tx0)
        assert state.aborted_transactions() == [transactions.AbortedTxn(1000, 0, 4),
                                                transactions.AbortedTxn(1000, 8, 9)]
    finally:
        manager.shutdown()


def test_a_segments_transaction_index_and_producer_snapshot_are_kafkas(tmp_path):
    """ProducerStateWalk over the segments of a log gives what Kafka's ProducerStateManager writes for each:
    the ``.txnindex`` entries of the aborted transactions whose marker it holds (with the last stable offset at
    the marker), and the producers at its end (a transaction open across the boundary in the snapshot), both
    in Kafka's formats, which ``dump-log`` reads."""
    import io

    from engine.tools import dump_log

    # segment 0: 0-1 tx0, 2 plain, 3 tx1, 4 ABORT(tx0), 5 tx0 | segment 6: 6 tx1, 7 ABORT(tx1), 8 ABORT(tx0)
    ops = [("data", 0, 2), ("plain", 1), ("data", 1, 1), ("end", 0, False), ("data", 0, 1), ("roll",),
           ("data", 1, 1), ("end", 1, False), ("end", 0, False)]
    _write(tmp_path / "data", ops)
    manager = LogManager(BrokerConfig(log_dirs=[str(tmp_path / "data")], log_cleaner_enable=False))
    manager.startup()
    try:
        log = log_of(manager, TP)
        first, second = list(log.segments.values())[:2]
        entries: list[transactions.TxnIndexEntry] = []
        walk = transactions.ProducerStateWalk(on_aborted=entries.append)
        walk.walk(first)
        assert entries == [transactions.TxnIndexEntry(1000, 0, 4, 3)]        # tx1 open at 3: the LSO
        assert walk.next_offset == 6
        assert walk.open_transactions() == {1000: 5, 1001: 3}
        snapshot = transactions.encode_producer_snapshot(walk.producers.values())
        restored = transactions.decode_producer_snapshot(snapshot, "test")
        assert {e.producer_id: e.current_txn_first_offset for e in restored} == {1000: 5, 1001: 3}
        # the second segment walked from the snapshot alone: what a walk of both segments finds
        entries.clear()
        walk = transactions.ProducerStateWalk(restored, 6, on_aborted=entries.append)
        walk.walk(second)
        assert entries == [transactions.TxnIndexEntry(1001, 3, 7, 5), transactions.TxnIndexEntry(1000, 5, 8, 9)]
        assert transactions.producer_state_at(log.segments, 6).open_transactions() == {1000: 5, 1001: 3}
        index = transactions.encode_txn_index(entries)
        assert transactions.decode_txn_index(index, "test") == entries
        (tmp_path / "00000000000000000006.txnindex").write_bytes(index)
        (tmp_path / "00000000000000000006.snapshot").write_bytes(snapshot)
        out, err = io.StringIO(), io.StringIO()
        assert dump_log([str(tmp_path / "00000000000000000006.txnindex"),
                         str(tmp_path / "00000000000000000006.snapshot")], False, out, err) == 0, err.getvalue()
        assert "producerId: 1001 firstOffset: 3 lastOffset: 7 lastStableOffset: 5" in out.getvalue()
        assert "producerId: 1000 producerEpoch: 0 coordinatorEpoch: 0 currentTxnFirstOffset: OptionalLong[5]" \
            in out.getvalue()
        with pytest.raises(transactions.CorruptRecordError):
            transactions.decode_producer_snapshot(snapshot[:-1] + bytes([snapshot[-1] ^ 1]), "damaged")
    finally:
        manager.shutdown()


# --------------------------------------------------------------------------- a live replica: stable offset bounded


def _op_batch(op, offset: int) -> tuple[bytes, int]:
    """The batch of one operation at ``offset`` and its record count (see ``operations``)."""
    if op[0] == "plain":
        return _batch(offset, [b"plain %d" % (offset + i) for i in range(op[1])]), op[1]
    if op[0] == "data":
        return _batch(offset, [b"tx%d %d" % (op[1], offset + i) for i in range(op[2])],
                      producer_id=1000 + op[1], transactional=True), op[2]
    return _batch(offset, [], producer_id=1000 + op[1], transactional=True,
                  control=struct.pack(">hh", 0, COMMIT if op[2] else ABORT)), 1


class _LiveModel:
    """What a read_committed consumer of a live log may read: records below the last stable offset that are
    plain or of a committed transaction (Kafka's ``lastStableOffset``, ``AbortedTxn``)."""

    def __init__(self) -> None:
        self.end = 0
        self.visible: list[int] = []        # plain or committed, any offset
        self.ongoing: dict[int, list[int]] = {}

    def apply(self, op, count: int) -> None:
        offsets = list(range(self.end, self.end + count))
        if op[0] == "plain":
            self.visible += offsets
        elif op[0] == "data":
            self.ongoing.setdefault(op[1], []).extend(offsets)
        else:
            batches = self.ongoing.pop(op[1], [])
            if op[2]:
                self.visible = sorted(self.visible + batches)
        self.end += count

    @property
    def last_stable_offset(self) -> int:
        return min((o[0] for o in self.ongoing.values() if o), default=self.end)

    def readable(self) -> list[int]:
        return [o for o in self.visible if o < self.last_stable_offset]


def _offsets_of(jsonl: bytes) -> list[int]:
    return [json.loads(line)["offset"] for line in jsonl.splitlines()]


def _read_all(view: LogView) -> bytes:
    return view.read(0, view.size())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
# a transaction's batch in a sealed segment, committed later: a view open since kept that segment's size at 0
@example(ops=[("data", 0, 1), ("roll",), ("data", 2, 1), ("roll",)])
def test_read_committed_views_of_a_live_replica_end_at_the_last_stable_offset(tmp_path_factory, ops):
    """Stable offset bounded (the cluster mount's replicas): batch by batch, as the replica fetcher appends
    them, every view shows the plain and committed records below the last stable offset and nothing after
    it; views opened earlier only grow at their end (the bytes read before never change), and agree with a
    view opened now, ``offset/<N>``, ``from/<N>`` and a consumer view (which ends at the last stable offset).
    """
    from engine.views.consume import open_consumer_view

    data = tmp_path_factory.mktemp("live") / "data"
    manager = LogManager(BrokerConfig(log_dirs=[str(data)], isolation_level="read_committed",
                                      log_cleaner_enable=False), stable_offset_bounded=True)
    manager.startup()
    try:
        log = manager.get_or_create_log(TP, "AAAAAAAAAAAAAAAAAAAAAA")
        model = _LiveModel()
        followers = {fmt: LogView(log, fmt) for fmt in ViewFormat}
        seen = dict.fromkeys(ViewFormat, b"")
        for op in [*ops, ("end", 0, True), ("end", 1, False), ("end", 2, True)]:
            if op[0] == "roll":
                if log.active_segment.size:
                    log.roll()
                continue
            batch, count = _op_batch(op, model.end)
            log.append_as_follower(batch)
            model.apply(op, count)
            expected = model.readable()
            lso = model.last_stable_offset
            assert transactions.visible_end_offset(log) == lso
            for fmt, view in followers.items():
                grown = view.read(len(seen[fmt]), 1 << 20)          # a follower at its end (tail -f)
                whole = _read_all(view)
                assert whole == seen[fmt] + grown, "a view's bytes changed before its end"
                seen[fmt] = whole
                fresh = LogView(log, fmt)
                assert _read_all(fresh) == whole
                fresh.close()
            assert _offsets_of(seen[ViewFormat.JSONL]) == expected
            assert len(seen[ViewFormat.TEXT].splitlines()) == len(expected)
            for offset in range(max(0, model.end - 4), model.end):
                if offset in expected:
                    assert record_at(log, offset).offset == offset
                else:
                    with pytest.raises(OffsetOutOfRangeError):
                        record_at(log, offset)
            consumer = open_consumer_view(log, ViewFormat.JSONL, None)
            assert consumer.end_offset == lso
            assert _offsets_of(_read_all(consumer)) == expected
            consumer.close()
            middle = LogView(log, ViewFormat.JSONL, start_offset=lso // 2)
            assert _offsets_of(_read_all(middle)) == [o for o in expected if o >= lso // 2]
            middle.close()
            if lso < model.end:
                with pytest.raises(OffsetOutOfRangeError):
                    LogView(log, ViewFormat.JSONL, start_offset=lso + 1)
        # every transaction ended: everything committed shows, as on a stopped broker's copy
        assert _offsets_of(seen[ViewFormat.JSONL]) == model.visible
        for view in followers.values():
            view.close()
    finally:
        manager.shutdown()


def _follow_one_transaction(log: Log, *, commit: bool) -> None:
    """A replica's appends of a plain record (0), a transaction's two records (1, 2) and its marker (3)."""
    log.append_as_follower(_op_batch(("plain", 1), 0)[0])
    log.append_as_follower(_op_batch(("data", 0, 2), 1)[0])
    log.append_as_follower(_op_batch(("end", 0, commit), 3)[0])


def test_a_live_replica_truncated_below_a_marker_is_walked_again(tmp_path):
    """A replica truncated to its leader (KIP-320 divergence) below a COMMIT marker it had fetched: the
    transaction is open again, its records are held back again, and the leader's ABORT marker, fetched
    next, hides them (in views opened after the truncation: the mount replaces a view's bytes cached
    before one, see logfs.nodes.ViewFile.mtime_ns)."""
    manager = LogManager(BrokerConfig(log_dirs=[str(tmp_path / "data")], isolation_level="read_committed",
                                      log_cleaner_enable=False), stable_offset_bounded=True)
    manager.startup()
    try:
        log = manager.get_or_create_log(TP, "AAAAAAAAAAAAAAAAAAAAAA")
        _follow_one_transaction(log, commit=True)                      # 0; 1, 2; COMMIT: 3
        log.append_as_follower(_op_batch(("plain", 1), 4)[0])             # 4
        assert _offsets_of(_read_all(LogView(log, ViewFormat.JSONL))) == [0, 1, 2, 4]
        assert log.truncate_to(3)                                          # the COMMIT marker is gone
        assert transactions.visible_end_offset(log) == 1
        assert _offsets_of(_read_all(LogView(log, ViewFormat.JSONL))) == [0]
        with pytest.raises(OffsetOutOfRangeError):
            record_at(log, 1)
        log.append_as_follower(_op_batch(("end", 0, False), 3)[0])        # the leader's ABORT: 3
        log.append_as_follower(_op_batch(("plain", 1), 4)[0])             # 4
        assert transactions.visible_end_offset(log) == 5
        assert _offsets_of(_read_all(LogView(log, ViewFormat.JSONL))) == [0, 4]
        with pytest.raises(OffsetOutOfRangeError):
            record_at(log, 1)
    finally:
        manager.shutdown()


def test_the_read_committed_view_index_is_the_segments_for_the_logs_transaction_state(tmp_path):
    """The read_committed view index of a segment is kept in the segment's attachment (the view layer's
    SegmentViews) for the transaction state it was built with: a read under that state reuses it, a
    truncation drops it with the attachment, and the state walked again after it builds its own (which shows
    the transaction committed by the marker appended after the truncation)."""
    from engine.views.index import SegmentViews, committed_view_index

    manager = LogManager(BrokerConfig(log_dirs=[str(tmp_path / "data")], isolation_level="read_committed",
                                      log_cleaner_enable=False))
    manager.startup()
    try:
        log = manager.get_or_create_log(TP, "AAAAAAAAAAAAAAAAAAAAAA")
        _follow_one_transaction(log, commit=False)                      # 0; 1, 2; ABORT: 3
        assert _offsets_of(_read_all(LogView(log, ViewFormat.JSONL))) == [0]
        segment = log.segments.peekitem(-1)[1]
        txn = log.transaction_state
        assert txn is not None
        views = segment.attachment
        assert isinstance(views, SegmentViews)
        assert views.committed is not None
        assert views.committed_txn is not None
        assert views.committed_txn() is txn
        assert committed_view_index(txn, segment) is views.committed
        assert log.truncate_to(3)
        assert segment.attachment is None
        log.append_as_follower(_op_batch(("end", 0, True), 3)[0])         # COMMIT: 3
        assert _offsets_of(_read_all(LogView(log, ViewFormat.JSONL))) == [0, 1, 2]
        views = segment.attachment
        assert isinstance(views, SegmentViews)
        assert views.committed_txn is not None
        assert views.committed_txn() is log.transaction_state is not txn
    finally:
        manager.shutdown()
