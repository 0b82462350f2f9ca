"""The least a pyfuse3 file system can cost a reader or a writer: bytes from memory, writes dropped.

``bench_reads.py --floor`` mounts this beside logfs and reads it the same
way: what is left between a view's read and a plain file's once logfs's own
work (finding the records, rendering them) is taken away.  The file is
``records`` at the mount's root, the bytes of ``SOURCE`` (an ``mmap`` of it,
so the bytes are in memory before the first read), served through the page
cache (``keep_cache``) or with ``--direct-io``, with the same FUSE options
and readahead as a logfs mount; and ``append``, whose writes are taken and
dropped (``bench_open.py --floor``: a shell loop's open, write, flushes and
release with nothing done).  Not part of logfs; a measuring instrument.

    .venv/bin/python scripts/bench/fuse_floor.py MOUNTPOINT SOURCE [--direct-io]
"""

from __future__ import annotations

import argparse
import errno
import mmap
import os
import stat
import sys

import pyfuse3
import trio

ROOT_INODE = pyfuse3.ROOT_INODE
FILE_INODE = ROOT_INODE + 1
APPEND_INODE = ROOT_INODE + 2
NAME = b"records"
APPEND = b"append"


class Floor(pyfuse3.Operations):
    """One read-only file whose reads are slices of an ``mmap``: no lookup, render or copy of our own."""

    def __init__(self, data: mmap.mmap, direct_io: bool) -> None:
        super().__init__()
        self._data = data
        self._view = memoryview(data)
        self._direct_io = direct_io

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        if inode == ROOT_INODE:
            attr.st_mode = stat.S_IFDIR | 0o755
            attr.st_nlink = 2
        elif inode == APPEND_INODE:
            attr.st_mode = stat.S_IFREG | 0o644
            attr.st_nlink = 1
        else:
            attr.st_mode = stat.S_IFREG | 0o444
            attr.st_nlink = 1
            attr.st_size = len(self._data)
        attr.st_blksize = 1 << 20        # as logfs reports for its views
        attr.attr_timeout = attr.entry_timeout = 1.0        # as logfs caches its stable names
        return attr

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        if inode not in (ROOT_INODE, FILE_INODE, APPEND_INODE):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    async def lookup(self, parent_inode: int, name: bytes,
                     ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        if parent_inode != ROOT_INODE or name not in (NAME, APPEND):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(FILE_INODE if name == NAME else APPEND_INODE)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if inode == APPEND_INODE:
            return pyfuse3.FileInfo(fh=inode, direct_io=True)
        if inode != FILE_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        return pyfuse3.FileInfo(fh=inode, direct_io=self._direct_io, keep_cache=not self._direct_io)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise pyfuse3.FUSEError(errno.EACCES)

    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return len(buf)

    async def flush(self, fh: int) -> None:
        pass

    async def release(self, fh: int) -> None:
        pass

    async def read(self, fh: int, off: int, size: int) -> memoryview:
        return self._view[off:off + size]

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        if start_id == 0:
            pyfuse3.readdir_reply(token, NAME, self._attr(FILE_INODE), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint")
    parser.add_argument("source")
    parser.add_argument("--direct-io", action="store_true")
    args = parser.parse_args()
    with open(args.source, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    data.madvise(mmap.MADV_WILLNEED)
    ops = Floor(data, args.direct_io)
    options = set(pyfuse3.default_options) | {"fsname=fusefloor", "subtype=fusefloor"}
    pyfuse3.init(ops, args.mountpoint, options)
    try:
        # the same readahead as a logfs mount (logfs.cli._raise_readahead)
        from logfs.cli import _raise_readahead

        async def serve() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, _raise_readahead, args.mountpoint)
                await pyfuse3.main()
        trio.run(serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
