"""Kafka's own tools read what logfs writes, and ``logfs dump-log`` prints what they print.

A logfs mount writes several topics (every ``compression.type``, keyed lines, small
segments, a ``before N`` deletion, a compacted topic with tombstones after our
cleaner ran); after a clean
unmount, Apache Kafka's ``DumpLogSegments`` (kafka-dump-log.sh, the released
jar) reads every ``.log``, ``.index`` and ``.timeindex`` with
``--deep-iteration --print-data-log`` and ``--index-sanity-check``: no invalid
batch, no index or time index mismatch, no error.  ``logfs dump-log`` run on
the same files prints the same lines.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LOGFS, Mount
from tests.helpers import QUICK_CLEANER, wait_for
from tests.jvm import run_tool

pytestmark = [pytest.mark.mount, pytest.mark.kafka]

DUMP = "org.apache.kafka.tools.DumpLogSegments"
OPTIONS = {**QUICK_CLEANER, "internal.log.segment.bytes": "8192", "log.index.interval.bytes": "256",
           "num.partitions": "2"}
CODECS = ["uncompressed", "gzip", "snappy", "lz4", "zstd", "producer"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory written through a real mount, then cleanly unmounted."""
    m = Mount(tmp_path_factory.mktemp("logfs-tools"), OPTIONS).start()
    try:
        for codec in CODECS:
            m.sh(f"mkdir c-{codec} && echo compression.type={codec} > c-{codec}/config")
            m.sh(f"for i in $(seq 1 400); do echo \"{codec} line $i $(printf 'x%.0s' $(seq 1 $((i % 30))))\"; "
                 f"done >> c-{codec}/0/append")
            m.sh(f"seq 1 50 | sed 's/^/p1 /' >> c-{codec}/1/append")
        # keyed lines through the topic's default partitioner, and a DeleteRecords
        m.sh("mkdir keyed && printf 'parse.key=true\\n' > keyed/config")
        m.sh("for i in $(seq 1 300); do printf 'k%d\\tvalue %d\\n' $((i % 17)) $i; done >> keyed/append")
        m.sh("echo 'before 40' > keyed/0/delete")
        # values that are not UTF-8: Java's replacement of malformed bytes is what kafka-dump-log prints
        m.sh("mkdir binary && printf '\\xed\\xa0\\x80 surrogate\\n\\xed\\xb0t\\n\\xe0\\x80x\\n\\xf0\\x90\\x80\\n"
             "\\xff\\xfe\\xc0\\xaf\\n\\xed\\xa0\\n\\xe2\\x82\\n' >> binary/0/append")
        # a compacted topic that our cleaner compacts, with tombstones
        m.sh("mkdir compacted && printf 'cleanup.policy=compact\\nparse.key=true\\nnull.marker=NULL\\n"
             "min.cleanable.dirty.ratio=0.1\\ninternal.segment.bytes=4096\\ncompression.type=lz4\\n'"
             " > compacted/config")
        for rnd in range(6):
            m.sh(f"for i in $(seq 1 60); do printf 'key%d\\tround {rnd} %d\\n' $((i % 20)) $i; done "
                 f">> compacted/0/append")
        m.sh("printf 'key3\\tNULL\\nkey4\\tNULL\\n' >> compacted/0/append")
        m.sh("for i in $(seq 1 80); do printf 'key%d\\tlast %d\\n' $((i % 20 + 5)) $i; done >> compacted/0/append")
        wait_for(lambda: json.loads((m.path / "compacted/0/state").read_bytes())["last_cleaning"],
                 "the log cleaner to clean compacted-0")
    finally:
        assert m.stop() == 0, m.log()
    return m.data


def _segment_files(data: Path) -> list[str]:
    files = []
    for part in sorted(p for p in data.iterdir() if p.is_dir()):
        files += sorted(str(f) for f in part.iterdir() if f.suffix in (".log", ".index", ".timeindex"))
    return files


