"""Broker and topic configuration: Kafka's names, Kafka's defaults, Kafka's validation.

Two levels, as in Kafka:

* :class:`BrokerConfig` -- the ``server.properties`` names (``log.dirs``,
  ``log.segment.bytes``, ``log.retention.hours`` ...) that configure the
  :class:`~engine.manager.LogManager` and its background jobs, and that supply
  every topic's defaults (:meth:`BrokerConfig.log_config`);
* :class:`LogConfig` -- the topic-level names (``segment.bytes``,
  ``retention.ms``, ``cleanup.policy`` ...), immutable, one per topic: the
  broker's defaults with that topic's overrides applied.  Three names of
  kafka-console-producer (``parse.key``, ``key.separator``, ``null.marker``) join
  them, because in logfs they say how the lines written to a topic's ``append``
  files become records.

Values arrive as strings (a properties file, a ``config`` file written through
the mount, ``-o name=value``) and are parsed like Kafka's ``ConfigDef``: typed
(INT is 32-bit, LONG 64-bit), range-checked, and refused with Kafka's message,
e.g. ``Invalid value abc for configuration segment.bytes: Not a number of type
INT``.  For the settings Kafka leaves unset by default (``log.roll.ms``,
``log.retention.ms``, ``log.retention.minutes``, ``log.flush.interval.ms``,
``log.dirs``, ``null.marker``) an empty value means "unset", which is how a
``name=`` line removes an override.

Kafka 4's minimum of 1 MiB for ``segment.bytes`` and ``log.segment.bytes`` holds
(KIP-1030); tests that need tiny segments set ``internal.segment.bytes`` (Kafka 4's
internal topic setting, which wins over ``segment.bytes``) or its broker default
``internal.log.segment.bytes`` (logfs's own, for a mount's every topic).

logfs differs from Kafka in four documented places: ``offsets.topic.segment.bytes``
must be at least 1 MiB too (Kafka accepts 1 but then cannot create the topic with
it as ``segment.bytes``); ``log.dirs`` falls back to
``log.dir``, whose default is ``./data`` (the directory ``scripts/run.sh`` mounts)
instead of ``/tmp/kafka-logs``; ``segment.index.bytes`` and
``log.index.size.max.bytes`` must be at least 12, because Kafka accepts 4 but
then cannot create a time index (12-byte entries) for the segment; and
``log.initial.task.delay.ms`` (Kafka's internal setting) is public.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidConfigError
from engine.numbers import INT_MAX, LONG_MAX, parse_canonical_int
from engine.properties import format_properties, parse_properties

if TYPE_CHECKING:
    from collections.abc import Mapping

logger = logging.getLogger(__name__)

__all__ = ["ConfigType", "ConfigKey", "LogConfig", "BrokerConfig", "TOPIC_CONFIG_NAMES", "TOPIC_CONFIG_KEYS",
           "validate_topic_overrides",
           "BROKER_CONFIG_NAMES", "BROKER_CONFIG_KEYS", "parse_properties", "format_properties", "DEFAULT_LOG_DIR"]

DOUBLE_MAX = 1.7976931348623157e308   # Java's Double.MAX_VALUE

#: Any: a config value is of its key's ConfigType (int, float, str, bool, a list of str), known only
#: when the key is looked up; parse() and check_typed() are where it is checked
ConfigValue = Any

# Kafka's defaults (LogConfig, ServerLogConfigs, CleanerConfig, ServerConfigs).
DEFAULT_SEGMENT_BYTES = 1024 * 1024 * 1024
DEFAULT_SEGMENT_MS = 7 * 24 * 60 * 60 * 1000
DEFAULT_SEGMENT_INDEX_BYTES = 10 * 1024 * 1024
DEFAULT_INDEX_INTERVAL_BYTES = 4096
DEFAULT_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
DEFAULT_RETENTION_BYTES = -1
DEFAULT_FLUSH_MESSAGES = LONG_MAX
DEFAULT_FLUSH_MS = LONG_MAX
DEFAULT_DELETE_RETENTION_MS = 24 * 60 * 60 * 1000
DEFAULT_MIN_CLEANABLE_DIRTY_RATIO = 0.5
DEFAULT_MIN_COMPACTION_LAG_MS = 0
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12       # 1 MiB + Records.LOG_OVERHEAD
DEFAULT_FILE_DELETE_DELAY_MS = 60_000
DEFAULT_COMPRESSION_TYPE = "producer"
DEFAULT_CLEANUP_POLICY = ("delete",)
DEFAULT_KEY_SEPARATOR = "\t"
#: ``local.retention.ms`` and ``local.retention.bytes``: -2, "the same as retention.ms/retention.bytes" (Kafka's)
DEFAULT_LOCAL_RETENTION = -2
#: logfs's default data directory: ``scripts/run.sh`` mounts with data in ``./data``.
DEFAULT_LOG_DIR = "./data"

#: Kafka 4's smallest ``segment.bytes`` and ``log.segment.bytes`` (KIP-1030): 1 MiB.
MIN_SEGMENT_BYTES = 1024 * 1024
#: Kafka's ``LegacyRecord.RECORD_OVERHEAD_V0``: the smallest ``internal.segment.bytes`` (the tests' setting).
MIN_INTERNAL_SEGMENT_BYTES = 14
#: One 12-byte time index entry: the smallest index a segment can be created with.
MIN_INDEX_BYTES = 12

CLEANUP_POLICIES = ("compact", "delete")
#: Kafka's ``BrokerCompressionType`` names.
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

# Java's Double.parseDouble: decimal or exponent forms, an optional d/f suffix, NaN, Infinity.
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)[fFdD]?)\Z", re.ASCII)
_LIST_SEPARATOR = re.compile(r"\s*,\s*")


def _config_error(name: str, value: ConfigValue, message: str) -> InvalidConfigError:
    """Kafka's ``ConfigException(name, value, message)`` text."""
    return InvalidConfigError(f"Invalid value {_show(value)} for configuration {name}: {message}")


