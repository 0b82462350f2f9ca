"""OffsetIndex and TimeIndex against naive models, on real mmap'ed files."""

from __future__ import annotations

import bisect
import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import CorruptIndexError, InvalidConfigError, InvalidRequestError, LogfsError, StorageError
from engine.index import (
    WARM_SECTION_BYTES,
    IndexFullError,
    IndexOffsetOverflowError,
    InvalidOffsetError,
    OffsetIndex,
    TimeIndex,
    offset_index_file_position,
)

BASE = 1_000
MB = 1 << 20
settings.register_profile("index", max_examples=60, deadline=None)
settings.load_profile("index")


def offset_entries(rng: random.Random, n: int, base: int = BASE) -> list[tuple[int, int]]:
    offset, position, out = base, 0, []
    for _ in range(n):
        offset += rng.randint(1, 40)
        position += rng.randint(1, 5000)
        out.append((offset, position))
    return out


def naive_lookup(entries: list[tuple[int, int]], target: int, default: tuple[int, int]) -> tuple[int, int]:
    keys = [k for k, _ in entries]
    i = bisect.bisect_right(keys, target)
    return entries[i - 1] if i else default


def fresh_offset_index(tmp_path, name="00000000000000001000.index", size=MB, base=BASE) -> OffsetIndex:
    return OffsetIndex(str(tmp_path / name), base, size)


def filled_offset_index(tmp_path, entries: list[tuple[int, int]]) -> OffsetIndex:
    """A fresh offset index in ``tmp_path`` holding ``entries``, appended in order."""
    idx = fresh_offset_index(tmp_path)
    for offset, position in entries:
        idx.append(offset, position)
    return idx


# -- OffsetIndex --------------------------------------------------------------------------------

