"""The metadata of remote log segments: Kafka's ``RemoteLogMetadataManager`` over a log of events.

Every step of a remote segment's life is an event appended to a log and
fsynced before the step it announces is taken as done (Kafka keeps these
events in its ``__remote_log_metadata`` topic; logfs owns its logs, so it keeps
them the same way, in a log it is given):

* ``COPY_SEGMENT_STARTED`` before the first object of a copy is written;
* ``COPY_SEGMENT_FINISHED`` once every object is in the store: from then on
  the copy serves reads, and the local segment may be deleted;
* ``DELETE_SEGMENT_STARTED`` before the first object is deleted (remote
  retention, DeleteRecords, topic deletion, or an orphan of a crashed copy);
* ``DELETE_SEGMENT_FINISHED`` once every object is gone.

The valid transitions are Kafka's (``RemoteLogSegmentState.isValidTransition``):
STARTED to FINISHED or to DELETE_SEGMENT_STARTED (a copy abandoned after a
crash), FINISHED to DELETE_SEGMENT_STARTED, DELETE_SEGMENT_STARTED to
DELETE_SEGMENT_FINISHED.  An event that breaks them is refused before it is
written.  Replaying the log at start rebuilds the state
(:class:`RemoteLogMetadataCache`), so a crash between any two steps leaves a
state the copy task finishes or undoes: a copy without FINISHED is an orphan
to delete, a deletion without FINISHED is deleted again (both idempotent).

Locking: one lock guards the cache and the appends, so the state seen after
an event is the state the log holds.  Events are appended and flushed under
it; the store is never called under it.
"""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from engine.errors import CorruptRecordError, InvalidRequestError
from engine.remote.storage import RemoteLogSegmentId, TopicIdPartition

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from engine.log import Log

logger = logging.getLogger(__name__)


class RemoteLogSegmentState(enum.Enum):
    """Kafka's ``RemoteLogSegmentState``."""

    COPY_SEGMENT_STARTED = "COPY_SEGMENT_STARTED"
    COPY_SEGMENT_FINISHED = "COPY_SEGMENT_FINISHED"
    DELETE_SEGMENT_STARTED = "DELETE_SEGMENT_STARTED"
    DELETE_SEGMENT_FINISHED = "DELETE_SEGMENT_FINISHED"


_VALID_TRANSITIONS: dict[RemoteLogSegmentState | None, set[RemoteLogSegmentState]] = {
    None: {RemoteLogSegmentState.COPY_SEGMENT_STARTED},
    RemoteLogSegmentState.COPY_SEGMENT_STARTED: {RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                                                 RemoteLogSegmentState.DELETE_SEGMENT_STARTED},
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED: {RemoteLogSegmentState.DELETE_SEGMENT_STARTED},
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED: {RemoteLogSegmentState.DELETE_SEGMENT_FINISHED},
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED: set(),
}


@dataclass(frozen=True)
class RemoteLogSegmentMetadata:
    """One copy of a segment and where it is in its life (Kafka's ``RemoteLogSegmentMetadata``).

    ``end_offset`` is the segment's last offset; ``segment_leader_epochs`` maps
    each leader epoch of its batches to the first offset of that epoch in it.
    ``transaction_index_entries`` (logfs's) is how many aborted transactions the
    copy's ``.txnindex`` lists (0: an empty index, which a reader need not
    fetch), -1 for a copy without ``.txnindex`` and ``.snapshot`` objects (made
    before logfs copied them).
    ``offset_index_size_bytes`` and ``time_index_size_bytes`` are the sizes of
    the index objects copied and ``offset_index_crc32c`` the CRC32C of the
    offset index (logfs's: ``segments/`` sizes a copy's index files, and a
    kept view index is bound to the copy, without a request to the store;
    None in events written before they were recorded: the index is then
    fetched).
    """

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp: int
    segment_size_bytes: int
    event_timestamp: int
    state: RemoteLogSegmentState
    segment_leader_epochs: Mapping[int, int] = field(default_factory=dict)
    transaction_index_entries: int = -1
    offset_index_size_bytes: int | None = None
    time_index_size_bytes: int | None = None
    offset_index_crc32c: int | None = None

    @property
    def has_transaction_index(self) -> bool:
        """The copy has its ``.txnindex`` and producer snapshot."""
        return self.transaction_index_entries >= 0

    def to_event(self) -> bytes:
        sid = self.segment_id
        indexes = {name: value for name, value in (("offsetIndexSizeBytes", self.offset_index_size_bytes),
                                                   ("timeIndexSizeBytes", self.time_index_size_bytes),
                                                   ("offsetIndexCrc32c", self.offset_index_crc32c))
                   if value is not None}
        return orjson.dumps({
            "state": self.state.value, "topic": sid.topic_id_partition.topic,
            "topicId": sid.topic_id_partition.topic_id, "partition": sid.topic_id_partition.partition,
            "baseOffset": sid.base_offset, "id": sid.id, "startOffset": self.start_offset,
            "endOffset": self.end_offset, "maxTimestamp": self.max_timestamp,
            "segmentSizeBytes": self.segment_size_bytes, "eventTimestamp": self.event_timestamp,
            "segmentLeaderEpochs": {str(e): o for e, o in sorted(self.segment_leader_epochs.items())},
            "txnIndexEntries": self.transaction_index_entries, **indexes})

    @classmethod
    def from_event(cls, data: bytes) -> RemoteLogSegmentMetadata:
        try:
            event: dict[str, Any] = orjson.loads(data)     # Any: a parsed JSON event
            tip = TopicIdPartition(str(event["topic"]), str(event["topicId"]), int(event["partition"]))
            return cls(RemoteLogSegmentId(tip, int(event["baseOffset"]), str(event["id"])),
                       int(event["startOffset"]), int(event["endOffset"]), int(event["maxTimestamp"]),
                       int(event["segmentSizeBytes"]), int(event["eventTimestamp"]),
                       RemoteLogSegmentState(event["state"]),
                       {int(e): int(o) for e, o in event["segmentLeaderEpochs"].items()},
                       int(event.get("txnIndexEntries", -1)),
                       _optional_int(event, "offsetIndexSizeBytes"), _optional_int(event, "timeIndexSizeBytes"),
                       _optional_int(event, "offsetIndexCrc32c"))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecordError(f"Unreadable remote log metadata event {data[:200]!r}: {exc}") from exc


