"""A slow LogView reader while the log cleaner and retention rewrite the log beneath it.

The mount's ``tail -f`` on ``records``/``records.jsonl`` is a sequential reader
that can stall for seconds (a full output pipe) while appends, rolls, several
cleanings and the unlinking of ``.deleted`` files happen.  These tests drive
that interleaving deterministically from the test (a seeded schedule, one
thread): a real ``Log`` with small segments, the real ``LogCleaner`` (or
``Cleaner``), retention through ``Log.delete_old_segments`` and the deletion
of ``.deleted`` files through ``Log.delete_expired_segment_files`` once
``file.delete.delay.ms`` has passed on the log's clock.

What a reader of a view opened before all that must see (SPEC: a view reads on
consistently): only whole lines, offsets strictly increasing (never a record
twice), no error, and - for compaction, which never removes the latest record
of a key - every key's latest value; for retention, everything from its first
record on except what retention deleted before the view got there.
"""

from __future__ import annotations

import gc
import json
import random
from typing import TYPE_CHECKING

import pytest

from engine.cleaner import LogCleaner
from engine.clock import ManualClock
from engine.config import BrokerConfig, LogConfig
from engine.log import Log
from engine.views import LogView, ViewFormat

if TYPE_CHECKING:
    from collections.abc import Callable

T0 = 1_700_000_000_000
KEYS = 9
DELETE_DELAY_MS = 200


def _log(tmp_path, clock: ManualClock, **props: str) -> Log:
    directory = tmp_path / "t-0"
    directory.mkdir()
    config = LogConfig.from_props({"internal.segment.bytes": "700", "index.interval.bytes": "64",
                                   "segment.index.bytes": "4096",
                                   "file.delete.delay.ms": str(DELETE_DELAY_MS), **props})
    return Log.load(str(directory), config, clock=clock)


def _value(key: int, offset: int) -> bytes:
    # the value names its own offset and key, so every line read can be checked on its own
    return b"k%d@%d:" % (key, offset) + b"x" * (offset * 7 % 23)


def _parse(line: bytes, fmt: ViewFormat) -> tuple[int, int]:
    """(offset, key) of one rendered line, cross-checked against the JSON fields."""
    if fmt is ViewFormat.JSONL:
        obj = json.loads(line)
        value = obj["value"].encode()
        assert obj["key"] == "k%d" % int(value[1:value.index(b"@")])
        offset = obj["offset"]
        assert value.startswith(b"k")
        assert int(value[value.index(b"@") + 1:value.index(b":")]) == offset
    else:
        value = line
        offset = int(value[value.index(b"@") + 1:value.index(b":")])
    key = int(value[1:value.index(b"@")])
    assert value == _value(key, offset), line
    return offset, key


class SlowReader:
    """A tail-like reader: sequential reads of assorted sizes, in bursts, with long pauses."""

    def __init__(self, view: LogView, fmt: ViewFormat, rng: random.Random) -> None:
        self.view, self.fmt, self.rng = view, fmt, rng
        self.position = 0
        self.pending = b""
        self.offsets: list[int] = []
        self.keys: dict[int, int] = {}       # key -> highest offset read

    def read_once(self) -> int:
        """One read; sizes include "exactly to the current end" and a few bytes (part of a record)."""
        end = self.view.size()
        choice = self.rng.random()
        if choice < 0.3 and end > self.position:
            size = end - self.position
        elif choice < 0.5:
            size = self.rng.randint(1, 40)
        else:
            size = self.rng.choice((64, 300, 4096, 8192))
        piece = self.view.read(self.position, size)
        self.position += len(piece)
        data = self.pending + piece
        *lines, self.pending = data.split(b"\n")
        for line in lines:
            offset, key = _parse(line, self.fmt)
            assert not self.offsets or offset > self.offsets[-1], (
                f"offset {offset} read after {self.offsets[-1]}")
            self.offsets.append(offset)
            self.keys[key] = offset
        return len(piece)

    def drain(self) -> None:
        while self.read_once() or self.view.size() > self.position:
            pass
        assert self.pending == b""          # a view ends at a record boundary


