"""Parsing of what users type, without FUSE: numbers, timestamps, markers, config lines.

One canonical spelling per number (``engine.numbers``) everywhere input is
parsed: path names, partition directories, ``before`` markers and config values.
Property tests (hypothesis) check that every integer round-trips through its
one spelling and that no other string is read as a number.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import validate_topic_overrides
from engine.errors import InvalidConfigError, InvalidPartitionError
from engine.numbers import INT_MAX, LONG_MAX, is_canonical_int, parse_canonical_int
from engine.topic import parse_partition
from logfs.names import parse_timestamp


@given(st.integers(min_value=0, max_value=LONG_MAX))
def test_every_non_negative_long_has_one_spelling(n):
    assert parse_canonical_int(str(n)) == n
    assert parse_canonical_int("0" + str(n)) is None          # leading zero: another spelling
    assert parse_canonical_int("+" + str(n)) is None
    assert parse_canonical_int(f" {n}") is None
    assert parse_canonical_int(f"{n}\n") is None


@given(st.integers(min_value=-LONG_MAX - 1, max_value=LONG_MAX))
def test_signed_values_for_config(n):
    assert parse_canonical_int(str(n), minimum=-LONG_MAX - 1) == n
    assert parse_canonical_int(str(n)) == (n if n >= 0 else None)


@settings(max_examples=300)
@given(st.text(max_size=30))
def test_no_other_string_is_a_number(text):
    value = parse_canonical_int(text, minimum=-LONG_MAX - 1)
    if value is None:
        assert not (text.isascii() and text.lstrip("-").isdigit() and str(int(text)) == text
                    and -LONG_MAX - 1 <= int(text) <= LONG_MAX)
    else:
        assert str(value) == text                             # the one spelling, read back


@pytest.mark.parametrize("text", ["007", "00", "-0", "+1", "٣", "²", "1_000", " 1", "1 ", "1e3", "0x10",
                                  "9" * 20, "1" * 5000, ""])
def test_refused_spellings(text):
    assert parse_canonical_int(text, minimum=-LONG_MAX - 1) is None
    assert not is_canonical_int(text, signed=True)


@pytest.mark.parametrize("text", ["03", "٣", "-1", str(INT_MAX + 1), "1" * 5000])
def test_partition_numbers(text):
    with pytest.raises(InvalidPartitionError):
        parse_partition(text)


def test_partition_number_bounds():
    assert parse_partition("0") == 0
    assert parse_partition(str(INT_MAX)) == INT_MAX


@pytest.mark.parametrize(("text", "expected"), [
    ("0", 0), ("1700000000000", 1700000000000), ("2026-11-21T23:52:24Z", 1795305144000),
    ("2026-11-21T23:52:24", 1795305144000), ("2026-11-21", 1795219200000),
    ("2026-11-21T23:52:24+01:00", 1795301544000),
])
def test_timestamps(text, expected):
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize("text", ["notatime", "007", "٢٠٢٦-١١-٢١", "2026-13-45", "", "-5", "1e3", "9" * 5000,
                                  "2026-11-21T25:00:00"])
def test_bad_timestamps_are_none(text):
    assert parse_timestamp(text) is None                      # every one is ENOENT at the mount


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_parse_timestamp_never_raises(text):
    result = parse_timestamp(text)
    assert result is None or isinstance(result, int)


@pytest.mark.parametrize("updates", [{"retention.ms": "0100"}, {"retention.ms": "1" * 5000},
                                     {"segment.bytes": "xyz"}, {"no.such.name": "1"},
                                     {"retention.ms": "٣"}, {"min.cleanable.dirty.ratio": "٠.5"}])
def test_config_values_refused_with_einval(updates):
    with pytest.raises(InvalidConfigError) as info:
        validate_topic_overrides(updates)
    assert len(str(info.value)) < 300                         # a 5,000-digit value stays one short line


def test_config_values_accepted():
    validate_topic_overrides({"retention.ms": "-1", "segment.bytes": "1048576", "cleanup.policy": None,
                              "min.cleanable.dirty.ratio": "0.25"})
