"""KIP-534: tombstones expire ``delete.retention.ms`` after the first clean that keeps them.

Kafka 3.1+ (KAFKA-8522) stores a batch's *delete horizon* in its base timestamp
with attribute bit 6 set; the first clean that retains a tombstone sets it to
the clean's time + ``delete.retention.ms``, and a clean at or after the horizon
drops the tombstone.  The engine's cleaner is driven here by a ManualClock, so
the horizon is an exact number; kafka-python reads every batch the cleaner
wrote (CRC checked) and must see the same timestamps as before the horizon was
set.  The mount test writes a compacted topic continuously, the case where the
legacy horizon (relative to the clean section's modification time) kept a
tombstone forever, and waits for the tombstone to disappear from
``records.jsonl``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cleaner import Cleaner, CleanerStats, Throttler
from engine.cleaner.cleaner_manager import LogToClean, cleanable_offsets
from engine.cleaner.offset_map import OffsetMap
from engine.clock import ManualClock
from engine.config import LogConfig
from engine.log import Log
from engine.records import (
    DELETE_HORIZON_FLAG_MASK,
    Compression,
    Record,
    TimestampType,
    decode_batch,
    decode_columns,
    encode_records,
    iter_batches,
    read_header,
    rebuild_batch,
    validate_batch,
)
from tests.helpers import JsonObject, add_config, cleaner_totals, wait_for
from tests.mount.test_mount_cleaner import CLEANER_OPTIONS

if TYPE_CHECKING:
    from tests.conftest import Mount

RETENTION_MS = 60_000


def _log(tmp_path: Path, clock: ManualClock, **overrides: str) -> Log:
    props = {"cleanup.policy": "compact", "internal.segment.bytes": "4096", "index.interval.bytes": "256",
             "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": str(RETENTION_MS)}
    props.update(overrides)
    d = tmp_path / "t-0"
    d.mkdir(parents=True, exist_ok=True)
    return Log.load(str(d), LogConfig.from_props(props), clock=clock)


def _clean(log: Log, now_ms: int | None = None) -> CleanerStats:
    cleaner = Cleaner(0, OffsetMap(1 << 20, 0.9), 4096, 1 << 20, 0.9, Throttler(float("inf")), log.clock)
    now = log.clock.milliseconds() if now_ms is None else now_ms
    offsets = cleanable_offsets(log, None, now)
    return cleaner.clean(LogToClean(log.topic_partition, log, offsets.first_dirty_offset,
                                    offsets.first_uncleanable_dirty_offset))


def _batches(log: Log):
    """(header, records) of every batch on disk, segment by segment."""
    out = []
    for segment in log.segments.values():
        data = Path(segment.log_path).read_bytes()
        for pos, header in iter_batches(data):
            validate_batch(data, pos)
            out.append((header, decode_batch(data, pos, header)))
    return out


def _tombstone_batch(log: Log, key: bytes):
    found = [(h, recs) for h, recs in _batches(log) for r in recs if r.key == key and r.value is None]
    return found[0] if found else None


def _all(log: Log) -> list[Record]:
    return log.read_records(log.log_start_offset)


def _kafka_python(log: Log) -> list[tuple[int, int, bytes | None, bytes | None]]:
    from kafka.record.memory_records import MemoryRecords
    out = []
    for segment in log.segments.values():
        records = MemoryRecords(Path(segment.log_path).read_bytes())
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc()
            out += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    return out


# ------------------------------------------------------------------------------- the cleaner

def test_first_clean_sets_the_horizon_and_the_first_clean_at_it_drops_the_tombstone(tmp_path):
    clock = ManualClock()
    log = _log(tmp_path, clock)
    try:
        for i in range(5):
            clock.sleep(7)
            log.append_values([b"v%d" % i], [b"k%d" % i])
        clock.sleep(7)
        log.append_values([None], [b"k2"])                      # the tombstone
        log.roll()
        before = {r.offset: r for r in _all(log)}
        kafka_before = {r[0]: r for r in _kafka_python(log)}

        # First clean at t1: k2's value goes, its tombstone stays, and its batch now carries the horizon.
        clock.sleep(1000)
        t1 = clock.milliseconds()
        stats = _clean(log)
        assert stats.horizons_set == 1
        assert stats.deletes_expired == 0
        header, _records = _tombstone_batch(log, b"k2")
        assert header.attributes & DELETE_HORIZON_FLAG_MASK
        assert header.delete_horizon_ms == header.base_timestamp == t1 + RETENTION_MS
        # Timestamps are unchanged for every reader: ours (records, columns) and kafka-python's.
        after = _all(log)
        assert [r.offset for r in after] == [0, 1, 3, 4, 5]
        assert all(r == before[r.offset] for r in after)
        assert _kafka_python(log) == [kafka_before[r.offset] for r in after]
        assert header.max_timestamp == before[5].timestamp
        # Every other batch (no tombstone) kept its original bytes and no flag.
        assert [h.delete_horizon_ms for h, _ in _batches(log)] == [None] * 4 + [t1 + RETENTION_MS]

        # A clean 1 ms before the horizon keeps it, and leaves the horizon where it was.
        log.append_values([b"v0b"], [b"k0"])
        log.roll()
        clock.now = t1 + RETENTION_MS - 1
        stats = _clean(log)
        assert stats.horizons_set == 0
        assert stats.deletes_expired == 0
        header, _ = _tombstone_batch(log, b"k2")
        assert header.delete_horizon_ms == t1 + RETENTION_MS
        assert [(r.offset, r.key, r.value) for r in _all(log)] == \
            [(1, b"k1", b"v1"), (3, b"k3", b"v3"), (4, b"k4", b"v4"), (5, b"k2", None), (6, b"k0", b"v0b")]

        # The first clean at the horizon drops it.
        log.append_values([b"v1b"], [b"k1"])
        log.roll()
        clock.now = t1 + RETENTION_MS
        stats = _clean(log)
        assert stats.deletes_expired == 1
        assert _tombstone_batch(log, b"k2") is None
        assert [(r.offset, r.key, r.value) for r in _all(log)] == \
            [(3, b"k3", b"v3"), (4, b"k4", b"v4"), (6, b"k0", b"v0b"), (7, b"k1", b"v1b")]
        assert [r[0] for r in _kafka_python(log)] == [3, 4, 6, 7]
    finally:
        log.close()


def test_tombstone_on_a_topic_that_keeps_being_written_expires(tmp_path):
    """KAFKA-8522: every clean re-writes the tombstone's segment with a fresh modification time.

    Updates to a few keys keep the clean section one small segment that every
    clean regroups with the newest one; under the legacy horizon (relative to
    that segment's modification time) the tombstone never expired.
    """
    clock = ManualClock()
    log = _log(tmp_path, clock)
    try:
        log.append_values([b"doomed"], [b"gone"])
        log.append_values([None], [b"gone"])
        tombstone_offset = log.log_end_offset - 1
        log.roll()
        first_clean = None
        for step in range(100):
            for i in range(3):
                log.append_values([b"r%d-%d" % (step, i)], [b"hot%d" % i])
            log.roll()
            for segment in log.segments.values():        # each segment as new as the clock
                segment.set_last_modified(clock.milliseconds())
            stats = _clean(log)
            first_clean = clock.milliseconds() if first_clean is None else first_clean
            present = any(r.key == b"gone" for r in _all(log))
            if clock.milliseconds() < first_clean + RETENTION_MS:
                assert present, f"the tombstone went before its horizon (round {step})"
            else:
                assert not present, f"the tombstone outlived its horizon (round {step})"
                assert stats.deletes_expired == 1
                break
            clock.sleep(RETENTION_MS // 10)
        else:
            pytest.fail("the clock never reached the horizon")
        key = log.read_records(tombstone_offset + 1, 1)[0].key
        assert key is not None
        assert key.startswith(b"hot")
    finally:
        log.close()


def test_horizons_that_were_already_set_are_honoured_and_kept(tmp_path):
    """A batch with a horizon (as Kafka's cleaner writes it) keeps it when re-written without a record."""
    clock = ManualClock()
    log = _log(tmp_path, clock)
    try:
        horizon = clock.milliseconds() + 5000
        original = encode_records([Record(0, clock.milliseconds() - 10, b"a", b"1"),
                                   Record(1, clock.milliseconds() - 5, b"b", None),
                                   Record(2, clock.milliseconds() - 1, b"c", b"3")])
        flagged = rebuild_batch(read_header(original), decode_batch(original), delete_horizon_ms=horizon)
        log.append_batch(flagged)
        log.append_values([b"1b"], [b"a"])                    # supersedes offset 0
        log.roll()
        _clean(log)
        header, records = _batches(log)[0]
        assert header.delete_horizon_ms == horizon             # not reset to now + retention
        assert [(r.offset, r.key) for r in records] == [(1, b"b"), (2, b"c")]
        assert header.base_offset == 0
        assert header.last_offset == 2                                 # Kafka keeps the batch's offsets
        log.append_values([b"3b"], [b"c"])
        log.roll()
        clock.now = horizon
        stats = _clean(log)
        assert stats.deletes_expired == 1
        assert [(r.offset, r.key) for r in _all(log)] == [(3, b"a"), (4, b"c")]
    finally:
        log.close()


# ------------------------------------------------------------------------------- the codec

records_strategy = st.lists(
    st.tuples(st.integers(0, 3),                                    # offset gap
              st.integers(-10**6, 10**6),                            # timestamp around now
              st.one_of(st.none(), st.binary(max_size=20)),
              st.one_of(st.none(), st.binary(max_size=200)),
              st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))),
                       max_size=2)),
    min_size=1, max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=records_strategy, compression=st.sampled_from(list(Compression)),
       timestamp_type=st.sampled_from(list(TimestampType)), horizon_delta=st.integers(-10**7, 10**7),
       keep=st.lists(st.booleans(), min_size=30, max_size=30))
