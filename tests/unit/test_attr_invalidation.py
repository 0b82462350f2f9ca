"""The page-cache mode's attribute invalidations against the one race a real mount cannot force.

A view's first lookup answers its size; the looking-up process applies that
answer in the kernel only once it runs again.  On a loaded machine a change of
the log can be invalidated before that (``pyfuse3.invalidate_inode`` finds no
inode: ENOENT), and the kernel then holds the lookup's size for the whole
attribute timeout.  A busy partition of a cluster mount met it in CI: a fresh
mount's ``cat moving/0/records`` read 0 lines, exit 0, of 110,800.

No real mount can order a kernel's application of an answer after this
process's invalidation on demand, so the kernel's side of the notification is
modelled here (``KernelAttrs``: which inodes it holds, and each invalidation it
received); the operations, the namespace and the log are the real ones.  The
mount-level behaviour is covered by tests/mount/test_mount_page_cache.py and
tests/cluster/test_cluster_changes.py.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import TYPE_CHECKING

import pyfuse3
import pytest
import trio

from engine.topic import TopicPartition
from tests.helpers import log_of, namespace_manager, page_cache_ops, wait_for  # noqa: F401  (the manager and ops fixtures)

if TYPE_CHECKING:
    from engine.manager import LogManager
    from logfs.fs import LogfsOperations

TP = TopicPartition("t", 0)


class KernelAttrs:
    """The kernel's side of ``invalidate_inode``: ENOENT for an inode it has not made yet."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.invalidated: list[int] = []
        self.refused: list[int] = []
        self.lock = threading.Lock()

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        assert attr_only
        with self.lock:
            if ino not in self.held:
                self.refused.append(ino)
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
            self.invalidated.append(ino)

    def applied_lookup(self, ino: int) -> None:
        """The looking-up process ran again and made the inode, with the size it was answered."""
        with self.lock:
            self.held.add(ino)
            self.invalidated.clear()

    def was_refused(self, ino: int) -> bool:
        with self.lock:
            return ino in self.refused

    def was_invalidated(self, ino: int) -> bool:
        with self.lock:
            return ino in self.invalidated


@pytest.fixture(name="kernel")
def kernel_attrs(monkeypatch: pytest.MonkeyPatch) -> KernelAttrs:
    kernel = KernelAttrs()
    monkeypatch.setattr(pyfuse3, "invalidate_inode", kernel.invalidate_inode)
    return kernel


def _lookup_records(ops: LogfsOperations) -> int:
    async def walk() -> int:
        ino = pyfuse3.ROOT_INODE
        for name in (b"t", b"0", b"records"):
            ino = (await ops.lookup(ino, name)).st_ino
        return ino
    return trio.run(walk)


def _changed_while_the_lookup_answer_is_on_its_way(ops: LogfsOperations, manager: LogManager,
                                                   kernel: KernelAttrs) -> int:
    records = _lookup_records(ops)
    log_of(manager, TP).append_values([b"more"])        # within the settle time: invalidated a little later
    # the deferred invalidation ran and found no inode in the kernel
    wait_for(lambda: kernel.was_refused(records), "the deferred invalidation")
    return records


def test_an_open_invalidates_a_size_the_kernel_got_before_a_lost_invalidation(
        ops: LogfsOperations, manager: LogManager, kernel: KernelAttrs) -> None:
    records = _changed_while_the_lookup_answer_is_on_its_way(ops, manager, kernel)
    kernel.applied_lookup(records)                      # the kernel now holds the lookup's (old) size
    # the reader opens it: its first read at EOF must ask the size again, or it reads the old size
    trio.run(ops.open, records, os.O_RDONLY, None)
    assert kernel.was_invalidated(records)


def test_an_invalidation_that_found_no_inode_is_sent_again_once_the_kernel_holds_it(
        ops: LogfsOperations, manager: LogManager, kernel: KernelAttrs) -> None:
    records = _changed_while_the_lookup_answer_is_on_its_way(ops, manager, kernel)
    kernel.applied_lookup(records)
    # no open: a stat after the lookup must not keep the old size for the attribute timeout either
    wait_for(lambda: kernel.was_invalidated(records), "the invalidation sent again", timeout=10)


def test_an_open_of_an_unchanged_view_invalidates_nothing(
        ops: LogfsOperations, manager: LogManager, kernel: KernelAttrs) -> None:
    records = _lookup_records(ops)
    kernel.applied_lookup(records)
    trio.run(ops.open, records, os.O_RDONLY, None)
    assert not kernel.was_invalidated(records)
