"""The errors a name of the namespace can give, each carrying its errno (SPEC.md section 7)."""

from __future__ import annotations

import errno as _errno

from engine.errors import LogfsError


class NoSuchNameError(LogfsError):
    """A name that does not exist in the namespace (a view, a file, a directory)."""

    errno = _errno.ENOENT


class NotPermittedError(LogfsError):
    """The namespace is fixed: files cannot be created, removed or renamed."""

    errno = _errno.EPERM


class AccessDeniedError(LogfsError):
    """A write to a read-only view or file."""

    errno = _errno.EACCES


class MalformedNameError(NoSuchNameError):
    """A name under ``offset/``, ``from/``, ``since/`` or ``segments/`` that spells no offset or time.

    ENOENT like any missing name (SPEC.md section 7), but a user typed it, so
    the mount logs it (plain missing names are probed by shells and tools all
    the time and are not logged).
    """


class StaleNameError(LogfsError):
    """The file behind this inode was replaced (records deleted or compacted) between lookup and open.

    ESTALE makes the kernel look the path up again and open the new file
    (``do_filp_open`` retries with LOOKUP_REVAL), so an ``open`` racing a
    deletion opens what the path names now.
    """

    errno = _errno.ESTALE


class RetryAfterRelease(Exception):
    """Mixin of a refusal that a ``release`` on its way will lift (FUSE sends release after close returns).

    ``logfs.fs`` retries the open that raised it for a moment before answering with its errno.
    """


def shown(name: str) -> str:
    """A name or a line as an error message or log line shows it: quoted, at most 80 characters."""
    return repr(name) if len(name) <= 80 else f"{name[:80]!r}... ({len(name)} characters)"
