"""dump-log and check on real segment directories built with encode_values."""

from __future__ import annotations

import io
import shutil
import struct
from typing import TYPE_CHECKING, Any

import pytest

from engine.records import Compression, Record, encode_records, encode_values, read_header
from engine.tools import check_dirs, dump_log

if TYPE_CHECKING:
    from pathlib import Path

TS = 1_700_000_000_000
NAME = "00000000000000000000"


def write_partition(log_dir: Path, topic: str = "t", partition: int = 0) -> dict[str, Any]:
    """Three batches in one segment, with an index entry and a time index entry per batch."""
    part = log_dir / f"{topic}-{partition}"
    part.mkdir(parents=True)
    batches = [
        encode_values(0, [b"a", b"bb"], TS),
        encode_values(2, [b"ccc"], TS + 10, keys=[b"k"]),
        encode_values(3, [b"d" * 30, None], TS + 20, compression=Compression.GZIP),
    ]
    positions, position = [], 0
    for batch in batches:
        positions.append(position)
        position += len(batch)
    (part / f"{NAME}.log").write_bytes(b"".join(batches))
    index = b"".join(struct.pack(">ii", read_header(b).last_offset, p) for b, p in zip(batches, positions))
    (part / f"{NAME}.index").write_bytes(index + bytes(8 * 4))          # preallocated zero tail
    timeindex = b"".join(struct.pack(">qi", read_header(b).max_timestamp, read_header(b).last_offset)
                         for b in batches)
    (part / f"{NAME}.timeindex").write_bytes(timeindex + bytes(12 * 2))
    for name, offset in (("recovery-point-offset-checkpoint", 5), ("log-start-offset-checkpoint", 0)):
        (log_dir / name).write_text(f"0\n1\n{topic} {partition} {offset}\n")
    return {"dir": part, "batches": batches, "positions": positions}


@pytest.fixture
def good(tmp_path: Path) -> dict[str, Any]:  # Any: write_partition's dir, batches and positions
    return write_partition(tmp_path / "data")


def run_check(*dirs: Path) -> tuple[int, list[str]]:
    out = io.StringIO()
    problems = check_dirs([str(d) for d in dirs], out)
    return problems, out.getvalue().splitlines()


def test_check_clean_dir(good) -> None:
    assert run_check(good["dir"].parent) == (0, [])


