"""Page-cache views never let the kernel show the zeros it fills a short read with.

A READ answered with fewer bytes than it asked for means end of file to the
kernel: it fills the rest of the request's pages with zeros, marks them up to
date and keeps them.  The size it holds hides them, as long as that size is no
larger than where the answer ended.  Two ways a view broke that, both seen as a
line of ``records.jsonl`` beginning with NUL bytes (test_mount_cleaner's
readers, once in a loaded suite; three readers at EOF of a mount with three
lines appended a millisecond read about fifty runs of NULs in 30 s):

* a larger size reached the kernel while those pages were cached.  A view's
  log grows, the kernel asks the size again and applies it: it sets the new
  size first and drops its cached pages after (``fuse_change_attributes``: the
  whole mapping, page by page from the first, the zero-filled last page last),
  and a reader on another CPU reads the zeros in between.  A reader waiting for
  that very READ copies its answer only once it runs again, up to the size it
  finds then (``filemap_read``);
* a READ rendered in a worker thread was answered after a size answered
  meanwhile on the trio thread: its pages are zero-filled inside the size the
  kernel holds, and with the attribute invalidation of the append in between
  (its ``attr_version`` moved) the kernel does not shrink the size to the
  answer (``fuse_read_update_size``).

No real mount orders a kernel's copy or its page walk on demand (the
workload of tests/mount/test_mount_page_cache.py's
``test_readers_at_eof_of_a_growing_view_never_read_zeros`` makes the first
frequent), so the kernel's side is modelled here (``KernelPages``: the
zero-filled bytes each short READ leaves, dropped by a data invalidation): a
size answered beyond them is the failure, whatever the kernel's timing.  The
operations, the namespace and the log are the real ones, and a worker thread
paused between its rendering and the answer orders the second race exactly.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import pyfuse3
import pytest
import trio

from engine.topic import TopicPartition
from tests.helpers import log_of, namespace_manager, page_cache_ops  # noqa: F401  (the manager and ops fixtures)

if TYPE_CHECKING:
    from engine.manager import LogManager
    from logfs.fs import LogfsOperations

TP = TopicPartition("t", 0)


class KernelPages:
    """The zero-filled bytes the kernel keeps of each inode: from where a short READ's answer ended on."""

    def __init__(self) -> None:
        self.zeros_from: dict[int, int] = {}
        self.data_invalidations = 0
        self.lock = threading.Lock()

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        if not attr_only:
            with self.lock:
                self.zeros_from.pop(ino, None)         # every cached page of the inode dropped
                self.data_invalidations += 1

    def answered(self, ino: int, offset: int, size: int, data: bytes | memoryview) -> None:
        if len(data) < size:
            with self.lock:
                end = offset + len(data)
                self.zeros_from[ino] = min(self.zeros_from.get(ino, end), end)

    def shows_zeros(self, ino: int, size: int) -> bool:
        """Whether a file of ``size`` bytes would read zeros the kernel filled in."""
        with self.lock:
            start = self.zeros_from.get(ino)
        return start is not None and start < size


@pytest.fixture(name="kernel")
def kernel_pages(monkeypatch: pytest.MonkeyPatch) -> KernelPages:
    kernel = KernelPages()
    monkeypatch.setattr(pyfuse3, "invalidate_inode", kernel.invalidate_inode)
    return kernel


async def _lookup(ops: LogfsOperations, *names: bytes) -> int:
    ino = pyfuse3.ROOT_INODE
    for name in names:
        ino = (await ops.lookup(ino, name)).st_ino
    return ino


async def _read(ops: LogfsOperations, kernel: KernelPages, ino: int, fh: int, offset: int, size: int) -> bytes:
    data = await ops.read(fh, offset, size)
    kernel.answered(ino, offset, size, data)
    return bytes(data)


