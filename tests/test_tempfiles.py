"""Temporary files next to config and append without FUSE: names, space, and what a rename applies."""

from __future__ import annotations

import errno

import pytest

from engine.errors import LogfsError
from engine.topic import TopicPartition
from logfs import tempfiles
from logfs.namespace import Namespace
from logfs.stats import MountStats
from logfs.tempfiles import TempFiles
from tests.helpers import started_manager


@pytest.fixture
def ns(tmp_path):
    manager = started_manager(str(tmp_path / "data"), 1)
    yield Namespace(manager, MountStats())
    manager.shutdown()


def test_created_written_renamed_over_append_and_config(ns):
    temps = TempFiles(ns)
    topic, partition = ns.root.lookup("t"), ns.root.lookup("t").lookup("0")
    node = temps.create(partition, ".append.X1")
    assert temps.names(partition) == [".append.X1"] and temps.get(partition, ".append.X1") is node
    node.write(0, b"a\nb\n")
    assert temps.rename(partition, ".append.X1", partition, "append")
    assert [r.value for r in ns.log(TopicPartition("t", 0)).read_records(10)] == [b"a", b"b"]
    assert temps.names(partition) == []
    conf = temps.create(topic, "sedAB12")
    conf.write(0, b"# a comment\nretention.ms=5000\n")
    assert temps.rename(topic, "sedAB12", topic, "config")
    assert ns.manager.topic_overrides("t") == {"retention.ms": "5000"}
    assert not temps.rename(topic, "no-such-temp", topic, "config")        # not ours: the caller refuses


def test_refusals_leave_things_as_they_were(ns):
    temps = TempFiles(ns)
    topic = ns.root.lookup("t")
    with pytest.raises(LogfsError) as exc:
        temps.create(topic, "config")                                       # an existing name
    assert exc.value.errno == errno.EEXIST
    with pytest.raises(LogfsError) as exc:
        temps.create(ns.root, "x")                                          # not next to config/append
    assert exc.value.errno == errno.EPERM
    bad = temps.create(topic, "tmp")
    bad.write(0, b"retention.ms=soon\n")
    with pytest.raises(LogfsError) as exc:
        temps.rename(topic, "tmp", topic, "config")
    assert exc.value.errno == errno.EINVAL and temps.get(topic, "tmp") is bad   # stays for the user to fix
    with pytest.raises(LogfsError) as exc:
        temps.rename(topic, "tmp", topic, "delete")                          # only config and append take it
    assert exc.value.errno == errno.EPERM


def test_space_is_bounded_and_given_back(ns, monkeypatch):
    monkeypatch.setattr(tempfiles, "MAX_BYTES", 1000)
    temps = TempFiles(ns)
    topic = ns.root.lookup("t")
    first = temps.create(topic, "a")
    first.write(0, b"x" * 800)
    second = temps.create(topic, "b")
    with pytest.raises(LogfsError) as exc:
        second.write(0, b"y" * 300)
    assert exc.value.errno == errno.ENOSPC
    assert temps.unlink(topic, "a")
    second.write(0, b"y" * 300)                                             # the removed file's bytes are back
    first.write(800, b"z")                                                  # still open: writable, not counted
    second.truncate(0)
    second.write(0, b"y" * 1000)
