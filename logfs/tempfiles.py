"""Temporary files next to ``config`` and ``append``: how editors, ``sed -i`` and ``rsync`` write a file.

Those tools never write a file in place: they create a temporary file in the
same directory (``sed`` a ``sedXXXXXX``, ``rsync`` a ``.append.XXXXXX``, vim
its ``.config.swp`` swap file and the ``4913`` probe), fill it, and rename it
over the target.  The namespace is otherwise fixed, so this module gives a
topic directory and a partition directory room for such files:

* a file created there lives in memory, private to the mount: nothing of it
  reaches the data directory, and it is gone when the mount stops.  It can be
  written, read, truncated, ``chmod``-ed, renamed to another free name and
  removed, like a file on disk; ``ls`` shows it while it exists;
* only a temporary file's name can be created (:func:`temporary_name`: what
  the tools above, emacs, Python's ``tempfile``, ``mktemp`` and an editor's
  ``name.tmp`` use).  Any other new name, ``t/0/apend`` or ``t/0/notes``, is
  refused with ``EPERM`` and one log line naming the file probably meant: a
  file under it would hold what is written to it in memory only, and lose it
  at unmount without a word;
* renamed over ``config``, its text is written to the topic's config as a
  whole, as ``cat tmp > config`` would (the overrides it gives replace the
  topic's, the ``#name=value`` defaults stay defaults); renamed over
  ``append`` or ``append.jsonl``, its lines are appended, as
  ``cat tmp >> append`` would (1 MiB per batch).  If that fails (a bad config
  line, an oversized record) the rename fails with the same errno and the
  temporary file stays; on success it is gone;
* renamed over anything else, or any other name renamed, ``EPERM``: the rest of
  the namespace stays fixed;
* they hold at most ``MAX_BYTES`` together (``ENOSPC`` beyond): the mount's
  memory is not a disk.

Kafka has no counterpart: this is the POSIX habit of "write a temporary file,
rename it over the old one" mapped onto the mount's control files.
"""

from __future__ import annotations

import difflib
import errno as _errno
import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING

from engine.errors import LogfsError
from engine.topic import TopicPartition
from logfs.control import AppendTargetFile, TopicConfigFile
from logfs.errors import NotPermittedError
from logfs.handles import Handle
from logfs.nodes import RW_MODE, FileNode, Node

if TYPE_CHECKING:  # pragma: no cover
    from logfs.tree import NodeKey, Tree

log = logging.getLogger(__name__)

__all__ = ["TempFile", "TempFiles", "MAX_BYTES"]

#: what the temporary files of one mount may hold together
MAX_BYTES = 256 << 20
#: the pieces a file renamed over ``append`` is appended in (the largest FUSE write)
_APPEND_CHUNK = 1 << 20
#: the kinds of directory (their node key's first element) that take temporary files
_DIR_KINDS = ("topic", "partition")


#: the names editors and tools give their temporary files (see :func:`temporary_name`)
_TEMPORARY_NAME = re.compile(r"""
      \..+                         # hidden: rsync .name.XXXXXX, vim .name.swp/.swx, emacs .#name, .#-emacsXXXXXX
    | [0-9]+                       # vim's probe of the directory: 4913 (then 5036, ...)
    | .+~                          # backups: name~ (vim, emacs)
    | \#.+\#                        # emacs' auto-save: #name#
    | sed[A-Za-z0-9]{6}            # sed -i
    | tmp[a-z0-9_]{8}              # Python's tempfile (mkstemp, NamedTemporaryFile) next to the target
    | tmp\.[A-Za-z0-9]{10}         # mktemp
    | .+\.(?:tmp|temp|swp|swx|bak|new|orig|part)   # an editor's or a script's name.tmp, then renamed
    | .+___jb_(?:tmp|old)___       # JetBrains IDEs' safe write
""", re.VERBOSE)


def temporary_name(name: str) -> bool:
    """Whether ``name`` is one an editor or a tool gives a temporary file (the only new names created here)."""
    return _TEMPORARY_NAME.fullmatch(name) is not None


class TempSpaceError(LogfsError):
    """The temporary files of the mount would hold more than ``MAX_BYTES``."""

    errno = _errno.ENOSPC


