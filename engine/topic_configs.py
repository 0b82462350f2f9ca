"""The topic-config store: ``topic-configs.json`` in every log dir, with its previous generation.

Topic configuration overrides (Kafka keeps them in ZooKeeper or the metadata
log) are persisted in a file ``topic-configs.json`` written to EVERY log dir,
so losing one dir does not lose them and a data directory stays
self-describing.  Format (UTF-8 JSON)::

    {"version": 1, "generation": 7, "written_ms": 1700000000000,
     "topics": {"orders": {"cleanup.policy": "compact", "retention.ms": "86400000"}},
     "deleting": ["payments"]}

``deleting`` (optional, absent when empty) lists topics whose deletion was
started but whose partition dirs may not all be renamed yet.  ``topics`` maps
a topic name to its overrides, Kafka topic-level names to string values
exactly as a user would write them; topics without overrides are absent.
``generation`` grows by one with every write; on load the copy with the
highest ``(generation, written_ms)`` wins, so a dir that missed a write (a
failed disk, a dir added later) is superseded.  Each copy is written
atomically and keeps its previous generation as ``topic-configs.json.prev``
(``write_keeping_previous``: in place over ``.prev``, fsync, swap of the two
names, fsync of the directory); a corrupt copy is replaced by its previous
generation at load (ERROR), and when no copy in any dir can be read startup
is refused rather than falling back to broker defaults.

The store knows the file and its generations; what the overrides mean (the
effective ``LogConfig`` of each topic, the deletion intent) is the
:class:`~engine.manager.LogManager`'s, which calls :meth:`TopicConfigStore.write`
under its lock.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from typing import TYPE_CHECKING, Any, NamedTuple

from engine.checkpoint import PREVIOUS_SUFFIX, read_no_follow, write_keeping_previous
from engine.errors import LogDirFullError, StorageError, storage_error

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from engine.clock import Clock

logger = logging.getLogger(__name__)

TOPIC_CONFIGS_FILE = "topic-configs.json"
_TOPIC_CONFIGS_VERSION = 1


class TopicConfigsCopy(NamedTuple):
    """One parsed copy of ``topic-configs.json``."""

    generation: int
    written_ms: int
    #: topic -> {Kafka topic-level config name: value as written}
    topics: dict[str, dict[str, str]]
    #: topics whose deletion was started and may not be finished
    deleting: list[str]
    #: the file it was read from (``topic-configs.json`` or its ``.prev``)
    path: str

    @property
    def rank(self) -> tuple[int, int]:
        """Newest wins: by generation, then by write time."""
        return self.generation, self.written_ms


def read_topic_configs_file(path: str) -> TopicConfigsCopy:
    """Parse one copy; raises FileNotFoundError, or ValueError/OSError saying what is wrong."""
    raw = read_no_follow(path)           # a planted symlink is an error, never followed
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("version") != _TOPIC_CONFIGS_VERSION:
        raise ValueError(f"unsupported version {doc.get('version') if isinstance(doc, dict) else doc!r}")
    topics = doc.get("topics")
    if not isinstance(topics, dict) or not all(
            isinstance(o, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in o.items())
            for o in topics.values()):
        raise ValueError("'topics' must map topic names to {name: string value} objects")
    deleting = doc.get("deleting", [])
    if not isinstance(deleting, list) or not all(isinstance(t, str) for t in deleting):
        raise ValueError("'deleting' must be a list of topic names")
    generation, written = doc.get("generation"), doc.get("written_ms", 0)
    if type(generation) is not int or type(written) is not int:
        raise ValueError("'generation' and 'written_ms' must be integers")
    return TopicConfigsCopy(generation, written, topics, deleting, path)


def topic_configs_sound(path: str) -> bool:
    """False when ``path`` is corrupt and its ``.prev`` is the only good copy (never write over that)."""
    try:
        read_topic_configs_file(path)
        return True
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        try:
            read_topic_configs_file(path + PREVIOUS_SUFFIX)
        except (OSError, ValueError):
            return True
        return False


class TopicConfigStore:
    """``topic-configs.json`` over all log dirs and its generation counter.

    Not thread-safe by itself: the LogManager calls :meth:`write` under its lock.
    """

    def __init__(self, log_dirs: list[str], clock: Clock) -> None:
        self.log_dirs = log_dirs
        self.clock = clock
        #: generation of the last copy loaded or written
        self.generation = 0

    def load(self) -> TopicConfigsCopy | None:
        """The newest readable copy of ``topic-configs.json`` over all log dirs; None when there is none.

        Each dir keeps the previous generation beside the current one
        (``topic-configs.json.prev``).  A current copy that cannot be parsed is
        an ERROR and the previous generation is used in its place.  Falling
        back to the broker defaults instead would be silent data loss: a
        compacted topic would become ``cleanup.policy=delete`` and retention
        would delete its records.  So when some dir has a copy but no dir has
        a readable one, StorageError refuses startup with how to repair it.
        """
        best: TopicConfigsCopy | None = None
        unreadable: list[str] = []
        for log_dir in self.log_dirs:
            path = os.path.join(log_dir, TOPIC_CONFIGS_FILE)
            previous = path + PREVIOUS_SUFFIX
            loaded = None
            try:
                loaded = read_topic_configs_file(path)
            except FileNotFoundError:
                if os.path.lexists(previous):
                    logger.warning("Topic configs file %s is missing; loading the previous generation %s",
                                   path, previous)
            except (OSError, ValueError) as exc:
                logger.error("Topic configs file %s is corrupt (%s); loading the previous generation %s",
                             path, exc, previous)
                unreadable.append(f"{path}: {exc}")
            if loaded is None and os.path.lexists(previous):
                try:
                    loaded = read_topic_configs_file(previous)
                except (OSError, ValueError) as exc:
                    logger.error("The previous generation %s of the topic configs is corrupt too: %s",
                                 previous, exc)
                    unreadable.append(f"{previous}: {exc}")
            if loaded is None:
                continue
            if best is None or loaded.rank > best.rank:
                best = loaded
        if best is None:
            if unreadable:
                raise StorageError(
                    "No readable copy of the topic configs in log dirs " + ", ".join(self.log_dirs) + " ("
                    + "; ".join(unreadable) + "). Refusing to start: the topics would fall back to the broker "
                    f"defaults, and retention could delete the records of compacted topics. To repair, restore "
                    f"{TOPIC_CONFIGS_FILE} from a backup (or fix the JSON by hand), or, to accept the broker "
                    f"defaults for every topic, move {TOPIC_CONFIGS_FILE} and {TOPIC_CONFIGS_FILE}{PREVIOUS_SUFFIX} "
                    "out of each log dir.")
            return None
        if unreadable:
            logger.error("Using the topic configs of %s (generation %d) in place of the corrupt copies; "
                         "the next config change rewrites them", best.path, best.generation)
        self.generation = best.generation
        return best

    def missing_generations(self) -> list[str]:
        """The log dirs lacking ``topic-configs.json`` or its ``.prev``.

        Deleting a topic writes the configs before anything else; on a full
        disk that write only succeeds in place over an existing ``.prev``
        (see ``write_keeping_previous``), so both files are made while there
        is room.
        """
        return [d for d in self.log_dirs
                if not (os.path.exists(os.path.join(d, TOPIC_CONFIGS_FILE))
                        and os.path.exists(os.path.join(d, TOPIC_CONFIGS_FILE + PREVIOUS_SUFFIX)))]

    def write(self, overrides: Mapping[str, Mapping[str, str]], deleting: Collection[str]) -> None:
        """Write ``overrides`` to every log dir, keeping the previous generation as ``.prev``.

        Written in place over ``.prev`` and swapped in (``write_keeping_previous``),
        so the intent of a topic deletion can be recorded on a full disk.
        Raises LogDirFullError (ENOSPC) or StorageError naming the dir that failed.
        """
        generation = self.generation + 1
        doc: dict[str, Any] = {     # Any: the JSON document
            "version": _TOPIC_CONFIGS_VERSION, "generation": generation,
            "written_ms": self.clock.milliseconds(),
            "topics": {t: dict(sorted(o.items())) for t, o in sorted(overrides.items()) if o}}
        if deleting:
            doc["deleting"] = sorted(deleting)
        data = json.dumps(doc, indent=1, sort_keys=False).encode("utf-8") + b"\n"
        for log_dir in self.log_dirs:
            path = os.path.join(log_dir, TOPIC_CONFIGS_FILE)
            try:
                write_keeping_previous(path, data, current_is_sound=topic_configs_sound(path))
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise LogDirFullError(f"No space left in {log_dir} to write {TOPIC_CONFIGS_FILE}") from exc
                raise storage_error(f"Error while writing {path}: {exc.strerror or exc}", exc) from exc
        self.generation = generation