@pytest.mark.parametrize("name", [b"records", b"records.jsonl"])
@pytest.mark.parametrize("appended_by", ["the log", "a write of the mount"])
def test_a_size_beyond_a_short_read_is_answered_only_once_the_kernel_dropped_its_zeros(
        ops: LogfsOperations, manager: LogManager, kernel: KernelPages, name: bytes, appended_by: str) -> None:
    async def scenario() -> None:
        ino = await _lookup(ops, b"t", b"0", name)
        fh = (await ops.open(ino, os.O_RDONLY, None)).fh
        size = (await ops.getattr(ino)).st_size
        assert await _read(ops, kernel, ino, fh, 0, 4096) != b""       # the whole view: a short READ
        assert kernel.shows_zeros(ino, size + 1)
        if appended_by == "the log":      # a replica fetcher, another process's producer
            log_of(manager, TP).append_values([b"appended"])
        else:
            append = await _lookup(ops, b"t", b"0", b"append")
            writer = (await ops.open(append, os.O_WRONLY, None)).fh
            await ops.write(writer, 0, b"appended\n")
            await ops.flush(writer)
            await ops.release(writer)
        for answer in (await ops.getattr(ino), await ops.lookup(await _lookup(ops, b"t", b"0"), name)):
            assert not kernel.shows_zeros(ino, answer.st_size), \
                f"size {answer.st_size} answered while the kernel holds zeros from {kernel.zeros_from[ino]}"
        # the kernel learns the grown size, and reads on from where it was
        grown = (await ops.getattr(ino)).st_size
        assert grown > size
        rest = await _read(ops, kernel, ino, fh, size, 4096)
        assert len(rest) == grown - size
        assert b"appended" in rest
        await ops.release(fh)

    trio.run(scenario)


def test_a_read_rendered_in_a_thread_ends_no_earlier_than_a_size_answered_meanwhile(
        ops: LogfsOperations, manager: LogManager, kernel: KernelPages) -> None:
    log = log_of(manager, TP)
    log.append_values([b"%05d-" % i + b"x" * 94 for i in range(3000)])     # 300 KB of text

    async def scenario() -> None:
        ino = await _lookup(ops, b"t", b"0", b"records")
        fh = (await ops.open(ino, os.O_RDONLY, None)).fh
        handle = ops._handles[fh][1]
        size = (await ops.getattr(ino)).st_size
        request = 512 * 1024
        assert size < request
        assert request >= (handle.offload_reads_from or 0)                      # a first large read: a thread
        rendered, proceed = threading.Event(), threading.Event()
        render = handle.read

        def paused(offset: int, size: int) -> bytes | memoryview:
            data = render(offset, size)
            if not rendered.is_set():
                rendered.set()
                proceed.wait(30)
            return data

        handle.read = paused      # type: ignore[method-assign]
        answer: list[bytes] = []

        async def read() -> None:
            answer.append(await _read(ops, kernel, ino, fh, 0, request))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.to_thread.run_sync(rendered.wait)        # the view rendered, its answer not sent yet
            log.append_values([b"appended meanwhile"])
            grown = (await ops.getattr(ino)).st_size          # answered while the READ is on its way
            assert grown > size
            proceed.set()
        assert len(answer[0]) >= min(request, grown), \
            f"READ answered {len(answer[0])} bytes after size {grown} was answered: zeros inside the file"
        assert answer[0].endswith(b"appended meanwhile\n")
        await ops.release(fh)

    trio.run(scenario)


def test_a_view_that_grew_after_a_short_render_completes_the_answer(ops: LogfsOperations, manager: LogManager) -> None:
    """The view's rendering ended short of the request, and an append landed before the check of its end
    (a read in a worker thread, an append of another thread): the answer takes the new bytes, where it
    failed the read with EIO ("ended before its end")."""
    async def scenario() -> None:
        ino = await _lookup(ops, b"t", b"0", b"records")
        fh = (await ops.open(ino, os.O_RDONLY, None)).fh
        handle = ops._handles[fh][1]
        rendered = handle._view.read_buffer(0, 4096)          # type: ignore[attr-defined]
        log_of(manager, TP).append_values([b"appended"])
        answer = handle._whole(rendered, 0, 4096)              # type: ignore[attr-defined]
        assert bytes(answer) == bytes(rendered) + b"appended\n"
        await ops.release(fh)

    trio.run(scenario)
