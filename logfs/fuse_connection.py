"""The kernel's FUSE connection of a mount: found in ``/proc/self/mountinfo``, aborted through fusectl.

The kernel ends a FUSE connection (the requests waiting on it fail with
``ECONNABORTED``, later ones with ``ENOTCONN``) once no process holds its ``/dev/fuse`` descriptor.  A logfs
killed by SIGKILL (``kill -9``, the OOM killer) can keep it held: a worker
thread dropping cached pages of a view (``pyfuse3.invalidate_inode``, which
waits for the READs in flight that this process answers) waits in the kernel,
uninterruptibly, for a page that a READ holds, and the READ is never answered
since the process's other threads are gone.  The process stays a zombie, its
descriptor open, and every process touching the mount waits for good, as
does ``logfs umount``.  Writing to ``/sys/fs/fuse/connections/N/abort`` ends the
connection, as the kernel would have: the READ fails, the page is unlocked,
the last thread exits.

Nothing here reads through the mount (a stat of a mount whose daemon hangs
would hang too).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import NamedTuple

FUSECTL = "/sys/fs/fuse/connections"


class MountInfo(NamedTuple):
    """One line of /proc/self/mountinfo: where, which file system type, and its device."""

    point: str
    fstype: str
    major: int
    minor: int


def mounts() -> list[MountInfo]:
    """The mounts of this process's namespace, from /proc/self/mountinfo (no stat: a dead or hung FUSE
    mount is listed too).  Raises OSError when it cannot be read."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            if len(fields) < 7 or "-" not in fields[6:]:
                continue
            major, _, minor = fields[2].partition(":")
            if not (major.isdigit() and minor.isdigit()):
                continue
            found.append(MountInfo(fields[4].replace("\\040", " "), fields[fields.index("-", 6) + 1],
                               int(major), int(minor)))
    return found


def fuse_connection(mountpoint: str | os.PathLike[str]) -> int | None:
    """The number of the FUSE connection mounted at ``mountpoint`` (fusectl's name for it: the minor of the
    mount's anonymous device), None when no FUSE file system is mounted there."""
    path = os.path.abspath(mountpoint)
    try:
        listed = mounts()
    except OSError:
        return None
    found = None
    for mount in listed:
        if mount.point == path and (mount.fstype == "fuse" or mount.fstype.startswith("fuse.")):
            found = mount.minor if mount.major == 0 else None       # the last one mounted there
    return found


def _fusectl_mounted() -> bool:
    with contextlib.suppress(OSError):
        if os.listdir(FUSECTL):
            return True
    # not mounted yet (a container, a minimal system): mount it, as `modprobe fuse` does on most systems
    subprocess.run(["mount", "-t", "fusectl", "none", FUSECTL], capture_output=True, check=False)
    with contextlib.suppress(OSError):
        return bool(os.listdir(FUSECTL))
    return False


def waiting_requests(connection: int) -> int | None:
    """How many requests wait on the connection (fusectl's ``waiting``); None when it cannot be read."""
    try:
        with open(os.path.join(FUSECTL, str(connection), "waiting"), encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def abort_fuse_connection(connection: int | None) -> bool:
    """End the connection: every request waiting on it fails, and its daemon's process can exit.  Returns
    whether it was aborted (False: no such connection, no fusectl, or no permission: only its owner and
    root may)."""
    if connection is None or not _fusectl_mounted():
        return False
    try:
        with open(os.path.join(FUSECTL, str(connection), "abort"), "w", encoding="ascii") as f:
            f.write("1")
    except OSError:
        return False
    return True
