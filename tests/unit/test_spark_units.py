"""Pieces of the ``logfs`` Spark source that need neither a JVM nor a mount.

The option parsing of Spark's Kafka source (logfs.spark.options) and the
``failOnDataLoss`` rule (logfs.spark.mount_client.skip_deleted), the one place
the source decides what a deleted offset range means.  Reading through a real
mount with a real SparkSession is tests/spark/test_spark.py's subject.
"""

from __future__ import annotations

import logging
import pickle

import pytest

from engine.errors import InvalidConfigError, OffsetOutOfRangeError
from logfs.spark.mount_client import skip_deleted
from logfs.spark.options import SourceOptions


def test_fail_on_data_loss_true_fails_naming_the_deleted_range(caplog):
    with pytest.raises(OffsetOutOfRangeError) as exc:
        skip_deleted(True, "t-0", 3, 10, 25)
    assert str(exc.value).startswith("Offsets [3, 10) of t-0 were deleted (retention or DeleteRecords)")
    assert "Set failOnDataLoss=false to skip them" in str(exc.value)
    assert (exc.value.offset, exc.value.log_start_offset, exc.value.log_end_offset) == (3, 10, 25)
    assert caplog.records == []


def test_an_option_below_the_log_start_says_which_option(caplog):
    with pytest.raises(OffsetOutOfRangeError, match=r"^startingOffsets offset 3 for t-0 is below the log start "
                                                    r"offset 10: Offsets \[3, 10\) of t-0 were deleted"):
        skip_deleted(True, "t-0", 3, 10, 25, option="startingOffsets")


def test_fail_on_data_loss_false_skips_to_the_log_start_with_one_warning(caplog):
    caplog.set_level(logging.INFO, logger="logfs.spark")
    assert skip_deleted(False, "t-0", 3, 10, 25) == 10
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "[logfs source] Offsets [3, 10) of t-0 were deleted before they were read; "
                          "skipping them (failOnDataLoss=false)")]


@pytest.mark.parametrize(("options", "message"), [
    ({}, "Option 'path' (the logfs mount point) is required"),
    ({"subscribe": "t"}, "Option 'path' (the logfs mount point) is required"),
    ({"path": "MOUNT"}, "Exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be given, "
                        "found none"),
    ({"path": "MOUNT", "subscribe": "t", "assign": '{"t":[0]}'}, "Exactly one of the options"),
    ({"path": "MOUNT", "subscribe": " , "}, "Option 'subscribe' names no topic"),
    ({"path": "MOUNT", "subscribePattern": "("}, "Option 'subscribePattern': invalid pattern"),
    ({"path": "MOUNT", "assign": "[0]"}, "Option 'assign': expected JSON like"),
    ({"path": "MOUNT", "assign": "{}"}, "Option 'assign' names no partition"),
])
def test_bad_options_are_refused_with_kafkas_option_names(tmp_path, options, message):
    options = {k: (str(tmp_path) if v == "MOUNT" else v) for k, v in options.items()}
    with pytest.raises(InvalidConfigError) as exc:
        SourceOptions.parse(options)
    assert str(exc.value).startswith(message)


def test_a_path_that_is_no_directory_is_refused(tmp_path):
    with pytest.raises(InvalidConfigError, match="is not a directory"):
        SourceOptions.parse({"path": str(tmp_path / "nothing"), "subscribe": "t"})


def test_options_parse_as_spark_kafka_source_does(tmp_path):
    opts = SourceOptions.parse({"path": str(tmp_path), "assign": '{"b":[1,0],"a":[2]}',
                                "failOnDataLoss": "false", "includeHeaders": "true"})
    assert opts.assign == (("a", 2), ("b", 0), ("b", 1))
    assert (opts.fail_on_data_loss, opts.include_headers, opts.read_format) == (False, True, "segments")
    defaults = SourceOptions.parse({"path": str(tmp_path), "subscribe": "x, y"})
    assert defaults.subscribe == ("x", "y")
    assert (defaults.fail_on_data_loss, defaults.include_headers) == (True, False)


@pytest.mark.parametrize(("name", "value"),
                         [("readFormat", "parquet"), ("startingOffsetsByTimestampStrategy", "never")])
def test_an_option_with_a_few_spellings_names_them(tmp_path, name, value):
    with pytest.raises(InvalidConfigError, match=rf"Invalid value '{value}' for option {name}: expected one of \("):
        SourceOptions.parse({"path": str(tmp_path), "subscribe": "t", name: value})
    assert SourceOptions.parse({"path": str(tmp_path), "subscribe": "t", "readFormat": " JSONL"}).read_format == "jsonl"


def test_spark_pickles_the_source_by_module_path_for_its_workers(tmp_path):
    # Spark ships the DataSource class and the planned partitions with cloudpickle; its
    # Python workers import them back from their module path, which must stay importable.
    from pyspark import cloudpickle

    from logfs.spark import LogfsDataSource, OffsetRangePartition

    shipped = cloudpickle.dumps(LogfsDataSource)
    assert b"logfs.spark.source" in shipped
    assert b"LogfsDataSource" in shipped
    assert pickle.loads(shipped) is LogfsDataSource
    opts = SourceOptions.parse({"path": str(tmp_path), "subscribe": "t"})
    rng = OffsetRangePartition("t", 3, 10, 20)
    assert pickle.loads(cloudpickle.dumps(opts)) == opts
    back = pickle.loads(cloudpickle.dumps(rng))
    assert (type(back), back.topic, back.partition, back.from_offset, back.until_offset) == (
        OffsetRangePartition, "t", 3, 10, 20)
