"""engine.store_waits: a wait on the remote store is taken without the caller's lock, and what it fetched
is held for the locked part's next attempt."""

from __future__ import annotations

import threading

import pytest

from engine import store_waits


def test_the_wait_runs_without_the_lock_and_the_locked_part_runs_again_with_what_it_fetched() -> None:
    lock = threading.Lock()
    attempts: list[bool] = []
    waited_with_lock: list[bool] = []

    def fetch() -> None:
        waited_with_lock.append(lock.locked())
        store_waits.hold("chunk", b"bytes")

    def locked_part() -> bytes:
        attempts.append(store_waits.deferring())
        got = store_waits.held("chunk")
        if got is None:
            raise store_waits.StoreWaitDeferred(fetch, "chunk 0")
        return got

    assert store_waits.outside_store_waits(lock, locked_part) == b"bytes"
    assert attempts == [True, True]             # deferring inside, twice: before and after the wait
    assert waited_with_lock == [False]
    assert store_waits.held("chunk") is None    # gone with the scope
    assert not store_waits.deferring()


def test_a_failed_wait_is_the_callers_error_and_the_lock_is_free() -> None:
    lock = threading.Lock()

    def fail() -> None:
        raise OSError("the store did not answer")

    def locked_part() -> None:
        raise store_waits.StoreWaitDeferred(fail, "chunk 0")

    with pytest.raises(OSError, match="did not answer"):
        store_waits.outside_store_waits(lock, locked_part)
    assert not lock.locked()
    assert not store_waits.deferring()


def test_held_bytes_stay_for_the_outermost_scope_until_forgotten() -> None:
    with store_waits.holding():
        store_waits.hold("a", b"1")
        with store_waits.holding():            # an inner scope shares the outer one's
            assert store_waits.held("a") == b"1"
        assert store_waits.held("a") == b"1"
        store_waits.forget_held()
        assert store_waits.held("a") is None
    store_waits.hold("b", b"2")                  # outside any scope: nothing is kept
    assert store_waits.held("b") is None
