#!/usr/bin/env python3
"""kafka-python's receive loop against logfs's (logfs/cluster/kafka_python_tuning.py), on a socketpair.

A sender thread writes ``--mb`` MiB in 1 MiB writes; the receiving thread drains the socket the way a
replica fetcher's transport does (a selector, then ``_sock_recv`` until it would block) with kafka-python
3.0's own method (4 KiB per ``recv()``) and with logfs's, and the bytes go through ``KafkaBytes`` as a
fetch response's records do (written into one, then read out).  Printed: the receiving thread's CPU
seconds per GiB for each, best of ``--repeat``, side by side.

    .venv/bin/python scripts/bench/bench_recv.py [--mb 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import selectors
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from logfs.cluster import kafka_python_tuning as tuning  # noqa: E402

FRAME = 8 << 20         # a fetch response's size


def _drain(sock_recv: Any, read: Any, total: int) -> float:
    from kafka.protocol.frame import KafkaBytes

    a, b = socket.socketpair()
    a.setblocking(False)
    payload = b"x" * (1 << 20)

    def send() -> None:
        for _ in range(total >> 20):
            b.sendall(payload)
        b.close()

    class Transport:
        _sock = a

    sender = threading.Thread(target=send)
    sender.start()
    selector = selectors.DefaultSelector()
    selector.register(a, selectors.EVENT_READ)
    started = time.thread_time()
    frame, got, ended = KafkaBytes(FRAME), 0, False
    while not ended:
        selector.select()
        data, err = sock_recv(Transport())
        ended = err is not None
        view = memoryview(data)
        while view:                         # the parser fills response frames, then the decoder reads them
            room = FRAME - frame.tell()
            frame.write(view[:room])
            view = view[room:]
            if frame.tell() == FRAME:
                frame.seek(0)
                got += len(read(frame, FRAME))
                frame = KafkaBytes(FRAME)
    cpu = time.thread_time() - started
    sender.join()
    selector.close()
    a.close()
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from kafka.net.transport import KafkaTCPTransport
    from kafka.protocol.frame import KafkaBytes

    if KafkaTCPTransport._sock_recv is tuning.tcp_sock_recv:
        raise SystemExit("kafka-python's methods are replaced already in this process")
    variants = {"kafka-python 3.0 (4 KiB recv, two copies out)": (KafkaTCPTransport._sock_recv, KafkaBytes.read),
                f"logfs ({tuning.RECV_BYTES // 1024} KiB recv, one copy out)":
                    (tuning.tcp_sock_recv, tuning.kafka_bytes_read)}
    best = {name: min(_drain(recv, read, args.mb << 20) for _ in range(args.repeat))
            for name, (recv, read) in variants.items()}
    print(f"| receive loop, {args.mb} MiB through a socketpair | CPU s per GiB | of kafka-python's |")
    print("|---|---|---|")
    base = next(iter(best.values()))
    for name, cpu in best.items():
        print(f"| {name} | {cpu / (args.mb / 1024):.2f} | {cpu / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
