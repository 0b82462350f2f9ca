"""The cleaner's key -> latest-offset map, in a fixed amount of memory (Kafka's ``SkimpyOffsetMap``).

The log cleaner has to remember, for every key of the dirty section of a log,
the offset of its latest record.  Keys can be arbitrarily large and a topic can
hold millions of them, so Kafka stores only a 16-byte MD5 digest of each key and
an 8-byte offset in one preallocated buffer sized by
``log.cleaner.dedupe.buffer.size / log.cleaner.threads``.  The memory used is
fixed up front and never grows; when the map holds as many keys as the load
factor allows, the cleaner stops building it and cleans only the part of the log
it has covered, leaving the rest dirty for the next round.

A digest collision between two keys makes the older of the two look superseded,
which loses a record; with 128-bit digests that is as unlikely as it is in
Kafka, and we accept the same trade-off for the same memory bound.

The buffer is an anonymous private mapping rather than a ``bytearray``: the
size is fixed at creation just the same, but pages are committed only when a
slot on them is first written, and ``clear()`` hands them back to the kernel
(``MADV_DONTNEED``) instead of writing 128 MiB of zeros before each cleaning.

The layout is Kafka's: slot ``i`` occupies bytes ``[24 i, 24 i + 24)``, the
digest followed by the offset as a big-endian int64; an all-zero slot is empty.
Probing is Kafka's too: attempt ``n`` reads a 4-byte big-endian integer from the
digest at position ``min(n, 12)`` and adds ``max(0, n - 12)``, so the first
thirteen attempts jump around the table and later ones walk it linearly, which
guarantees an empty slot is found while the map is not full.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
import sys
from array import array
from operator import methodcaller
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import LogfsError
from engine.records import compiled

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

HASH_SIZE = 16                      # MD5 digest length
BYTES_PER_ENTRY = HASH_SIZE + 8     # digest + int64 offset
_EMPTY_SLOT = bytes(BYTES_PER_ENTRY)
_EMPTY_DIGEST = bytes(HASH_SIZE)
_EMPTY_OFFSET = bytes(BYTES_PER_ENTRY - HASH_SIZE)
_LITTLE_ENDIAN = sys.byteorder == "little"
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_INT_MIN = -(1 << 31)
_INT32_UNPACK = _INT32.unpack_from
_INT64_PACK_INTO = _INT64.pack_into
_INT64_UNPACK = _INT64.unpack_from
try:
    # CPython's own MD5 (HACL*) skips OpenSSL's per-object EVP context set-up, the larger
    # part of hashing a short key (figures: docs/performance.md, the cleaner).
    from _md5 import md5 as _md5
except ImportError:     # pragma: no cover - a build without the builtin hash modules
    _md5 = hashlib.md5
_digest = methodcaller("digest")


def digests_of(keys: Iterable[bytes]) -> list[bytes]:
    """The MD5 digests of ``keys``, hashed in one C-level loop (no Python frame per key)."""
    return list(map(_digest, map(_md5, keys)))


class OffsetMapFullError(LogfsError):
    """A new key was put into an offset map whose every slot is taken."""


class OffsetMap:
    """A bounded hash map from key (by MD5 digest) to the latest offset seen for it.

    ``memory`` bytes are allocated once; ``slots = memory // 24``.  ``capacity``
    is the number of keys the cleaner may put before it must stop
    (``slots * load_factor``, Kafka's ``maxDesiredMapSize``): open addressing
    slows sharply as the table fills, so the cleaner keeps it below
    ``log.cleaner.io.buffer.load.factor``.  The map itself only refuses a put
    when every slot is taken, exactly like Kafka's.

    Not thread-safe: each cleaner worker owns its own map.
    """

    __slots__ = ("memory", "slots", "load_factor", "_bytes", "_entries", "_lookups", "_probes",
                 "_last_offset")

    def __init__(self, memory: int, load_factor: float = 0.9) -> None:
        if memory < BYTES_PER_ENTRY:
            raise OffsetMapFullError(
                f"log.cleaner.dedupe.buffer.size per cleaner thread is {memory} bytes, less than "
                f"one {BYTES_PER_ENTRY}-byte offset map entry")
        if not 0.0 < load_factor <= 1.0:
            raise OffsetMapFullError(
                f"log.cleaner.io.buffer.load.factor must be in (0, 1], got {load_factor}")
        self.memory = memory
        self.slots = memory // BYTES_PER_ENTRY
        self.load_factor = load_factor
        # Private, so that MADV_DONTNEED really drops the pages (a shared anonymous mapping,
        # mmap's default, would keep them).
        self._bytes = mmap.mmap(-1, self.slots * BYTES_PER_ENTRY,
                                flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._entries = 0
        self._lookups = 0
        self._probes = 0
        self._last_offset = -1

    # -- sizing -------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """How many distinct keys the cleaner puts before it calls the map full."""
        return int(self.slots * self.load_factor)

    @property
    def size(self) -> int:
        """Number of distinct key digests in the map."""
        return self._entries

    def __len__(self) -> int:
        return self._entries

    @property
    def utilization(self) -> float:
        """Fraction of slots in use (Kafka's ``OffsetMap.utilization``)."""
        return self._entries / self.slots

    def is_full(self) -> bool:
        """True once ``capacity`` keys are in the map: the cleaner must stop adding."""
        return self._entries >= self.capacity

    @property
    def collision_rate(self) -> float:
        """Extra probes per lookup; a high value means the table is too full."""
        return (self._probes - self._lookups) / self._lookups if self._lookups else 0.0

    # -- offsets ------------------------------------------------------------------------------

    @property
    def latest_offset(self) -> int:
        """The highest offset the map covers (every record at or below it was seen); -1 if none."""
        return self._last_offset

    def update_latest_offset(self, offset: int) -> None:
        """Advance the covered range past records that put no key (gaps, keyless records)."""
        self._last_offset = offset

    # -- probing ------------------------------------------------------------------------------

    def _first_probe(self, key: bytes) -> tuple[bytes, int]:
        """The key's digest and the byte position of its slot at attempt 0 (the only probe for most
        keys at Kafka's load factors, so computed here without ``_position_of``'s general case)."""
        self._lookups += 1
        self._probes += 1
        digest = _md5(key).digest()
        probe = _INT32_UNPACK(digest, 0)[0]
        return digest, (0 if probe == _INT_MIN else abs(probe)) % self.slots * BYTES_PER_ENTRY

    def _position_of(self, digest: bytes, attempt: int) -> int:
        """Byte position of the slot probed at ``attempt`` (Kafka's ``positionOf``)."""
        if attempt < HASH_SIZE - 4:
            probe = _INT32.unpack_from(digest, attempt)[0]
        else:
            probe = _INT32.unpack_from(digest, HASH_SIZE - 4)[0] + attempt - HASH_SIZE + 4
            # Java int arithmetic wraps; keep the same probe sequence as Kafka.
            probe = (probe + (1 << 31)) % (1 << 32) - (1 << 31)
        self._probes += 1
        # Utils.abs: Integer.MIN_VALUE maps to 0 rather than overflowing.
        return (0 if probe == _INT_MIN else abs(probe)) % self.slots * BYTES_PER_ENTRY

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` as the latest offset of ``key`` and as the map's latest offset.

        Returns True when ``key`` was not in the map (its size grew by one).
        """
        if self._entries >= self.slots:
            raise OffsetMapFullError(
                f"Attempted to add a new entry to a full offset map, entries: {self._entries}, "
                f"slots: {self.slots}")
        digest, pos = self._first_probe(key)
        buf = self._bytes
        attempt = 0
        while buf[pos:pos + BYTES_PER_ENTRY] != _EMPTY_SLOT:
            if buf[pos:pos + HASH_SIZE] == digest:
                # an existing key: overwrite its offset, the size does not change
                _INT64_PACK_INTO(buf, pos + HASH_SIZE, offset)
                self._last_offset = offset
                return False
            attempt += 1
            pos = self._position_of(digest, attempt)
        buf[pos:pos + HASH_SIZE] = digest
        _INT64_PACK_INTO(buf, pos + HASH_SIZE, offset)
        self._last_offset = offset
        self._entries += 1
        return True

    def get(self, key: bytes) -> int:
        """The latest offset put for ``key``, or -1 if the key is not in the map."""
        digest, pos = self._first_probe(key)
        buf = self._bytes
        # Kafka bounds the search so a completely full map cannot loop forever.
        max_attempts = self.slots + HASH_SIZE - 4
        attempt = 0
        while True:
            slot = buf[pos:pos + BYTES_PER_ENTRY]
            if slot.startswith(digest):
                found: int = _INT64_UNPACK(slot, HASH_SIZE)[0]
                return found
            if slot == _EMPTY_SLOT:
                return -1
            attempt += 1
            if attempt >= max_attempts:
                return -1
            pos = self._position_of(digest, attempt)

    # -- batched operations (the cleaner's hot path) --------------------------------------------
    #
    # The cleaner puts or looks up thousands of keys per read chunk; one call per
    # chunk hashes them all with map(md5, ...) and probes in a loop over local
    # variables, which costs a third of a put()/get() per key.  Slots, probing and
    # the full-map rule are exactly those of put() and get(); a put_many that cannot
    # fill the map goes in bulk (_put_bulk), where colliding keys of one call may
    # take each other's slots, with the same entries and the same lookups.

    def _first_positions(self, digests: list[bytes]) -> list[int]:
        """Byte positions of the first probe of each digest, computed in bulk.

        The first probe is the digest's leading big-endian int32: one array over
        the joined digests reads them all in C, where ``_position_of`` would cost
        a Python call per key.
        """
        probes = array("i", b"".join(digests))
        if _LITTLE_ENDIAN:
            probes.byteswap()
        probes = probes[::HASH_SIZE // 4]
        slots = self.slots
        positions = [probe % slots * BYTES_PER_ENTRY for probe in map(abs, probes)]
        if _INT_MIN in probes:      # Utils.abs(Integer.MIN_VALUE) is 0, not 2**31
            for i, probe in enumerate(probes):
                if probe == _INT_MIN:
                    positions[i] = 0
        return positions

    def _probe_on(self, digest: bytes, pos: int, max_attempts: int) -> tuple[int, bool]:
        """Continue probing after a first slot that holds another digest.

        Returns (position, True) of the slot holding ``digest``, or (position,
        False) of the first empty slot (-1 when ``max_attempts`` ran out).
        """
        buf = self._bytes
        position_of = self._position_of
        for attempt in range(1, max_attempts):
            pos = position_of(digest, attempt)
            slot = buf[pos:pos + BYTES_PER_ENTRY]
            if slot.startswith(digest):
                return pos, True
            if slot == _EMPTY_SLOT:
                return pos, False
        return -1, False

    def put_many(self, keys: Sequence[bytes], offsets: Sequence[int], max_entries: int | None = None) -> int:
        """``put(key, offset)`` for each pair in order; returns how many pairs were put.

        With ``max_entries`` the puts stop, before the first pair, at which the map
        already holds that many keys, even when that pair's key is in it (Kafka's
        cleaner stops building the map at ``maxDesiredMapSize`` that way): a
        result below ``len(keys)`` means the map is "full" for the cleaner.
        """
        slots = self.slots
        limit = slots if max_entries is None else min(max_entries, slots)
        digests = digests_of(keys)
        if keys and self._entries + len(keys) <= limit:
            # Even if every key is new the map stays under the limit: no stopping point
            # to find, so the pairs can go in all at once.
            self._put_bulk(digests, offsets)
            return len(keys)
        buf = self._bytes
        entries = self._entries
        empty_digest = _EMPTY_DIGEST
        empty_offset = _EMPTY_OFFSET
        pack_offset = _INT64.pack
        pack_into = _INT64_PACK_INTO
        probe_on = self._probe_on
        done = 0
        last = self._last_offset
        try:
            for digest, pos, offset in zip(digests, self._first_positions(digests), offsets):
                if entries >= limit:
                    if limit == slots:
                        raise OffsetMapFullError(
                            f"Attempted to add a new entry to a full offset map, entries: {entries}, "
                            f"slots: {slots}")
                    break
                head = buf[pos:pos + HASH_SIZE]
                if head == digest:          # the key is in its first slot: overwrite its offset
                    pack_into(buf, pos + HASH_SIZE, offset)
                else:
                    if head != empty_digest or buf[pos + HASH_SIZE:pos + BYTES_PER_ENTRY] != empty_offset:
                        pos, found = probe_on(digest, pos, slots + HASH_SIZE - 4)
                        if found:
                            pack_into(buf, pos + HASH_SIZE, offset)
                            last = offset
                            done += 1
                            continue
                    buf[pos:pos + BYTES_PER_ENTRY] = digest + pack_offset(offset)
                    entries += 1
                last = offset
                done += 1
        finally:
            self._entries = entries
            self._last_offset = last
            self._lookups += done
            self._probes += done     # _position_of counted the probes after the first
        return done

    def put_digests(self, digests: np.ndarray, offsets: np.ndarray, max_entries: int | None = None) -> int:
        """:meth:`put_many` of keys given by their digests (a ``(n, 16)`` uint8 array, the cleaner's compiled
        map pass hashes them in ``engine.records.kernels``), put one by one in compiled code.

        Exactly ``put`` per pair in order (the same slots, probes and stopping
        point).
        """
        kernels = compiled.KERNELS
        if kernels is None:
            raise RuntimeError("put_digests needs the compiled record kernels (engine.records.compiled)")
        slots = self.slots
        limit = slots if max_entries is None else min(max_entries, slots)
        count = len(offsets)
        done, entries, probes = kernels.put_digests(self._bytes, slots, digests, offsets, limit, self._entries)
        self._entries = entries
        self._lookups += done
        self._probes += probes
        if done:
            self._last_offset = int(offsets[done - 1])
        if done < count and limit == slots:
            raise OffsetMapFullError(
                f"Attempted to add a new entry to a full offset map, entries: {entries}, slots: {slots}")
        return int(done)

    def _put_bulk(self, digests: list[bytes], offsets: Sequence[int]) -> None:
        """Put pairs that cannot fill the map, the common case, in a few array operations.

        Each digest's last offset is put.  A digest already in its first slot is
        overwritten, and a new digest whose first slot is empty takes it (the
        first of several wanting the same slot); only the rest probe on in Python,
        one by one.  The map then holds the same entries as after one put() per
        pair, though colliding keys may sit in each other's slots: slots are
        never emptied, so every key's probe sequence still reaches it first.
        """
        latest = dict(zip(digests, offsets))        # each digest's last offset
        distinct = list(latest)
        n = len(distinct)
        joined = b"".join(distinct)
        words = np.frombuffer(joined, dtype=np.uint64).reshape(n, 2)
        probes = np.frombuffer(joined, dtype=">i4")[::HASH_SIZE // 4].astype(np.int64)
        positions = np.abs(probes) % self.slots
        positions[probes == _INT_MIN] = 0       # Utils.abs(Integer.MIN_VALUE) is 0
        new_offsets = np.fromiter(latest.values(), dtype=np.int64, count=n)
        table = np.frombuffer(self._bytes, dtype=np.uint64).reshape(self.slots, 3)
        table_offsets = np.frombuffer(self._bytes, dtype=">i8").reshape(self.slots, 3)
        try:
            heads = table[positions]
            present = (heads[:, 0] == words[:, 0]) & (heads[:, 1] == words[:, 1])
            table_offsets[positions[present], 2] = new_offsets[present]
            empty = ~heads.any(axis=1)
            candidates = np.flatnonzero(empty)
            _, first = np.unique(positions[candidates], return_index=True)
            winners = candidates[first]
            table[positions[winners], :2] = words[winners]
            table_offsets[positions[winners], 2] = new_offsets[winners]
            self._entries += len(winners)
            rest = np.ones(n, dtype=bool)
            rest[present] = False
            rest[winners] = False
            rest_indexes = np.flatnonzero(rest).tolist()
        finally:
            del table, table_offsets
        if rest_indexes:
            buf = self._bytes
            pack_into = _INT64_PACK_INTO
            max_attempts = self.slots + HASH_SIZE - 4
            offset_list = new_offsets.tolist()
            for i in rest_indexes:
                digest, offset = distinct[i], offset_list[i]
                pos, found = self._probe_on(digest, int(positions[i]) * BYTES_PER_ENTRY, max_attempts)
                if not found:
                    buf[pos:pos + HASH_SIZE] = digest
                    self._entries += 1
                pack_into(buf, pos + HASH_SIZE, offset)
        self._last_offset = offsets[-1]
        self._lookups += len(digests)
        self._probes += len(digests)

    def get_many(self, keys: Sequence[bytes]) -> list[int]:
        """``[get(key) for key in keys]``: the latest offset of each key, -1 where absent."""
        digests = digests_of(keys)
        buf = self._bytes
        empty_digest = _EMPTY_DIGEST
        empty_offset = _EMPTY_OFFSET
        unpack_offset = _INT64_UNPACK
        probe_on = self._probe_on
        max_attempts = self.slots + HASH_SIZE - 4
        out: list[int] = []
        add = out.append
        for digest, pos in zip(digests, self._first_positions(digests)):
            head = buf[pos:pos + HASH_SIZE]
            if head == digest:
                add(unpack_offset(buf, pos + HASH_SIZE)[0])
            elif head == empty_digest and buf[pos + HASH_SIZE:pos + BYTES_PER_ENTRY] == empty_offset:
                add(-1)
            else:
                pos, found = probe_on(digest, pos, max_attempts)
                add(unpack_offset(buf, pos + HASH_SIZE)[0] if found else -1)
        self._lookups += len(out)
        self._probes += len(out)
        return out

    def latest_offsets(self, stride: int = 1 << 15) -> np.ndarray:
        """Every offset in the map, sorted (an int64 array of ``size`` entries).

        A mapped record is the latest of its key exactly when its offset is one
        of these (offsets are unique, and the map holds the highest offset put
        for each digest), so the copy pass can decide retention from offsets
        alone, without decoding or hashing the keys again.  The table is read
        ``stride`` slots at a time, in C; only the result (8 bytes per key, a
        third of the map's own memory) is allocated.
        """
        found: list[np.ndarray] = []
        if self._entries:
            buf = self._bytes
            for first in range(0, self.slots, stride):
                count = min(stride, self.slots - first)
                # The offset column of the slots: an empty slot reads 0, and so does the one
                # slot that may hold offset 0 (offsets are unique), told apart by the count below.
                column = np.frombuffer(buf, dtype=">i8", count=count * 3,
                                       offset=first * BYTES_PER_ENTRY)[2::3]
                found.append(column[column != 0].astype(np.int64))
                del column
        if sum(map(len, found)) < self._entries:
            found.append(np.zeros(1, dtype=np.int64))
        result = np.concatenate(found) if found else np.empty(0, dtype=np.int64)
        result.sort()
        return result

    def clear(self) -> None:
        """Forget every key and the latest offset, keeping the (fixed-size) mapping."""
        self._entries = 0
        self._lookups = 0
        self._probes = 0
        self._last_offset = -1
        _zero_fill(self._bytes)

    def close(self) -> None:
        """Release the mapping (the map is unusable afterwards)."""
        self._bytes.close()

    def __repr__(self) -> str:
        return (f"OffsetMap(slots={self.slots}, entries={self._entries}, "
                f"latest_offset={self._last_offset}, utilization={self.utilization:.3f})")


def _zero_fill(buf: mmap.mmap, chunk: int = 1 << 20) -> None:
    """Zero the map's buffer without ever allocating a second one of its size.

    On Linux, ``MADV_DONTNEED`` on a private anonymous mapping makes every page
    read as zeros again and releases the memory (other systems do not promise
    the zeros); elsewhere, write zeros in 1 MiB strides.
    """
    if sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            buf.madvise(mmap.MADV_DONTNEED)
            return
        except OSError:
            pass
    zeros = bytes(min(chunk, len(buf)))
    for start in range(0, len(buf), chunk):
        end = min(start + chunk, len(buf))
        buf[start:end] = zeros[:end - start]
