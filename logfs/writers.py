"""Whether the close() of an append file comes from a writer killed by a signal (Linux /proc).

pyfuse3 does not say which process a FLUSH request comes from, but a process
that dies closes its files in the kernel's ``do_exit``, after it has marked
itself exiting (``PF_EXITING`` in the flags of ``/proc/<tid>/stat``) and
stored its exit status (the last field, as ``waitpid`` reports it: the
signal's number in the low 7 bits for a death by signal).  It stays in
``/proc``, blocked on the FLUSH (state ``D``, or ``S``), until the mount answers.  So a
killed writer's FLUSH is recognised by a task among the opener's process tree
(the process that opened the file and its descendants, which inherit the
descriptor) that is exiting by a signal and blocked while the mount serves a
FLUSH of that opening.  A writer that ends normally (``exit``, end of
``main``) has a zero low byte; a process that closes its descriptor itself
(``close(2)``) is not exiting.
"""

from __future__ import annotations

import os
import signal
from typing import NamedTuple

__all__ = ["KilledWriter", "killed_writer"]

#: include/linux/sched.h: the task is getting shut down
_PF_EXITING = 0x4
#: at most this many tasks of a tree are looked at (a shell's job is a few)
_MAX_TASKS = 4096
#: the states of a task waiting for the FLUSH's answer: D (the kernel waits uninterruptibly when the dying task
#: has a signal pending, as a killed one has), S (an interruptible wait, on kernels that choose one)
_BLOCKED = ("D", "S")


class KilledWriter(NamedTuple):
    """A task of the opener's tree that is dying by ``signal``, blocked in the kernel."""

    pid: int
    command: str
    signal: int

    def describe(self) -> str:
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        return f"{self.command} (pid {self.pid}) killed by {name}"


def _task_state(path: str) -> tuple[str, str, int, int] | None:
    """(command, state, flags, exit code) from a ``/proc/.../stat`` file, or None when it is gone."""
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    open_paren, close_paren = stat.find(b"("), stat.rfind(b")")
    if open_paren < 0 or close_paren < 0:
        return None
    fields = stat[close_paren + 2:].split()
    # fields[0] is field 3 (state); flags is field 9, exit_code field 52 (Linux 3.5 and later)
    if len(fields) < 50:
        return None
    return (stat[open_paren + 1:close_paren].decode(errors="replace"), fields[0].decode(), int(fields[6]),
            int(fields[49]))


def killed_writer(opener: int) -> KilledWriter | None:
    """A task of ``opener``'s process tree that is exiting by a signal and blocked (closing its files), or None.

    Looks at every thread of the opener and of its descendants (through
    ``/proc/<pid>/task/<tid>/children``).  None when ``opener`` is unknown
    (0) or gone: nothing tells a killed writer then.
    """
    if opener <= 0:
        return None
    pending = [opener]
    seen = 0
    while pending and seen < _MAX_TASKS:
        pid = pending.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            seen += 1
            base = f"/proc/{pid}/task/{tid}"
            state = _task_state(f"{base}/stat")
            if state is not None:
                command, run_state, flags, exit_code = state
                if flags & _PF_EXITING and exit_code & 0x7F and run_state in _BLOCKED:
                    return KilledWriter(int(tid), command, exit_code & 0x7F)
            try:
                with open(f"{base}/children", "rb") as f:
                    pending.extend(int(child) for child in f.read().split())
            except OSError:
                pass
    return None
