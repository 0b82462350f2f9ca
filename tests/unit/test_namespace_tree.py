"""The directories and the node table of the namespace without FUSE (logfs.dirs, logfs.namespace).

Each test looks names up as ``logfs.fs`` would, over a real LogManager on disk:
which names a directory lists, what a malformed or out-of-range name raises
(with its errno), and SPEC.md's "one path, one file": the same node object for
a name while its content is the same file, a new one once it was replaced.
Writing to control files is tests/unit/test_control_files.py's subject.
"""

from __future__ import annotations

import errno

import pytest

from engine.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError
from engine.files import offset_from_file_name, parse_segment_file_name
from engine.topic import TopicPartition
from logfs.errors import MalformedNameError, NoSuchNameError, shown
from logfs.namespace import Namespace
from logfs.nodes import Directory, FileNode
from tests.helpers import log_of, namespace, namespace_manager, walk, walk_to  # noqa: F401  (the ns and manager fixtures)

TP = TopicPartition("t", 0)
NAMESPACE_PARTITIONS = 2


def test_directories_list_the_tree_of_the_spec(ns):
    assert {"t", ".logfs"} <= set(ns.root.names())
    topic = set(walk_to(ns, "t", Directory).names())
    assert {"0", "1", "append", "append.jsonl", "config", "delete", "groups"} <= topic
    partition = set(walk_to(ns, "t/0", Directory).names())
    assert {"records", "records.jsonl", "state", "append", "delete", "offset", "from", "since",
            "segments", "consume"} <= partition
    assert walk_to(ns, "t/0/segments", Directory).names() == [
        "00000000000000000000" + suffix for suffix in (".log", ".index", ".timeindex", ".jsonl")]


@pytest.mark.parametrize("path", ["t/0/offset/007", "t/0/offset/-1", "t/0/from/x.jsonl", "t/0/from/+3",
                                  "t/0/since/yesterday", "t/0/since/\u0661\u0662"])
def test_a_malformed_name_is_enoent_and_says_what_a_name_must_be(ns, path):
    with pytest.raises(MalformedNameError) as exc:
        walk(ns, path)
    assert exc.value.errno == errno.ENOENT
    assert path.rsplit("/", 1)[1] in str(exc.value)


def test_missing_names_are_enoent(ns):
    with pytest.raises(NoSuchNameError) as exc:
        walk(ns, "t/0/segments/00000000000000000009.log")
    assert exc.value.errno == errno.ENOENT
    with pytest.raises(NoSuchNameError, match="No partition '7' in topic t"):
        walk(ns, "t/7")
    with pytest.raises(MalformedNameError, match="a partition is written in ASCII digits"):
        walk(ns, "t/01")
    with pytest.raises((NoSuchNameError, UnknownTopicOrPartitionError)) as unknown:
        walk(ns, "nope")
    assert unknown.value.errno == errno.ENOENT


def test_an_offset_beyond_the_log_end_names_no_view(ns):
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 11 is outside the log .*log end offset 10"):
        walk(ns, "t/0/from/11")
    assert walk(ns, "t/0/from/10").size() == 0      # the log end: an empty view that grows


def test_offset_names_read_the_record_value(ns):
    node = walk_to(ns, "t/0/offset/3", FileNode)
    assert node.open(False).read(0, 100) == b"v3\n"


def test_one_path_one_node_while_the_content_is_the_same_file(ns, manager):
    records = walk(ns, "t/0/records")
    since = walk(ns, "t/0/since/0")
    offset = walk(ns, "t/0/offset/3")
    assert walk(ns, "t/0/records") is records
    assert walk(ns, "t/0/since/0") is since
    assert walk(ns, "t/0/offset/3") is offset
    # Appends only grow a view: still the same file.
    log_of(manager, TP).append_values([b"v10"])
    assert walk(ns, "t/0/records") is records
    # Deleting records below offset 5 replaces what the views from the log start show.
    manager.delete_records(TP, 5)
    assert walk(ns, "t/0/records") is not records
    assert walk(ns, "t/0/from/5") is walk(ns, "t/0/from/5")


def test_a_forgotten_content_node_leaves_the_table_and_keeps_its_inode_if_unchanged(ns):
    node = walk(ns, "t/0/from/2")
    node.ino = 42
    ns.forgotten(node)
    again = walk(ns, "t/0/from/2")
    assert again.ino == 42


