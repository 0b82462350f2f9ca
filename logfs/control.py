"""The control files: ``config`` (the topic's, and the broker's read-only one), ``delete`` markers and ``append``.

Each parses what is written to it, refuses a bad line with one clear error
before anything applies, and hands the result to the engine.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from engine.config import TOPIC_CONFIG_KEYS
from engine.errors import (
    InternalTopicError,
    InvalidConfigError,
    InvalidRequestError,
    LogfsError,
)
from engine.numbers import parse_canonical_int
from engine.topic import TopicPartition, is_internal
from logfs.appender import JSON_LINES, TEXT_LINES, AppendHandle, LineFormat
from logfs.errors import shown
from logfs.handles import BytesHandle, Handle, LineCommandHandle, LineHandle
from logfs.nodes import RW_MODE, STABLE_TIMEOUT_S, WRITE_ONLY_MODE, FileNode, GeneratedFile

if TYPE_CHECKING:  # pragma: no cover
    from logfs.tree import NodeKey, Tree

log = logging.getLogger(__name__)


class EditAbandonedError(InvalidConfigError):
    """A write to a config opening after one of its lines was refused (logged once, at the first)."""

    quiet = True


class ConfigEditHandle(LineHandle):
    """``<topic>/config`` opened for writing: the whole text is applied when it is closed.

    An edited file is written in pieces (bash's builtin ``printf`` writes
    line by line, editors in blocks), so nothing is applied before the close:
    each write checks its complete lines (known name, valid value) and fails
    with EINVAL on a bad one, after which nothing written through this opening
    is applied and its further writes fail too.  At close (flush) the collected
    overrides are applied at once, all or nothing (``alter_topic_config``).

    Opened with ``O_TRUNC`` (``>``, an editor saving the file), truncated to 0
    (``ftruncate``), or created after ``config`` was unlinked (``mv`` across
    filesystems), the text written is the whole set of overrides: one the text
    does not name is removed, as ``kafka-configs --alter`` with the full list
    would.  That replacement is applied at close like the rest, whole or not at
    all: a close with nothing written yet (bash closes its first descriptor of
    a redirection before the command writes) applies nothing, a refused line
    leaves every override as it was, and an opening closed without a write
    (``: > config``) applies the empty text (every override removed) at its
    last close.  Opened without it (``>>``) the lines are added to the overrides.
    The defaults the file shows as ``#name=value`` comments stay defaults when
    the file is written back.  The same handle serves both backends: what it
    applies goes through ``Backend.alter_topic_config``.
    """

    def __init__(self, node: TopicConfigFile, content: bytes) -> None:
        super().__init__(content)
        self._node = node
        self._updates: dict[str, str | None] = {}
        self._refused: str | None = None
        self._replace = False        # O_TRUNC/ftruncate(0): the text is the whole set of overrides
        self._pending = False        # written (or truncated) since the last apply

    def opened(self, flags: int) -> None:
        self._replace = bool(flags & os.O_TRUNC)

    def truncate(self, size: int) -> None:
        """``ftruncate(fd, 0)``: the text written from now on replaces the overrides (at close)."""
        if size != 0:
            return          # a size the text will have once written changes nothing
        with self._lock:
            self._partial, self._updates, self._refused = b"", {}, None
            self._replace = self._pending = True

    def take_lines(self, lines: list[bytes]) -> None:
        self._pending = True
        self._take(lines)

    def _take(self, lines: list[bytes]) -> None:
        if self._refused is not None:
            raise EditAbandonedError(
                f"{self._node.describe()}: an earlier line written through this opening was refused "
                f"({self._refused}); nothing written through it will be applied")
        try:
            updates = self._node.parse_lines(lines)
            written = updates
            if not self._node.ns.backend.remote:
                # the engine checks combinations (tiered storage on a compacted topic), so it is given what
                # close() would apply: this opening's earlier lines too, and the removals of a replacement
                written = {**self._updates, **updates}
                if self._replace:
                    written = {**dict.fromkeys(self._node.overrides()), **written}
            self._node.ns.backend.validate_topic_overrides(self._node.topic, written)
        except LogfsError as exc:
            self._refused = str(exc)
            self._updates.clear()
            refused = InvalidConfigError(f"{exc}; nothing written to {self._node.describe()} "
                                         "through this opening will be applied")
            refused.errno = exc.errno          # EINVAL, or EPERM for what an internal topic refuses
            raise refused from None
        self._updates.update(updates)

    def flush(self) -> None:
        """close(): apply what was written through this opening since the last close, if anything."""
        with self._lock:
            if self._pending:
                self._apply()

    def release(self) -> None:
        """Last close: a replacement nothing was written to (``: > config``) removes every override."""
        with self._lock:
            if self._pending or self._replace:
                self._apply()

    def _apply(self) -> None:
        self._pending = False
        if self._refused is not None:
            self._replace = False
            return          # the write that carried the bad line failed; nothing of this opening applies
        rest = self._pop_rest()
        if rest:
            self._take([rest])
        updates, self._updates = self._updates, {}
        if self._replace:
            self._replace = False        # a later close of the same opening adds what was written since
            removed = {name: None for name in self._node.overrides() if name not in updates}
            updates = {**removed, **updates}
        if updates:
            self._node.apply(updates)


class BrokerConfigFile(GeneratedFile):
    key = ("broker", "config")

    def describe(self) -> str:
        return ".logfs/config"

    def render(self) -> bytes:
        """The broker configuration; on a cluster mount, the settings it runs with (the cluster's address,
        client, fetcher and replica settings, secrets redacted: logfs.cluster.mount_settings)."""
        props = self.ns.manager.config.to_props()
        options = getattr(self.ns.backend, "options", None)
        if self.ns.backend.remote and options is not None:
            from logfs.cluster.mount_settings import mount_settings_text
            return mount_settings_text(options, props)
        return _props_text(props)


class TopicConfigFile(GeneratedFile):
    """Effective topic configuration; writing ``name=value`` lines alters overrides.

    Read, it is the overrides as ``name=value`` lines, then every other name
    as a ``#name=value`` comment showing its default (``kafka-configs
    --describe`` and ``--describe --all`` in one file), so a saved editor
    buffer keeps what is an override (see :class:`ConfigEditHandle`).
    """

    writable = True
    mode = RW_MODE
    entry_timeout = STABLE_TIMEOUT_S       # the name is stable; the size changes with the overrides

    def __init__(self, ns: Tree, topic: str) -> None:
        super().__init__(ns)
        self.topic = topic
        #: when a write through the mount last changed the overrides (0: not since the mount started)
        self.applied_ns = 0

    @property
    def key(self) -> NodeKey:
        return ("config", self.topic)

    def describe(self) -> str:
        return f"{self.topic}/config"

    def render(self) -> bytes:
        self.ns.require_topic(self.topic)
        props = self.ns.backend.topic_config_props(self.topic)
        overrides = self.overrides()
        out = [f"# Overrides of topic {self.topic}: a write with > replaces them, >> adds to them, "
               "and name= removes one\n"]
        out += [f"{k}={v}\n" for k, v in sorted(props.items()) if k in overrides]
        out.append("# Defaults (remove the # and change the value to override one)\n")
        out += [f"#{k}={v}\n" for k, v in sorted(props.items()) if k not in overrides]
        return "".join(out).encode()

    def overrides(self) -> dict[str, str]:
        return self.ns.backend.topic_overrides(self.topic)

    def open(self, write: bool) -> Handle:
        if not write:
            return BytesHandle(self.render())
        self.ns.check_writable()
        return ConfigEditHandle(self, self.render())

    def parse_lines(self, lines: list[bytes]) -> dict[str, str | None]:
        """``name=value`` lines -> overrides (``name=`` removes one); blank and ``#`` lines skipped.

        Values are trimmed, except those of names whose value may be any string
        (``key.separator``, ``null.marker``): they are the bytes after the
        ``=`` up to the end of the line (a ``\\r`` of a CRLF file aside), so
        ``key.separator= `` is a space.
        """
        updates: dict[str, str | None] = {}
        for raw in lines:
            text = raw.decode("utf-8", "replace").removesuffix("\r")
            line = text.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, value = text.lstrip().partition("=")
            name = name.strip()
            if not sep or not name:
                raise InvalidConfigError(
                    f"Invalid config line {shown(line)} for topic {self.topic}: expected name=value")
            key = TOPIC_CONFIG_KEYS.get(name)
            if key is None or key.trim:
                value = value.strip()
            updates[name] = value if value else None
        return updates

    def apply(self, updates: dict[str, str | None]) -> None:
        # LogManager.alter_topic_config logs the change (once).
        self.ns.backend.alter_topic_config(self.topic, updates)
        self.applied_ns = time.time_ns()

    def mtime_ns(self) -> int:
        """When a write through the mount last changed the overrides (the mount's start before that)."""
        return self.applied_ns or self.ns.started_ns


# ---- control files


class _MarkerFile(FileNode):
    """A write-only ``delete`` file: each write's complete lines are markers, checked and applied together."""

    writable = True
    mode = WRITE_ONLY_MODE
    entry_timeout = attr_timeout = STABLE_TIMEOUT_S

    def open(self, write: bool) -> Handle:
        if write:
            self.ns.check_writable()
        return LineCommandHandle(self._apply)

    def _apply(self, lines: list[bytes]) -> None:
        raise NotImplementedError


class TopicDeleteFile(_MarkerFile):
    """Write the marker ``topic`` to delete the topic asynchronously (like rmdir)."""

    def __init__(self, ns: Tree, topic: str) -> None:
        super().__init__(ns)
        self.topic = topic

    @property
    def key(self) -> NodeKey:
        return ("delete", self.topic)

    def describe(self) -> str:
        return f"{self.topic}/delete"

    def _apply(self, lines: list[bytes]) -> None:
        for marker in (line.strip() for line in lines):
            if marker != b"topic":
                raise InvalidRequestError(f"Invalid marker {shown(marker.decode('utf-8', 'replace'))} "
                                          f"for {self.topic}/delete: expected 'topic'")
        self.ns.delete_topic(self.topic)


class PartitionDeleteFile(_MarkerFile):
    """``before <offset>`` (Kafka's DeleteRecords) or ``key <key>`` (a tombstone)."""

    def __init__(self, ns: Tree, tp: TopicPartition) -> None:
        super().__init__(ns)
        self.tp = tp

    @property
    def key(self) -> NodeKey:
        return ("delete", self.tp)

    def describe(self) -> str:
        return f"{self.tp.topic}/{self.tp.partition}/delete"

    def _apply(self, lines: list[bytes]) -> None:
        # Parse every marker first so a bad one applies none of them: an int is
        # ``before <offset>``, bytes are ``key <key>``, in the order written.
        actions: list[int | bytes] = []
        for raw in lines:
            line = raw.rstrip(b"\r")
            verb, _, arg = line.lstrip().partition(b" ")
            offset = (parse_canonical_int(arg.strip().decode("ascii", "replace"))
                      if verb == b"before" else None)
            if offset is not None:
                actions.append(offset)
            elif verb == b"key" and arg:
                actions.append(arg)
            else:
                raise InvalidRequestError(
                    f"Invalid marker {shown(line.decode('utf-8', 'replace'))} for {self.tp}/delete:"
                    " expected 'before <offset>' (the offset in digits, no leading zero) or 'key <key>'")
        if is_internal(self.tp.topic):     # refused whatever the offset, as the engine refuses it
            raise InternalTopicError(f"Cannot delete records of internal topic {self.tp.topic}: it holds its "
                                     "coordinator's state")
        target = self.ns.log(self.tp)
        end = target.log_end_offset        # only grows: checking first keeps a bad marker from applying any
        for action in actions:
            if isinstance(action, int) and action > end:
                raise InvalidRequestError(
                    f"Cannot delete records of {self.tp} before offset {action}: "
                    f"it is beyond the log end offset {end}")
        for action in actions:
            if isinstance(action, int):
                # The manager checkpoints the new log start offset before this
                # returns: once `echo before N > delete` succeeds, no crash brings
                # the records back.  Beyond the log end: InvalidRequestError (EINVAL).
                # (LineCommandHandle is blocking: this runs off the trio thread.)
                start = self.ns.backend.delete_records(self.tp, action)
                log.info("[Log partition=%s, dir=%s] DeleteRecords before offset %s: log start offset is now %d",
                         self.tp, target.dir, action, start)
            else:
                first, _ = self.ns.backend.append_values(self.tp, [None], [action])
                self.ns.stats.record_append(1, 0)
                log.info("[Log partition=%s, dir=%s] Appended tombstone at offset %d", self.tp, target.dir, first)


class AppendTargetFile(FileNode):
    """A file appended to: of a partition (``partition``) or of a topic (``partition`` None).

    ``append`` and ``append.jsonl`` differ only in the :class:`~logfs.appender.LineFormat`
    their openings' :class:`~logfs.appender.AppendHandle` parses lines with.
    """

    writable = True
    mode = RW_MODE
    #: the same inode and attributes (size 0) for as long as the topic exists
    entry_timeout = attr_timeout = STABLE_TIMEOUT_S
    #: how the lines written become records; its ``file_name`` is the file's name
    format: LineFormat

    def __init__(self, ns: Tree, topic: str, partition: int | None) -> None:
        super().__init__(ns)
        self.topic = topic
        self.partition = partition

    @property
    def name(self) -> str:
        return self.format.file_name

    @property
    def key(self) -> NodeKey:
        return (self.name, self.topic, self.partition)

    def describe(self) -> str:
        if self.partition is None:
            return f"{self.topic}/{self.name}"
        return f"{self.topic}/{self.partition}/{self.name}"

    def open(self, write: bool) -> Handle:
        if write:
            self.ns.check_writable()
        if self.partition is None:
            self.ns.require_topic(self.topic)
        else:
            self.ns.log(TopicPartition(self.topic, self.partition))
        path = self.path()
        return AppendHandle(self.ns.backend, self.topic, self.partition, self.format,
                            self.ns.router(self.topic), self.ns.stats,
                            note=lambda code, reason: self.ns.refusals.record(path, code, reason))


class AppendFile(AppendTargetFile):
    """``append``: one record per line, as kafka-console-producer reads them (``engine.text_in``)."""

    format = TEXT_LINES


class JsonlAppendFile(AppendTargetFile):
    """``append.jsonl``: the JSON lines ``records.jsonl`` gives out (``engine.jsonl_in``).

    ``MOUNT/<topic>/<p>/append.jsonl`` appends to partition ``p``;
    ``MOUNT/<topic>/append.jsonl`` routes a line with a ``partition`` member to
    that partition (an explicit partition wins over the partitioner, as in a
    ``ProducerRecord``), so ``cat a/*/records.jsonl >> b/append.jsonl`` keeps
    the partitioning; strip it (``jq -c 'del(.partition)'``) to re-partition by key.
    """

    format = JSON_LINES


def _props_text(props: dict[str, str]) -> bytes:
    return "".join(f"{k}={v}\n" for k, v in sorted(props.items())).encode()