class _Producer:
    """Appends records of random keys (of KEYS) whose values name key and offset (``_value``), keeping the
    next offset and each key's latest offset."""

    def __init__(self, log: Log, rng: random.Random) -> None:
        self.log = log
        self.rng = rng
        self.next_offset = 0
        self.latest: dict[int, int] = {}

    def append(self, n: int) -> None:
        keys = [self.rng.randrange(KEYS) for _ in range(n)]
        self.log.append_values([_value(k, self.next_offset + i) for i, k in enumerate(keys)],
                               [b"k%d" % k for k in keys])
        for i, k in enumerate(keys):
            self.latest[k] = self.next_offset + i
        self.next_offset += n


def _walk(rng: random.Random, steps: int, stretch: int, reader: SlowReader,
          actions: list[tuple[float, Callable[[], object]]]) -> None:
    """``steps`` random steps: a draw below an action's threshold (the first such, in order) runs it; any other
    draw is a read by ``reader``, except in every third stretch of ``stretch`` steps, when the reader stalls."""
    for step in range(steps):
        draw = rng.random()
        for threshold, action in actions:
            if draw < threshold:
                action()
                break
        else:
            if (step // stretch) % 3 != 2:
                reader.read_once()


def _cleaner(tmp_path, log: Log, clock: ManualClock) -> LogCleaner:
    config = BrokerConfig.from_props({"log.dirs": str(tmp_path), "log.cleaner.dedupe.buffer.size": str(1 << 20),
                                      "log.cleaner.io.buffer.size": str(1 << 16)})
    return LogCleaner(config, [str(tmp_path)], lambda: [log], clock)


def _expire(log: Log, clock: ManualClock) -> None:
    """file.delete.delay.ms passes: the .deleted files go, and with them the last engine references."""
    clock.sleep(DELETE_DELAY_MS + 1)
    if log.delete_expired_segment_files():
        gc.collect()


@pytest.mark.parametrize("fmt", list(ViewFormat))
@pytest.mark.parametrize("seed", range(3))
def test_slow_reader_follows_across_repeated_compaction(tmp_path, fmt, seed):
    rng = random.Random(seed)
    clock = ManualClock(T0)
    log = _log(tmp_path, clock, **{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                                   "delete.retention.ms": str(10**12)})
    cleaner = _cleaner(tmp_path, log, clock)
    producer = _Producer(log, rng)
    producer.append(20)
    reader = SlowReader(LogView(log, fmt), fmt, rng)
    cleaned: list[bool] = []
    _walk(rng, 500, 60, reader, [
        (0.45, lambda: producer.append(rng.randint(1, 6))),
        (0.52, log.roll),
        (0.62, lambda: cleaned.append(cleaner.clean_once() is not None)),
        (0.72, lambda: _expire(log, clock)),
    ])
    log.roll()
    cleaned.append(cleaner.clean_once() is not None)
    _expire(log, clock)
    reader.drain()
    assert sum(cleaned) >= 5
    assert reader.offsets[-1] == producer.next_offset - 1
    # compaction never removes a key's latest record: the reader saw each of them
    assert {k: reader.keys.get(k) for k in producer.latest} == producer.latest
    log.close()


@pytest.mark.parametrize("fmt", list(ViewFormat))
@pytest.mark.parametrize("seed", range(2))
def test_slow_reader_falls_behind_retention(tmp_path, fmt, seed):
    rng = random.Random(100 + seed)
    clock = ManualClock(T0)
    log = _log(tmp_path, clock, **{"retention.bytes": "1500"})
    producer = _Producer(log, rng)
    producer.append(10)
    reader = SlowReader(LogView(log, fmt), fmt, rng)
    _walk(rng, 400, 50, reader, [
        (0.5, lambda: producer.append(rng.randint(1, 6))),
        (0.6, log.delete_old_segments),
        (0.7, lambda: _expire(log, clock)),
    ])
    reader.drain()
    assert reader.offsets[0] == 0
    assert reader.offsets[-1] == producer.next_offset - 1
    # only what retention deleted before the reader got there may be missing
    missed = set(range(producer.next_offset)) - set(reader.offsets)
    assert not missed or max(missed) < log.log_start_offset
    log.close()