def test_shown_quotes_and_shortens_long_names():
    assert shown("abc") == "'abc'"
    long = "x" * 100
    assert shown(long) == f"{'x' * 80!r}... (100 characters)"


@pytest.mark.parametrize("name", ["0.log", "0000000000000000000.log", "000000000000000000000.log",
                                  "00000000000000000000.log.deleted", "00000000000000000000.swap",
                                  "\u0660" * 20 + ".log", "00000000000000000000.txnindex", "x.log"])
def test_segments_dir_names_only_the_20_digit_files_it_lists(ns, name):
    # one path, one file: 0.log is not another name of 00000000000000000000.log
    with pytest.raises(NoSuchNameError):
        walk(ns, f"t/0/segments/{name}")
    assert walk(ns, "t/0/segments/00000000000000000000.index").describe() == "t/0/segments/00000000000000000000.index"


def test_parse_segment_file_name_is_the_one_reading_of_segment_names():
    assert parse_segment_file_name("00000000000000000042.index.swap") == (42, ".index.swap")
    assert parse_segment_file_name("/data/t-0/00000000000000000007.log") == (7, ".log")
    assert parse_segment_file_name("42.log") == (42, ".log")               # Kafka reads any digit count
    assert parse_segment_file_name("leader-epoch-checkpoint") is None
    assert parse_segment_file_name("\u0664\u0662.log") is None           # ASCII digits only
    assert parse_segment_file_name(".log") is None
    with pytest.raises(ValueError, match="does not start with a base offset"):
        offset_from_file_name("partition.metadata")


@pytest.mark.parametrize("path", [".logfs", ".logfs/errors", "t", "t/config", "t/groups", "t/append", "t/0",
                                  "t/0/append", "t/0/records", "t/0/offset", "t/0/from", "t/0/since",
                                  "t/0/segments", "t/0/consume", "t/0/state", "t/0/from/0.jsonl"])
def test_a_node_knows_the_path_it_is_found_at(ns, path):
    """``Node.path`` is what ``.logfs/errors`` names a refusal with: the path the node was looked up by."""
    assert walk(ns, path).path() == path
    assert ns.root.path() == ""


@pytest.mark.parametrize("name", ["records", "records.jsonl"])
def test_the_whole_log_replaced_between_lookup_and_open_opens_the_log_as_it_is_now(ns, manager, name):
    """ESTALE makes the kernel look a path up once more only: a `cat records` racing two replacements
    (a clean swapping group after group) must not fail. With direct I/O the node takes the log's start."""
    node = walk_to(ns, f"t/0/{name}", FileNode)
    manager.delete_records(TP, 3)
    manager.delete_records(TP, 5)               # two replacements before the open
    handle = node.open(False)
    text = bytes(handle.read(0, 1 << 20))
    first = text.splitlines()[0]
    assert first == b"v5" if name == "records" else b'"offset":5' in first
    assert node.size() == len(text)             # the size restarts with the new start (it never goes back)


def test_a_view_anchored_at_an_offset_or_through_the_page_cache_stays_stale(manager):
    """from/N names records from N: replaced below N it is gone (ESTALE, then the lookup answers);
    through the page cache the kernel may hold the old rendering's pages, so ESTALE stays there too."""
    from logfs import stats as _stats
    from logfs.errors import StaleNameError

    direct = Namespace(manager, _stats.MountStats())
    node = walk_to(direct, "t/0/from/2", FileNode)
    manager.delete_records(TP, 4)
    with pytest.raises(StaleNameError):
        node.open(False)
    cached = Namespace(manager, _stats.MountStats(), views_direct_io=False)
    records = walk_to(cached, "t/0/records", FileNode)
    manager.delete_records(TP, 6)
    with pytest.raises(StaleNameError):
        records.open(False)


def test_the_whole_log_of_a_deleted_topic_stays_stale(ns, manager):
    """A topic deleted between lookup and open: ESTALE, so the kernel's second lookup says ENOENT."""
    from logfs.errors import StaleNameError

    node = walk_to(ns, "t/0/records", FileNode)
    manager.delete_records(TP, 3)       # replaced, as the deletion's segments leave
    manager.delete_topic("t")
    with pytest.raises(StaleNameError):
        node.open(False)
