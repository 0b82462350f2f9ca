"""The replica fetcher's incremental fetch sessions (KIP-227, logfs.cluster.replica_fetcher.FetchSession).

The broker side is exercised by tests/cluster/test_cluster_mount.py (every cluster
test fetches through sessions); here the client's bookkeeping: what each
request lists, what it forgets, and how an error or a broker without a
session cache falls back to full requests.
"""

from __future__ import annotations

import uuid

from engine.topic import TopicPartition
from logfs.cluster.replica_fetcher import FetchSession

T = uuid.uuid4()


#: what a fetch wants of a partition, by the session's key: the partition and its (offset, epoch, log start)
Wanted = dict[tuple[uuid.UUID, int], tuple[TopicPartition, tuple[int, int, int]]]


def wanted(**positions: tuple[int, int, int]) -> Wanted:
    return {(T, int(p[1:])): (TopicPartition("t", int(p[1:])), pos) for p, pos in positions.items()}


def test_a_session_starts_full_then_sends_only_what_moved():
    session = FetchSession()
    w = wanted(p0=(0, -1, 0), p1=(5, 0, 0))
    assert session.next_request(w) == (0, 0, [(T, 0), (T, 1)], [])
    session.acknowledged(42, {k: v for k, (_, v) in w.items()}, [])
    assert session.next_request(w) == (42, 1, [], [])              # nothing moved: an empty long poll
    session.acknowledged(42, {}, [])
    w = wanted(p0=(10, 0, 0), p1=(5, 0, 0))                          # records appended to p0
    assert session.next_request(w) == (42, 2, [(T, 0)], [])
    session.acknowledged(42, {(T, 0): (10, 0, 0)}, [])
    w = wanted(p0=(10, 0, 1))                                        # a new leader epoch; p1 backs off
    assert session.next_request(w) == (42, 3, [(T, 0)], [(T, 1)])
    session.acknowledged(42, {(T, 0): (10, 0, 1)}, [(T, 1)])
    assert session.sent == {(T, 0): (10, 0, 1)}
    w = wanted(p0=(10, 0, 1), p1=(5, 0, 0))                          # p1 back: sent again
    assert session.next_request(w)[2] == [(T, 1)]


def test_an_error_starts_a_new_session_with_a_full_request():
    session = FetchSession()
    w = wanted(p0=(0, -1, 0))
    session.acknowledged(7, {k: v for k, (_, v) in w.items()}, [])
    session.reset()
    assert session.next_request(w) == (0, 0, [(T, 0)], [])


def test_a_broker_that_gives_no_session_gets_full_requests():
    session = FetchSession()
    w = wanted(p0=(0, -1, 0), p1=(3, 0, 0))
    session.acknowledged(0, {k: v for k, (_, v) in w.items()}, [])
    assert session.next_request(w) == (0, -1, [(T, 0), (T, 1)], [])
    session.acknowledged(0, {}, [])
    assert session.next_request(w) == (0, -1, [(T, 0), (T, 1)], [])
