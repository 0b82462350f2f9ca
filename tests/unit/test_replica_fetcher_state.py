"""The replica fetcher's shared state (logfs.cluster.replica_fetcher): a few typed parts, each with one rule.

The fetching itself is exercised against a real 3-node cluster (tests/cluster); here, without any broker,
that a fetcher holds nothing but those parts, and the hand-off between request threads and the fetcher
thread: a sync wish taken once, and ``request_sync`` waiting for a sync begun after it.
"""

from __future__ import annotations

import dataclasses
import threading
import types
from typing import TYPE_CHECKING

import pytest

from logfs.cluster.replica_fetcher import (
    FetcherSettings,
    ReplicaFetcher,
    _FetchLoop,
    _Handoff,
    _Replicas,
    _SideClient,
)

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def fetcher() -> Iterator[ReplicaFetcher]:
    made = ReplicaFetcher(None, types.SimpleNamespace(brokers="127.0.0.1:1"), {},  # type: ignore[arg-type]
                          metadata_max_age_s=3.0, listing_max_age_s=1.0)
    try:
        yield made
    finally:
        made._client.close()


def test_the_fetcher_holds_its_state_in_its_typed_parts(fetcher: ReplicaFetcher) -> None:
    assert set(vars(fetcher)) == {"manager", "admin", "settings", "topic_removed", "_client", "_loop", "_replicas",
                                  "_handoff", "_side", "_create_lock", "_stop", "_thread"}
    assert isinstance(fetcher.settings, FetcherSettings)
    assert isinstance(fetcher._loop, _FetchLoop)
    assert isinstance(fetcher._replicas, _Replicas)
    assert isinstance(fetcher._handoff, _Handoff)
    assert isinstance(fetcher._side, _SideClient)
    assert fetcher.settings.brokers == "127.0.0.1:1"
    assert fetcher.settings.listing_max_age_s == 3.0        # never below metadata_max_age_s
    with pytest.raises(dataclasses.FrozenInstanceError):
        fetcher.settings.brokers = "elsewhere:9092"  # type: ignore[misc]


def test_a_sync_wish_is_taken_once(fetcher: ReplicaFetcher) -> None:
    handoff = fetcher._handoff
    assert not handoff.take_sync_wanted()
    handoff.want_sync()
    handoff.want_sync()
    assert handoff.take_sync_wanted()
    assert not handoff.take_sync_wanted()


def test_request_sync_waits_for_a_sync_begun_after_it(fetcher: ReplicaFetcher) -> None:
    # no fetcher thread: nothing ends a sync, the wish stays for the thread's next round
    assert not fetcher.request_sync(0.05)
    assert fetcher._handoff.take_sync_wanted()
    # one sync ending may have begun before the request: the request waits for a second one
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(fetcher.request_sync(10.0)))
    waiter.start()
    while not fetcher._handoff.take_sync_wanted():
        threading.Event().wait(0.01)
    fetcher._bump_generation()
    waiter.join(0.2)
    assert waiter.is_alive()
    assert not done
    fetcher._bump_generation()
    waiter.join(10.0)
    assert done == [True]
