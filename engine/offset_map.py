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

from engine.errors import LogfsError

HASH_SIZE = 16                      # MD5 digest length
BYTES_PER_ENTRY = HASH_SIZE + 8     # digest + int64 offset
_EMPTY_SLOT = bytes(BYTES_PER_ENTRY)
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_INT_MIN = -(1 << 31)
_INT32_UNPACK = _INT32.unpack_from
_INT64_PACK_INTO = _INT64.pack_into
_INT64_UNPACK = _INT64.unpack_from
_md5 = hashlib.md5


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
        self._lookups += 1
        self._probes += 1
        digest = _md5(key).digest()
        buf = self._bytes
        # Attempt 0 inlined: it is the only probe for most keys at Kafka's load factors.
        probe = _INT32_UNPACK(digest, 0)[0]
        pos = (0 if probe == _INT_MIN else abs(probe)) % self.slots * BYTES_PER_ENTRY
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
        self._lookups += 1
        self._probes += 1
        digest = _md5(key).digest()
        buf = self._bytes
        probe = _INT32_UNPACK(digest, 0)[0]
        pos = (0 if probe == _INT_MIN else abs(probe)) % self.slots * BYTES_PER_ENTRY
        # Kafka bounds the search so a completely full map cannot loop forever.
        max_attempts = self.slots + HASH_SIZE - 4
        attempt = 0
        while True:
            slot = buf[pos:pos + BYTES_PER_ENTRY]
            if slot.startswith(digest):
                return _INT64_UNPACK(slot, HASH_SIZE)[0]
            if slot == _EMPTY_SLOT:
                return -1
            attempt += 1
            if attempt >= max_attempts:
                return -1
            pos = self._position_of(digest, attempt)

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
