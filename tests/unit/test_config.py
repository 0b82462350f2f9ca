"""BrokerConfig and LogConfig: Kafka's names and defaults, ConfigDef validation, properties files."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import (
    BROKER_CONFIG_KEYS,
    BROKER_CONFIG_NAMES,
    TOPIC_CONFIG_KEYS,
    TOPIC_CONFIG_NAMES,
    BrokerConfig,
    LogConfig,
    format_properties,
    parse_properties,
)
from engine.errors import InvalidConfigError

LONG_MAX = 9223372036854775807

# Kafka's documented defaults, written out independently of engine/config.py.
KAFKA_BROKER_DEFAULTS = {
    "num.partitions": 1,
    "log.segment.bytes": 1073741824,
    "internal.log.segment.bytes": None,         # logfs's tests' setting: unset
    "log.roll.hours": 168,
    "log.roll.ms": 604800000,
    "log.index.interval.bytes": 4096,
    "log.index.size.max.bytes": 10485760,
    "log.retention.hours": 168,
    "log.retention.minutes": None,
    "log.retention.ms": 604800000,
    "log.retention.bytes": -1,
    "log.retention.check.interval.ms": 300000,
    "log.flush.interval.messages": LONG_MAX,
    "log.flush.interval.ms": LONG_MAX,
    "log.flush.scheduler.interval.ms": LONG_MAX,
    "log.flush.offset.checkpoint.interval.ms": 60000,
    "log.flush.start.offset.checkpoint.interval.ms": 60000,
    "log.segment.delete.delay.ms": 60000,
    "log.cleanup.policy": ("delete",),
    "log.cleaner.enable": True,
    "log.cleaner.threads": 1,
    "log.cleaner.dedupe.buffer.size": 134217728,
    "log.cleaner.io.buffer.size": 524288,
    "log.cleaner.io.buffer.load.factor": 0.9,
    "log.cleaner.io.max.bytes.per.second": 1.7976931348623157e308,
    "log.cleaner.backoff.ms": 15000,
    "log.cleaner.min.cleanable.ratio": 0.5,
    "log.cleaner.delete.retention.ms": 86400000,
    "log.cleaner.min.compaction.lag.ms": 0,
    "message.max.bytes": 1048588,
    "num.recovery.threads.per.data.dir": 1,
    "compression.type": "producer",
    "log.initial.task.delay.ms": 30000,
    "isolation.level": "read_uncommitted",
    "remote.log.storage.system.enable": False,      # KIP-405's
    "remote.log.manager.task.interval.ms": 30000,
    "offsets.topic.num.partitions": 50,
    "offsets.topic.segment.bytes": 104857600,
    "log.dir": "./data",
    "log.dirs": ["./data"],
}

KAFKA_TOPIC_DEFAULTS = {
    "internal.segment.bytes": None,             # Kafka 4's internal setting for tests: unset
    "cleanup.policy": ("delete",),
    "retention.ms": 604800000,
    "retention.bytes": -1,
    "segment.bytes": 1073741824,
    "segment.ms": 604800000,
    "segment.index.bytes": 10485760,
    "index.interval.bytes": 4096,
    "flush.messages": LONG_MAX,
    "flush.ms": LONG_MAX,
    "delete.retention.ms": 86400000,
    "min.cleanable.dirty.ratio": 0.5,
    "min.compaction.lag.ms": 0,
    "max.message.bytes": 1048588,
    "file.delete.delay.ms": 60000,
    "compression.type": "producer",
    "parse.key": False,
    "key.separator": "\t",
    "null.marker": None,
    "remote.storage.enable": False,                 # KIP-405's
    "local.retention.ms": -2,
    "local.retention.bytes": -2,
}


def attr(name: str) -> str:
    return name.replace(".", "_")


# -- defaults ----------------------------------------------------------------------------------

def test_broker_defaults_are_kafkas():
    config = BrokerConfig.from_props({})
    assert set(KAFKA_BROKER_DEFAULTS) == BROKER_CONFIG_NAMES
    for name, expected in KAFKA_BROKER_DEFAULTS.items():
        assert getattr(config, attr(name)) == expected, name
    assert config == BrokerConfig()


def test_topic_defaults_are_kafkas():
    assert set(KAFKA_TOPIC_DEFAULTS) == TOPIC_CONFIG_NAMES
    config = LogConfig()
    for name, expected in KAFKA_TOPIC_DEFAULTS.items():
        assert getattr(config, attr(name)) == expected, name
    assert config.delete
    assert not config.compact
    assert BrokerConfig().log_config() == config


def test_log_config_is_immutable_and_hashable():
    config = LogConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.segment_bytes = 5  # type: ignore[misc]  # the assignment a frozen dataclass refuses, tested
    assert hash(config) == hash(LogConfig())
    assert {config: 1}[LogConfig()] == 1
    assert hash(config.with_overrides({"internal.segment.bytes": "100"})) != hash(config)


# -- parsing and validation -------------------------------------------------------------------

@pytest.mark.parametrize(("name", "value", "message"), [
    ("segment.bytes", "abc", "Invalid value abc for configuration segment.bytes: Not a number of type INT"),
    ("segment.bytes", "1048575", "Invalid value 1048575 for configuration segment.bytes: Value must be at least "
                                 "1048576"),
    ("internal.segment.bytes", "13", "Invalid value 13 for configuration internal.segment.bytes: Value must be at "
                                     "least 14"),
    ("segment.bytes", "2147483648", "Not a number of type INT"),
    ("segment.bytes", "1_000", "Not a number of type INT"),
    ("segment.bytes", "1e6", "Not a number of type INT"),
    ("segment.ms", "0", "segment.ms: Value must be at least 1"),
    ("segment.index.bytes", "11", "segment.index.bytes: Value must be at least 12"),
    ("index.interval.bytes", "-1", "index.interval.bytes: Value must be at least 0"),
    ("retention.ms", "-2", "retention.ms: Value must be at least -1"),
    ("retention.bytes", "9223372036854775808", "retention.bytes: Not a number of type LONG"),
    ("flush.messages", "0", "flush.messages: Value must be at least 1"),
    ("flush.ms", "-1", "flush.ms: Value must be at least 0"),
    ("delete.retention.ms", "-1", "delete.retention.ms"),
    ("min.cleanable.dirty.ratio", "1.5", "min.cleanable.dirty.ratio: Value must be no more than 1"),
    ("min.cleanable.dirty.ratio", "-0.1", "min.cleanable.dirty.ratio: Value must be at least 0"),
    ("min.cleanable.dirty.ratio", "half", "min.cleanable.dirty.ratio: Not a number of type DOUBLE"),
    ("min.cleanable.dirty.ratio", "NaN", "min.cleanable.dirty.ratio"),
    ("min.compaction.lag.ms", "-5", "min.compaction.lag.ms"),
    ("max.message.bytes", "-1", "max.message.bytes"),
    ("file.delete.delay.ms", "x", "file.delete.delay.ms: Not a number of type LONG"),
    ("compression.type", "brotli", "compression.type: String must be one of: uncompressed, zstd, lz4, snappy, "
                                   "gzip, producer"),
    ("cleanup.policy", "delete,archive", "Invalid value archive for configuration cleanup.policy: String must be "
                                         "one of: compact, delete"),
    ("cleanup.policy", "delete,,compact", "cleanup.policy"),
    ("parse.key", "yes", "Invalid value yes for configuration parse.key: Expected value to be either true or false"),
    ("key.separator", "", "key.separator: String must be non-empty"),
])
def test_invalid_topic_values_name_the_setting(name, value, message):
    base = LogConfig().with_overrides({"retention.ms": "1000"})
    with pytest.raises(InvalidConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as info:
        base.with_overrides({"segment.ms": "5", name: value})
    assert name in str(info.value)
    assert base.retention_ms == 1000
    assert base.segment_ms == 604800000                                 # nothing changed


def test_unknown_topic_name_refused():
    with pytest.raises(InvalidConfigError, match=r"Unknown topic config name: segment\.byte"):
        LogConfig.from_props({"segment.byte": "100"})
    with pytest.raises(InvalidConfigError, match=r"log\.segment\.bytes"):
        LogConfig.from_props({"log.segment.bytes": "1048576"})   # a broker name is not a topic name


def test_topic_values_parse_like_configdef():
    config = LogConfig.from_props({
        "segment.bytes": " 1048576 ", "retention.ms": "-1", "retention.bytes": "500",
        "min.cleanable.dirty.ratio": "1", "cleanup.policy": "compact , delete",
        "compression.type": " zstd", "parse.key": "TRUE", "key.separator": " : ", "null.marker": "<null>",
        "flush.messages": str(LONG_MAX),
    })
    assert (config.segment_bytes, config.retention_ms, config.retention_bytes) == (1048576, -1, 500)
    assert config.min_cleanable_dirty_ratio == 1.0
    assert isinstance(config.min_cleanable_dirty_ratio, float)
    assert config.cleanup_policy == ("compact", "delete")
    assert config.compact
    assert config.delete
    assert config.compression_type == "zstd"
    assert config.parse_key is True
    assert config.key_separator == " : "            # not trimmed: blanks can be the separator
    assert config.null_marker == "<null>"
    assert config.flush_messages == LONG_MAX
    assert LogConfig.from_props({"cleanup.policy": ""}).cleanup_policy == ()
    assert LogConfig.from_props({"min.cleanable.dirty.ratio": ".25"}).min_cleanable_dirty_ratio == 0.25


@pytest.mark.parametrize("value", ["+500", "0500", "00", "-0", "\u0665\u0660\u0660", "1" * 5000, "9" * 20, " - 1"])
def test_integer_values_have_one_spelling(value):
    # One canonical spelling per number (engine.numbers): Kafka's Long.parseLong
    # would take "+500" and "0500"; a mount path or marker never does, and
    # config values follow the same rule.  5,000 digits is EINVAL, not a ValueError.
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_props({"retention.bytes": value})
    assert "retention.bytes" in str(info.value)
    assert len(str(info.value)) < 300


def test_overrides_layer_on_defaults():
    broker = BrokerConfig.from_props({"log.retention.hours": "1", "log.cleanup.policy": "compact"})
    defaults = broker.log_config()
    assert defaults.retention_ms == 3_600_000
    assert defaults.compact
    topic = LogConfig.from_props({"internal.segment.bytes": "1024"}, defaults=defaults)
    assert (topic.segment_size, topic.retention_ms, topic.compact) == (1024, 3_600_000, True)
    again = topic.with_overrides({"retention.ms": "5"})
    assert again.retention_ms == 5
    assert topic.retention_ms == 3_600_000
    assert again.segment_size == 1024
    assert topic.with_overrides({}) is topic


def test_null_marker_empty_means_unset():
    config = LogConfig.from_props({"null.marker": "NULL"})
    assert config.with_overrides({"null.marker": ""}).null_marker is None


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "segment.bytes": st.integers(1 << 20, 2**31 - 1).map(str),
    "internal.segment.bytes": st.one_of(st.just(""), st.integers(14, 2**31 - 1).map(str)),
    "retention.ms": st.integers(-1, 2**63 - 1).map(str),
    "min.cleanable.dirty.ratio": st.floats(0, 1).map(repr),
    "cleanup.policy": st.sampled_from(["delete", "compact", "compact,delete", ""]),
    "key.separator": st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=3),
    "null.marker": st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=5),
    "parse.key": st.sampled_from(["true", "false"]),
}))
def test_to_props_round_trips(props):
    config = LogConfig.from_props(props)
    text = config.to_props()
    assert set(text) == TOPIC_CONFIG_NAMES
    assert LogConfig.from_props(text) == config
    # ... also through a properties file as written by format_properties.
    assert LogConfig.from_props(parse_properties(format_properties(text))) == config


def test_direct_construction_is_validated():
    with pytest.raises(InvalidConfigError, match=r"internal\.segment\.bytes: Value must be at least 14"):
        LogConfig(internal_segment_bytes=1)
    with pytest.raises(InvalidConfigError, match=r"segment\.bytes: Value must be at least 1048576"):
        LogConfig(segment_bytes=4096)
    with pytest.raises(InvalidConfigError, match=r"segment\.bytes"):
        LogConfig(segment_bytes="100")  # type: ignore[arg-type]  # a str where an int goes: what is refused
    # a list where the tuple goes: what is tested is that it becomes the tuple
    assert LogConfig(cleanup_policy=["compact"]).cleanup_policy == ("compact",)  # type: ignore[arg-type]


# -- broker -----------------------------------------------------------------------------------

def test_broker_time_precedence():
    assert BrokerConfig.from_props({"log.retention.hours": "2"}).log_retention_ms == 7_200_000
    assert BrokerConfig.from_props({"log.retention.hours": "2", "log.retention.minutes": "3"}).log_retention_ms \
        == 180_000
    assert BrokerConfig.from_props({"log.retention.hours": "2", "log.retention.minutes": "3",
                                    "log.retention.ms": "42"}).log_retention_ms == 42
    assert BrokerConfig.from_props({"log.retention.hours": "-1"}).log_retention_ms == -1
    assert BrokerConfig.from_props({"log.retention.ms": "-7"}).log_retention_ms == -1
    assert BrokerConfig.from_props({"log.roll.hours": "1"}).log_roll_ms == 3_600_000
    assert BrokerConfig.from_props({"log.roll.hours": "1", "log.roll.ms": "5"}).log_roll_ms == 5
    assert BrokerConfig.from_props({"log.flush.scheduler.interval.ms": "1000"}).log_flush_interval_ms == 1000
    assert BrokerConfig.from_props({"log.flush.scheduler.interval.ms": "1000",
                                    "log.flush.interval.ms": "10"}).log_flush_interval_ms == 10
    with pytest.raises(InvalidConfigError, match=r"log\.retention\.ms must be unlimited"):
        BrokerConfig.from_props({"log.retention.ms": "0"})
    with pytest.raises(InvalidConfigError, match=r"log\.retention\.minutes"):
        BrokerConfig.from_props({"log.retention.minutes": "0"})
    with pytest.raises(InvalidConfigError, match=r"log\.roll\.ms: Value must be at least 1"):
        BrokerConfig.from_props({"log.roll.ms": "0"})


def test_broker_log_dirs():
    assert BrokerConfig.from_props({"log.dir": "/a"}).log_dirs == ["/a"]
    assert BrokerConfig.from_props({"log.dir": "/a", "log.dirs": "/b, /c"}).log_dirs == ["/b", "/c"]
    with pytest.raises(InvalidConfigError, match=r"log\.dirs"):
        BrokerConfig.from_props({"log.dirs": "/b,,/c"})
    with pytest.raises(InvalidConfigError, match=r"log\.dir"):
        BrokerConfig.from_props({"log.dir": " "})
    assert BrokerConfig(log_dirs=["/x"]).log_dirs == ["/x"]


@pytest.mark.parametrize(("name", "value"), [
    ("num.partitions", "0"), ("log.segment.bytes", "1048575"), ("internal.log.segment.bytes", "13"),
    ("offsets.topic.segment.bytes", "1000"), ("log.index.size.max.bytes", "4"),
    ("log.retention.check.interval.ms", "0"), ("log.flush.interval.messages", "0"),
    ("log.cleaner.threads", "-1"), ("log.cleaner.min.cleanable.ratio", "2"), ("log.cleaner.enable", "on"),
    ("log.cleanup.policy", "keep"), ("message.max.bytes", "big"), ("num.recovery.threads.per.data.dir", "0"),
    ("compression.type", "none"), ("log.initial.task.delay.ms", "-1"), ("log.cleaner.backoff.ms", "-1"),
    ("log.cleaner.io.buffer.load.factor", "x"), ("log.flush.offset.checkpoint.interval.ms", "-1"),
])
def test_invalid_broker_values_name_the_setting(name, value):
    with pytest.raises(InvalidConfigError, match=f"Invalid value .* for configuration {name}: "):
        BrokerConfig.from_props({name: value})


def test_unknown_broker_names(caplog):
    with caplog.at_level(logging.WARNING, logger="engine.config"):
        config = BrokerConfig.from_props({"broker.id": "0", "listeners": "PLAINTEXT://:9092", "num.partitions": "3"})
    assert config.num_partitions == 3
    assert "The configuration 'broker.id' was supplied but isn't a known config." in caplog.text
    with pytest.raises(InvalidConfigError, match=r"Unknown broker config name: broker\.id"):
        BrokerConfig.from_props({"broker.id": "0"}, strict=True)


def test_broker_with_overrides():
    base = BrokerConfig.from_props({"log.retention.hours": "2", "num.partitions": "4", "log.dirs": "/d1"})
    over = base.with_overrides({"log.retention.hours": "1", "internal.log.segment.bytes": "1000"})
    assert (over.log_retention_ms, over.num_partitions, over.internal_log_segment_bytes, over.log_dirs) == \
        (3_600_000, 4, 1000, ["/d1"])
    assert over.log_config().segment_size == 1000
    assert over.log_config().segment_bytes == 1 << 30
    pinned = BrokerConfig.from_props({"log.retention.ms": "5000"})
    assert pinned.with_overrides({"log.retention.hours": "1"}).log_retention_ms == 5000   # ms wins, as in Kafka
    with pytest.raises(InvalidConfigError, match=r"Unknown broker config name: retention\.ms"):
        base.with_overrides({"retention.ms": "1"})
    assert base.num_partitions == 4


def test_broker_to_props_round_trips():
    config = BrokerConfig.from_props({"log.dirs": "/a,/b", "log.retention.minutes": "30", "log.roll.ms": "1234",
                                      "log.cleaner.io.max.bytes.per.second": "1048576.5",
                                      "log.cleanup.policy": "compact,delete"})
    props = config.to_props()
    assert set(props) == BROKER_CONFIG_NAMES
    assert props["log.dirs"] == "/a,/b"
    assert props["log.retention.ms"] == "1800000"
    assert props["log.roll.ms"] == "1234"
    assert props["log.cleanup.policy"] == "compact,delete"
    assert BrokerConfig().to_props()["log.cleaner.io.max.bytes.per.second"] == "1.7976931348623157E308"
    assert BrokerConfig.from_props(props) == config
    assert BrokerConfig.from_props(BrokerConfig().to_props()) == BrokerConfig()


def test_every_key_has_a_doc():
    for key in [*TOPIC_CONFIG_KEYS.values(), *BROKER_CONFIG_KEYS.values()]:
        assert key.doc, key.name


# -- java.util.Properties ---------------------------------------------------------------------

def test_properties_syntax():
    text = (
        "# a comment\n"
        "! another comment \\\n"
        "not.a.continuation=1\n"
        "   \n"
        "log.dirs=/data/a,\\\n"
        "          /data/b\n"
        "num.partitions : 3\n"
        "log.cleaner.enable   false\n"
        "key.separator=\\t\n"
        "null.marker=\\u004eULL\n"
        "message.max.bytes=2000   \n"
        "weird\\ key\\=x = v\\\\\n"
        "empty=\n"
        "only.key\n"
        "dup=1\r\n"
        "dup=2\r"
        "colon:x=y\n"
        "escaped\\\\\n"
        "last=tail\\"
    )
    assert parse_properties(text) == {
        "not.a.continuation": "1",
        "log.dirs": "/data/a,/data/b",
        "num.partitions": "3",
        "log.cleaner.enable": "false",
        "key.separator": "\t",
        "null.marker": "NULL",
        "message.max.bytes": "2000   ",
        "weird key=x": "v\\",
        "empty": "",
        "only.key": "",
        "dup": "2",
        "colon": "x=y",
        "escaped\\": "",
        "last": "tail",
    }


def test_malformed_unicode_escape_names_file_and_line(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("a=1\nb=\\u12G4\n")
    with pytest.raises(InvalidConfigError, match=r"Malformed \\uxxxx encoding in .*server.properties line 2"):
        BrokerConfig.read_properties_file(str(path))


def test_read_properties_file_and_build(tmp_path):
    path = tmp_path / "server.properties"
    path.write_bytes("broker.id=0\nlog.dirs=/tmp/kafka-logs\nlog.retention.hours=24\ncaf\xe9=1\n"
                     .encode("iso-8859-1"))
    props = BrokerConfig.read_properties_file(str(path))
    assert props["café"] == "1"            # not UTF-8: read as ISO-8859-1 like Properties.load
    config = BrokerConfig.from_props(props)
    assert config.log_dirs == ["/tmp/kafka-logs"]
    assert config.log_retention_ms == 86_400_000
    with pytest.raises(InvalidConfigError, match="Cannot read config file"):
        BrokerConfig.read_properties_file(str(tmp_path / "missing.properties"))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=8),
                       st.text(st.characters(exclude_categories=["Cs"]), max_size=8), max_size=8))
def test_format_properties_round_trips(props):
    assert parse_properties(format_properties(props)) == props
