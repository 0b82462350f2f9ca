"""Fewer passes over the bytes kafka-python receives, on the versions whose receive path logfs knows.

A replica fetcher that receives a gigabyte spends most of its thread in kafka-python 3.0's
receive path (docs/performance.md, "Many partitions"):

* ``KafkaTCPTransport._sock_recv`` (and the TLS transport's) drains a readable socket 4 KiB per
  ``recv()``, a literal with no setting: a quarter of a million calls per gigabyte;
* ``KafkaBytes.read``, which hands each partition's records to the response decoder, copies them
  twice (``bytes(bytearray[start:end])``: a bytearray slice, then its bytes).

:func:`install` replaces these methods with the same code reading :data:`RECV_BYTES` per call and
copying once, **only** when every installed method's source is exactly the one this module was
written against (:data:`KNOWN_SOURCES`, a digest per method; kafka-python 3.0.12).  Any other
kafka-python keeps its own code, and the mount says so once at INFO.  ``LOGFS_KAFKA_PYTHON_TUNING=0``
in the environment keeps kafka-python's own code too (to compare, or to rule logfs's out).

The replacements keep the originals' contracts: ``_sock_recv`` returns ``(bytes received, None)``
once the socket would block, and ``(bytes received before, KafkaConnectionError)`` when the peer
closed or the read failed, logging as the original on kafka-python's own logger; ``read`` returns
the same bytes and moves the same position.

Invariant: after :func:`install` returned True every transport and response of the process uses
the replacements; it is idempotent, and safe from any thread before the first client is made.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import ssl
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

logger = logging.getLogger(__name__)

#: bytes asked of one ``recv()``: 64 KiB drained a gigabyte with half the CPU of 4 KiB reads, and less than
#: 1 MiB reads, whose every call allocates a MiB before the kernel fills part of it
#: (scripts/bench/bench_recv.py)
RECV_BYTES = 64 << 10

#: sha256 of ``inspect.getsource`` of each method :func:`install` replaces (kafka-python 3.0.12)
KNOWN_SOURCES = {
    "kafka.net.transport.KafkaTCPTransport._sock_recv":
        "2594a6a62ec5a3e56355033514d33265dcd9513bc5c24342c1b91c90641589ff",
    "kafka.net.transport.KafkaSSLTransport._sock_recv":
        "0a592f230c5c4455245fa50057926170680e0f950c003a2186b10e578f10a481",
    "kafka.protocol.frame.KafkaBytes.read":
        "21580870f9dff4aa732e1b80061bd6d11ccd122104d7e10c7c93962417a9a3a9",
}

_kafka_log = logging.getLogger("kafka.net.transport")
_lock = threading.Lock()
_installed: bool | None = None


def _drain(owner: object, sock: socket.socket,
           would_block: tuple[type[BaseException], ...]) -> tuple[bytes, Exception | None]:
    """Everything ``sock`` holds now, read :data:`RECV_BYTES` at a time (kafka-python's contract)."""
    from kafka.errors import KafkaConnectionError

    received: list[bytes] = []
    err: Exception | None = None
    while True:
        try:
            data = sock.recv(RECV_BYTES)
        except would_block:
            break
        except BaseException as e:      # kafka-python's contract: any failure closes the socket
            _kafka_log.exception("%s: Error receiving network data closing socket", owner)
            err = KafkaConnectionError(e)
            break
        if not data:
            _kafka_log.error("%s: socket disconnected", owner)
            err = KafkaConnectionError("socket disconnected")
            break
        received.append(data)
    return (received[0] if len(received) == 1 else b"".join(received)), err


def tcp_sock_recv(self: Any) -> tuple[bytes, Exception | None]:  # Any: kafka-python's transport
    """``KafkaTCPTransport._sock_recv``, :data:`RECV_BYTES` per ``recv()``."""
    return _drain(self, self._sock, (BlockingIOError, InterruptedError))


def ssl_sock_recv(self: Any) -> tuple[bytes, Exception | None]:  # Any: kafka-python's transport
    """``KafkaSSLTransport._sock_recv``, :data:`RECV_BYTES` per ``recv()`` (at most a TLS record each)."""
    return _drain(self, self._sock,
                  (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError))


def kafka_bytes_read(self: Any, nbytes: int | None = None) -> bytes:  # Any: kafka-python's KafkaBytes
    """``KafkaBytes.read``, one copy: the bytes of ``self[position:position + nbytes]``."""
    if nbytes is None:
        nbytes = len(self) - self._idx
    start = self._idx
    self._idx = min(start + nbytes, len(self))
    with memoryview(self) as view:
        return bytes(view[start:self._idx])


def _targets() -> dict[str, tuple[type, str, Callable[..., Any]]]:
    from kafka.net import transport
    from kafka.protocol import frame

    return {
        "kafka.net.transport.KafkaTCPTransport._sock_recv": (transport.KafkaTCPTransport, "_sock_recv", tcp_sock_recv),
        "kafka.net.transport.KafkaSSLTransport._sock_recv": (transport.KafkaSSLTransport, "_sock_recv", ssl_sock_recv),
        "kafka.protocol.frame.KafkaBytes.read": (frame.KafkaBytes, "read", kafka_bytes_read),
    }


def source_digest(cls: type, name: str) -> str:
    """The sha256 of the source of ``cls.name`` (how :data:`KNOWN_SOURCES` is made)."""
    return hashlib.sha256(inspect.getsource(getattr(cls, name)).encode()).hexdigest()


def install() -> bool:
    """Use the replacements in kafka-python, if its methods are the known ones and the environment does
    not say ``LOGFS_KAFKA_PYTHON_TUNING=0``; True when installed (now or before)."""
    global _installed
    with _lock:
        if _installed is not None:
            return _installed
        import kafka

        if os.environ.get("LOGFS_KAFKA_PYTHON_TUNING", "1") == "0":
            logger.info("LOGFS_KAFKA_PYTHON_TUNING=0: kafka-python %s receives with its own code", kafka.__version__)
            _installed = False
            return False
        targets = _targets()
        try:
            known = all(source_digest(cls, name) == KNOWN_SOURCES[key] for key, (cls, name, _) in targets.items())
        except (OSError, TypeError):        # no source to compare (a zipped or compiled install)
            known = False
        if not known:
            logger.info("kafka-python %s: its receive path is not the one logfs knows; leaving it as it is "
                        "(4 KiB per recv() in 3.0)", kafka.__version__)
            _installed = False
            return False
        for cls, name, replacement in targets.values():
            setattr(cls, name, replacement)
        _installed = True
        return True
