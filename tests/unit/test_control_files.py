"""The control files of the namespace without FUSE: ``config`` lines and ``delete`` markers.

Each test opens the node the mount would open (``logfs.namespace``) over a real
LogManager on disk and writes to its handle as ``echo ... > file`` would, one
``write()`` per call, then ``close()`` (``flush``).  The numbers inside markers
(canonical spellings) are tests/unit/test_namespace_parsing.py's subject.
"""

from __future__ import annotations

import errno
import logging
import os

import pytest

from engine.errors import InvalidConfigError, InvalidRequestError, ReadOnlyError
from engine.topic import TopicPartition
from logfs.control import PartitionDeleteFile, TopicConfigFile, TopicDeleteFile
from logfs.handles import LineCommandHandle
from logfs.namespace import Namespace
from logfs.stats import MountStats
from tests.helpers import log_of, namespace, namespace_manager  # noqa: F401  (the ns and manager fixtures)

TP = TopicPartition("t", 0)


def records(manager) -> list[tuple[int, bytes | None, bytes | None]]:
    log = log_of(manager, TP)
    return [(r.offset, r.key, r.value) for r in log.read_records(log.log_start_offset)]


# --------------------------------------------------------------------------- line handling


def test_line_command_handle_applies_each_writes_complete_lines_together():
    applied: list[list[bytes]] = []
    handle = LineCommandHandle(applied.append)
    assert handle.write(0, b"a=1\nb=") == 6
    assert handle.write(0, b"2\n\n  \nc=3") == 9       # blank lines are not commands
    assert applied == [[b"a=1"], [b"b=2"]]
    handle.flush()                                       # close(): the unterminated last line
    handle.flush()                                       # ... once
    assert applied == [[b"a=1"], [b"b=2"], [b"c=3"]]


def test_a_failed_write_keeps_the_buffer_as_it_was_so_a_retry_is_safe():
    applied: list[list[bytes]] = []

    def apply(lines: list[bytes]) -> None:
        if b"bad" in b"".join(lines):
            raise InvalidRequestError("bad line")
        applied.append(lines)

    handle = LineCommandHandle(apply)
    handle.write(0, b"first\nse")
    with pytest.raises(InvalidRequestError):
        handle.write(0, b"cond bad\nthird")
    handle.write(0, b"cond\nthird")                     # the writer's corrected retry of that write
    handle.flush()
    assert applied == [[b"first"], [b"second"], [b"third"]]


# --------------------------------------------------------------------------- config

def _config_text(ns: Namespace, topic: str = "t") -> bytes:
    """The whole text of a topic's config file, as one read of it answers."""
    return bytes(TopicConfigFile(ns, topic).open(write=False).read(0, 1 << 20))


def test_config_shows_overrides_as_lines_and_defaults_as_comments(ns, manager):
    manager.alter_topic_config("t", {"internal.segment.bytes": "4096"})
    text = _config_text(ns)
    lines = text.decode().splitlines()
    assert text.endswith(b"\n")
    assert lines[0].startswith("# Overrides of topic t")
    overrides = [line for line in lines if not line.startswith("#")]
    assert overrides == ["internal.segment.bytes=4096"]
    defaults = [line[1:] for line in lines if line.startswith("#") and not line.startswith("# ")]
    assert defaults == sorted(defaults)
    assert "retention.ms=604800000" in defaults                                    # the broker's default
    assert dict(line.split("=", 1) for line in overrides + defaults) == manager.topic_config("t").to_props()


def _write(ns, data: bytes, flags: int) -> None:
    handle = TopicConfigFile(ns, "t").open(write=True)
    handle.opened(flags)
    handle.write(0, data)
    handle.flush()
    handle.release()


def test_the_text_read_written_back_with_o_trunc_keeps_the_overrides_and_the_defaults(ns, manager):
    """An editor saving the buffer (or cat config > x; cat x > config): nothing becomes an override."""
    manager.alter_topic_config("t", {"internal.segment.bytes": "4096", "cleanup.policy": "compact"})
    text = _config_text(ns)
    _write(ns, text, os.O_WRONLY | os.O_TRUNC)
    assert manager.topic_overrides("t") == {"internal.segment.bytes": "4096", "cleanup.policy": "compact"}
    _write(ns, b"retention.ms=1234\n", os.O_WRONLY | os.O_TRUNC)          # >: the set of overrides
    assert manager.topic_overrides("t") == {"retention.ms": "1234"}
    _write(ns, b"segment.ms=60000\n", os.O_WRONLY | os.O_APPEND)          # >>: added
    assert manager.topic_overrides("t") == {"retention.ms": "1234", "segment.ms": "60000"}
    _write(ns, b"", os.O_WRONLY | os.O_TRUNC)                               # : > config: none left
    assert manager.topic_overrides("t") == {}


@pytest.mark.parametrize("separator", [" ", "::", " | ", "\t"])
def test_any_key_separator_is_taken_verbatim(ns, manager, separator):
    _write(ns, f"parse.key=true\nkey.separator={separator}\n".encode(), os.O_WRONLY | os.O_APPEND)
    assert manager.topic_config("t").key_separator == separator
    assert f"\nkey.separator={separator}\n" in _config_text(ns).decode()