def _show(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    text = str(value)
    if len(text) > _SHOWN_CHARS:    # a 5,000-digit value stays one readable log line
        return f"{text[:_SHOWN_CHARS]}... ({len(text)} characters)"
    return text


_SHOWN_CHARS = 64


# -- validators ------------------------------------------------------------------------------

class AtLeast:
    """``ConfigDef.Range.atLeast``."""

    def __init__(self, minimum: float) -> None:
        self.minimum = minimum

    def ensure_valid(self, name: str, value: ConfigValue) -> None:
        if value < self.minimum:
            raise _config_error(name, value, f"Value must be at least {self.minimum}")

    def __repr__(self) -> str:
        return f"[{self.minimum},...]"


class Between:
    """``ConfigDef.Range.between``, bounds inclusive."""

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum, self.maximum = minimum, maximum

    def ensure_valid(self, name: str, value: ConfigValue) -> None:
        if math.isnan(value) or value < self.minimum:
            raise _config_error(name, value, f"Value must be at least {self.minimum}")
        if value > self.maximum:
            raise _config_error(name, value, f"Value must be no more than {self.maximum}")

    def __repr__(self) -> str:
        return f"[{self.minimum},...,{self.maximum}]"


class ValidString:
    """``ConfigDef.ValidString.in``."""

    def __init__(self, *valid: str) -> None:
        self.valid = valid

    def ensure_valid(self, name: str, value: ConfigValue) -> None:
        if value not in self.valid:
            raise _config_error(name, value, "String must be one of: " + ", ".join(self.valid))

    def __repr__(self) -> str:
        return "[" + ", ".join(self.valid) + "]"


class ValidList:
    """``ConfigDef.ValidList.in``: every element one of the valid strings."""

    def __init__(self, *valid: str) -> None:
        self.element = ValidString(*valid)

    def ensure_valid(self, name: str, value: ConfigValue) -> None:
        for element in value:
            self.element.ensure_valid(name, element)

    def __repr__(self) -> str:
        return repr(self.element)


class NonEmptyString:
    """``ConfigDef.NonEmptyString``."""

    def ensure_valid(self, name: str, value: ConfigValue) -> None:
        if value == "":
            raise _config_error(name, value, "String must be non-empty")

    def __repr__(self) -> str:
        return "non-empty string"


class NonEmptyList:
    """At least one element (``log.dirs``)."""

    def ensure_valid(self, name: str, value: ConfigValue) -> None:
        if not value:
            raise _config_error(name, value,
                                "At least one log directory must be defined via log.dirs or log.dir.")
        if any(not element for element in value):
            raise _config_error(name, value, "A log directory name is empty")


# -- keys --------------------------------------------------------------------------------------

class ConfigType(enum.Enum):
    BOOLEAN = "BOOLEAN"
    STRING = "STRING"
    INT = "INT"
    LONG = "LONG"
    DOUBLE = "DOUBLE"
    LIST = "LIST"


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One configuration name: Kafka's ``ConfigDef.ConfigKey``.

    ``nullable`` keys accept an empty value as "unset" (None); ``trim`` is off
    for the console-producer strings, where a tab or a space is the value.
    """

    name: str
    type: ConfigType
    default: ConfigValue
    validator: ConfigValue = None
    doc: str = ""
    nullable: bool = False
    trim: bool = True

    @property
    def attr(self) -> str:
        return self.name.replace(".", "_")

    def parse(self, value: ConfigValue) -> ConfigValue:
        """Parse a string (or check an already typed value), then validate it."""
        value = self._parse_string(value) if isinstance(value, str) else self.check_typed(value)
        self.validate(value)
        return value

    def _parse_string(self, text: str) -> ConfigValue:
        name, kind = self.name, self.type
        trimmed = text.strip() if self.trim else text
        if self.nullable and trimmed == "":
            return None
        if kind is ConfigType.STRING:
            return trimmed
        if kind is ConfigType.BOOLEAN:
            lowered = trimmed.lower()
            if lowered in ("true", "false"):
                return lowered == "true"
            raise _config_error(name, text, "Expected value to be either true or false")
        if kind is ConfigType.LIST:
            return () if trimmed == "" else tuple(_LIST_SEPARATOR.split(trimmed))
        if kind is ConfigType.DOUBLE:
            if _JAVA_DOUBLE.match(trimmed):
                return float(trimmed.rstrip("fFdD").replace("Infinity", "inf"))
            raise _config_error(name, text, "Not a number of type DOUBLE")
        limit = INT_MAX if kind is ConfigType.INT else LONG_MAX
        # One spelling per number (engine.numbers): no '+', no leading zeros, ASCII
        # digits only, and never more digits than a long has (int() of 4,300+ digits
        # would raise ValueError, not a config error).
        number = parse_canonical_int(trimmed, minimum=-limit - 1, maximum=limit)
        if number is not None:
            return number
        raise _config_error(name, text, f"Not a number of type {kind.value}")

    def check_typed(self, value: ConfigValue) -> ConfigValue:
        """Check (and normalise: list -> tuple, int -> float) a value given as a Python object."""
        name, kind = self.name, self.type
        if value is None:
            if self.nullable:
                return None
            raise _config_error(name, value, "Value must be non-null")
        if kind is ConfigType.BOOLEAN:
            if isinstance(value, bool):
                return value
            raise _config_error(name, value, "Expected value to be either true or false")
        if kind is ConfigType.STRING:
            if isinstance(value, str):
                return value
            raise _config_error(name, value, f"Expected value to be a string, but it was a {type(value).__name__}")
        if kind is ConfigType.LIST:
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                return tuple(value)
            raise _config_error(name, value, "Expected a comma separated list.")
        if kind is ConfigType.DOUBLE:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            raise _config_error(name, value, "Not a number of type DOUBLE")
        limit = INT_MAX if kind is ConfigType.INT else LONG_MAX
        if isinstance(value, int) and not isinstance(value, bool) and -limit - 1 <= value <= limit:
            return value
        raise _config_error(name, value, f"Not a number of type {kind.value}")

    def validate(self, value: ConfigValue) -> None:
        if value is not None and self.validator is not None:
            self.validator.ensure_valid(self.name, value)

    def format(self, value: ConfigValue) -> str:
        """The value as it would be written in a properties file (``parse(format(v)) == v``)."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        if isinstance(value, list):
            return ",".join(value)
        if isinstance(value, float):
            return _java_double(value)
        return str(value)


def _java_double(value: float) -> str:
    """Java's ``Double.toString`` look for the common cases: ``0.5``, ``1.7976931348623157E308``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}E{int(exponent)}"


_B, _S, _I, _L, _D, _LIST = (ConfigType.BOOLEAN, ConfigType.STRING, ConfigType.INT, ConfigType.LONG,
                             ConfigType.DOUBLE, ConfigType.LIST)

_TOPIC_KEYS = (
    ConfigKey("segment.bytes", _I, DEFAULT_SEGMENT_BYTES, AtLeast(MIN_SEGMENT_BYTES),
              "The segment file size for the log: a new segment is rolled when the active one would exceed it."),
    ConfigKey("internal.segment.bytes", _I, None, AtLeast(MIN_INTERNAL_SEGMENT_BYTES),
              "For tests only (Kafka 4's LogConfig.INTERNAL_SEGMENT_BYTES_CONFIG): the segment size, without "
              "segment.bytes's 1 MiB minimum; when set it wins over segment.bytes.", nullable=True),
    ConfigKey("segment.ms", _L, DEFAULT_SEGMENT_MS, AtLeast(1),
              "Roll a new segment after this time even if the active one is not full."),
    ConfigKey("segment.index.bytes", _I, DEFAULT_SEGMENT_INDEX_BYTES, AtLeast(MIN_INDEX_BYTES),
              "The size each offset and time index is preallocated to."),
    ConfigKey("index.interval.bytes", _I, DEFAULT_INDEX_INTERVAL_BYTES, AtLeast(0),
              "Bytes of log between two index entries."),
    ConfigKey("retention.ms", _L, DEFAULT_RETENTION_MS, AtLeast(-1),
              "Delete segments whose newest record is older than this (-1: no time limit)."),
    ConfigKey("retention.bytes", _L, DEFAULT_RETENTION_BYTES, None,
              "Delete the oldest segments while the partition is larger than this (-1: no size limit)."),
    ConfigKey("flush.messages", _L, DEFAULT_FLUSH_MESSAGES, AtLeast(1),
              "fsync the log after this many appended messages."),
    ConfigKey("flush.ms", _L, DEFAULT_FLUSH_MS, AtLeast(0),
              "fsync the log when its oldest unflushed message is this old."),
    ConfigKey("delete.retention.ms", _L, DEFAULT_DELETE_RETENTION_MS, AtLeast(0),
              "How long the cleaner keeps tombstones of a compacted topic."),
    ConfigKey("min.cleanable.dirty.ratio", _D, DEFAULT_MIN_CLEANABLE_DIRTY_RATIO, Between(0, 1),
              "The dirty share of a log above which the cleaner compacts it."),
    ConfigKey("min.compaction.lag.ms", _L, DEFAULT_MIN_COMPACTION_LAG_MS, AtLeast(0),
              "The minimum age of a record before the cleaner may compact it."),
    ConfigKey("max.message.bytes", _I, DEFAULT_MAX_MESSAGE_BYTES, AtLeast(0),
              "The largest record batch the log accepts."),
    ConfigKey("file.delete.delay.ms", _L, DEFAULT_FILE_DELETE_DELAY_MS, AtLeast(0),
              "How long a deleted segment's files stay on disk with the .deleted suffix."),
    ConfigKey("compression.type", _S, DEFAULT_COMPRESSION_TYPE, ValidString(*COMPRESSION_TYPES),
              "Compression of appended batches; 'producer' keeps what the writer used."),
    ConfigKey("cleanup.policy", _LIST, DEFAULT_CLEANUP_POLICY, ValidList(*CLEANUP_POLICIES),
              "'delete' (retention), 'compact' (log cleaner) or both."),
    ConfigKey("remote.storage.enable", _B, False, None,
              "Tiered storage (KIP-405): copy the topic's closed segments to the mount's remote storage "
              "(needs remote.log.storage.system.enable=true; refused on a compacted topic)."),
    ConfigKey("local.retention.ms", _L, DEFAULT_LOCAL_RETENTION, AtLeast(-2),
              "With remote.storage.enable: how long segments stay on local disk once copied (-2: retention.ms)."),
    ConfigKey("local.retention.bytes", _L, DEFAULT_LOCAL_RETENTION, AtLeast(-2),
              "With remote.storage.enable: the local bytes of the partition kept once copied (-2: "
              "retention.bytes)."),
    ConfigKey("parse.key", _B, False, None,
              "kafka-console-producer: split each appended line into key and value."),
    ConfigKey("key.separator", _S, DEFAULT_KEY_SEPARATOR, NonEmptyString(),
              "kafka-console-producer: what separates the key from the value.", trim=False),
    ConfigKey("null.marker", _S, None, None,
              "kafka-console-producer: a value equal to it is a null value (a tombstone).",
              nullable=True, trim=False),
)

#: Topic-level name -> key.
TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {key.name: key for key in _TOPIC_KEYS}
TOPIC_CONFIG_NAMES: frozenset[str] = frozenset(TOPIC_CONFIG_KEYS)
#: Topic-level name -> default: the one home of the defaults, which LogConfig's fields take.
_TOPIC_DEFAULTS: dict[str, ConfigValue] = {key.name: key.default for key in _TOPIC_KEYS}


def validate_topic_overrides(updates: Mapping[str, str | None]) -> None:
    """InvalidConfigError naming the first unknown name or invalid value (None removes an override).

    Checks each value on its own; the combination is checked when the overrides
    are applied (``LogManager.alter_topic_config``), which is all or nothing.
    """
    for name, value in updates.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            raise InvalidConfigError(f"Unknown topic config name: {_show(name)}")
        if value is not None:
            key.parse(value)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """One topic's effective configuration (Kafka's ``LogConfig``); immutable and hashable.

    Attribute names are the topic-level names with '.' replaced by '_'.  Build it
    with :meth:`from_props` or :meth:`with_overrides`; direct construction is
    validated too.
    """

    segment_bytes: int = _TOPIC_DEFAULTS["segment.bytes"]
    internal_segment_bytes: int | None = _TOPIC_DEFAULTS["internal.segment.bytes"]
    segment_ms: int = _TOPIC_DEFAULTS["segment.ms"]
    segment_index_bytes: int = _TOPIC_DEFAULTS["segment.index.bytes"]
    index_interval_bytes: int = _TOPIC_DEFAULTS["index.interval.bytes"]
    retention_ms: int = _TOPIC_DEFAULTS["retention.ms"]
    retention_bytes: int = _TOPIC_DEFAULTS["retention.bytes"]
    flush_messages: int = _TOPIC_DEFAULTS["flush.messages"]
    flush_ms: int = _TOPIC_DEFAULTS["flush.ms"]
    delete_retention_ms: int = _TOPIC_DEFAULTS["delete.retention.ms"]
    min_cleanable_dirty_ratio: float = _TOPIC_DEFAULTS["min.cleanable.dirty.ratio"]
    min_compaction_lag_ms: int = _TOPIC_DEFAULTS["min.compaction.lag.ms"]
    max_message_bytes: int = _TOPIC_DEFAULTS["max.message.bytes"]
    file_delete_delay_ms: int = _TOPIC_DEFAULTS["file.delete.delay.ms"]
    compression_type: str = _TOPIC_DEFAULTS["compression.type"]
    cleanup_policy: tuple[str, ...] = _TOPIC_DEFAULTS["cleanup.policy"]
    remote_storage_enable: bool = _TOPIC_DEFAULTS["remote.storage.enable"]
    local_retention_ms: int = _TOPIC_DEFAULTS["local.retention.ms"]
    local_retention_bytes: int = _TOPIC_DEFAULTS["local.retention.bytes"]
    parse_key: bool = _TOPIC_DEFAULTS["parse.key"]
    key_separator: str = _TOPIC_DEFAULTS["key.separator"]
    null_marker: str | None = _TOPIC_DEFAULTS["null.marker"]

    def __post_init__(self) -> None:
        for key in _TOPIC_KEYS:
            value = getattr(self, key.attr)
            checked = key.check_typed(value)
            key.validate(checked)
            if checked is not value:
                object.__setattr__(self, key.attr, checked)   # e.g. a list -> tuple, 1 -> 1.0

    @property
    def segment_size(self) -> int:
        """The size a segment rolls at (Kafka's ``LogConfig.segmentSize()``): ``internal.segment.bytes``
        when set (tests), else ``segment.bytes``."""
        internal = self.internal_segment_bytes
        return self.segment_bytes if internal is None else internal

    @property
    def compact(self) -> bool:
        """The log cleaner compacts this topic."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Retention deletes old segments of this topic."""
        return "delete" in self.cleanup_policy

    @property
    def effective_local_retention_ms(self) -> int:
        """Kafka's ``LogConfig.localRetentionMs``: ``local.retention.ms``, or ``retention.ms`` when -2."""
        return self.retention_ms if self.local_retention_ms == DEFAULT_LOCAL_RETENTION else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """Kafka's ``LogConfig.localRetentionBytes``: ``local.retention.bytes``, or ``retention.bytes`` when -2."""
        return (self.retention_bytes if self.local_retention_bytes == DEFAULT_LOCAL_RETENTION
                else self.local_retention_bytes)

    def check_remote_storage(self, system_enabled: bool) -> None:
        """Kafka's ``LogConfig.validate`` checks of a tiered topic, on the combined values.

        InvalidConfigError when ``remote.storage.enable=true`` and the mount has
        no remote storage (``remote.log.storage.system.enable``), or the topic is
        compacted, or a local retention is above its total retention (Kafka's
        ``validateRemoteStorageRetentionSize`` and ``...RetentionTime``).
        """
        if not self.remote_storage_enable:
            return
        if not system_enabled:
            raise InvalidConfigError(
                "Invalid value true for configuration remote.storage.enable: the mount has no remote storage; "
                "mount with -o remote.log.storage.system.enable=true and rsm.config.uri (docs/tiering.md)")
        if self.compact:
            raise InvalidConfigError(
                f"Remote log storage is unsupported for the compacted topics: remote.storage.enable=true cannot "
                f"be combined with cleanup.policy={','.join(self.cleanup_policy)}")
        for local, total, name in ((self.local_retention_ms, self.retention_ms, "ms"),
                                   (self.local_retention_bytes, self.retention_bytes, "bytes")):
            if local == DEFAULT_LOCAL_RETENTION or total == -1:
                continue
            if local == -1:
                raise _config_error(f"local.retention.{name}", local,
                                    f"Value must not be -1 as retention.{name} value is set as {total}.")
            if local > total:
                raise _config_error(f"local.retention.{name}", local,
                                    f"Value must not be more than retention.{name} property value: {total}")

    @classmethod
    def from_props(cls, props: Mapping[str, ConfigValue], defaults: LogConfig | None = None) -> LogConfig:
        """``defaults`` (Kafka's defaults when None) with ``props`` applied.

        Every name must be a topic-level name and every value valid for it;
        otherwise :class:`InvalidConfigError` names the first bad one and nothing
        is built.
        """
        changes: dict[str, ConfigValue] = {}
        for name, value in props.items():
            key = TOPIC_CONFIG_KEYS.get(name)
            if key is None:
                raise InvalidConfigError(f"Unknown topic config name: {name}")
            changes[key.attr] = key.parse(value)
        base = defaults if defaults is not None else cls()
        return dataclasses.replace(base, **changes) if changes else base

    def with_overrides(self, overrides: Mapping[str, ConfigValue]) -> LogConfig:
        """A new config: this one with ``overrides`` (topic-level names) applied."""
        return self.from_props(overrides, defaults=self)

    def to_props(self) -> dict[str, str]:
        """Every topic-level name with its value, as strings that :meth:`from_props` reads back."""
        return {key.name: key.format(getattr(self, key.attr)) for key in _TOPIC_KEYS}


# -- broker ------------------------------------------------------------------------------------

_BROKER_KEYS = (
    ConfigKey("log.dir", _S, DEFAULT_LOG_DIR, NonEmptyString(),
              "The data directory, used when log.dirs is not set (logfs default ./data)."),
    ConfigKey("log.dirs", _LIST, None, NonEmptyList(),
              "Comma-separated data directories; partitions are spread over them.", nullable=True),
    ConfigKey("num.partitions", _I, 1, AtLeast(1), "Partitions of a topic created with mkdir."),
    ConfigKey("log.segment.bytes", _I, DEFAULT_SEGMENT_BYTES, AtLeast(MIN_SEGMENT_BYTES), "segment.bytes default."),
    ConfigKey("internal.log.segment.bytes", _I, None, AtLeast(MIN_INTERNAL_SEGMENT_BYTES),
              "For tests only: internal.segment.bytes default, every topic's segment size without the 1 MiB "
              "minimum (wins over segment.bytes, as internal.segment.bytes does).", nullable=True),
    ConfigKey("log.roll.ms", _L, None, AtLeast(1), "segment.ms default; overrides log.roll.hours.",
              nullable=True),
    ConfigKey("log.roll.hours", _I, DEFAULT_SEGMENT_MS // 3_600_000, AtLeast(1), "segment.ms default in hours."),
    ConfigKey("log.index.interval.bytes", _I, DEFAULT_INDEX_INTERVAL_BYTES, AtLeast(0),
              "index.interval.bytes default."),
    ConfigKey("log.index.size.max.bytes", _I, DEFAULT_SEGMENT_INDEX_BYTES, AtLeast(MIN_INDEX_BYTES),
              "segment.index.bytes default."),
    ConfigKey("log.retention.ms", _L, None, None,
              "retention.ms default; overrides log.retention.minutes and log.retention.hours.", nullable=True),
    ConfigKey("log.retention.minutes", _I, None, None,
              "retention.ms default in minutes; overrides log.retention.hours.", nullable=True),
    ConfigKey("log.retention.hours", _I, DEFAULT_RETENTION_MS // 3_600_000, None, "retention.ms default in hours."),
    ConfigKey("log.retention.bytes", _L, DEFAULT_RETENTION_BYTES, None, "retention.bytes default."),
    ConfigKey("log.retention.check.interval.ms", _L, 300_000, AtLeast(1), "Period of the retention job."),
    ConfigKey("log.flush.interval.messages", _L, LONG_MAX, AtLeast(1), "flush.messages default."),
    ConfigKey("log.flush.interval.ms", _L, None, AtLeast(0),
              "flush.ms default; unset means log.flush.scheduler.interval.ms.", nullable=True),
    ConfigKey("log.flush.scheduler.interval.ms", _L, LONG_MAX, None, "Period of the flusher."),
    ConfigKey("log.flush.offset.checkpoint.interval.ms", _I, 60_000, AtLeast(0),
              "Period of the recovery-point checkpoint."),
    ConfigKey("log.flush.start.offset.checkpoint.interval.ms", _I, 60_000, AtLeast(0),
              "Period of the log-start-offset checkpoint."),
    ConfigKey("log.segment.delete.delay.ms", _L, DEFAULT_FILE_DELETE_DELAY_MS, AtLeast(0),
              "file.delete.delay.ms default."),
    ConfigKey("log.cleanup.policy", _LIST, DEFAULT_CLEANUP_POLICY, ValidList(*CLEANUP_POLICIES),
              "cleanup.policy default."),
    ConfigKey("log.cleaner.enable", _B, True, None, "Run the log cleaner."),
    ConfigKey("log.cleaner.threads", _I, 1, AtLeast(0), "Log cleaner workers."),
    ConfigKey("log.cleaner.dedupe.buffer.size", _L, 128 * 1024 * 1024, None,
              "Memory for the cleaner's offset maps, over all workers."),
    ConfigKey("log.cleaner.io.buffer.size", _I, 512 * 1024, AtLeast(0), "The cleaner's I/O buffers, over all workers."),
    ConfigKey("log.cleaner.io.buffer.load.factor", _D, 0.9, None, "Load factor of the cleaner's offset map."),
    ConfigKey("log.cleaner.io.max.bytes.per.second", _D, DOUBLE_MAX, None, "The cleaner's I/O throttle."),
    ConfigKey("log.cleaner.backoff.ms", _L, 15_000, AtLeast(0), "The cleaner's sleep when there is nothing to clean."),
    ConfigKey("log.cleaner.min.cleanable.ratio", _D, DEFAULT_MIN_CLEANABLE_DIRTY_RATIO, Between(0, 1),
              "min.cleanable.dirty.ratio default."),
    ConfigKey("log.cleaner.delete.retention.ms", _L, DEFAULT_DELETE_RETENTION_MS, AtLeast(0),
              "delete.retention.ms default."),
    ConfigKey("log.cleaner.min.compaction.lag.ms", _L, DEFAULT_MIN_COMPACTION_LAG_MS, AtLeast(0),
              "min.compaction.lag.ms default."),
    ConfigKey("message.max.bytes", _I, DEFAULT_MAX_MESSAGE_BYTES, AtLeast(0), "max.message.bytes default."),
    ConfigKey("num.recovery.threads.per.data.dir", _I, 1, AtLeast(1), "Threads loading and recovering logs."),
    ConfigKey("compression.type", _S, DEFAULT_COMPRESSION_TYPE, ValidString(*COMPRESSION_TYPES),
              "compression.type default."),
    ConfigKey("log.initial.task.delay.ms", _L, 30_000, AtLeast(0),
              "Delay before the first run of each background job."),
    # The group coordinator's (GroupCoordinatorConfig) settings for __consumer_offsets.
    ConfigKey("offsets.topic.num.partitions", _I, 50, AtLeast(1), "Partitions of __consumer_offsets."),
    ConfigKey("offsets.topic.segment.bytes", _I, 100 * 1024 * 1024, AtLeast(MIN_SEGMENT_BYTES),
              "segment.bytes of __consumer_offsets."),
    ConfigKey("remote.log.storage.system.enable", _B, False, None,
              "Tiered storage (KIP-405): the mount copies the closed segments of topics with "
              "remote.storage.enable=true to the store the rsm.config.* settings name."),
    ConfigKey("remote.log.manager.task.interval.ms", _L, 30_000, AtLeast(1),
              "Period of the task copying segments to remote storage and deleting the copies retention "
              "dropped."),
    ConfigKey("isolation.level", _S, "read_uncommitted", ValidString("read_uncommitted", "read_committed"),
              "The consumer setting, for every view: read_committed hides aborted transactions."),
)

#: Broker-level name -> key.
BROKER_CONFIG_KEYS: dict[str, ConfigKey] = {key.name: key for key in _BROKER_KEYS}
BROKER_CONFIG_NAMES: frozenset[str] = frozenset(BROKER_CONFIG_KEYS)
#: Broker-level name -> default: the one home of the defaults, which BrokerConfig's fields take.  The
#: four effective values (see BrokerConfig) default to what Kafka derives from their fallbacks.
_BROKER_DEFAULTS: dict[str, ConfigValue] = {key.name: key.default for key in _BROKER_KEYS}



@dataclass(frozen=True)
class BrokerConfig:
    """The broker-level configuration (the log part of Kafka's ``KafkaConfig``).

    Attribute names are the broker names with '.' replaced by '_'.  Four hold the
    *effective* value Kafka derives: ``log_dirs`` (``log.dirs``, else
    ``log.dir``), ``log_roll_ms`` (else ``log.roll.hours``), ``log_retention_ms``
    (else ``log.retention.minutes``, else ``log.retention.hours``; negative means
    -1, unlimited) and ``log_flush_interval_ms`` (else
    ``log.flush.scheduler.interval.ms``).  :meth:`from_props` resolves them;
    direct construction takes them as given (handy in tests).
    """

    log_dir: str = _BROKER_DEFAULTS["log.dir"]
    log_dirs: list[str] = field(default_factory=lambda: [_BROKER_DEFAULTS["log.dir"]])
    num_partitions: int = _BROKER_DEFAULTS["num.partitions"]
    log_segment_bytes: int = _BROKER_DEFAULTS["log.segment.bytes"]
    internal_log_segment_bytes: int | None = _BROKER_DEFAULTS["internal.log.segment.bytes"]
    log_roll_ms: int = 3_600_000 * _BROKER_DEFAULTS["log.roll.hours"]
    log_roll_hours: int = _BROKER_DEFAULTS["log.roll.hours"]
    log_index_interval_bytes: int = _BROKER_DEFAULTS["log.index.interval.bytes"]
    log_index_size_max_bytes: int = _BROKER_DEFAULTS["log.index.size.max.bytes"]
    log_retention_ms: int = 3_600_000 * _BROKER_DEFAULTS["log.retention.hours"]
    log_retention_minutes: int | None = _BROKER_DEFAULTS["log.retention.minutes"]
    log_retention_hours: int = _BROKER_DEFAULTS["log.retention.hours"]
    log_retention_bytes: int = _BROKER_DEFAULTS["log.retention.bytes"]
    log_retention_check_interval_ms: int = _BROKER_DEFAULTS["log.retention.check.interval.ms"]
    log_flush_interval_messages: int = _BROKER_DEFAULTS["log.flush.interval.messages"]
    log_flush_interval_ms: int = _BROKER_DEFAULTS["log.flush.scheduler.interval.ms"]
    log_flush_scheduler_interval_ms: int = _BROKER_DEFAULTS["log.flush.scheduler.interval.ms"]
    log_flush_offset_checkpoint_interval_ms: int = _BROKER_DEFAULTS["log.flush.offset.checkpoint.interval.ms"]
    log_flush_start_offset_checkpoint_interval_ms: int = (
        _BROKER_DEFAULTS["log.flush.start.offset.checkpoint.interval.ms"])
    log_segment_delete_delay_ms: int = _BROKER_DEFAULTS["log.segment.delete.delay.ms"]
    log_cleanup_policy: tuple[str, ...] = _BROKER_DEFAULTS["log.cleanup.policy"]
    log_cleaner_enable: bool = _BROKER_DEFAULTS["log.cleaner.enable"]
    log_cleaner_threads: int = _BROKER_DEFAULTS["log.cleaner.threads"]
    log_cleaner_dedupe_buffer_size: int = _BROKER_DEFAULTS["log.cleaner.dedupe.buffer.size"]
    log_cleaner_io_buffer_size: int = _BROKER_DEFAULTS["log.cleaner.io.buffer.size"]
    log_cleaner_io_buffer_load_factor: float = _BROKER_DEFAULTS["log.cleaner.io.buffer.load.factor"]
    log_cleaner_io_max_bytes_per_second: float = _BROKER_DEFAULTS["log.cleaner.io.max.bytes.per.second"]
    log_cleaner_backoff_ms: int = _BROKER_DEFAULTS["log.cleaner.backoff.ms"]
    log_cleaner_min_cleanable_ratio: float = _BROKER_DEFAULTS["log.cleaner.min.cleanable.ratio"]
    log_cleaner_delete_retention_ms: int = _BROKER_DEFAULTS["log.cleaner.delete.retention.ms"]
    log_cleaner_min_compaction_lag_ms: int = _BROKER_DEFAULTS["log.cleaner.min.compaction.lag.ms"]
    message_max_bytes: int = _BROKER_DEFAULTS["message.max.bytes"]
    num_recovery_threads_per_data_dir: int = _BROKER_DEFAULTS["num.recovery.threads.per.data.dir"]
    compression_type: str = _BROKER_DEFAULTS["compression.type"]
    log_initial_task_delay_ms: int = _BROKER_DEFAULTS["log.initial.task.delay.ms"]
    offsets_topic_num_partitions: int = _BROKER_DEFAULTS["offsets.topic.num.partitions"]
    offsets_topic_segment_bytes: int = _BROKER_DEFAULTS["offsets.topic.segment.bytes"]
    remote_log_storage_system_enable: bool = _BROKER_DEFAULTS["remote.log.storage.system.enable"]
    remote_log_manager_task_interval_ms: int = _BROKER_DEFAULTS["remote.log.manager.task.interval.ms"]
    isolation_level: str = _BROKER_DEFAULTS["isolation.level"]

    def __post_init__(self) -> None:
        if self.log_dirs is None:
            object.__setattr__(self, "log_dirs", [self.log_dir])
        for key in _BROKER_KEYS:
            value = getattr(self, key.attr)
            checked = key.check_typed(value)
            if key.name == "log.dirs":
                checked = list(checked)
            key.validate(checked)
            if checked is not value:
                object.__setattr__(self, key.attr, checked)
        if not (self.log_retention_ms >= 1 or self.log_retention_ms == -1):
            raise _config_error("log.retention.ms", self.log_retention_ms,
                                "log.retention.ms must be unlimited (-1) or, greater than or equal to 1")

    @classmethod
    def from_props(cls, props: Mapping[str, ConfigValue], strict: bool = False) -> BrokerConfig:
        """Build from broker settings (e.g. a ``server.properties``), applying Kafka's precedence.

        An unknown name is ignored with a warning, as Kafka does for the many
        non-log settings of a ``server.properties``; with ``strict`` (names given
        one by one on the command line) it is refused.
        """
        values: dict[str, ConfigValue] = {key.name: key.default for key in _BROKER_KEYS}
        for name, value in props.items():
            key = BROKER_CONFIG_KEYS.get(name)
            if key is None:
                if strict:
                    raise InvalidConfigError(f"Unknown broker config name: {name}")
                logger.warning("The configuration '%s' was supplied but isn't a known config.", name)
                continue
            values[name] = key.parse(value)

        kwargs = {key.attr: values[key.name] for key in _BROKER_KEYS}
        kwargs["log_dirs"] = list(values["log.dirs"] or [values["log.dir"]])
        if values["log.roll.ms"] is None:
            kwargs["log_roll_ms"] = 3_600_000 * values["log.roll.hours"]
        if values["log.flush.interval.ms"] is None:
            kwargs["log_flush_interval_ms"] = values["log.flush.scheduler.interval.ms"]
        kwargs["log_retention_ms"] = cls._retention_ms(values, props)
        return cls(**kwargs)

    @staticmethod
    def _retention_ms(values: Mapping[str, ConfigValue], props: Mapping[str, ConfigValue]) -> int:
        """Kafka's ``logRetentionTimeMillis``: ms, else minutes, else hours; negative is -1."""
        if values["log.retention.ms"] is not None:
            millis, source = values["log.retention.ms"], "log.retention.ms"
        elif values["log.retention.minutes"] is not None:
            millis, source = 60_000 * values["log.retention.minutes"], "log.retention.minutes"
        else:
            millis, source = 3_600_000 * values["log.retention.hours"], "log.retention.hours"
        if millis < 0:
            return -1
        if millis == 0:
            raise _config_error(source, props.get(source, values[source]),
                                "log.retention.ms must be unlimited (-1) or, greater than or equal to 1")
        return int(millis)

    def _explicit_props(self) -> dict[str, str]:
        """The settings that rebuild this config: every plain one, and each derived one
        only where it differs from what its fallbacks give (so an override of
        ``log.retention.hours`` still takes effect unless ``log.retention.ms`` was set)."""
        props = self.to_props()
        fallback = {
            "log.dirs": [self.log_dir],
            "log.roll.ms": 3_600_000 * self.log_roll_hours,
            "log.flush.interval.ms": self.log_flush_scheduler_interval_ms,
            "log.retention.ms": self._fallback_retention_ms(),
        }
        for name, value in fallback.items():
            if getattr(self, BROKER_CONFIG_KEYS[name].attr) == value:
                del props[name]
        return props

    def _fallback_retention_ms(self) -> int | None:
        try:
            return self._retention_ms({"log.retention.ms": None, "log.retention.minutes": self.log_retention_minutes,
                                       "log.retention.hours": self.log_retention_hours}, {})
        except InvalidConfigError:
            return None      # minutes/hours alone would be invalid (0): only log.retention.ms explains it

    def with_overrides(self, overrides: Mapping[str, ConfigValue], strict: bool = True) -> BrokerConfig:
        """A new config: this one with ``overrides`` applied (``-o name=value`` on the command line).

        With ``strict`` (the default) an unknown name is refused.
        """
        return self.from_props({**self._explicit_props(), **overrides}, strict=strict)

    @staticmethod
    def read_properties_file(path: str) -> dict[str, str]:
        """Read a ``server.properties`` in ``java.util.Properties`` syntax."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise InvalidConfigError(f"Cannot read config file {path}: {exc.strerror or exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("iso-8859-1")    # what Properties.load(InputStream) assumes
        return parse_properties(text, os.fspath(path))

    def log_config(self) -> LogConfig:
        """Every topic's defaults, from the broker settings (Kafka's ``extractLogConfigMap``)."""
        return LogConfig(
            segment_bytes=self.log_segment_bytes,
            internal_segment_bytes=self.internal_log_segment_bytes,
            segment_ms=self.log_roll_ms,
            segment_index_bytes=self.log_index_size_max_bytes,
            index_interval_bytes=self.log_index_interval_bytes,
            retention_ms=self.log_retention_ms,
            retention_bytes=self.log_retention_bytes,
            flush_messages=self.log_flush_interval_messages,
            flush_ms=self.log_flush_interval_ms,
            delete_retention_ms=self.log_cleaner_delete_retention_ms,
            min_cleanable_dirty_ratio=self.log_cleaner_min_cleanable_ratio,
            min_compaction_lag_ms=self.log_cleaner_min_compaction_lag_ms,
            max_message_bytes=self.message_max_bytes,
            file_delete_delay_ms=self.log_segment_delete_delay_ms,
            compression_type=self.compression_type,
            cleanup_policy=self.log_cleanup_policy,
        )

    def to_props(self) -> dict[str, str]:
        """Every broker name with its effective value (``MOUNT/.logfs/config``).

        Read back by :meth:`from_props`, it gives an equal config.
        """
        return {key.name: key.format(getattr(self, key.attr)) for key in _BROKER_KEYS}


# Every field is a key and every key a field: a key added to a table without its field
# (or the other way) would be neither validated nor settable.
assert {f.name for f in dataclasses.fields(LogConfig)} == {key.attr for key in _TOPIC_KEYS}
assert {f.name for f in dataclasses.fields(BrokerConfig)} == {key.attr for key in _BROKER_KEYS}
