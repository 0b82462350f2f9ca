"""OffsetMap: Kafka's SkimpyOffsetMap semantics in a fixed amount of memory."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cleaner.offset_map import BYTES_PER_ENTRY, OffsetMap, OffsetMapFullError
from engine.errors import LogfsError


def test_slots_and_capacity_follow_memory_and_load_factor():
    m = OffsetMap(1000 * BYTES_PER_ENTRY + 7, load_factor=0.75)
    assert m.slots == 1000
    assert m.capacity == 750
    assert m.size == 0
    assert m.latest_offset == -1
    assert m.utilization == 0.0


def test_put_get_overwrite_and_latest_offset():
    m = OffsetMap(100 * BYTES_PER_ENTRY)
    m.put(b"a", 3)
    m.put(b"b", 5)
    m.put(b"a", 9)
    assert m.get(b"a") == 9
    assert m.get(b"b") == 5
    assert m.get(b"missing") == -1
    assert m.size == 2                       # an overwrite does not grow the map
    assert m.latest_offset == 9
    assert m.utilization == pytest.approx(2 / 100)
    m.update_latest_offset(20)               # the cleaner advances past keyless records
    assert m.latest_offset == 20


def test_empty_key_is_a_key():
    m = OffsetMap(10 * BYTES_PER_ENTRY)
    m.put(b"", 4)
    assert m.get(b"") == 4


def test_slot_layout_is_md5_digest_then_big_endian_offset():
    m = OffsetMap(64 * BYTES_PER_ENTRY)
    m.put(b"key", 0x0102030405)
    digest = hashlib.md5(b"key").digest()
    raw = bytes(m._bytes)
    pos = raw.index(digest)
    assert pos % BYTES_PER_ENTRY == 0
    assert struct.unpack_from(">q", raw, pos + 16)[0] == 0x0102030405
    # Kafka's first probe: abs(first 4 digest bytes as a signed int) % slots
    probe = struct.unpack_from(">i", digest)[0]
    assert pos // BYTES_PER_ENTRY == abs(probe) % m.slots


def test_full_map_refuses_new_keys_but_not_lookups():
    m = OffsetMap(8 * BYTES_PER_ENTRY, load_factor=1.0)
    for i in range(8):
        m.put(b"k%d" % i, i)
    with pytest.raises(OffsetMapFullError) as info:
        m.put(b"another", 100)
    assert isinstance(info.value, LogfsError)
    assert "full offset map" in str(info.value)
    assert [m.get(b"k%d" % i) for i in range(8)] == list(range(8))
    assert m.get(b"absent") == -1             # bounded search: no infinite probe loop
    assert m.utilization == 1.0
    assert m.is_full()


def test_clear_forgets_everything_and_keeps_memory():
    m = OffsetMap(50 * BYTES_PER_ENTRY)
    for i in range(40):
        m.put(b"%d" % i, i)
    m.clear()
    assert m.size == 0
    assert m.latest_offset == -1
    assert all(m.get(b"%d" % i) == -1 for i in range(40))
    assert bytes(m._bytes) == bytes(50 * BYTES_PER_ENTRY)
    assert m.slots == 50
    m.put(b"x", 1)
    assert m.get(b"x") == 1


def test_too_small_or_bad_load_factor_is_refused():
    with pytest.raises(OffsetMapFullError, match=r"dedupe\.buffer\.size"):
        OffsetMap(BYTES_PER_ENTRY - 1)
    with pytest.raises(OffsetMapFullError, match=r"load\.factor"):
        OffsetMap(1000, load_factor=0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=12), st.integers(0, 2**40)), max_size=300),
       st.integers(min_value=1, max_value=64))
def test_behaves_like_a_dict_until_full(ops, extra_slots):
    """Against a dict of digests: same answers for every key while there is room."""
    distinct = len({k for k, _ in ops})
    m = OffsetMap((distinct + extra_slots) * BYTES_PER_ENTRY, load_factor=1.0)
    model: dict[bytes, int] = {}
    for key, offset in ops:
        m.put(key, offset)
        model[key] = offset
        assert m.latest_offset == offset
    assert m.size == len(model)
    for key, offset in model.items():
        assert m.get(key) == offset
    assert m.get(b"\xff" * 13) == -1           # longer than any generated key


def test_collisions_in_a_nearly_full_table_resolve_by_probing():
    # 97 slots, 97 keys: every probe sequence, including Kafka's linear tail, must be exercised.
    m = OffsetMap(97 * BYTES_PER_ENTRY, load_factor=1.0)
    for i in range(97):
        m.put(b"key-%d" % i, 1000 + i)
    assert m.size == 97
    assert all(m.get(b"key-%d" % i) == 1000 + i for i in range(97))
    assert m.collision_rate > 0


# ----------------------------------------------------------------------- batched operations

@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=6), st.integers(0, 2**40)), max_size=200),
       st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=40))
def test_put_many_and_get_many_are_put_and_get_in_a_loop(ops, extra_slots, max_entries):
    """Same entries, size, latest offset and stopping point as one put() per pair.

    Colliding keys may sit in each other's slots (put_many places the keys whose
    first slot is free at once), so the slots hold the same entries, not
    necessarily in the same places; every lookup answers the same.
    """
    distinct = len({k for k, _ in ops})
    memory = (distinct + extra_slots) * BYTES_PER_ENTRY
    one_by_one, batched = OffsetMap(memory, 1.0), OffsetMap(memory, 1.0)
    keys, offsets = [k for k, _ in ops], [o for _, o in ops]
    expected_done = 0
    for key, offset in ops:
        if one_by_one.size >= max_entries:
            break
        one_by_one.put(key, offset)
        expected_done += 1
    assert batched.put_many(keys, offsets, max_entries) == expected_done
    assert _entries(batched) == _entries(one_by_one)
    assert (batched.size, batched.latest_offset) == (one_by_one.size, one_by_one.latest_offset)
    probes = [*keys, b"\xff" * 7, b""]
    assert batched.get_many(probes) == [one_by_one.get(k) for k in probes]


def _digests(keys):
    import numpy as np
    return np.frombuffer(b"".join(hashlib.md5(k).digest() for k in keys), dtype=np.uint8).reshape(-1, 16)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=6), st.integers(0, 2**40)), max_size=200),
       st.integers(min_value=0, max_value=8), st.none() | st.integers(min_value=0, max_value=40))
def test_put_digests_is_put_in_a_loop_byte_for_byte(ops, extra_slots, max_entries):
    """The compiled put of the cleaner's map pass: the same slots (byte for byte), probes, size, latest offset
    and stopping point as one put() per pair, and the same refusal of a new key when every slot is taken."""
    import numpy as np
    distinct = len({k for k, _ in ops})
    memory = max(distinct // 2 + extra_slots, 1) * BYTES_PER_ENTRY      # may be too small: the full-map rule
    one_by_one, compiled = OffsetMap(memory, 1.0), OffsetMap(memory, 1.0)
    limit = one_by_one.slots if max_entries is None else min(max_entries, one_by_one.slots)
    expected_done, expected_full = 0, False
    for key, offset in ops:
        if one_by_one.size >= limit:
            expected_full = max_entries is None or max_entries >= one_by_one.slots
            break
        one_by_one.put(key, offset)
        expected_done += 1
    digests = _digests([k for k, _ in ops]) if ops else np.zeros((0, 16), dtype=np.uint8)
    offsets = np.array([o for _, o in ops], dtype=np.int64)
    if expected_full:
        with pytest.raises(OffsetMapFullError, match="full offset map"):
            compiled.put_digests(digests, offsets, max_entries)
    else:
        assert compiled.put_digests(digests, offsets, max_entries) == expected_done
    assert bytes(compiled._bytes) == bytes(one_by_one._bytes)
    assert (compiled.size, compiled.latest_offset) == (one_by_one.size, one_by_one.latest_offset)
    assert compiled.collision_rate == one_by_one.collision_rate


def test_put_many_refuses_a_new_key_when_every_slot_is_taken():
    m = OffsetMap(3 * BYTES_PER_ENTRY, load_factor=1.0)
    with pytest.raises(OffsetMapFullError, match="full offset map, entries: 3, slots: 3"):
        m.put_many([b"a", b"b", b"c", b"d"], [1, 2, 3, 4])
    # what was put before the refusal stays, and lookups still work on a full map
    assert m.size == 3
    assert m.latest_offset == 3
    assert m.get_many([b"a", b"c", b"zz"]) == [1, 3, -1]


def test_get_many_walks_collision_chains_of_a_full_table():
    m = OffsetMap(31 * BYTES_PER_ENTRY, load_factor=1.0)
    keys = [b"key-%d" % i for i in range(31)]
    assert m.put_many(keys, list(range(500, 531))) == 31
    assert m.collision_rate > 0
    assert m.get_many([*keys, b"absent"]) == [*range(500, 531), -1]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=8), st.integers(0, 50)), max_size=60, unique_by=lambda p: p[1]))
def test_latest_offsets_are_the_sorted_offsets_held(pairs):
    m = OffsetMap(97 * BYTES_PER_ENTRY)
    latest: dict[bytes, int] = {}
    for key, offset in sorted(pairs, key=lambda p: p[1]):
        m.put(key, offset)
        latest[key] = offset
    assert m.latest_offsets(stride=7).tolist() == sorted(latest.values())   # offset 0 too


def _entries(m: OffsetMap) -> list[bytes]:
    raw = bytes(m._bytes)
    slots = (raw[i:i + BYTES_PER_ENTRY] for i in range(0, len(raw), BYTES_PER_ENTRY))
    return sorted(slot for slot in slots if slot != bytes(BYTES_PER_ENTRY))