def test_a_horizon_batch_reads_back_the_same_records_everywhere(spec, compression, timestamp_type,
                                                                horizon_delta, keep):
    from kafka.record.default_records import DefaultRecordBatch

    now = 1_700_000_000_000
    offset = 100
    records = []
    for gap, ts, key, value, headers in spec:
        offset += gap + 1
        records.append(Record(offset, now + ts, key, value, tuple(headers)))
    original = encode_records(records, compression=compression, timestamp_type=timestamp_type)
    header = read_header(original)
    expected = decode_batch(original)
    kept = [r for r, k in zip(expected, keep) if k] or expected[-1:]
    horizon = now + horizon_delta
    rebuilt = rebuild_batch(header, kept, delete_horizon_ms=horizon)
    new = validate_batch(rebuilt)
    assert new.delete_horizon_ms == new.base_timestamp == horizon
    assert (new.base_offset, new.last_offset, new.compression, new.timestamp_type) == \
        (header.base_offset, header.last_offset, header.compression, header.timestamp_type)
    assert new.max_timestamp == (header.max_timestamp if timestamp_type == TimestampType.LOG_APPEND_TIME
                                 else max(r.timestamp for r in kept))
    assert decode_batch(rebuilt) == kept
    columns = decode_columns(rebuilt)
    assert list(columns.offsets) == [r.offset for r in kept]
    assert columns.timestamps == [r.timestamp for r in kept]
    # kafka-python knows nothing of the flag and computes baseTimestamp + delta (or LogAppendTime).
    batch = DefaultRecordBatch(bytearray(rebuilt))
    assert batch.validate_crc()
    theirs = [(r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers)) for r in batch]
    assert theirs == [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in kept]
    # Without a horizon the flag is clear and the base timestamp is the first record's.
    plain = read_header(rebuild_batch(header, kept))
    assert plain.delete_horizon_ms is None
    assert plain.base_timestamp == kept[0].timestamp


