"""Batches as Kafka's Java producer and librdkafka write them, through the compiled walk of the views.

A real broker (tests/kafka_broker.py) is written by Kafka's ``ProducerPerformance`` (every codec) and by
``kcat -P -K: -H`` (keys, null keys and values, headers, every codec).  Every batch of its ``.log`` files must
be taken by the compiled walk (``kernels.records_text`` / ``records_jsonl``: not left to the Python fallback),
render the bytes the general decoder renders (the kernels switched off), and the text view must be what
librdkafka's consumer prints (``kcat -C -f '%s\\n'``).
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

import pytest

from engine.records import compiled, decode_text
from engine.records.decode import _records_section
from engine.records.format import TIMESTAMP_TYPE_MASK
from engine.records.reader import read_chunks
from engine.views import render, walk
from tests.jvm import run_tool

if TYPE_CHECKING:
    from pathlib import Path

    from engine.records.reader import ReadAt
    from tests.kafka_broker import KafkaBroker

pytestmark = [pytest.mark.kafka]

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
RECORDS = 3000


def _kcat(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["kcat", *args], input=stdin, capture_output=True, check=True, timeout=120).stdout


def _python(call, *args):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(compiled, "KERNELS", None)
        return call(*args)


def _reader(fd: int) -> ReadAt:
    """read_chunks' reads of an open file: ``size`` bytes at ``position``."""
    return lambda position, size: os.pread(fd, size, position)


def _text_of_log(partition_dir: Path, topic: str) -> bytes:
    """The text view of every batch of the partition, each checked against the walk and the general decoder."""
    kernels = compiled.KERNELS
    assert kernels is not None
    text = []
    batches = 0
    for log in sorted(partition_dir.glob("*.log")):
        fd = os.open(log, os.O_RDONLY)
        try:
            for chunk in read_chunks(_reader(fd), 0, None, 1 << 20, path=str(log),
                                     verify_crc=True):
                for off, header in chunk.batches:
                    header, section = _records_section(chunk.buf, off, header, view=True)
                    if section is None:
                        continue                        # a control batch renders nothing
                    batches += 1
                    pieces = render.compiled_pieces(topic, 0, int(header.timestamp_type))
                    assert kernels.records_text(section, header.records_count) is not None, \
                        f"the walk refused the batch at offset {header.base_offset} of {log}"
                    assert kernels.records_jsonl(section, header.records_count, header.base_offset,
                                                 header.base_timestamp, bool(header.attributes & TIMESTAMP_TYPE_MASK),
                                                 header.max_timestamp, pieces, False) is not None
                    lines = bytes(decode_text(chunk.buf, off, header))
                    assert lines == bytes(_python(decode_text, chunk.buf, off, header))
                    jsonl = walk.batch_jsonl(chunk.buf, off, header, topic, 0)
                    assert jsonl == _python(walk.batch_jsonl, chunk.buf, off, header, topic, 0)
                    assert walk.batch_view_sizes(chunk.buf, off, header, topic, 0) == \
                        (len(lines), len(jsonl), header.records_count)
                    text.append(lines)
        finally:
            os.close(fd)
    assert batches > 0
    return b"".join(text)


@pytest.mark.parametrize("codec", CODECS)
def test_the_java_producers_batches_render_through_the_walk(kafka_broker: KafkaBroker, codec: str,
                                                            tmp_path: Path) -> None:
    topic = f"java-{codec}"
    kafka_broker.create_topic(topic)
    run_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", str(RECORDS),
             "--record-size", "100", "--throughput", "-1", "--bootstrap-server", kafka_broker.bootstrap,
             "--command-property", "acks=1", "--command-property", "linger.ms=5",
             "--command-property", f"compression.type={codec}", base=tmp_path)
    consumed = _kcat("-C", "-e", "-q", "-b", kafka_broker.bootstrap, "-t", topic, "-f", "%s\n")
    assert consumed.count(b"\n") == RECORDS
    assert _text_of_log(kafka_broker.log_dir / f"{topic}-0", topic) == consumed


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafkas_keyed_batches_with_headers_render_through_the_walk(kafka_broker: KafkaBroker,
                                                                        codec: str) -> None:
    topic = f"kcat-{codec}"
    kafka_broker.create_topic(topic)
    # -Z: an empty key or value is sent as null; every record carries the two headers (one of them null)
    lines = [b"user-%d:{\"n\":%d,\"caf\xc3\xa9\":\"\\u0001\"}" % (i % 17, i) if i % 5 else
             (b":no key %d" % i if i % 2 else b"k%d:" % i) for i in range(RECORDS)]
    _kcat("-P", "-b", kafka_broker.bootstrap, "-t", topic, "-p", "0", "-K:", "-Z", "-z", codec,
          "-H", "traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "-H", "nothing",
          stdin=b"\n".join(lines) + b"\n")
    consumed = _kcat("-C", "-e", "-q", "-b", kafka_broker.bootstrap, "-t", topic, "-f", "%s\n")
    assert consumed.count(b"\n") == RECORDS
    assert _text_of_log(kafka_broker.log_dir / f"{topic}-0", topic) == consumed
