"""A process a test or a benchmark starts and owns (a ``logfs mount``, a Kafka JVM): waited for to the end, or
crashed."""

from __future__ import annotations

import signal
import subprocess


class ChildProcess:
    """Holds ``proc`` while the process runs; :meth:`wait_stopped` and :meth:`kill` leave it None."""

    proc: subprocess.Popen[bytes] | None = None

    def wait_stopped(self, timeout: float, *, kill: bool = False) -> int:
        """The exit code once the process ended (0 if none runs); past ``timeout`` it is killed, and
        ``subprocess.TimeoutExpired`` raised unless ``kill`` (then -9 is returned)."""
        if self.proc is None:
            return 0
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            if not kill:
                raise
            return -signal.SIGKILL
        self.proc = None
        return code

    def kill(self) -> None:
        """A crash: SIGKILL, and wait for it."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