# ------------------------------------------------------------------------------- the mount


def _rows(mount: Mount) -> list[JsonObject]:
    return [json.loads(line) for line in (mount / "t/0/records.jsonl").read_bytes().splitlines()]


@pytest.mark.mount
@pytest.mark.mount_options(CLEANER_OPTIONS)
def test_a_tombstone_expires_in_a_mount_under_continuous_writes(mount):
    retention_ms = 2000
    (mount / "t").mkdir()
    add_config(mount / "t/config", "cleanup.policy=compact\nparse.key=true\nnull.marker=NULL\n"
                                    f"min.cleanable.dirty.ratio=0.1\ninternal.segment.bytes=4096\n"
                                    f"delete.retention.ms={retention_ms}\n")
    fd = os.open(mount / "t/0/append", os.O_WRONLY)
    try:
        os.write(fd, b"gone\tsoon\n")
        written = time.monotonic()              # before the tombstone, so before any clean that sees it
        (mount / "t/0/delete").write_bytes(b"key gone\n")      # the tombstone
        n = 0

        def write_round() -> None:
            # Updates of the same 20 keys: the compacted log stays one small segment that every
            # clean regroups with the newest (the KAFKA-8522 shape).
            nonlocal n
            n += 1
            os.write(fd, "".join(f"hot{i}\tround{n}-{i}-{'x' * 40}\n" for i in range(20)).encode())

        def horizon_set() -> bool:
            write_round()
            horizons: int = cleaner_totals(mount)["horizons_set"]
            return horizons >= 1
        wait_for(horizon_set, "a clean that sets the tombstone's delete horizon", timeout=60, interval=0.1)
        rows = _rows(mount)
        assert [r["value"] for r in rows if r["key"] == "gone"] == [None], "the value was not compacted away"

        def tombstone_gone() -> bool:
            write_round()
            return not any(r["key"] == "gone" for r in _rows(mount))
        wait_for(tombstone_gone, "the tombstone to expire", timeout=60, interval=0.1)
        assert time.monotonic() - written >= retention_ms / 1000, "dropped before delete.retention.ms"
        assert cleaner_totals(mount)["deletes_expired"] >= 1
        metrics = (mount / ".logfs/metrics").read_text()
        assert "logfs_cleaner_deletes_expired_total" in metrics
        assert "logfs_cleaner_delete_horizons_set_total" in metrics
    finally:
        os.close(fd)
    latest = {r["key"]: r["value"] for r in _rows(mount)}
    assert latest == {f"hot{i}": f"round{n}-{i}-{'x' * 40}" for i in range(20)}