class NameExistsError(LogfsError):
    errno = _errno.EEXIST


class TempFile(FileNode):
    """One temporary file: bytes in memory, a mode, a modification time."""

    transient = True
    writable = True

    def __init__(self, ns: Tree, space: TempFiles, where: str, name: str) -> None:
        super().__init__(ns)
        self.space = space
        self.where = where
        self.name = name
        self.data = bytearray()
        self.mode = RW_MODE
        self._mtime_ns = time.time_ns()
        self.lock = threading.Lock()
        #: removed or renamed over a file: its bytes no longer count (an open descriptor may still write)
        self.dropped = False

    @property
    def key(self) -> NodeKey:
        return ("temp", id(self))

    def describe(self) -> str:
        return f"{self.where}/{self.name}"

    def size(self) -> int:
        return len(self.data)

    def mtime_ns(self) -> int:
        return self._mtime_ns

    def open(self, write: bool) -> Handle:
        if write:
            self.ns.check_writable()
        return TempHandle(self)

    def truncate(self, size: int) -> None:
        with self.lock:
            grow = max(0, size - len(self.data))
            if not self.dropped:
                self.space.reserve(grow)
                self.space.release_bytes(max(0, len(self.data) - size))
            if size < len(self.data):
                del self.data[size:]
            else:
                self.data.extend(bytes(grow))
            self._mtime_ns = time.time_ns()

    def write(self, offset: int, buf: bytes) -> int:
        with self.lock:
            end = offset + len(buf)
            grow = max(0, end - len(self.data))
            if self.dropped and end > MAX_BYTES:
                raise TempSpaceError(f"{self.describe()} was removed; it cannot grow beyond {MAX_BYTES} bytes")
            if not self.dropped:
                self.space.reserve(grow)
            if offset > len(self.data):
                self.data.extend(bytes(offset - len(self.data)))
            self.data[offset:end] = buf
            self._mtime_ns = time.time_ns()
        return len(buf)


class TempHandle(Handle):
    """An open temporary file: reads and writes at the offsets given (the page cache is bypassed)."""

    def __init__(self, node: TempFile) -> None:
        self._node = node

    def opened(self, flags: int) -> None:
        if flags & os.O_TRUNC:
            self._node.truncate(0)

    def read(self, offset: int, size: int) -> bytes:
        return bytes(self._node.data[offset:offset + size])

    def write(self, offset: int, data: bytes) -> int:
        return self._node.write(offset, data)


