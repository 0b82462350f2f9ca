"""Waits on tiered storage's remote store, taken outside the lock of the reader that needs the bytes.

A reader that holds a lock others need (a view's lock guards its size and its
other readers) must not wait on the remote store under it: a store that does
not answer would hold every one of them for its request timeout.  Such a
reader runs its locked part through :func:`outside_store_waits`: inside it, a
read of remote bytes the local cache does not hold raises
:class:`StoreWaitDeferred` instead of waiting (engine.remote.chunk_cache); the
reader lets go of its lock, calls :meth:`StoreWaitDeferred.wait` (which fetches
the bytes and :func:`hold` s them for this thread), and runs its locked part
again, which now finds them (:func:`held`), even if the cache has evicted them
meanwhile (a cache bound of a chunk or two would otherwise never let a read of
three chunks finish).

Invariant: a locked part run this way is repeatable: whatever it changed before
the deferral leaves its object consistent (it raises there as it would for a
failed read).  The flag and the held bytes are per thread; the held bytes go
when :func:`outside_store_waits` returns.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

T = TypeVar("T")

_local = threading.local()


class StoreWaitDeferred(Exception):
    """A read that would wait on the remote store, handed back to be waited for outside the caller's lock."""

    def __init__(self, wait: Callable[[], object], what: str) -> None:
        super().__init__(what)
        self.wait = wait


def deferring() -> bool:
    """Whether a wait on the store in this thread must raise :class:`StoreWaitDeferred` instead."""
    return bool(getattr(_local, "deferring", False))


@contextlib.contextmanager
def _deferred() -> Iterator[None]:
    previous = deferring()
    _local.deferring = True
    try:
        yield
    finally:
        _local.deferring = previous


def hold(key: object, data: bytes) -> None:
    """Keep ``data`` for this thread's locked part until :func:`outside_store_waits` returns."""
    held_now: dict[object, bytes] | None = getattr(_local, "held", None)
    if held_now is not None:
        held_now[key] = data


def forget_held() -> None:
    """Let go of what :func:`hold` kept in this thread (a reader past those bytes), within its scope."""
    held_now: dict[object, bytes] | None = getattr(_local, "held", None)
    if held_now is not None:
        held_now.clear()


def held(key: object) -> bytes | None:
    """What :func:`hold` kept for ``key`` in this thread, or None."""
    held_now: dict[object, bytes] | None = getattr(_local, "held", None)
    return None if held_now is None else held_now.get(key)


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """A scope for :func:`hold`: what it keeps goes at the end of the outermost one."""
    outermost = getattr(_local, "held", None) is None
    if outermost:
        _local.held = {}
    try:
        yield
    finally:
        if outermost:
            _local.held = None


def outside_store_waits(lock: threading.Lock, locked_part: Callable[[], T]) -> T:
    """``locked_part()`` under ``lock``, every wait on the remote store it meets taken without the lock."""
    with holding():
        while True:
            with _deferred(), lock:
                try:
                    return locked_part()
                except StoreWaitDeferred as deferred:
                    pending = deferred
            pending.wait()
