#!/usr/bin/env python3
"""A FUSE layer that keeps everything not yet fsynced in memory, so a "power loss" can drop it.

    python tests/harness/powerloss_fs.py BACKING MOUNTPOINT [--torn-writes --seed N]

The mount point shows the files of ``BACKING`` and passes every operation
through, with one difference: nothing reaches ``BACKING`` before the matching
``fsync``, as on a disk behind a page cache (the counterpart of the power loss
a Kafka broker's log recovery is written for; LazyFS is the same idea):

* data writes and size changes (``write``, ``truncate``) of a file are held as
  dirty pages and a pending size until ``fsync`` of that file;
* namespace changes (``create``, ``mkdir``, ``unlink``, ``rmdir``, ``rename``,
  ``link``) are held per directory until ``fsync`` of that directory: a new
  file's name is durable only once its parent directory is fsynced, a rename
  once the directory is fsynced (across two directories: either of them, the
  rename is one journal entry on ext4);
* reads, ``stat`` and listings see the pending state, as through a page cache.

``BACKING`` always holds exactly the durable state, except for one hidden
directory (``.powerloss-fs-staging``) holding the data of files and directories
that exist but have no durable name yet.  Signals:

* ``SIGUSR1``: power loss.  Nothing more is applied; with ``--torn-writes`` a
  random subset of the dirty pages of files with a durable name is written
  (page-granular torn writes); the staging directory is removed; the layer
  unmounts itself and exits 0.  ``BACKING`` is then what the disk would hold
  after the power came back.
* ``SIGTERM``/``SIGINT``, or ``fusermount3 -u``: an orderly shutdown; every
  file and directory is made durable first (as ``sync`` before a power-off).

``--lying-fsync`` is a self-test for harnesses: ``fsync`` of a file or a
directory returns success and makes nothing durable (a disk that lies), so
acknowledged data must go missing at the next power loss.

Modes, owners and times go straight to ``BACKING`` (they are not what the
harness checks); only regular files and directories are supported (anything
else: EPERM and one log line).  The layer never fsyncs ``BACKING`` itself: the
power loss it simulates is its own, not the host's.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pyfuse3
import trio

log = logging.getLogger("powerloss_fs")

PAGE = 4096
STAGING = ".powerloss-fs-staging"
_STAGING_B = STAGING.encode()


@dataclass(eq=False)
class Node:
    """One file or directory of the mount (its FUSE inode), with its durable copy in ``BACKING``."""

    ino: int
    is_dir: bool
    fd: int | None = None                 # on the backing inode (directories: always open)
    links: int = 0                        # names in the pending (visible) namespace
    nlookup: int = 0                      # the kernel's references
    opens: int = 0                        # open handles
    blinks: set[tuple[int, bytes]] = field(default_factory=set)   # (dir ino, name) in BACKING
    staged: bool = False                  # linked as STAGING/<ino> (exactly when blinks is empty)
    # files
    size: int = 0                         # the size readers see
    dsize: int = 0                        # the durable size (of the backing file)
    valid: int = 0                        # backing bytes below this still show through
    dirty: dict[int, bytearray] = field(default_factory=dict)    # page index -> page
    mtime_ns: int = 0
    # directories
    entries: dict[bytes, int] | None = None     # pending names (None: not loaded yet)
    dentries: dict[bytes, int] | None = None    # durable names (what BACKING holds)
    renames: set[tuple[int, bytes, int, bytes]] = field(default_factory=set)  # pending cross-dir renames
    backing_key: tuple[int, int] | None = None


class PowerLossFS(pyfuse3.Operations):
    """The operations of the layer; every handler runs to its end without awaiting, so a loss never cuts one."""

    def __init__(self, backing: str, *, torn_writes: bool = False, seed: int = 0, lying_fsync: bool = False) -> None:
        super().__init__()
        self.backing = os.path.abspath(backing)
        self.torn_writes = torn_writes
        self.lying_fsync = lying_fsync
        self.rng = random.Random(seed)
        self.lost = False
        root_fd = os.open(self.backing, os.O_RDONLY | os.O_DIRECTORY)
        shutil.rmtree(os.path.join(self.backing, STAGING), ignore_errors=True)   # a crashed layer's leftovers
        os.mkdir(STAGING, 0o700, dir_fd=root_fd)
        self.staging = os.open(STAGING, os.O_RDONLY | os.O_DIRECTORY, dir_fd=root_fd)
        root = Node(pyfuse3.ROOT_INODE, True, fd=root_fd, links=1)
        self.nodes: dict[int, Node] = {root.ino: root}
        self.by_backing: dict[tuple[int, int], int] = {}
        self.next_ino = pyfuse3.ROOT_INODE + 1
        self.handles: dict[int, int] = {}
        self.dir_handles: dict[int, list[tuple[bytes, int]]] = {}
        self.next_fh = 1

    # ------------------------------------------------------------------ nodes

    def _new_node(self, is_dir: bool) -> Node:
        node = Node(self.next_ino, is_dir)
        self.next_ino += 1
        self.nodes[node.ino] = node
        return node

    def _node(self, ino: int) -> Node:
        try:
            return self.nodes[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _load(self, d: Node) -> dict[bytes, int]:
        """The pending names of a directory, read from BACKING the first time (then pending = durable)."""
        if d.entries is not None:
            return d.entries
        d.entries, d.dentries = {}, {}
        for name in os.listdir(d.fd):
            bname = os.fsencode(name)
            if d.ino == pyfuse3.ROOT_INODE and bname == _STAGING_B:
                continue
            st = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                child = self._new_node(True)
                child.fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=d.fd)
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in self.by_backing:
                    child = self.nodes[self.by_backing[key]]
                else:
                    child = self._new_node(False)
                    child.size = child.dsize = child.valid = st.st_size
                    child.mtime_ns = st.st_mtime_ns
                    child.backing_key = key
                    self.by_backing[key] = child.ino
            else:
                log.warning("%s: not a regular file or directory, left out of the mount", name)
                continue
            child.links += 1
            child.blinks.add((d.ino, bname))
            d.entries[bname] = d.dentries[bname] = child.ino
        return d.entries

    def _fd(self, node: Node) -> int:
        """The node's descriptor on its backing inode, opened through any backing name it has."""
        if node.fd is None:
            dir_fd: int | None
            if node.staged:
                dir_fd, name = self.staging, str(node.ino).encode()
            else:
                parent, name = next(iter(node.blinks))
                dir_fd = self.nodes[parent].fd
            try:
                node.fd = os.open(name, os.O_RDWR, dir_fd=dir_fd)
            except PermissionError:
                node.fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
        return node.fd

    def _needed(self, node: Node) -> bool:
        return bool(node.links or node.opens or node.nlookup or node.ino == pyfuse3.ROOT_INODE)

    def _maybe_drop(self, node: Node) -> None:
        """Forget a node nobody can reach any more (no name, no handle, no kernel reference, no backing name)."""
        if self._needed(node) or node.blinks:
            return
        if node.is_dir:
            for name, child in list((node.dentries or {}).items()):
                self._detach(node, name, self.nodes[child])
            if node.staged:
                try:
                    os.rmdir(str(node.ino), dir_fd=self.staging)
                except OSError:
                    shutil.rmtree(os.path.join(self.backing, STAGING, str(node.ino)), ignore_errors=True)
        elif node.staged:
            os.unlink(str(node.ino), dir_fd=self.staging)
        self._finalize(node)

    def _finalize(self, node: Node) -> None:
        if node.fd is not None:
            os.close(node.fd)
            node.fd = None
        if node.backing_key is not None:
            self.by_backing.pop(node.backing_key, None)
        self.nodes.pop(node.ino, None)

    # ------------------------------------------------------------------ durability

    def _detach(self, d: Node, name: bytes, node: Node) -> None:
        """Remove the durable name ``d/name`` of ``node`` from BACKING (to staging if the node lives on)."""
        assert d.dentries is not None
        del d.dentries[name]
        node.blinks.discard((d.ino, name))
        needed = self._needed(node)
        if not node.is_dir:
            if not node.blinks and needed:
                os.link(name, str(node.ino), src_dir_fd=d.fd, dst_dir_fd=self.staging, follow_symlinks=False)
                node.staged = True
            os.unlink(name, dir_fd=d.fd)
            if not node.blinks and not needed:
                self._finalize(node)
        elif needed:
            os.rename(name, str(node.ino), src_dir_fd=d.fd, dst_dir_fd=self.staging)
            node.staged = True
        else:
            for cname, child in list((node.dentries or {}).items()):
                self._detach(node, cname, self.nodes[child])
            try:
                os.rmdir(name, dir_fd=d.fd)
            except OSError:          # entries the layer left out (not files or dirs) go with it
                shutil.rmtree(os.fsdecode(name), dir_fd=d.fd)
            self._finalize(node)

    def _attach(self, d: Node, name: bytes, node: Node) -> None:
        """Give ``node`` the durable name ``d/name`` in BACKING."""
        assert d.dentries is not None
        assert name not in d.dentries
        if not node.is_dir:
            if node.staged:
                src_fd: int | None = self.staging
                src = str(node.ino).encode()
            else:
                parent, src = next(iter(node.blinks))
                src_fd = self.nodes[parent].fd
            os.link(src, name, src_dir_fd=src_fd, dst_dir_fd=d.fd, follow_symlinks=False)
            if node.staged:
                os.unlink(str(node.ino), dir_fd=self.staging)
        elif node.staged:
            os.rename(str(node.ino), name, src_dir_fd=self.staging, dst_dir_fd=d.fd)
        else:                                          # moved in from its old durable place
            (parent, old), = node.blinks
            p = self.nodes[parent]
            os.rename(old, name, src_dir_fd=p.fd, dst_dir_fd=d.fd)
            assert p.dentries is not None
            del p.dentries[old]
            node.blinks.clear()
        node.staged = False
        node.blinks.add((d.ino, name))
        d.dentries[name] = node.ino

    def _reconcile_entry(self, d: Node, name: bytes) -> None:
        if d.entries is None or d.dentries is None:
            return
        pending, durable = d.entries.get(name), d.dentries.get(name)
        if pending == durable:
            return
        if durable is not None:
            self._detach(d, name, self.nodes[durable])
        if pending is not None:
            self._attach(d, name, self.nodes[pending])

    def sync_dir(self, d: Node) -> None:
        """fsync of a directory: its names become durable (and both sides of a rename across directories)."""
        if d.entries is None or d.dentries is None:
            return
        for name in sorted(set(d.entries) | set(d.dentries)):
            self._reconcile_entry(d, name)
        for rename in list(d.renames):
            src, old, dst, new = rename
            for ino, name in ((src, old), (dst, new)):
                if ino in self.nodes:
                    self._reconcile_entry(self.nodes[ino], name)
                    self.nodes[ino].renames.discard(rename)

    def sync_file(self, node: Node) -> None:
        """fsync of a file: its data and size become durable (in its backing inode)."""
        if node.is_dir or (not node.dirty and node.size == node.dsize and node.valid == node.size):
            return
        fd = self._fd(node)
        if node.valid < node.dsize:
            os.ftruncate(fd, node.valid)
        for page, data in sorted(node.dirty.items()):
            end = min(PAGE, node.size - page * PAGE)
            if end > 0:
                os.pwrite(fd, data[:end], page * PAGE)
        os.ftruncate(fd, node.size)
        node.dirty.clear()
        node.dsize = node.valid = node.size

    def sync_all(self) -> None:
        """Everything durable (an orderly shutdown)."""
        for node in list(self.nodes.values()):
            if not node.is_dir:
                self.sync_file(node)
        # parents before children is not needed: every directory's names are reconciled on their own
        for node in list(self.nodes.values()):
            if node.is_dir and node.ino in self.nodes:
                self.sync_dir(node)

    def power_loss(self) -> dict[str, int]:
        """Drop everything not durable; with torn writes, some dirty pages of durably named files land."""
        self.lost = True
        summary = {"files_with_unsynced_data": 0, "unsynced_pages": 0, "dirs_with_unsynced_names": 0,
                   "torn_pages_written": 0}
        for node in self.nodes.values():
            if node.is_dir:
                if node.entries is not None and node.entries != node.dentries:
                    summary["dirs_with_unsynced_names"] += 1
                continue
            if node.dirty or node.size != node.dsize:
                summary["files_with_unsynced_data"] += 1
                summary["unsynced_pages"] += len(node.dirty)
            if self.torn_writes and node.dirty and node.blinks:
                fd = self._fd(node)
                for page, data in sorted(node.dirty.items()):
                    end = min(PAGE, node.size - page * PAGE)
                    if end > 0 and self.rng.random() < 0.5:
                        os.pwrite(fd, data[:end], page * PAGE)       # the file grows over it: writeback order
                        summary["torn_pages_written"] += 1
        shutil.rmtree(os.path.join(self.backing, STAGING), ignore_errors=True)
        return summary

    # ------------------------------------------------------------------ file contents

    def _read_range(self, node: Node, off: int, size: int) -> bytes:
        end = min(node.size, off + size)
        if off >= end:
            return b""
        out = bytearray()
        pos = off
        while pos < end:
            page = pos // PAGE
            stop = min(end, (page + 1) * PAGE)
            data = node.dirty.get(page)
            if data is not None:
                out += data[pos - page * PAGE:stop - page * PAGE]
                pos = stop
                continue
            # a run of clean pages: one read of the backing file, zeros past what still shows through
            run_end = stop
            while run_end < end and (run_end // PAGE) not in node.dirty:
                run_end = min(end, run_end + PAGE)
            limit = min(run_end, node.valid, node.dsize)
            chunk = os.pread(self._fd(node), limit - pos, pos) if limit > pos else b""
            out += chunk
            out += bytes(run_end - pos - len(chunk))
            pos = run_end
        return bytes(out)

    def _write(self, node: Node, off: int, buf: bytes) -> None:
        pos, end = off, off + len(buf)
        while pos < end:
            page = pos // PAGE
            data = node.dirty.get(page)
            if data is None:
                data = bytearray(self._read_range_clean(node, page))
                node.dirty[page] = data
            stop = min(end, (page + 1) * PAGE)
            data[pos - page * PAGE:stop - page * PAGE] = buf[pos - off:stop - off]
            pos = stop
        node.size = max(node.size, end)
        node.mtime_ns = time.time_ns()

    def _read_range_clean(self, node: Node, page: int) -> bytes:
        start = page * PAGE
        limit = min(start + PAGE, node.valid, node.dsize, node.size)
        chunk = os.pread(self._fd(node), limit - start, start) if limit > start else b""
        return chunk + bytes(PAGE - len(chunk))

    def _truncate(self, node: Node, size: int) -> None:
        if size < node.size:
            for page in [p for p in node.dirty if p * PAGE >= size]:
                del node.dirty[page]
            tail = node.dirty.get(size // PAGE)
            if tail is not None:
                tail[size % PAGE:] = bytes(PAGE - size % PAGE)
            node.valid = min(node.valid, size)
        node.size = size
        node.mtime_ns = time.time_ns()

    # ------------------------------------------------------------------ attributes

    def _attr(self, node: Node) -> pyfuse3.EntryAttributes:
        st = os.fstat(self._fd(node))
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        a.entry_timeout = 0
        a.attr_timeout = 0
        a.st_mode = st.st_mode
        a.st_uid, a.st_gid, a.st_rdev = st.st_uid, st.st_gid, 0
        a.st_blksize = PAGE
        if node.is_dir:
            subdirs = sum(1 for i in (node.entries or {}).values() if self.nodes[i].is_dir)
            a.st_nlink = 2 + subdirs if node.links else 0
            a.st_size = st.st_size
            a.st_mtime_ns = st.st_mtime_ns
        else:
            a.st_nlink = node.links
            a.st_size = node.size
            a.st_mtime_ns = node.mtime_ns or st.st_mtime_ns
        a.st_blocks = (a.st_size + 511) // 512
        a.st_atime_ns = st.st_atime_ns
        a.st_ctime_ns = max(st.st_ctime_ns, a.st_mtime_ns)
        return a

    def _check(self) -> None:
        if self.lost:
            raise pyfuse3.FUSEError(errno.EIO)

    def _dir(self, ino: int) -> tuple[Node, dict[bytes, int]]:
        """A directory node and its pending names."""
        node = self._node(ino)
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return node, self._load(node)

    def _child(self, parent_inode: int, name: bytes) -> tuple[dict[bytes, int], Node]:
        """The pending names of the directory ``parent_inode`` and the node ``name`` is in them (ENOENT if
        not); EIO after a power loss."""
        self._check()
        _, entries = self._dir(parent_inode)
        ino = entries.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return entries, self.nodes[ino]

    @staticmethod
    def _check_name(d: Node, name: bytes) -> None:
        if d.ino == pyfuse3.ROOT_INODE and name == _STAGING_B:
            log.warning("%s is the layer's own staging directory: refused", STAGING)
            raise pyfuse3.FUSEError(errno.EPERM)

    # ------------------------------------------------------------------ FUSE operations

    async def lookup(self, parent_inode, name, ctx=None):
        _, node = self._child(parent_inode, name)
        attr = self._attr(node)
        node.nlookup += 1
        return attr

    async def forget(self, inode_list):
        for ino, count in inode_list:
            node = self.nodes.get(ino)
            if node is None:
                continue
            node.nlookup = max(0, node.nlookup - count)
            if not self.lost:
                self._maybe_drop(node)

    async def getattr(self, inode, ctx=None):
        self._check()
        return self._attr(self._node(inode))

    async def setattr(self, inode, attr, fields, fh, ctx):
        self._check()
        node = self._node(inode)
        fd = self._fd(node)
        if fields.update_size:
            if node.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            self._truncate(node, attr.st_size)
        if fields.update_mode:
            os.fchmod(fd, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            os.fchown(fd, attr.st_uid if fields.update_uid else -1, attr.st_gid if fields.update_gid else -1)
        if fields.update_atime or fields.update_mtime:
            st = os.fstat(fd)
            atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else (node.mtime_ns or st.st_mtime_ns)
            os.utime(fd, ns=(atime, mtime))
            if fields.update_mtime and not node.is_dir:
                node.mtime_ns = mtime
        return self._attr(node)

    async def opendir(self, inode, ctx):
        self._check()
        d, entries = self._dir(inode)
        fh = self.next_fh
        self.next_fh += 1
        self.dir_handles[fh] = sorted(entries.items())
        self.handles[fh] = inode
        d.opens += 1
        return fh

    async def readdir(self, fh, start_id, token):
        self._check()
        listing = self.dir_handles[fh]
        for i in range(start_id, len(listing)):
            name, ino = listing[i]
            node = self.nodes.get(ino)
            if node is None:
                continue
            if not pyfuse3.readdir_reply(token, name, self._attr(node), i + 1):
                break
            node.nlookup += 1

    async def releasedir(self, fh):
        self.dir_handles.pop(fh, None)
        node = self.nodes.get(self.handles.pop(fh, 0))
        if node is not None:
            node.opens -= 1
            if not self.lost:
                self._maybe_drop(node)

    async def fsyncdir(self, fh, datasync):
        self._check()
        if not self.lying_fsync:
            self.sync_dir(self._node(self.handles[fh]))

    async def mkdir(self, parent_inode, name, mode, ctx):
        self._check()
        d, entries = self._dir(parent_inode)
        self._check_name(d, name)
        if name in entries:
            raise pyfuse3.FUSEError(errno.EEXIST)
        node = self._new_node(True)
        os.mkdir(str(node.ino), stat.S_IMODE(mode), dir_fd=self.staging)
        node.fd = os.open(str(node.ino), os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.staging)
        node.staged = True
        node.entries, node.dentries = {}, {}
        node.links = 1
        entries[name] = node.ino
        attr = self._attr(node)
        node.nlookup += 1
        return attr

    async def create(self, parent_inode, name, mode, flags, ctx):
        self._check()
        d, entries = self._dir(parent_inode)
        self._check_name(d, name)
        if name in entries:
            raise pyfuse3.FUSEError(errno.EEXIST)
        if not stat.S_ISREG(mode) and stat.S_IFMT(mode):
            log.warning("create of %r with mode %o: only regular files are supported", name, mode)
            raise pyfuse3.FUSEError(errno.EPERM)
        node = self._new_node(False)
        node.fd = os.open(str(node.ino), os.O_CREAT | os.O_EXCL | os.O_RDWR, stat.S_IMODE(mode),
                          dir_fd=self.staging)
        st = os.fstat(node.fd)
        node.backing_key = (st.st_dev, st.st_ino)
        self.by_backing[node.backing_key] = node.ino
        node.staged = True
        node.links = 1
        node.mtime_ns = st.st_mtime_ns
        entries[name] = node.ino
        attr = self._attr(node)
        node.nlookup += 1
        return pyfuse3.FileInfo(fh=self._open_handle(node)), attr

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        log.warning("mknod of %r: only regular files and directories are supported", name)
        raise pyfuse3.FUSEError(errno.EPERM)

    async def symlink(self, parent_inode, name, target, ctx):
        log.warning("symlink %r: only regular files and directories are supported", name)
        raise pyfuse3.FUSEError(errno.EPERM)

    def _remove(self, parent_inode: int, name: bytes, *, directory: bool) -> None:
        """unlink (``directory`` False) or rmdir: the name goes from the pending namespace only."""
        entries, node = self._child(parent_inode, name)
        if node.is_dir != directory:
            raise pyfuse3.FUSEError(errno.EISDIR if node.is_dir else errno.ENOTDIR)
        if directory and self._load(node):
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del entries[name]
        node.links = 0 if directory else node.links - 1
        self._maybe_drop(node)

    async def unlink(self, parent_inode, name, ctx):
        self._remove(parent_inode, name, directory=False)

    async def rmdir(self, parent_inode, name, ctx):
        self._remove(parent_inode, name, directory=True)

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        self._check()
        src, src_entries = self._dir(parent_inode_old)
        dst, dst_entries = self._dir(parent_inode_new)
        self._check_name(dst, name_new)
        ino = src_entries.get(name_old)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        target = dst_entries.get(name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            if target is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            src_entries[name_old], dst_entries[name_new] = target, ino
        else:
            if target is not None:
                if flags & pyfuse3.RENAME_NOREPLACE:
                    raise pyfuse3.FUSEError(errno.EEXIST)
                old = self.nodes[target]
                if old.is_dir != self.nodes[ino].is_dir:
                    raise pyfuse3.FUSEError(errno.EISDIR if old.is_dir else errno.ENOTDIR)
                if old.is_dir and self._load(old):
                    raise pyfuse3.FUSEError(errno.ENOTEMPTY)
            if target == ino:
                return
            del src_entries[name_old]
            dst_entries[name_new] = ino
            if target is not None:
                old = self.nodes[target]
                old.links = 0 if old.is_dir else old.links - 1
                self._maybe_drop(old)
        if src is not dst:
            rename = (src.ino, name_old, dst.ino, name_new)
            src.renames.add(rename)
            dst.renames.add(rename)

    async def link(self, inode, new_parent_inode, new_name, ctx):
        self._check()
        node = self._node(inode)
        d, entries = self._dir(new_parent_inode)
        self._check_name(d, new_name)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EPERM)
        if new_name in entries:
            raise pyfuse3.FUSEError(errno.EEXIST)
        entries[new_name] = node.ino
        node.links += 1
        attr = self._attr(node)
        node.nlookup += 1
        return attr

    def _open_handle(self, node: Node) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = node.ino
        node.opens += 1
        return fh

    async def open(self, inode, flags, ctx):
        self._check()
        node = self._node(inode)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        self._fd(node)
        return pyfuse3.FileInfo(fh=self._open_handle(node))

    async def read(self, fh, off, size):
        self._check()
        return self._read_range(self._node(self.handles[fh]), off, size)

    async def write(self, fh, off, buf):
        self._check()
        self._write(self._node(self.handles[fh]), off, buf)
        return len(buf)

    async def fsync(self, fh, datasync):
        self._check()
        if not self.lying_fsync:
            self.sync_file(self._node(self.handles[fh]))

    async def flush(self, fh):
        self._check()

    async def release(self, fh):
        node = self.nodes.get(self.handles.pop(fh, 0))
        if node is not None:
            node.opens -= 1
            if not self.lost:
                self._maybe_drop(node)

    async def statfs(self, ctx):
        st = os.statvfs(self.backing)
        out = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                     "f_favail", "f_namemax"):
            setattr(out, name, getattr(st, name))
        return out


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backing", help="the directory holding the durable state")
    parser.add_argument("mountpoint")
    parser.add_argument("--torn-writes", action="store_true",
                        help="at a power loss, write a random half of the dirty pages of durably named files")
    parser.add_argument("--seed", type=int, default=0, help="seed of the torn-write choices")
    parser.add_argument("--lying-fsync", action="store_true",
                        help="self-test of a harness: fsync of a file or directory makes nothing durable")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s powerloss_fs %(levelname)s %(message)s")
    os.umask(0)                  # modes come from the callers (their umask is applied by the kernel)
    _raise_fd_limit()
    ops = PowerLossFS(args.backing, torn_writes=args.torn_writes, seed=args.seed, lying_fsync=args.lying_fsync)
    options = set(pyfuse3.default_options) | {"fsname=powerloss", "subtype=powerloss_fs"}
    pyfuse3.init(ops, args.mountpoint, options)
    mountpoint = os.path.abspath(args.mountpoint)
    outcome: dict[str, str] = {}

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                outcome["how"] = "loss" if signum == signal.SIGUSR1 else "shutdown"
                pyfuse3.terminate()
                return

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            log.info("mounted %s over %s%s", mountpoint, ops.backing, " (torn writes)" if args.torn_writes else "")
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    trio.run(serve)
    if outcome.get("how") == "loss":
        summary = ops.power_loss()
        log.info("power loss: %s", ", ".join(f"{k} {v}" for k, v in summary.items()))
        # the kernel's connection goes with the process; detach the mount point for the next layer
        subprocess.run(["fusermount3", "-uz", mountpoint], capture_output=True)
        os._exit(0)
    ops.sync_all()
    shutil.rmtree(os.path.join(ops.backing, STAGING), ignore_errors=True)
    log.info("shut down: everything synced to %s", ops.backing)
    pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