@given(n=st.integers(0, 2500), seed=st.integers(0, 2**32), probes=st.lists(st.integers(-50, 120_000), max_size=40))
def test_offset_lookup_matches_bisect(tmp_path_factory, n, seed, probes):
    # Up to 2500 entries: more than the 1024 of the warm section, so both halves are searched.
    rng = random.Random(seed)
    entries = offset_entries(rng, n)
    idx = filled_offset_index(tmp_path_factory.mktemp("oi"), entries)
    targets = probes + [o for o, _ in rng.sample(entries, min(len(entries), 20))]
    targets += [o - 1 for o, _ in entries[-3:]] + [BASE - 1, BASE]
    for target in targets:
        assert idx.lookup(target) == naive_lookup(entries, target, (BASE, 0)), target
    for i in range(0, n, max(1, n // 10)):
        assert idx.entry(i) == entries[i]
    idx.close()


@given(n=st.integers(0, 1500), seed=st.integers(0, 2**32), probes=st.lists(st.integers(-50, 70_000), max_size=30))
def test_file_position_lookup_matches_the_mapped_index(tmp_path_factory, n, seed, probes):
    # The Spark source's pread search over the file, preallocated (zeros after the
    # written entries) and then trimmed by a clean close: the position of the naive lookup.
    rng = random.Random(seed)
    entries = offset_entries(rng, n)
    idx = filled_offset_index(tmp_path_factory.mktemp("oi"), entries)
    idx.flush()
    targets = probes + [o for o, _ in entries[:: max(1, n // 15)]] + [BASE - 1, BASE]
    expected = {target: naive_lookup(entries, target, (BASE, 0))[1] for target in targets}
    for trimmed in (False, True):
        if trimmed:
            idx.close()
        assert (os.path.getsize(idx.path) == n * 8) == trimmed
        fd = os.open(idx.path, os.O_RDONLY)
        try:
            for target in targets:
                assert offset_index_file_position(fd, BASE, target) == expected[target], (trimmed, target)
        finally:
            os.close(fd)


@given(n=st.integers(1, 1500), seed=st.integers(0, 2**32), data=st.data())
def test_fetch_upper_bound_matches_naive(tmp_path_factory, n, seed, data):
    entries = offset_entries(random.Random(seed), n)
    idx = filled_offset_index(tmp_path_factory.mktemp("ub"), entries)
    start = data.draw(st.integers(0, entries[-1][1] + 10))
    size = data.draw(st.integers(0, 20_000))
    expected = next(((o, p) for o, p in entries if p >= start + size), None)
    assert idx.fetch_upper_bound_offset(start, size) == expected
    idx.close()


def test_fetch_upper_bound_is_an_entry_at_the_bound_itself(tmp_path):
    """The search's first slot holding exactly the bound (one entry; the first of several) is the answer, not
    None (hypothesis found it: (1022, 479) alone, a read of 479 bytes from 0)."""
    idx = fresh_offset_index(tmp_path)
    idx.append(1022, 479)
    assert idx.fetch_upper_bound_offset(0, 479) == (1022, 479)
    assert idx.fetch_upper_bound_offset(0, 480) is None
    idx.append(1030, 900)
    assert idx.fetch_upper_bound_offset(400, 79) == (1022, 479)
    assert idx.fetch_upper_bound_offset(400, 80) == (1030, 900)
    idx.close()


@given(n=st.integers(0, 1500), seed=st.integers(0, 2**32), data=st.data())
def test_truncate_to_removes_entries_at_or_above(tmp_path_factory, n, seed, data):
    entries = offset_entries(random.Random(seed), n)
    idx = filled_offset_index(tmp_path_factory.mktemp("tr"), entries)
    cut = data.draw(st.integers(BASE - 5, (entries[-1][0] + 5) if entries else BASE + 5))
    idx.truncate_to(cut)
    kept = [e for e in entries if e[0] < cut]
    assert idx.entries == len(kept)
    assert idx.last_offset == (kept[-1][0] if kept else BASE)
    # Appending continues right after the truncation point.
    idx.append(max(cut, idx.last_offset + 1), 10**6)
    idx.close()


def test_file_format_is_kafkas(tmp_path):
    idx = fresh_offset_index(tmp_path, size=80)
    idx.append(1003, 0)
    idx.append(1010, 4242)
    idx.close()
    with open(idx.path, "rb") as f:
        assert f.read() == struct.pack(">iiii", 3, 0, 10, 4242)


def test_new_file_preallocated_rounded_down(tmp_path):
    idx = fresh_offset_index(tmp_path, size=1003)
    assert os.path.getsize(idx.path) == 1000
    assert (idx.entries, idx.max_entries, idx.size_in_bytes) == (0, 125, 0)
    assert idx.lookup(5000) == (BASE, 0)
    t = TimeIndex(str(tmp_path / "t.timeindex"), BASE, 1003)
    assert os.path.getsize(t.path) == 996
    assert t.max_entries == 83


def test_invalid_max_index_size(tmp_path):
    with pytest.raises(InvalidConfigError, match="Invalid max index size 4"):
        OffsetIndex(str(tmp_path / "x.index"), 0, 4)
    with pytest.raises(InvalidConfigError):
        OffsetIndex(str(tmp_path / "y.index"), 0)      # -1: only valid for an existing file
    assert not os.path.exists(tmp_path / "x.index")


def test_append_rules(tmp_path):
    idx = fresh_offset_index(tmp_path, size=24)
    idx.append(1000, 0)        # the base offset itself is a valid first entry
    with pytest.raises(InvalidOffsetError, match="no larger than the last offset appended"):
        idx.append(1000, 10)
    with pytest.raises(InvalidOffsetError):
        idx.append(999, 10)
    idx.append(1001, 10)
    with pytest.raises(IndexOffsetOverflowError, match="Integer overflow"):
        idx.append(BASE + 2**31, 20)
    assert not idx.can_append_offset(BASE + 2**31)
    assert idx.can_append_offset(BASE + 2**31 - 1)
    idx.append(1002, 20)
    assert idx.is_full()
    with pytest.raises(IndexFullError, match="full index"):
        idx.append(1003, 30)
    assert isinstance(IndexFullError("x"), InvalidOffsetError)
    assert issubclass(InvalidOffsetError, LogfsError)
    assert idx.entries == 3
    assert idx.lookup(10**9) == (1002, 20)
    with pytest.raises(InvalidRequestError):
        idx.entry(3)


def test_clean_close_trims_and_reopen_restores(tmp_path):
    entries = offset_entries(random.Random(7), 3000)
    idx = fresh_offset_index(tmp_path)
    for e in entries:
        idx.append(*e)
    idx.close()
    assert os.path.getsize(idx.path) == 3000 * 8
    again = OffsetIndex(idx.path, BASE, MB)
    assert (again.entries, again.last_offset) == (3000, entries[-1][0])
    again.sanity_check()
    assert again.is_full()          # trimmed: an inactive segment's index takes no more entries
    for target in (entries[5][0], entries[2000][0] + 1, 10**9):
        assert again.lookup(target) == naive_lookup(entries, target, (BASE, 0))
    # Reloading the active segment re-grows it (Kafka's resizeIndexes), entries kept.
    assert again.resize(MB)
    assert not again.is_full()
    assert again.entries == 3000
    again.append(entries[-1][0] + 1, entries[-1][1] + 1)
    assert again.lookup(10**9) == (entries[-1][0] + 1, entries[-1][1] + 1)
    assert not again.resize(MB)     # already that size
    again.close()


def test_unclean_shutdown_leaves_preallocated_junk_detected(tmp_path):
    idx = fresh_offset_index(tmp_path, size=4096)
    for e in offset_entries(random.Random(1), 10):
        idx.append(*e)
    idx.flush()
    idx.close_handler()             # a crash: nobody trimmed the file
    reopened = OffsetIndex(idx.path, BASE, 4096)
    assert reopened.entries == 512
    assert reopened.last_offset == BASE
    with pytest.raises(CorruptIndexError, match="not larger than the first offset"):
        reopened.sanity_check()
    reopened.reset()                # what recovery does before rebuilding
    assert reopened.entries == 0
    assert reopened.max_entries == 512
    reopened.sanity_check()
    reopened.close()


def test_preallocated_with_no_entries_detected(tmp_path):
    idx = fresh_offset_index(tmp_path, size=4096)
    idx.close_handler()
    with pytest.raises(CorruptIndexError):
        OffsetIndex(idx.path, BASE, 4096).sanity_check()


def test_corrupt_length_and_offset_below_base(tmp_path):
    path = tmp_path / "00000000000000001000.index"
    path.write_bytes(struct.pack(">ii", 1, 0) + b"\x00\x01\x02")
    idx = OffsetIndex(str(path), BASE)
    assert idx.entries == 1
    with pytest.raises(CorruptIndexError, match="neither positive nor a multiple of 8"):
        idx.sanity_check()
    path.write_bytes(struct.pack(">iiii", 1, 0, -5, 10))
    with pytest.raises(CorruptIndexError, match="less than the base offset 1000"):
        OffsetIndex(str(path), BASE).sanity_check()


def test_empty_trimmed_index_has_no_mapping_and_regrows(tmp_path):
    idx = fresh_offset_index(tmp_path)
    idx.close()
    assert os.path.getsize(idx.path) == 0
    again = OffsetIndex(idx.path, BASE, MB)
    assert (again.entries, again.max_entries) == (0, 0)
    assert again.lookup(12345) == (BASE, 0)
    assert again.fetch_upper_bound_offset(0, 10) is None
    again.sanity_check()
    again.truncate_to(5)
    with pytest.raises(IndexFullError):
        again.append(1001, 0)
    again.resize(MB)
    again.append(1001, 0)
    assert again.lookup(12345) == (1001, 0)
    again.close()


def test_resize_refuses_to_drop_entries(tmp_path):
    idx = fresh_offset_index(tmp_path)
    for e in offset_entries(random.Random(2), 10):
        idx.append(*e)
    with pytest.raises(InvalidRequestError, match="holds 10 entries"):
        idx.resize(79)
    assert idx.resize(80)
    assert os.path.getsize(idx.path) == 80
    assert idx.entries == 10
    idx.close()


def test_read_only(tmp_path):
    with pytest.raises(CorruptIndexError, match="does not exist"):
        OffsetIndex(str(tmp_path / "missing.index"), BASE, MB, writable=False)
    idx = fresh_offset_index(tmp_path)
    entries = offset_entries(random.Random(3), 50)
    for e in entries:
        idx.append(*e)
    idx.close()
    ro = OffsetIndex(idx.path, BASE, MB, writable=False)
    assert ro.lookup(entries[20][0]) == entries[20]
    with pytest.raises(InvalidRequestError, match="read-only"):
        ro.append(10**6, 0)
    ro.close()
    assert os.path.getsize(idx.path) == 50 * 8


def test_lifecycle_rename_delete_closed(tmp_path):
    idx = fresh_offset_index(tmp_path)
    idx.append(1005, 0)
    new_path = idx.path + ".deleted"
    idx.rename_to(new_path)
    assert idx.path == new_path
    assert os.path.exists(new_path)
    assert idx.lookup(2000) == (1005, 0)       # the mapping survives the rename
    (tmp_path / "moved").mkdir()
    os.rename(new_path, tmp_path / "moved" / os.path.basename(new_path))
    idx.update_parent_dir(str(tmp_path / "moved"))
    assert os.path.exists(idx.path)
    assert idx.delete_if_exists() is True
    assert not os.path.exists(idx.path)
    assert idx.delete_if_exists() is False
    with pytest.raises(StorageError, match="is closed"):
        idx.lookup(2000)


@pytest.mark.parametrize("first_hot", [0, 1, 2, 3, 700])
def test_every_entry_around_the_warm_section_start_is_found(tmp_path, first_hot):
    """Searches try the last WARM_SECTION_BYTES of entries first, then the cold head: each entry
    where one ends and the other starts is found exactly by every search, from either side."""
    n = first_hot + 1 + WARM_SECTION_BYTES // 8          # the warm section then starts at entry first_hot
    entries = [(BASE + 3 * (i + 1), 10 * (i + 1)) for i in range(n)]
    idx = filled_offset_index(tmp_path, entries)
    for i in sorted({0, n - 1, *range(max(0, first_hot - 3), min(n, first_hot + 4))}):
        offset, position = entries[i]
        below = entries[i - 1] if i else (BASE, 0)
        assert (idx.lookup(offset - 1), idx.lookup(offset), idx.lookup(offset + 1)) == \
            (below, entries[i], entries[i]), i
        assert idx.fetch_upper_bound_offset(position - 1, 0) == entries[i], i
        assert idx.fetch_upper_bound_offset(position, 1) == (entries[i + 1] if i + 1 < n else None), i

    times = [(1_700_000_000_000 + 5 * i, BASE + 2 * i) for i in range(1 + first_hot + WARM_SECTION_BYTES // 12)]
    t = TimeIndex(str(tmp_path / "00000000000000001000.timeindex"), BASE, MB)
    for timestamp, offset in times:
        t.maybe_append(timestamp, offset)
    m = len(times)
    for i in sorted({0, m - 1, *range(max(0, first_hot - 3), min(m, first_hot + 4))}):
        timestamp, offset = times[i]
        below = times[i - 1] if i else (-1, BASE)
        assert (t.lookup(timestamp - 1), t.lookup(timestamp), t.lookup(timestamp + 1)) == \
            (below, times[i], times[i]), i

    idx.truncate_to(entries[first_hot][0])              # drops the entry at first_hot and after
    assert idx.entries == first_hot
    assert first_hot == 0 or idx.last_offset == entries[first_hot - 1][0]
    idx.close()
    t.close()


# -- TimeIndex ----------------------------------------------------------------------------------

def time_entries(rng: random.Random, n: int) -> list[tuple[int, int]]:
    ts, offset, out = 1_700_000_000_000, BASE, []
    for _ in range(n):
        ts += rng.randint(1, 1000)
        offset += rng.randint(0, 30)
        out.append((ts, offset))
    return out


@given(n=st.integers(0, 1500), seed=st.integers(0, 2**32), data=st.data())
def test_time_lookup_matches_bisect(tmp_path_factory, n, seed, data):
    rng = random.Random(seed)
    offered = time_entries(rng, n)
    t = TimeIndex(str(tmp_path_factory.mktemp("ti") / "x.timeindex"), BASE, MB)
    stored: list[tuple[int, int]] = []
    for ts, offset in offered:
        # Offer some stale timestamps too: they must be ignored, not stored.
        if stored and rng.random() < 0.2:
            t.maybe_append(stored[-1][0] - rng.randint(0, 5), max(offset, stored[-1][1]))
        t.maybe_append(ts, offset)
        stored.append((ts, offset))
    assert t.entries == len(stored)
    assert t.last_entry == (stored[-1] if stored else (-1, BASE))
    lo = offered[0][0] - 5 if offered else 0
    hi = offered[-1][0] + 5 if offered else 10
    for target in data.draw(st.lists(st.integers(lo, hi), max_size=30)) + [s[0] for s in stored[:5]]:
        assert t.lookup(target) == naive_lookup(stored, target, (-1, BASE))
    t.sanity_check()
    t.close()


def test_time_index_rules(tmp_path):
    t = TimeIndex(str(tmp_path / "00000000000000001000.timeindex"), BASE, 48)   # 4 slots, 3 usable
    t.maybe_append(100, 1001)
    t.maybe_append(100, 1002)          # same timestamp: ignored
    t.maybe_append(99, 1003)           # older timestamp: ignored
    assert t.entries == 1
    assert t.last_entry == (100, 1001)
    with pytest.raises(InvalidOffsetError, match="no larger than the last offset"):
        t.maybe_append(200, 1000)
    t.maybe_append(200, 1005)
    t.maybe_append(300, 1006)
    assert t.is_full()                 # the last slot is kept for the roll
    with pytest.raises(IndexFullError):
        t.maybe_append(400, 1007)
    t.maybe_append(400, 1007, skip_full_check=True)
    assert t.entries == 4
    assert t.lookup(10**15) == (400, 1007)
    assert t.lookup(50) == (-1, BASE)
    assert t.entry(1) == (200, 1005)
    t.close()
    with open(t.path, "rb") as f:
        assert f.read(12) == struct.pack(">qi", 100, 1)


def test_time_truncate_to(tmp_path):
    t = TimeIndex(str(tmp_path / "x.timeindex"), BASE, MB)
    for ts, offset in [(10, 1001), (20, 1004), (30, 1009)]:
        t.maybe_append(ts, offset)
    t.truncate_to(1005)
    assert t.entries == 2
    assert t.last_entry == (20, 1004)
    t.truncate_to(1004)
    assert t.entries == 1
    assert t.last_entry == (10, 1001)
    t.truncate_to(0)
    assert t.entries == 0
    assert t.last_entry == (-1, BASE)
    t.maybe_append(5, 1000)            # an emptied index accepts any timestamp again
    t.close()


def test_time_index_crash_junk_detected(tmp_path):
    t = TimeIndex(str(tmp_path / "x.timeindex"), BASE, 1200)
    t.maybe_append(1_700_000_000_000, 1001)
    t.flush()
    t.close_handler()
    with pytest.raises(CorruptIndexError, match="not larger than the first timestamp"):
        TimeIndex(t.path, BASE, 1200).sanity_check()
    empty = TimeIndex(str(tmp_path / "y.timeindex"), BASE, 1200)
    empty.close_handler()              # crash before any entry: an all-zero file
    with pytest.raises(CorruptIndexError):
        TimeIndex(empty.path, BASE, 1200).sanity_check()
    (tmp_path / "z.timeindex").write_bytes(b"\x00" * 13)
    with pytest.raises(CorruptIndexError, match="multiple of 12"):
        TimeIndex(str(tmp_path / "z.timeindex"), BASE).sanity_check()


def test_time_index_resize_reloads_last_entry(tmp_path):
    t = TimeIndex(str(tmp_path / "x.timeindex"), BASE, MB)
    t.maybe_append(10, 1001)
    t.maybe_append(20, 1002)
    t.trim_to_valid_size()
    assert os.path.getsize(t.path) == 24
    assert t.last_entry == (20, 1002)
    t.resize(MB)
    t.maybe_append(30, 1003)
    t.close()
    reopened = TimeIndex(t.path, BASE, MB)
    assert reopened.entries == 3
    assert reopened.last_entry == (30, 1003)
    reopened.sanity_check()
    reopened.close()