def _optional_int(event: Mapping[str, Any], name: str) -> int | None:     # Any: a parsed JSON event
    value = event.get(name)
    return None if value is None else int(value)


class RemoteLogMetadataCache:
    """The latest state of every copy of every partition (Kafka's ``RemoteLogMetadataCache``).

    Not thread-safe on its own: :class:`RemoteLogMetadataManager` holds its lock around every use.
    """

    def __init__(self) -> None:
        self._segments: dict[TopicIdPartition, dict[str, RemoteLogSegmentMetadata]] = {}

    def current(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        return self._segments.get(segment_id.topic_id_partition, {}).get(segment_id.id)

    def check_transition(self, metadata: RemoteLogSegmentMetadata) -> None:
        current = self.current(metadata.segment_id)
        state = current.state if current is not None else None
        if metadata.state not in _VALID_TRANSITIONS[state]:
            raise InvalidRequestError(f"Remote log segment {metadata.segment_id}: {metadata.state.value} cannot "
                                      f"follow {state.value if state else 'nothing'}")

    def apply(self, metadata: RemoteLogSegmentMetadata) -> None:
        sid = metadata.segment_id
        partition = self._segments.setdefault(sid.topic_id_partition, {})
        current = partition.get(sid.id)
        if current is not None and metadata.state is not RemoteLogSegmentState.COPY_SEGMENT_STARTED:
            # later events carry the state; the segment's description is the copy's
            metadata = replace(current, state=metadata.state, event_timestamp=metadata.event_timestamp)
        if metadata.state is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
            del partition[sid.id]
            if not partition:
                del self._segments[sid.topic_id_partition]
        else:
            partition[sid.id] = metadata

    def segments(self, tip: TopicIdPartition,
                 states: Iterable[RemoteLogSegmentState] | None = None) -> list[RemoteLogSegmentMetadata]:
        """The partition's copies (in ``states``, default all), by start offset."""
        wanted = set(states) if states is not None else None
        found = [m for m in self._segments.get(tip, {}).values()
                 if wanted is None or m.state in wanted]
        return sorted(found, key=lambda m: (m.start_offset, m.segment_id.id))

    def partitions(self) -> list[TopicIdPartition]:
        return sorted(self._segments)


_FINISHED = (RemoteLogSegmentState.COPY_SEGMENT_FINISHED,)


def serving_copies(finished: Iterable[RemoteLogSegmentMetadata]
                   ) -> tuple[list[RemoteLogSegmentMetadata], list[RemoteLogSegmentMetadata]]:
    """(serving, superseded) of a partition's finished copies: one copy per base offset serves, by offset.

    Two finished copies can share a base offset: a local segment copied when it was closed can grow again,
    because a power loss that took the roll after it (the next segment's file, whose records were never
    fsynced) leaves it the active segment, and appends after the restart go on in it; its next copy has the
    same base offset and more records.  A copy is taken at or below the recovery point, whose records a
    power loss never takes, so a later copy of a base offset holds the earlier one's bytes and possibly
    more: the longest serves (then the newest, then the id: one answer whatever the order).  A map of copies
    by base offset that kept another would skip the serving copy's extra records without an error.
    """
    by_base: dict[int, RemoteLogSegmentMetadata] = {}
    superseded: list[RemoteLogSegmentMetadata] = []
    for copy in finished:
        kept = by_base.get(copy.start_offset)
        if kept is None:
            by_base[copy.start_offset] = copy
            continue
        if (copy.end_offset, copy.event_timestamp, copy.segment_id.id) > \
                (kept.end_offset, kept.event_timestamp, kept.segment_id.id):
            by_base[copy.start_offset], copy = copy, kept
        superseded.append(copy)
    def by_offset(m: RemoteLogSegmentMetadata) -> tuple[int, str]:
        return m.start_offset, m.segment_id.id

    return sorted(by_base.values(), key=by_offset), sorted(superseded, key=by_offset)


class RemoteLogMetadataManager:
    """Records every event of the remote segments in ``log`` and answers from their replayed state."""

    def __init__(self, log: Log) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._cache = RemoteLogMetadataCache()
        #: grows with every event recorded (readers that cache what they derived from the state compare it)
        self.generation = 0
        self._replay()

    def _replay(self) -> None:
        count = 0
        for record in self._log.read_records(self._log.log_start_offset):
            if record.value is None:
                continue
            metadata = RemoteLogSegmentMetadata.from_event(record.value)
            try:
                self._cache.check_transition(metadata)
            except InvalidRequestError as exc:
                logger.warning("Skipping remote log metadata event at offset %d of %s: %s", record.offset,
                               self._log.topic_partition, exc)
                continue
            self._cache.apply(metadata)
            count += 1
        if count:
            logger.info("Loaded %d remote log metadata events of %d partitions from %s", count,
                        len(self._cache.partitions()), self._log.topic_partition)

    def add(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Record ``metadata`` (a new copy, or the next state of one), durably, then apply it.

        InvalidRequestError for a transition Kafka does not allow; whatever the
        log's append or flush raises leaves the state as it was.
        """
        with self._lock:
            self._cache.check_transition(metadata)
            sid = metadata.segment_id
            self._log.append_values([metadata.to_event()], [str(sid.topic_id_partition).encode()])
            self._log.flush()
            self._cache.apply(metadata)
            self.generation += 1

    def update_state(self, segment_id: RemoteLogSegmentId, state: RemoteLogSegmentState,
                     event_timestamp: int) -> RemoteLogSegmentMetadata:
        """Record the next state of an existing copy; returns its metadata in that state."""
        with self._lock:
            current = self._cache.current(segment_id)
        if current is None:
            raise InvalidRequestError(f"Remote log segment {segment_id} is unknown")
        updated = replace(current, state=state, event_timestamp=event_timestamp)
        self.add(updated)
        return updated

    def state_of(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentState | None:
        """The copy's current state; None when the metadata does not know it (or its deletion finished)."""
        with self._lock:
            current = self._cache.current(segment_id)
        return None if current is None else current.state

    def copied_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """The copies that serve reads, by start offset: the finished ones, one per base offset
        (:func:`serving_copies`)."""
        with self._lock:
            return serving_copies(self._cache.segments(tip, _FINISHED))[0]

    def superseded_segments(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """Finished copies that serve no read: a longer copy of their base offset was made after them
        (:func:`serving_copies`); the copy task deletes them."""
        with self._lock:
            return serving_copies(self._cache.segments(tip, _FINISHED))[1]

    def segment_for_offset(self, tip: TopicIdPartition, offset: int) -> RemoteLogSegmentMetadata | None:
        """The finished copy holding ``offset``, None when no copy does (Kafka's ``remoteLogSegmentMetadata``)."""
        for metadata in reversed(self.copied_segments(tip)):
            if metadata.start_offset <= offset:
                return metadata if offset <= metadata.end_offset else None
        return None

    def highest_copied_offset(self, tip: TopicIdPartition) -> int:
        """The last offset of the partition held by a finished copy, -1 when none is."""
        return max((m.end_offset for m in self.copied_segments(tip)), default=-1)

    def unfinished(self, tip: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """Copies a crash left mid-way (COPY_SEGMENT_STARTED) and deletions not finished (DELETE_SEGMENT_STARTED)."""
        with self._lock:
            return self._cache.segments(tip, (RemoteLogSegmentState.COPY_SEGMENT_STARTED,
                                              RemoteLogSegmentState.DELETE_SEGMENT_STARTED))

    def known_ids(self, tip: TopicIdPartition) -> set[RemoteLogSegmentId]:
        """Every copy the metadata knows in any state (what a store listing is checked against)."""
        with self._lock:
            return {m.segment_id for m in self._cache.segments(tip)}

    def partitions(self) -> list[TopicIdPartition]:
        with self._lock:
            return self._cache.partitions()