def test_check_corrupt_crc_names_file_and_position(good, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(good["dir"].parent, copy)
    log = copy / "t-0" / f"{NAME}.log"
    raw = bytearray(log.read_bytes())
    raw[good["positions"][1] + 65] ^= 0x40
    log.write_bytes(bytes(raw))
    problems, lines = run_check(copy)
    # one damaged batch is one problem: its length still frames the next batch, so
    # the check goes on after it, and the index entries and the recovery point
    # past it point at readable batches (issue 9: no overstating)
    assert problems == len(lines) == 1
    assert f"{log}, position {good['positions'][1]}" in lines[0]
    assert "crc" in lines[0]


def test_check_torn_tail(good) -> None:
    log = good["dir"] / f"{NAME}.log"
    with open(log, "ab") as f:
        f.write(good["batches"][0][:40])
    problems, lines = run_check(good["dir"].parent)
    assert problems == 1
    assert "truncated" in lines[0]
    assert str(log) in lines[0]


def test_check_bad_index_entry(good) -> None:
    index = good["dir"] / f"{NAME}.index"
    raw = bytearray(index.read_bytes())
    struct.pack_into(">ii", raw, 8, 2, good["positions"][1] + 3)     # not a batch start
    index.write_bytes(bytes(raw))
    problems, lines = run_check(good["dir"].parent)
    assert problems == 1
    assert str(index) in lines[0]
    assert "not the start of a batch" in lines[0]


def test_check_index_offsets_must_increase(good) -> None:
    index = good["dir"] / f"{NAME}.index"
    raw = bytearray(index.read_bytes())
    struct.pack_into(">ii", raw, 16, 1, good["positions"][2])
    index.write_bytes(bytes(raw))
    _problems, lines = run_check(good["dir"].parent)
    assert any("not larger than the previous" in line for line in lines)
    assert any("does not match the batch" in line for line in lines)


def test_check_time_index_not_monotonic(good) -> None:
    timeindex = good["dir"] / f"{NAME}.timeindex"
    raw = bytearray(timeindex.read_bytes())
    struct.pack_into(">qi", raw, 24, TS - 5, 4)
    timeindex.write_bytes(bytes(raw))
    problems, lines = run_check(good["dir"].parent)
    assert problems == 1
    assert str(timeindex) in lines[0]
    assert "not larger" in lines[0]


def test_check_offsets_must_increase_across_batches(tmp_path) -> None:
    part = tmp_path / "data" / "t-0"
    part.mkdir(parents=True)
    (part / f"{NAME}.log").write_bytes(encode_values(0, [b"a", b"b"], TS) + encode_values(1, [b"c"], TS))
    problems, lines = run_check(tmp_path / "data")
    assert problems == 1
    assert "does not follow" in lines[0]


def test_check_checkpoints(good) -> None:
    log_dir = good["dir"].parent
    (log_dir / "recovery-point-offset-checkpoint").write_text("0\n2\nt 0 99\ngone 3 0\n")
    (log_dir / "log-start-offset-checkpoint").write_text("0\n5\nt 0 0\n")
    problems, lines = run_check(log_dir)
    assert problems == 3
    text = "\n".join(lines)
    assert "offset 99 of t-0 is outside the log [0, 5]" in text
    assert "names partition gone-3" in text
    assert "log-start-offset-checkpoint: cannot be parsed" in text


def test_check_missing_dir_and_stray_dir(tmp_path, good) -> None:
    (good["dir"].parent / "not-a-partition").mkdir()
    problems, lines = run_check(good["dir"].parent, tmp_path / "missing")
    assert problems == 2
    assert any("not-a-partition" in line for line in lines)
    assert any("missing: is not a directory" in line for line in lines)


def test_dump_log_batches_and_records(good) -> None:
    log = good["dir"] / f"{NAME}.log"
    out, err = io.StringIO(), io.StringIO()
    assert dump_log([str(log)], True, out, err) == 0
    lines = out.getvalue().splitlines()
    first = good["batches"][0]
    h = read_header(first)
    assert lines[0] == f"Dumping {log}"
    assert lines[1] == "Log starting offset: 0"
    assert lines[2] == (
        "baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: -1 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: 0 LogAppendTime: {TS} size: {len(first)} "
        f"magic: 2 compresscodec: none crc: {h.crc} isvalid: true")
    assert lines[3] == (f"| offset: 0 LogAppendTime: {TS} keySize: -1 valueSize: 1 sequence: -1 "
                        "headerKeys: [] payload: a")
    assert lines[6] == (f"| offset: 2 LogAppendTime: {TS + 10} keySize: 1 valueSize: 3 sequence: -1 "
                        "headerKeys: [] key: k payload: ccc")
    assert "compresscodec: gzip" in lines[7]
    assert lines[9] == f"| offset: 4 LogAppendTime: {TS + 20} keySize: -1 valueSize: -1 sequence: -1 headerKeys: []"
    assert len(lines) == 10


def test_dump_log_without_data_and_with_headers(tmp_path) -> None:
    log = tmp_path / "00000000000000000007.log"
    log.write_bytes(encode_records([Record(7, TS, None, b"v", (("h1", b"x"), ("h2", None)))]))
    out = io.StringIO()
    dump_log([str(log)], False, out, io.StringIO())
    assert out.getvalue().splitlines()[1] == "Log starting offset: 7"
    assert "CreateTime: " + str(TS) in out.getvalue()
    assert "| offset" not in out.getvalue()
    out = io.StringIO()
    dump_log([str(log)], True, out, io.StringIO())
    assert "headerKeys: [h1,h2] payload: v" in out.getvalue()


def test_dump_log_reports_invalid_crc_and_trailing_bytes(good) -> None:
    log = good["dir"] / f"{NAME}.log"
    raw = bytearray(log.read_bytes())
    raw[70] ^= 1
    log.write_bytes(bytes(raw) + b"\x00" * 7)
    out = io.StringIO()
    assert dump_log([str(log)], False, out, io.StringIO()) == 2
    text = out.getvalue()
    assert "isvalid: false" in text
    assert text.splitlines()[-1] == f"Found 7 invalid bytes at the end of {NAME}.log"


def test_dump_index_and_time_index(good) -> None:
    index = good["dir"] / f"{NAME}.index"
    timeindex = good["dir"] / f"{NAME}.timeindex"
    out, err = io.StringIO(), io.StringIO()
    assert dump_log([str(index), str(timeindex)], False, out, err) == 0
    p = good["positions"]
    assert out.getvalue().splitlines() == [
        f"Dumping {index}",
        f"offset: 1 position: {p[0]}", f"offset: 2 position: {p[1]}", f"offset: 4 position: {p[2]}",
        f"Dumping {timeindex}",
        f"timestamp: {TS} offset: 1", f"timestamp: {TS + 10} offset: 2", f"timestamp: {TS + 20} offset: 4",
    ]
    assert err.getvalue() == ""


def test_dump_index_mismatch_goes_to_stderr(good) -> None:
    index = good["dir"] / f"{NAME}.index"
    index.write_bytes(struct.pack(">ii", 0, good["positions"][1]))
    out, err = io.StringIO(), io.StringIO()
    assert dump_log([str(index)], False, out, err) == 1
    assert "Index offset: 0, log offset: 2" in err.getvalue()


def test_dump_unknown_file(tmp_path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("x")
    err = io.StringIO()
    dump_log([str(other)], False, io.StringIO(), err)
    assert err.getvalue() == f"Ignoring unknown file {other}\n"


def test_dump_log_of_a_missing_file_says_no_such_file(tmp_path) -> None:
    """Issue 16: ``logfs dump-log nonexist.log`` said "not named after a base offset"."""
    out, err = io.StringIO(), io.StringIO()
    assert dump_log([str(tmp_path / "nonexist.log"), str(tmp_path / "x.index")], False, out, err) == 2
    assert err.getvalue().count("No such file or directory") == 2
    assert "base offset" not in err.getvalue()
