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
    assert temps.names(partition) == [".append.X1"]
    assert temps.get(partition, ".append.X1") is node
    node.write(0, b"a\nb\n")
    assert temps.rename(partition, ".append.X1", partition, "append")
    assert [r.value for r in ns.log(TopicPartition("t", 0)).read_records(10)] == [b"a", b"b"]
    assert temps.names(partition) == []
    conf = temps.create(topic, "sed5pMF9y")
    conf.write(0, b"# a comment\nretention.ms=5000\n")
    assert temps.rename(topic, "sed5pMF9y", topic, "config")
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
    bad = temps.create(topic, "config.tmp")
    bad.write(0, b"retention.ms=soon\n")
    with pytest.raises(LogfsError) as exc:
        temps.rename(topic, "config.tmp", topic, "config")
    assert exc.value.errno == errno.EINVAL
    assert temps.get(topic, "config.tmp") is bad                                       # stays for the user to fix
    with pytest.raises(LogfsError) as exc:
        temps.rename(topic, "config.tmp", topic, "delete")                          # only config and append take it
    assert exc.value.errno == errno.EPERM


def test_space_is_bounded_and_given_back(ns, monkeypatch):
    monkeypatch.setattr(tempfiles, "MAX_BYTES", 1000)
    temps = TempFiles(ns)
    topic = ns.root.lookup("t")
    first = temps.create(topic, "a.tmp")
    first.write(0, b"x" * 800)
    second = temps.create(topic, "b.tmp")
    with pytest.raises(LogfsError) as exc:
        second.write(0, b"y" * 300)
    assert exc.value.errno == errno.ENOSPC
    assert temps.unlink(topic, "a.tmp")
    second.write(0, b"y" * 300)                                             # the removed file's bytes are back
    first.write(800, b"z")                                                  # still open: writable, not counted
    second.truncate(0)
    second.write(0, b"y" * 1000)


# names seen with strace (docs/usage.md, "The namespace"): sed -i, rsync, vim's swap files and probe, emacs' lock and
# auto-save files, Python's tempfile next to the target, mktemp, an editor's name.tmp, backups
TOOL_NAMES = ["sed5pMF9y", ".config.yP7neR", ".append.Ab3xYz", ".config.swp", ".config.swpx", ".config.swx",
              "4913", "5036", "config~", ".#config", ".#-emacsDFQCrz", "#config#", "tmprbao92q4",
              "tmp.Xy3AbC9dEf", "config.tmp", "append.new", "config___jb_tmp___"]


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_tools_temporary_names_are_created(ns, name):
    temps = TempFiles(ns)
    assert tempfiles.temporary_name(name)
    assert temps.create(ns.root.lookup("t").lookup("0"), name).name == name


def test_any_other_new_name_is_refused_naming_the_file_probably_meant(ns):
    temps = TempFiles(ns)
    topic, partition = ns.root.lookup("t"), ns.root.lookup("t").lookup("0")
    for parent, name, meant in ((partition, "apend", "t/0/append"), (partition, "recods", "t/0/records"),
                                (topic, "confg", "t/config"), (partition, "append.jsnl", "t/0/append.jsonl")):
        with pytest.raises(LogfsError, match=f"Cannot create .*{name}.*did you mean {meant}\\?") as exc:
            temps.create(parent, name)
        assert exc.value.errno == errno.EPERM
    with pytest.raises(LogfsError, match="Cannot create t/0/newfile") as exc:
        temps.create(partition, "newfile")                    # far from every name: refused all the same
    assert exc.value.errno == errno.EPERM
    assert temps.names(partition) == []
