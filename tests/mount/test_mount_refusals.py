"""Every refusal visible, nothing half-applied (issue 28): through a real mount and the real tools.

* a line over ``max.message.bytes`` leaves nothing, and the command that wrote it fails;
* a new name next to ``config``/``append`` that is no tool's temporary file is refused, naming the file
  probably meant, while sed -i, rsync, vim, emacs, Python's tempfile and ``mv`` keep working;
* a refused ``config`` opening changes nothing; ``>`` and ``mv`` replace the overrides at close, whole;
* ``.logfs/errors`` lists the recent refusals, and ``tail -f`` follows it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.helpers import wait_for

if TYPE_CHECKING:
    from tests.conftest import Mount

pytestmark = pytest.mark.mount

PYTHON = sys.executable


def overrides(mount) -> list[str]:
    """The override lines of ``t/config`` (the lines before the commented defaults)."""
    return [line for line in (mount / "t/config").read_text().splitlines() if line and not line.startswith("#")]


def errors(mount: Mount) -> list[str]:
    return (mount / ".logfs/errors").read_text().splitlines()


# --------------------------------------------------------------------------- an oversized line


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_an_oversized_printed_line_leaves_nothing_and_fails_the_command(mount, unbuffered):
    """``print('x'*1100000)``: written as write(line) then, unbuffered, write(newline), which was an empty record."""
    mount.sh("mkdir t && echo before >> t/0/append")
    result = mount.sh(f"PYTHONUNBUFFERED={unbuffered} {PYTHON} -c \"print('x'*1100000)\" >> t/0/append",
                      check=False)
    assert result.returncode != 0, result
    assert b"Message too long" in result.stderr, result
    mount.sh("echo next >> t/0/append")                    # the next line appends normally
    assert (mount / "t/0/records").read_bytes() == b"before\nnext\n"
    assert [line for line in errors(mount) if " t/0/append EMSGSIZE " in line], errors(mount)


def test_close_reports_a_refusal_the_write_could_not(mount):
    """A write(2) whose refused part the kernel turned into a short count: close() of the descriptor fails."""
    mount.sh("mkdir t")
    fd = os.open(mount / "t/0/append", os.O_WRONLY | os.O_APPEND)
    try:
        written = os.write(fd, b"y" * 1_100_000)           # no newline: the line's end never comes
        assert 0 < written < 1_100_000
    finally:
        with pytest.raises(OSError) as info:
            os.close(fd)
    assert info.value.errno == errno.EMSGSIZE
    mount.sh("echo next >> t/0/append")
    assert (mount / "t/0/records").read_bytes() == b"next\n"


# --------------------------------------------------------------------------- new names


def test_a_mistyped_or_new_name_is_refused_naming_the_file_probably_meant(mount):
    mount.sh("mkdir t")
    for command, meant in (("echo hi >> t/0/apend", "t/0/append"), ("echo x > t/0/recods", "t/0/records"),
                           ("echo retention.ms=1 > t/confg", "t/config")):
        result = mount.sh(command, check=False)
        assert result.returncode != 0, command
        assert b"Operation not permitted" in result.stderr, command
        assert f"did you mean {meant}?" in mount.log(), command
    result = mount.sh("touch t/0/newfile", check=False)
    assert result.returncode != 0
    assert b"Operation not permitted" in result.stderr
    assert sorted(os.listdir(mount / "t/0")) == sorted(
        ["append", "append.jsonl", "consume", "delete", "from", "offset", "records", "records.jsonl", "segments",
         "since", "state"])
    assert (mount / "t/0/records").read_bytes() == b""
    assert overrides(mount) == []
    assert any(" t/0/apend EPERM create: " in line and "did you mean t/0/append?" in line for line in errors(mount))


def test_tools_that_write_through_temporary_files_keep_working(mount, tmp_path):
    """sed -i (sedXXXXXX), rsync (.name.XXXXXX), Python's tempfile (tmpXXXXXXXX), an editor's name.tmp,
    vim (swap files .name.swp/.swx, backup name~) and emacs (lock .#name via .#-emacsXXXXXX)."""
    mount.sh("mkdir t && echo retention.ms=3600000 > t/config")
    mount.sh("sed -i 's/^retention.ms=.*/retention.ms=7200000/' t/config")
    assert overrides(mount) == ["retention.ms=7200000"]
    (tmp_path / "lines").write_bytes(b"one\ntwo\n")
    mount.sh(f"rsync {tmp_path / 'lines'} t/0/append")
    mount.sh(f"""{PYTHON} -c "
import os, tempfile
with tempfile.NamedTemporaryFile(dir='t', delete=False) as f:
    f.write(b'retention.ms=60000\\n')
os.replace(f.name, 't/config')"
""")
    assert overrides(mount) == ["retention.ms=60000"]
    mount.sh("printf 'three\\n' > t/0/append.tmp && mv t/0/append.tmp t/0/append")
    result = mount.sh("vim -N -u NONE -i NONE -es -c 'set swapfile backup writebackup backupcopy=auto' "
                      "-c 'g/^retention.ms=/s/60000/70000/' -c wq t/config", check=False)
    assert result.returncode == 0, result.stderr
    assert overrides(mount) == ["retention.ms=70000"]
    emacs = shutil.which("emacs")
    assert emacs, "emacs is needed for this test: apt-get install emacs-nox"
    result = mount.sh(f"{emacs} -Q --batch t/config --eval '(progn (setq create-lockfiles t) "
                      "(goto-char (point-max)) (insert \"segment.ms=100000\\n\") (save-buffer))'", check=False)
    assert result.returncode == 0, result.stderr
    assert overrides(mount) == ["retention.ms=70000", "segment.ms=100000"]
    assert (mount / "t/0/records").read_bytes() == b"one\ntwo\nthree\n"
    assert sorted(os.listdir(mount / "t")) == ["0", "append", "append.jsonl", "config", "delete", "groups"]
    assert "create failed" not in mount.log()
    assert "rename failed" not in mount.log()


# --------------------------------------------------------------------------- config


def test_a_refused_config_opening_changes_nothing(mount):
    mount.sh("mkdir t && echo retention.ms=5000 > t/config")
    before = os.stat(mount / "t/config").st_mtime_ns
    mount.sh_refused("echo retention.ms=abc > t/config")
    assert overrides(mount) == ["retention.ms=5000"]               # the O_TRUNC did not reset them
    assert os.stat(mount / "t/config").st_mtime_ns == before
    result = mount.sh("printf 'segment.ms=100000\\nretention.ms=soon\\n' > t/config", check=False)
    assert result.returncode != 0
    assert overrides(mount) == ["retention.ms=5000"]
    mount.sh("echo segment.ms=100000 > t/config")                   # applied at close: the mtime moves
    assert overrides(mount) == ["segment.ms=100000"]
    assert os.stat(mount / "t/config").st_mtime_ns > before
    mount.sh(": > t/config")                                        # the empty text: every override removed
    assert overrides(mount) == []


def test_ftruncate_of_a_config_opening_makes_it_a_replacement(mount):
    mount.sh("mkdir t && echo retention.ms=5000 > t/config")
    fd = os.open(mount / "t/config", os.O_WRONLY)                  # no O_TRUNC: lines would be added
    try:
        os.write(fd, b"cleanup.policy=compact\n")
        os.ftruncate(fd, 0)                                          # ... until the text is cut to nothing
        os.write(fd, b"segment.ms=100000\n")
    finally:
        os.close(fd)
    assert overrides(mount) == ["segment.ms=100000"]


def test_mv_across_filesystems_replaces_config_as_a_redirection_does(mount, tmp_path):
    """mv unlinks the target, then creates it and copies: one replacement, applied at close."""
    mount.sh("mkdir t && echo retention.ms=5000 > t/config")
    good, bad = tmp_path / "good.cfg", tmp_path / "bad.cfg"
    good.write_text("segment.ms=100000\n")
    result = mount.sh(f"mv {good} t/config", check=False)
    assert result.returncode == 0, result.stderr
    assert overrides(mount) == ["segment.ms=100000"]
    assert not good.exists()
    bad.write_text("retention.ms=soon\n")
    mount.sh_refused(f"mv {bad} t/config")
    assert overrides(mount) == ["segment.ms=100000"]
    assert bad.exists()                                                 # nothing applied, nothing lost
    assert mount.sh("rm t/config", check=False).returncode == 0          # rm alone: every override removed
    wait_for(lambda: overrides(mount) == [], "the overrides of the removed config to go")


# --------------------------------------------------------------------------- .logfs/errors


def test_logfs_errors_is_followed_by_tail_f_and_keeps_the_last_thousand(mount):
    mount.sh("mkdir t")
    tail = subprocess.Popen(["tail", "-f", str(mount / ".logfs/errors")], stdout=subprocess.PIPE)
    assert tail.stdout is not None
    os.set_blocking(tail.stdout.fileno(), False)
    seen = bytearray()

    def followed() -> bool:
        seen.extend(tail.stdout.read() or b"")                    # type: ignore[union-attr]
        return seen.endswith(b"\n")

    try:
        mount.sh("echo retention.ms=abc > t/config", check=False)
        wait_for(followed, "tail -f to print the refusal")
        line = seen.decode()
        assert " t/config EINVAL write: Invalid value abc for configuration retention.ms" in line, line
        stamp = line.split()[0]
        assert len(stamp) == len("2026-11-27T17:43:38.681Z")
        assert stamp.endswith("Z")
    finally:
        tail.kill()
        tail.communicate()     # and its pipe closed
    mount.sh("for i in $(seq 1005); do echo x > t/0/no-such-$i; done", check=False)
    lines = errors(mount)
    assert len(lines) == 1000
    assert " t/0/no-such-1005 EPERM create: " in lines[-1]
    assert " t/0/no-such-6 EPERM " in lines[0]
    # the file only grows: its size counts the dropped lines too, so a follower never sees it shrink
    assert os.stat(mount / ".logfs/errors").st_size > sum(len(line) + 1 for line in lines)
