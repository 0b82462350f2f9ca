"""The store side of the torture harness's ``--tiered`` mode (tests/harness/torture.py).

Tiered storage (docs/tiering.md) copies closed segments to a store and records
each copy in a metadata log (``DATA/remote-log/__remote_log_metadata-0``).  The
harness holds the mount to one invariant after every remount, and at every
clean shutdown: **the store holds exactly the finished copies** (no object a
copy left behind, no finished copy missing or short).  It checks it here,
independently of the engine's own code:

* :func:`metadata_state` replays the metadata log's segment files with
  kafka-python (JSON events, the last state of each copy wins,
  ``DELETE_SEGMENT_FINISHED`` forgets it);
* :class:`StoreLister` lists every object of the store (a ``file://``
  directory walked, or an S3 bucket listed through boto3), temporary files
  included;
* :func:`compare` says what does not match: an object of a copy the metadata
  does not hold finished (an orphan), a temporary file, an object outside the
  layout, a finished copy missing an object or with a ``.log`` of another size.

While the mount runs, copies and deletions go on (retention moves log starts
with no traffic), so :func:`quiescent_snapshot` takes the listing between two
reads of the metadata log that are the same and hold no unfinished copy: then
no copy or deletion was under way (each is bracketed by fsynced events).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

METADATA_DIR = Path("remote-log") / "__remote_log_metadata-0"
#: every object of a finished copy
COPY_SUFFIXES = ("index", "timeindex", "txnindex", "snapshot", "leader-epoch-checkpoint", "log")
FINISHED = "COPY_SEGMENT_FINISHED"
UNFINISHED = ("COPY_SEGMENT_STARTED", "DELETE_SEGMENT_STARTED")


@dataclass(frozen=True)
class Copy:
    """One copy as the metadata log last described it."""

    directory: str          # TOPIC-TOPIC_ID/PARTITION
    base_offset: int
    copy_id: str
    state: str
    size: int               # segmentSizeBytes: the .log object's size

    def object_name(self, suffix: str) -> str:
        return f"{self.directory}/{self.base_offset:020d}-{self.copy_id}.{suffix}"


def metadata_state(data_dir: Path) -> tuple[int, dict[str, Copy]]:
    """(bytes of the metadata log, copy id -> its last state), from the log's segment files.

    A batch cut at the end (a crash, or an append in progress) ends the replay.
    """
    from kafka.record.memory_records import MemoryRecords

    directory = data_dir / METADATA_DIR
    copies: dict[str, Copy] = {}
    total = 0
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    except FileNotFoundError:
        return 0, copies
    for name in names:
        data = (directory / name).read_bytes()
        total += len(data)
        records = MemoryRecords(data)
        while (batch := records.next_batch()) is not None:
            if not batch.validate_crc():
                break           # a torn tail (a power loss): the mount's recovery truncates it
            for record in batch:
                if record.value is None:
                    continue
                event: dict[str, Any] = json.loads(record.value)    # Any: a parsed JSON event
                copy_id = str(event["id"])
                if event["state"] == "DELETE_SEGMENT_FINISHED":
                    copies.pop(copy_id, None)
                    continue
                copies[copy_id] = Copy(f"{event['topic']}-{event['topicId']}/{event['partition']}",
                                       int(event["baseOffset"]), copy_id, str(event["state"]),
                                       int(event["segmentSizeBytes"]))
    return total, copies


class StoreLister:
    """Every object of the store, as ``{name below the prefix: size}``."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self.uri = settings["rsm.config.uri"]
        self._client: Any = None        # Any: boto3 builds its client at run time
        if self.uri.startswith("file://"):
            self.root: Path | None = Path(self.uri[len("file://"):])
            return
        import boto3

        self.root = None
        bucket, _, prefix = self.uri[len("s3://"):].partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=settings.get("rsm.config.s3.endpoint.url"), region_name="us-east-1",
            aws_access_key_id=settings.get("rsm.config.s3.access.key.id"),
            aws_secret_access_key=settings.get("rsm.config.s3.secret.access.key"))

    def list(self) -> dict[str, int]:
        if self.root is not None:
            found = {}
            for dirpath, _dirs, files in os.walk(self.root):
                for name in files:
                    path = Path(dirpath) / name
                    try:
                        found[str(path.relative_to(self.root))] = path.stat().st_size
                    except FileNotFoundError:
                        continue
            return found
        prefix = f"{self.prefix}/" if self.prefix else ""
        found = {}
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", ()):
                found[item["Key"][len(prefix):]] = int(item["Size"])
        return found

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


@dataclass
class Findings:
    orphans: list[str] = field(default_factory=list)        # objects of no finished copy, temporary files
    missing: list[str] = field(default_factory=list)        # finished copies missing an object, or short
    unfinished: list[str] = field(default_factory=list)     # copies or deletions under way (or left by a crash)

    def __bool__(self) -> bool:
        return bool(self.orphans or self.missing or self.unfinished)


def _parse(name: str) -> tuple[str, str, str] | None:
    """(partition directory, copy id, suffix) of an object named by the layout, None otherwise."""
    directory, _, leaf = name.rpartition("/")
    stem, dot, suffix = leaf.partition(".")
    base, dash, copy_id = stem.partition("-")
    if directory.count("/") != 1 or not dot or not dash or not base.isdigit() or len(base) != 20 or not copy_id:
        return None
    return directory, copy_id, suffix


def compare(copies: Mapping[str, Copy], objects: Mapping[str, int]) -> Findings:
    """What does not match between the metadata's copies and the store's objects."""
    found = Findings()
    for copy in copies.values():
        if copy.state in UNFINISHED:
            found.unfinished.append(f"{copy.object_name('log')} ({copy.state})")
    for name in sorted(objects):
        parsed = _parse(name)
        if parsed is None or parsed[2] not in COPY_SUFFIXES:
            found.orphans.append(f"{name} (not an object of a copy)")
            continue
        owner = copies.get(parsed[1])
        if owner is None or owner.state != FINISHED:
            found.orphans.append(f"{name} (its copy is {owner.state if owner else 'unknown to the metadata'})")
    for copy in copies.values():
        if copy.state != FINISHED:
            continue
        for suffix in COPY_SUFFIXES:
            name = copy.object_name(suffix)
            if name not in objects:
                found.missing.append(f"{name} of a finished copy is missing")
            elif suffix == "log" and objects[name] != copy.size:
                found.missing.append(f"{name} holds {objects[name]} bytes, the metadata says {copy.size}")
    return found


def quiescent_snapshot(data_dir: Path, lister: StoreLister, timeout: float = 120.0
                       ) -> tuple[dict[str, Copy], dict[str, int]] | None:
    """(copies, objects) listed while no copy or deletion was under way; None if none came within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before, copies = metadata_state(data_dir)
        if not any(c.state in UNFINISHED for c in copies.values()):
            objects = lister.list()
            after, _ = metadata_state(data_dir)
            if after == before:
                return copies, objects
        time.sleep(0.05)        # a copy or deletion is under way: look again once it may have ended
    return None
