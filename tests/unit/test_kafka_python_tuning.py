"""kafka-python's receive path with fewer passes, its contracts kept (logfs.cluster.kafka_python_tuning)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.errors import KafkaConnectionError
from kafka.net import transport
from kafka.protocol import frame

from logfs.cluster import kafka_python_tuning as tuning

if TYPE_CHECKING:
    from collections.abc import Iterator

REPLACEMENTS = (tuning.tcp_sock_recv, tuning.ssl_sock_recv, tuning.kafka_bytes_read)


def test_the_installed_kafka_python_is_the_one_whose_receive_path_is_known() -> None:
    """A kafka-python upgrade that changes these methods must be looked at: the tuning then stays out."""
    for key, (cls, name, _) in tuning._targets().items():
        if getattr(cls, name) in REPLACEMENTS:
            continue                     # installed already by another test of this process
        assert tuning.source_digest(cls, name) == tuning.KNOWN_SOURCES[key], key
    assert tuning.install()
    assert transport.KafkaTCPTransport._sock_recv is tuning.tcp_sock_recv
    assert transport.KafkaSSLTransport._sock_recv is tuning.ssl_sock_recv
    assert frame.KafkaBytes.read is tuning.kafka_bytes_read


class _Transport:
    def __init__(self, sock: object) -> None:
        self._sock = sock


class _CountingSocket:
    """A real socket's ``recv``, counting the bytes of each call."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sizes: list[int] = []

    def recv(self, n: int) -> bytes:
        data = self.sock.recv(n)
        self.sizes.append(len(data))
        return data


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def test_a_readable_socket_is_drained_whole_in_large_reads(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, peer = pair
    payload = bytes(range(256)) * 600          # 153,600 bytes: 38 reads of 4 KiB
    peer.sendall(payload)
    counting = _CountingSocket(ours)
    data, err = tuning.tcp_sock_recv(_Transport(counting))
    assert err is None
    assert data == payload
    # RECV_BYTES at a time (the last read short), then EAGAIN: not 38 reads of 4 KiB
    assert len(counting.sizes) <= -(-len(payload) // tuning.RECV_BYTES) + 1, counting.sizes
    assert max(counting.sizes) > 4096, counting.sizes


def test_a_closed_peer_is_a_connection_error_after_the_bytes_it_sent(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, peer = pair
    peer.sendall(b"last words")
    peer.close()
    data, err = tuning.tcp_sock_recv(_Transport(ours))
    assert data == b"last words"
    assert isinstance(err, KafkaConnectionError)
    assert "socket disconnected" in str(err)


def test_an_empty_socket_returns_nothing_and_no_error(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, _ = pair
    data, err = tuning.tcp_sock_recv(_Transport(ours))
    assert data == b""
    assert err is None


def _original_read(buf: bytearray, idx: int, nbytes: int | None) -> tuple[bytes, int]:
    """kafka-python 3.0.12's ``KafkaBytes.read``, as its source reads, on a plain bytearray."""
    if nbytes is None:
        nbytes = len(buf) - idx
    start = idx
    idx += nbytes
    idx = min(idx, len(buf))
    return bytes(buf[start:idx]), idx


@given(st.binary(max_size=300), st.lists(st.one_of(st.none(), st.integers(0, 120)), max_size=8))
def test_kafka_bytes_read_returns_what_kafka_python_s_does(data: bytes, reads: list[int | None]) -> None:
    kb = frame.KafkaBytes(len(data))
    kb.write(data)
    kb.seek(0)
    plain, idx = bytearray(data), 0
    for n in reads:
        got = tuning.kafka_bytes_read(kb, n)
        want, idx = _original_read(plain, idx, n)
        assert got == want
        assert type(got) is bytes
        assert kb.tell() == idx
    kb.write(b"")                            # the buffer is not left exported (a bytearray with a view can't resize)
    kb.extend(b"x")
