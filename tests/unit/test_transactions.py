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
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from engine import transactions
from engine.config import BrokerConfig
from engine.errors import OffsetOutOfRangeError
from engine.manager import LogManager
from engine.topic import TopicPartition
from engine.views import LogView, ViewFormat, record_at

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
            log = manager.get_log(TP)
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
        state = transactions.read_committed_state(manager.get_log(TP))
        assert state is not None
        # offsets: 0-1 tx0, 2 plain, 3 tx1, 4 ABORT(tx0), 5-6 tx1, 7 COMMIT(tx1), 8 tx0, 9 ABORT(tx0)
        assert state.aborted_transactions() == [transactions.AbortedTxn(1000, 0, 4),
                                                transactions.AbortedTxn(1000, 8, 9)]
    finally:
        manager.shutdown()