def test_config_lines_are_checked_at_each_write_and_applied_together_at_close(ns, manager, caplog):
    handle = TopicConfigFile(ns, "t").open(write=True)
    with caplog.at_level(logging.INFO):
        handle.write(0, b"# a comment\n\n  retention.ms = 1234 \ninternal.segment.")
        handle.write(0, b"bytes=4096\n")
        assert manager.topic_config("t").retention_ms == 604800000      # an edit in pieces: nothing yet
        handle.flush()                                                   # close(): all of it at once
    assert manager.topic_config("t").retention_ms == 1234
    assert manager.topic_config("t").segment_size == 4096
    changes = [r.getMessage() for r in caplog.records if "retention.ms=1234" in r.getMessage()]
    assert changes == ["Updated config of topic t: retention.ms=1234, internal.segment.bytes=4096"]   # logged once
    handle = TopicConfigFile(ns, "t").open(write=True)
    handle.write(0, b"retention.ms=")                   # name= removes the override; the last line at close
    handle.flush()
    assert manager.topic_config("t").retention_ms == 604800000
    assert manager.topic_config("t").segment_size == 4096


@pytest.mark.parametrize(("line", "message"), [
    (b"retention.ms 1234", "Invalid config line 'retention.ms 1234' for topic t: expected name=value"),
    (b"=5", "Invalid config line '=5' for topic t: expected name=value"),
    (b"no.such.config=1", "no.such.config"),
    (b"internal.segment.bytes=12", "segment.bytes"),
])
def test_a_bad_config_line_abandons_everything_written_through_that_opening(ns, manager, line, message):
    before = manager.topic_config("t")
    handle = TopicConfigFile(ns, "t").open(write=True)
    handle.write(0, b"internal.segment.bytes=4096\n")
    with pytest.raises(InvalidConfigError) as exc:
        handle.write(0, b"retention.ms=1234\n" + line + b"\n")
    assert exc.value.errno == errno.EINVAL
    assert message in str(exc.value)
    assert str(exc.value).endswith("; nothing written to t/config through this opening will be applied")
    with pytest.raises(InvalidConfigError, match="an earlier line written through this opening was refused"):
        handle.write(0, b"cleanup.policy=compact\n")
    handle.flush()                                       # the close succeeds and applies nothing
    assert manager.topic_config("t") == before           # not even the good lines around it


# --------------------------------------------------------------------------- delete markers


def test_before_marker_is_delete_records_and_key_marker_a_tombstone(ns, manager):
    handle = PartitionDeleteFile(ns, TP).open(write=True)
    handle.write(0, b"before 4\n")
    assert log_of(manager, TP).log_start_offset == 4
    handle.write(0, b"  key user 42\r\nbefore 6\r\n")    # leading blanks and CRLF endings are tolerated
    assert records(manager) == [(o, None, b"v%d" % o) for o in range(6, 10)] + [(10, b"user 42", None)]
    assert ns.stats.appended_records == 1                # the tombstone counts as an append


_MARKER_HELP = "for t-0/delete: expected 'before <offset>' (the offset in digits, no leading zero) or 'key <key>'"


@pytest.mark.parametrize(("marker", "message"), [
    (b"before 11", "Cannot delete records of t-0 before offset 11: it is beyond the log end offset 10"),
    (b"before", f"Invalid marker 'before' {_MARKER_HELP}"),
    (b"key", f"Invalid marker 'key' {_MARKER_HELP}"),
    (b"after 3", f"Invalid marker 'after 3' {_MARKER_HELP}"),
    (b"before -1", f"Invalid marker 'before -1' {_MARKER_HELP}"),
    (b"before 3 4", f"Invalid marker 'before 3 4' {_MARKER_HELP}"),
])
def test_a_bad_marker_applies_none_of_the_write(ns, manager, marker, message):
    handle = PartitionDeleteFile(ns, TP).open(write=True)
    with pytest.raises(InvalidRequestError) as exc:
        handle.write(0, b"key a\nbefore 2\n" + marker + b"\n")
    assert exc.value.errno == errno.EINVAL
    assert str(exc.value) == message
    assert records(manager) == [(o, None, b"v%d" % o) for o in range(10)]
    assert log_of(manager, TP).log_start_offset == 0


def test_topic_delete_marker(ns, manager):
    handle = TopicDeleteFile(ns, "t").open(write=True)
    with pytest.raises(InvalidRequestError, match="Invalid marker 'yes' for t/delete: expected 'topic'"):
        handle.write(0, b"yes\n")
    assert manager.topics() == ["t"]
    handle.write(0, b"topic\n")
    assert manager.topics() == []


def test_a_read_only_namespace_refuses_every_control_file_for_writing(manager):
    ro = Namespace(manager, MountStats(), read_only=True)
    for node in (TopicConfigFile(ro, "t"), TopicDeleteFile(ro, "t"), PartitionDeleteFile(ro, TP)):
        with pytest.raises(ReadOnlyError) as exc:
            node.open(write=True)
        assert exc.value.errno == errno.EROFS
    assert b"\n#cleanup.policy=delete\n" in _config_text(ro)
