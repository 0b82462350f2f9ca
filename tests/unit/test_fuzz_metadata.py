"""Hypothesis fuzzing of the metadata a LogManager reads at startup (issue 9).

Whatever bytes a checkpoint or ``topic-configs.json`` holds, startup either
uses them, falls back to the previous generation (saying so at ERROR), or
refuses with a StorageError that says how to repair; it never crashes with
another exception and never silently falls back to broker defaults.
"""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.checkpoint import LOG_START_OFFSET_CHECKPOINT, OffsetCheckpointFile
from engine.config import BrokerConfig
from engine.errors import CorruptCheckpointError, InvalidConfigError, StorageError
from engine.manager import LogManager
from engine.topic import TopicPartition
from engine.topic_configs import TOPIC_CONFIGS_FILE

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)

config_docs = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 1, 2, "1"]), "generation": st.integers(-5, 10**30) | st.text(max_size=3),
     "topics": st.dictionaries(st.text(max_size=12), st.dictionaries(
         st.sampled_from(["cleanup.policy", "retention.ms", "segment.bytes", "bogus"]),
         st.text(max_size=8) | st.integers()), max_size=3) | json_values},
    optional={"written_ms": st.integers() | st.text(max_size=3), "deleting": json_values})

garbage = st.binary(max_size=300) | config_docs.map(lambda d: json.dumps(d).encode())


def _start(log_dir: str) -> LogManager:
    manager = LogManager(BrokerConfig.from_props({"log.dirs": log_dir, "log.cleaner.enable": "false"}))
    manager.startup()
    return manager


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(current=garbage, previous=st.none() | garbage)
def test_any_topic_configs_bytes_load_fall_back_or_refuse(current: bytes, previous: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, TOPIC_CONFIGS_FILE), "wb") as f:
            f.write(current)
        if previous is not None:
            with open(os.path.join(d, TOPIC_CONFIGS_FILE + ".prev"), "wb") as f:
                f.write(previous)
        try:
            manager = _start(d)
        except StorageError as exc:
            assert "Refusing to start" in str(exc)
            assert "restore" in str(exc)
            return
        except InvalidConfigError as exc:          # parsed, but a value is not a valid config
            assert TOPIC_CONFIGS_FILE in str(exc)
            return
        manager.shutdown()


@settings(max_examples=50, deadline=None)
@given(previous=config_docs.map(lambda d: json.dumps(d).encode()))
def test_a_sound_previous_generation_is_used_when_the_current_is_corrupt(previous: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        sound = {"version": 1, "generation": 4, "written_ms": 1,
                 "topics": {"c": {"cleanup.policy": "compact"}}}
        with open(os.path.join(d, TOPIC_CONFIGS_FILE), "wb") as f:
            f.write(previous[: len(previous) // 2] + b"\x00")            # torn
        with open(os.path.join(d, TOPIC_CONFIGS_FILE + ".prev"), "w") as f:
            json.dump(sound, f)
        os.mkdir(os.path.join(d, "c-0"))
        manager = _start(d)
        try:
            assert manager.topic_overrides("c") == {"cleanup.policy": "compact"}
        finally:
            manager.shutdown()


@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=200) | st.lists(
    st.text(alphabet="0123456789 -+\nt\r\t", max_size=15), max_size=6).map(lambda ls: "\n".join(ls).encode()))
def test_any_checkpoint_bytes_parse_or_are_corrupt(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, LOG_START_OFFSET_CHECKPOINT)
        with open(path, "wb") as f:
            f.write(content)
        try:
            offsets = OffsetCheckpointFile(path).read()
        except CorruptCheckpointError:
            return
        assert all(isinstance(tp, TopicPartition) and isinstance(o, int) for tp, o in offsets.items())
        # what parsed is written back identically
        OffsetCheckpointFile(path).write(offsets)
        assert OffsetCheckpointFile(path).read() == offsets
