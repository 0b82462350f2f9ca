"""Who besides the mount's owner may do what: the owner, group and mode bits of every name.

The kernel checks these bits at every path walk and open (the mount runs with
``default_permissions``), so what ``ls -l`` shows is what is enforced; other
users reach the mount at all only with ``--allow-other``.  One rule for the
embedded and the cluster mount (SPEC.md section 7, "Other users"):

* the mount's owner has each node's own bits (``Node.mode``: views read-only,
  control files read-write, ``delete`` write-only, directories ``rwx``);
* the group (``--allow-group``, else the owner's primary group) has the owner's
  bits when ``--allow-group`` names it: its members act as the owner does;
* every other user, and the group without ``--allow-group``, has the owner's
  read and search bits only, and nothing at all on a file whose read changes
  something (``Node.commits_on_read``: ``consume/<group>`` commits the group's
  offsets at close), so nobody else can write, create, delete or commit;
* ``--umask`` then takes bits away from every name (``027``: others see nothing).

On a cluster mount every local user who passes these checks acts as the
mount's Kafka principal; a mount per user or per group (its own credentials)
is how the cluster's ACLs tell them apart (docs/cluster.md).
"""

from __future__ import annotations

import grp
import os
from dataclasses import dataclass

__all__ = ["MountAccess", "group_id"]


@dataclass(frozen=True)
class MountAccess:
    """The owner, group and mode rule of one mount (see the module docstring)."""

    uid: int
    gid: int
    #: the group acts as the owner (``--allow-group``)
    group_acts: bool = False
    #: bits taken away from every name (``--umask``)
    umask: int = 0

    @classmethod
    def of_process(cls, group: int | None = None, umask: int = 0) -> MountAccess:
        """The rule of a mount served by this process: owned by its user, ``group`` acting as the owner."""
        return cls(uid=os.getuid(), gid=os.getgid() if group is None else group,
                   group_acts=group is not None, umask=umask)

    def mode(self, owner_mode: int, commits_on_read: bool = False) -> int:
        """The permission bits shown and enforced for a node whose own bits are ``owner_mode``."""
        owner = (owner_mode >> 6) & 0o7
        shared = 0 if commits_on_read else owner & 0o5
        group = owner if self.group_acts else shared
        return ((owner << 6) | (group << 3) | shared) & ~self.umask & 0o777

    def describe(self) -> str:
        """One line for the log: what other users may do."""
        others = "other users may read and list, never write, create, delete or commit"
        text = f"group {_group_name(self.gid)} acts as the mount's owner; {others}" if self.group_acts \
            else f"group and {others}"
        return text + (f" (umask {self.umask:03o})" if self.umask else "")


def group_id(text: str) -> int:
    """A group given by name or number (``--allow-group``); ValueError naming it when there is none."""
    if text.isdigit():
        return int(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise ValueError(f"no group {text!r} on this host (getent group {text})") from None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