def _kafka_dump(files: list[str], *args: str, base: Path) -> subprocess.CompletedProcess[bytes]:
    return run_tool(DUMP, *args, "--files", ",".join(files), base=base)


def test_the_data_dir_has_what_the_checks_need(data_dir: Path):
    files = _segment_files(data_dir)
    logs = [f for f in files if f.endswith(".log")]
    assert len(logs) > 2 * len(CODECS)     # several segments in some partitions
    assert any(os.path.getsize(f) > 0 for f in files if f.endswith(".index"))
    compacted = [f for f in logs if "/compacted-0/" in f]
    assert len(compacted) >= 1
    assert int(Path(logs[0]).stem) == 0
    assert any(int(Path(f).stem) > 0 for f in logs)


def test_kafka_dump_log_segments_reads_every_file_logfs_writes(data_dir: Path, tmp_path: Path):
    files = _segment_files(data_dir)
    result = _kafka_dump(files, "--deep-iteration", "--print-data-log", base=tmp_path)
    out = result.stdout.decode()
    err = result.stderr.decode()
    assert out.count("Dumping ") == len(files)
    assert "isvalid: false" not in out
    for problem in ("Mismatches in", "Found time index problems", "invalid bytes", "Exception", "ERROR"):
        assert problem not in out, f"{problem}:\n{out[-3000:]}\n{err[-3000:]}"
        assert problem not in err, f"{problem}:\n{out[-3000:]}\n{err[-3000:]}"
    # the compacted topic has gaps: Kafka reports them on stderr as non-consecutive offsets, which
    # is what it says of its own compacted segments too; nothing else may appear there
    other = [line for line in err.splitlines()
             if line.strip() and not line.startswith("Non-consecutive offsets in ")
             and not re.fullmatch(r"  -?\d+ is followed by \d+", line)]
    assert not other, err[-3000:]
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        assert f"compresscodec: {codec}" in out


def test_kafka_index_sanity_check_passes_on_every_index(data_dir: Path, tmp_path: Path):
    indexes = [f for f in _segment_files(data_dir) if not f.endswith(".log")]
    result = _kafka_dump(indexes, "--index-sanity-check", base=tmp_path)
    out = result.stdout.decode()
    # an empty offset index is reported as such instead of checked
    assert out.count(" passed sanity check.") + out.count(" is empty.") == len(indexes), out[-3000:]
    assert out.count(" passed sanity check.") > len(indexes) // 2
    assert "failed sanity check" not in out, result.stderr.decode()[-3000:]
    assert not result.stderr.strip(), result.stderr.decode()[-3000:]


def test_logfs_dump_log_prints_what_kafka_dump_log_prints(data_dir: Path, tmp_path: Path):
    files = _segment_files(data_dir)
    kafka = _kafka_dump(files, "--deep-iteration", "--print-data-log", base=tmp_path)
    ours = subprocess.run([str(LOGFS), "dump-log", *files, "--print-data-log"], capture_output=True, timeout=300)
    assert ours.returncode == 0, ours.stderr.decode()[-3000:]
    # Nothing is normalised: the same files give the same bytes on stdout and on stderr.
    kafka_lines = kafka.stdout.decode().splitlines()
    our_lines = ours.stdout.decode().splitlines()
    assert len(our_lines) == len(kafka_lines)
    for k, o in zip(kafka_lines, our_lines):
        assert o == k
    # stderr holds the non-consecutive offsets report: the same blocks, but Kafka prints them at
    # the end from a HashMap (in hash order of the file names), we print each after its file
    assert _report_blocks(ours.stderr.decode()) == _report_blocks(kafka.stderr.decode())


def _report_blocks(err: str) -> list[str]:
    """The blocks of a DumpLogSegments stderr report (a heading line and its indented lines), sorted."""
    blocks: list[str] = []
    for line in err.splitlines():
        if line.startswith(" ") and blocks:
            blocks[-1] += "\n" + line
        else:
            blocks.append(line)
    return sorted(blocks)

