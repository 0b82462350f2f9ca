"""The console blocks of README.md and docs/*.md run as written, against a real mount laid out as
scripts/run.sh lays it out.

Each ```console block is one shell session: ``$ `` lines are commands, the
lines after one are its expected output.  Output is compared token by token
(``ls`` prints columns on a terminal and one name per line into a pipe) with
JSON timestamps masked; a command shown without output is only required to
succeed.  ``tail -f`` is stopped with SIGINT after two seconds, as a reader
would press Ctrl-C.  Each file's blocks run in order on one fresh mount.
Blocks that need Spark are run by tests/spark/test_readme_spark.py.  ```sh blocks
are not sessions of this mount: the set-up commands, and the Kafka procedures
that need a broker or a Kafka install (tests/kafka/test_kafka_to_logfs.py,
tests/kafka/test_to_kafka.py, tests/cluster/test_cluster_mount.py and
tests/kafka/test_cluster_security.py run them against real brokers).
"""

from __future__ import annotations

import re
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.conftest import ROOT, Mount
from tests.docs import console_blocks, doc_files

if TYPE_CHECKING:
    from pathlib import Path

_TIMESTAMP = re.compile(rb'"timestamp":\d+')


def _normalise(data: bytes) -> list[bytes]:
    return _TIMESTAMP.sub(b'"timestamp":T', data).split()


def _run_block(cwd: Path, commands: list[tuple[str, list[str]]]) -> None:
    shell = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=cwd, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stdin, stdout = shell.stdin, shell.stdout
    assert stdin is not None     # a pipe
    assert stdout is not None    # a pipe
    try:
        for command, expected in commands:
            run = command
            if re.search(r"\btail\b[^|;]*\s-f\b", command):
                run = f"timeout -s INT 2 {command}\n_rc=$?; [ $_rc -eq 124 ] || [ $_rc -eq 0 ]"
            marker = "__README_DONE__"
            stdin.write(f"{run}\necho {marker} $?\n".encode())
            stdin.flush()
            out = b""
            while True:
                line = stdout.readline()
                if not line:
                    raise AssertionError(f"shell ended during {command!r}")
                if line.startswith(marker.encode()):
                    status = int(line.split()[1])
                    break
                out += line
            assert status == 0, f"{command!r} exited {status}:\n{out.decode(errors='replace')}"
            if expected:
                assert _normalise(out) == _normalise("\n".join(expected).encode()), \
                    f"{command!r} printed:\n{out.decode(errors='replace')}"
    finally:
        stdin.close()
        shell.wait(timeout=30)
        stdout.close()


def _spark_block(commands) -> bool:
    return any("pipeline.py" in c or "pyspark" in c for c, _ in commands)


def _sessions(path: Path) -> list[list[tuple[str, list[str]]]]:
    return [b for b in console_blocks(path.read_text()) if not _spark_block(b)]


def test_every_console_block_of_the_docs_is_read() -> None:
    """The block rule finds every ```console fence, each with a command, and the README's first session."""
    total = 0
    for path in doc_files():
        text = path.read_text()
        blocks = console_blocks(text)
        assert len(blocks) == text.splitlines().count("```console"), path
        assert all(block for block in blocks), f"a console block of {path} has no $ command"
        total += len(blocks)
    assert _sessions(ROOT / "README.md"), "README.md shows no first session"
    assert total >= 5


@pytest.mark.mount
@pytest.mark.parametrize("doc", [p for p in doc_files() if _sessions(p)],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_console_blocks_run_as_written(tmp_path, doc: Path):
    # the layout scripts/run.sh makes: ./mnt, ./data and the .venv with the logfs command
    root = tmp_path / "project"
    m = Mount(root, {}).start()
    (root / ".venv").symlink_to(ROOT / ".venv")
    (root / "scripts").symlink_to(ROOT / "scripts")
    try:
        for commands in _sessions(doc):
            starts_outside = commands[0][0].split("#")[0].strip() == "cd mnt"
            _run_block(root if starts_outside else m.path, commands)
    finally:
        assert m.stop() == 0, m.log()
    assert "Traceback" not in m.log()
