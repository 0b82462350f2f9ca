"""What the page-cache mode of the namespace tells the FUSE layer, without FUSE.

The FUSE side (cached pages dropped, attributes invalidated) is driven
through a real mount in test_mount_page_cache.py; these cover what a mount
test cannot reach on demand: a truncation of the log (a replica's truncation
to its leader, an append rolled back) and which changes are reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.topic import TopicPartition
from logfs.namespace import Namespace
from logfs.nodes import ViewFile
from logfs.stats import MountStats
from tests.helpers import log_of, namespace_manager, walk_to  # noqa: F401  (the manager fixture)

if TYPE_CHECKING:
    from engine.manager import LogManager

TP = TopicPartition("t", 0)


def _records(ns: Namespace) -> ViewFile:
    return walk_to(ns, "t/0/records", ViewFile)


def test_a_truncation_moves_the_mtime_of_a_view(manager: LogManager) -> None:
    ns = Namespace(manager, MountStats(), views_direct_io=False)
    view = _records(ns)
    log = log_of(manager, TP)
    before = view.mtime_ns()
    assert view.mtime_ns() == before                     # nothing changed: the same mtime
    modified = log.active_segment.last_modified
    assert log.truncate_to(5)
    # the .log's own mtime may not move (the same millisecond, a coarse clock): the view's still does
    log.active_segment.set_last_modified(modified)
    after = view.mtime_ns()
    assert after > before                                # the kernel drops what it cached of the view
    assert view.mtime_ns() == after


def test_page_cache_views_report_every_change_of_the_log_end(manager: LogManager) -> None:
    ns = Namespace(manager, MountStats(), views_direct_io=False)
    changed: list[TopicPartition] = []
    ns.views_changed_listeners.append(changed.append)
    view = _records(ns)
    assert view.attr_timeout > 0
    log = log_of(manager, TP)
    log.append_values([b"x"])
    assert changed == [TP]
    log.truncate_to(3)
    assert changed == [TP, TP]
    _records(ns)                                          # a second view: still one report per change
    log.append_values([b"y"])
    assert changed == [TP, TP, TP]


def test_direct_io_views_report_nothing(manager: LogManager) -> None:
    ns = Namespace(manager, MountStats())
    changed: list[TopicPartition] = []
    ns.views_changed_listeners.append(changed.append)
    assert _records(ns).attr_timeout == 0
    log_of(manager, TP).append_values([b"x"])
    assert changed == []
    assert log_of(manager, TP).end_listeners == []