class TempFiles:
    """The temporary files of one mount, by directory (see the module docstring)."""

    def __init__(self, ns: Tree) -> None:
        self._ns = ns
        self._files: dict[tuple[NodeKey, str], TempFile] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    # ---- space

    def reserve(self, nbytes: int) -> None:
        with self._lock:
            if self._bytes + nbytes > MAX_BYTES:
                raise TempSpaceError(f"The temporary files of the mount would hold more than {MAX_BYTES} bytes "
                                     "(they live in memory): rename or remove some first")
            self._bytes += nbytes

    def release_bytes(self, nbytes: int) -> None:
        with self._lock:
            self._bytes -= nbytes

    # ---- names

    @staticmethod
    def takes(parent: Node) -> bool:
        """Whether ``parent`` is a directory temporary files may be created in."""
        try:
            return parent.key[0] in _DIR_KINDS
        except NotImplementedError:
            return False

    def get(self, parent: Node, name: str) -> TempFile | None:
        if not self._files:
            return None
        return self._files.get((parent.key, name))

    def names(self, parent: Node) -> list[str]:
        key = parent.key
        return sorted(name for (where, name) in self._files if where == key)

    def create(self, parent: Node, name: str) -> TempFile:
        """A new empty temporary file ``name`` in ``parent`` (EEXIST if the name exists, EPERM where none go)."""
        self._ns.check_writable()
        if not self.takes(parent):
            raise NotPermittedError(f"Cannot create {name!r}: files can be created only next to config and "
                                    "append (temporary files of editors and tools)")
        if self.get(parent, name) is not None or self._exists(parent, name):
            raise NameExistsError(f"{name!r} exists")
        if not temporary_name(name):
            raise NotPermittedError(self._not_temporary(parent, name))
        node = TempFile(self._ns, self, _describe(parent), name)
        self._files[(parent.key, name)] = node
        log.debug("Created temporary file %s", node.describe())
        return node

    def unlink(self, parent: Node, name: str) -> bool:
        """Remove temporary file ``name``; False if there is none (the caller then handles it as a name of the
        namespace)."""
        node = self._files.pop((parent.key, name), None)
        if node is None:
            return False
        self._drop(node)
        return True

    def rename(self, old_parent: Node, old_name: str, new_parent: Node, new_name: str, *,
               noreplace: bool = False) -> bool:
        """Rename a temporary file: to a free name, or over ``config``/``append`` (applied, see module docstring).

        False if ``old_name`` is no temporary file (the caller then handles it as a name of the namespace).
        Runs off the trio thread: applying a config writes to disk.
        """
        node = self.get(old_parent, old_name)
        if node is None:
            return False
        self._ns.check_writable()
        if not self.takes(new_parent):
            raise NotPermittedError(f"Cannot rename {node.describe()} out of its directory")
        if noreplace and (self.get(new_parent, new_name) is not None or self._exists(new_parent, new_name)):
            raise NameExistsError(f"{new_name!r} exists")     # RENAME_NOREPLACE (emacs' lock file)
        existing = self.get(new_parent, new_name)
        if existing is not None or not self._exists(new_parent, new_name):
            if existing is not None and existing is not node:
                del self._files[(new_parent.key, new_name)]
                self._drop(existing)
            del self._files[(old_parent.key, old_name)]
            node.name, node.where = new_name, _describe(new_parent)
            self._files[(new_parent.key, new_name)] = node
            return True
        # ignore: a parent is a Directory (Node has no lookup())
        target = new_parent.lookup(new_name)   # type: ignore[attr-defined]
        with node.lock:
            data = bytes(node.data)
        if isinstance(target, TopicConfigFile):
            self._write_config(target, data)
        elif isinstance(target, AppendTargetFile):
            self._append(target, data)
        else:
            raise NotPermittedError(f"Cannot rename {node.describe()} over {new_name!r}: only config, append and "
                                    "append.jsonl take a file renamed over them; the namespace is fixed")
        del self._files[(old_parent.key, old_name)]
        self._drop(node)
        log.info("Applied %s renamed over %s (%d bytes)", node.describe(), target.describe(), len(data))
        return True

    # ---- internals

    @staticmethod
    def _not_temporary(parent: Node, name: str) -> str:
        where = _describe(parent)
        # ignore: a parent is a Directory (Node has no names())
        names = parent.names()      # type: ignore[attr-defined]
        meant = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"; did you mean {where}/{meant[0]}?" if meant else f" (it holds {', '.join(sorted(names))})"
        return (f"Cannot create {where}/{name}: the namespace is fixed, and next to config and append only "
                f"editors' and tools' temporary files can be created (docs/usage.md, \"The namespace\"){hint}")

    def _exists(self, parent: Node, name: str) -> bool:
        try:
            parent.lookup(name)   # type: ignore[attr-defined]  # a parent is a Directory (Node has no lookup())
        except LogfsError:
            return False
        return True

    def _drop(self, node: TempFile) -> None:
        with node.lock:
            if not node.dropped:
                self.release_bytes(len(node.data))
            node.dropped = True

    @staticmethod
    def _write_config(target: TopicConfigFile, data: bytes) -> None:
        handle = target.open(True)
        handle.opened(os.O_WRONLY | os.O_TRUNC)      # the whole file: its overrides replace the topic's
        handle.write(0, data)
        handle.flush()
        handle.release()

    @staticmethod
    def _append(target: AppendTargetFile, data: bytes) -> None:
        handle = target.open(True)
        try:
            for start in range(0, len(data), _APPEND_CHUNK):
                handle.write(start, data[start:start + _APPEND_CHUNK])
            handle.flush()
        finally:
            handle.release()


def _describe(parent: Node) -> str:
    key = parent.key
    if key[0] == "topic":
        return str(key[1])
    tp = key[1]
    assert isinstance(tp, TopicPartition), key      # else a partition's directory
    return f"{tp.topic}/{tp.partition}"
