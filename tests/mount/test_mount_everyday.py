"""Everyday use through a real mount (issue 16): config files that round-trip, any key separator, signals.

Each test drives the mount with the tools a user would (bash redirections,
``cat``, editors) and checks what a user would see.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from logfs.fuse_connection import FUSECTL, fuse_connection
from tests.conftest import LOGFS, Mount
from tests.helpers import wait_for

pytestmark = pytest.mark.mount


def overrides(mount: Mount, topic: str = "t") -> list[str]:
    """The override lines of ``<topic>/config`` (the defaults are ``#`` comments)."""
    return [line for line in (mount / topic / "config").read_text().splitlines() if not line.startswith("#")]


def test_a_space_is_a_key_separator(mount):
    mount.sh("mkdir t && printf 'parse.key=true\\nkey.separator= \\n' > t/config")
    assert "key.separator= " in overrides(mount)
    mount.sh("echo 'user-1 logged in' >> t/0/append")
    record = json.loads(mount.sh("cat t/0/records.jsonl").stdout)
    assert (record["key"], record["value"]) == ("user-1", "logged in")


def test_config_written_back_keeps_what_is_an_override(mount, tmp_path):
    """``cat config > x; edit x; cat x > config`` changes what was edited, nothing else becomes an override."""
    mount.sh("mkdir t && echo retention.ms=3600000 > t/config && echo cleanup.policy=compact >> t/config")
    assert overrides(mount) == ["cleanup.policy=compact", "retention.ms=3600000"]
    copy = tmp_path / "config"
    mount.sh(f"cat t/config > {copy} && sed -i 's/^retention.ms=.*/retention.ms=7200000/' {copy} "
             f"&& cat {copy} > t/config")
    assert overrides(mount) == ["cleanup.policy=compact", "retention.ms=7200000"]
    mount.sh("echo segment.ms=60000 >> t/config")                    # >> adds an override
    assert len(overrides(mount)) == 3
    mount.sh("echo segment.ms=60000 > t/config")                     # > replaces the set of overrides
    assert overrides(mount) == ["segment.ms=60000"]
    mount.sh("vim -es -c 'g/^segment.ms=/s/60000/120000/' -c wq t/config")    # an editor's save
    assert overrides(mount) == ["segment.ms=120000"]
    assert "#retention.ms=604800000\n" in (mount / "t/config").read_text()    # a default again


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=["HUP", "TERM", "INT"])
def test_a_stop_signal_shuts_the_mount_down_cleanly(logfs_mount, signum):
    """A closed terminal or an ssh drop (SIGHUP) stops the mount as a broker stops: cleanly, with a log line."""
    mount = logfs_mount()
    mount.sh("mkdir t && seq 1 5 > t/0/append")
    assert mount.proc is not None
    mount.proc.send_signal(signum)
    assert mount.proc.wait(timeout=60) == 0
    mount.proc = None
    name = signal.Signals(signum).name
    assert f"Received {name}: unmounting" in mount.log()
    assert (mount.data / ".kafka_cleanshutdown").exists()
    assert not os.path.ismount(mount.path)                          # no "Transport endpoint is not connected"
    mount.start()
    assert "since clean shutdown file was found" in mount.log()      # no recovery
    assert mount.sh("cat t/0/records").stdout == b"1\n2\n3\n4\n5\n"


@pytest.mark.mount_options({"num.partitions": "60"})
def test_umount_returns_once_the_clean_shutdown_is_done(mount):
    """docs/kafka.md's "Moving to Kafka" runs `to-kafka plan` right after `logfs umount`: the marker must be there."""
    mount.sh("for t in a b c d; do mkdir $t && seq 1 100 > $t/append; done")       # 240 partitions
    result = subprocess.run([str(LOGFS), "umount", str(mount.path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert mount.proc is not None
    assert mount.proc.poll() == 0                                     # the serving process has exited
    mount.proc = None
    assert (mount.data / ".kafka_cleanshutdown").exists()
    assert "Shutdown completed" in mount.log()


def test_umount_names_a_mount_that_does_not_answer_and_abort_ends_it(mount):
    """A logfs that cannot answer (here stopped; after a kill -9 it can be stuck in the kernel, unable to exit:
    logfs.fuse_connection): `logfs umount` says so instead of waiting for good, and `--abort` ends the FUSE
    connection, so the processes waiting on the mount get an error and the mount goes."""
    mount.sh("mkdir t && seq 1 5 > t/0/append && sync t/0/append")
    assert mount.proc is not None
    connection = fuse_connection(mount.path)
    mount.proc.send_signal(signal.SIGSTOP)
    try:
        reader = subprocess.Popen(["cat", str(mount.path / "t/0/records")], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        result = subprocess.run([str(LOGFS), "umount", str(mount.path)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 1, result
        assert "does not answer within 10 s" in result.stderr, result.stderr
        assert "logfs umount --abort" in result.stderr, result.stderr
        assert reader.poll() is None                                  # still waiting on the stopped logfs
        result = subprocess.run([str(LOGFS), "umount", "--abort", str(mount.path)], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "aborted the FUSE connection" in result.stderr
        _out, err = reader.communicate(timeout=60)
        assert reader.returncode != 0, err                            # an error, never a short read that exits 0
        assert b"Software caused connection abort" in err, err        # ECONNABORTED
        assert not os.path.ismount(mount.path)
    finally:
        mount.proc.send_signal(signal.SIGKILL)
        mount.proc.send_signal(signal.SIGCONT)
        mount.proc.wait(timeout=60)
        mount.proc = None
    # the old connection's last reference goes with the killed process: then the mount point is free
    wait_for(lambda: not os.path.exists(f"{FUSECTL}/{connection}"), "the aborted connection to go")
    mount.start()                                                     # recovered as after any crash
    assert mount.sh("cat t/0/records").stdout == b"1\n2\n3\n4\n5\n"


def test_sed_i_rsync_and_vim_write_through_temporary_files(mount, tmp_path):
    """Tools that write a temporary file and rename it over the target: config takes it whole, append appends."""
    mount.sh("mkdir t && echo retention.ms=3600000 > t/config")
    mount.sh("sed -i 's/^retention.ms=3600000$/retention.ms=7200000/' t/config")
    assert overrides(mount) == ["retention.ms=7200000"]
    source = tmp_path / "lines"
    source.write_bytes(b"one\ntwo\nthree\n")
    mount.sh(f"rsync {source} t/0/append")
    mount.sh(f"rsync {source} t/0/append")                            # again: appended again, not replaced
    assert mount.sh("cat t/0/records").stdout == b"one\ntwo\nthree\n" * 2
    before_vim = len(mount.log())
    result = mount.sh("vim -N -u NONE -i NONE -es -c 'set swapfile' -c 'g/^retention.ms=/s/7200000/60000/' "
                      "-c wq t/config", check=False)
    assert result.returncode == 0, result.stderr
    assert overrides(mount) == ["retention.ms=60000"]
    assert "EPERM" not in mount.log()[before_vim:]                    # swap, probe and backup files all worked
    assert mount.sh("ls -a t | sort").stdout.split() == sorted(
        [b".", b"..", b"0", b"append", b"append.jsonl", b"config", b"delete", b"groups"])    # nothing left over
    assert not list(mount.data.glob("t-0/*sed*"))
    assert not list(mount.data.glob("**/.append.*"))
    # a bad config line fails the rename and applies nothing; the temporary file stays for the user to fix
    result = mount.sh("sed -i 's/^retention.ms=.*/retention.ms=soon/' t/config", check=False)
    assert result.returncode != 0
    assert overrides(mount) == ["retention.ms=60000"]
    # the rest of the namespace stays fixed
    for command in ("mv t/config t/config.old", "touch t/0/segments/x", "touch new-file", "mv t/0/records t/r"):
        result = mount.sh(command, check=False)
        assert result.returncode != 0, command
        assert b"Operation not permitted" in result.stderr, command


def test_to_kafka_plan_on_a_live_mount_says_it_is_mounted(mount):
    mount.sh("mkdir t && echo x > t/0/append")
    result = subprocess.run([str(LOGFS), "to-kafka", "plan", str(mount.data)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "is in use" in result.stderr, result.stderr
    assert "logfs umount" in result.stderr, result.stderr
    assert "not shut down cleanly" not in result.stderr


def test_the_startup_summary_comes_first_and_the_timestamps_stay_in_order(logfs_mount):
    mount = logfs_mount()
    mount.sh("mkdir t u")
    mount.stop()
    mount.start()                                   # loads two logs: their lines follow the summary
    lines = [line for line in mount.log().splitlines() if line.startswith("[")]
    second_start = max(i for i, line in enumerate(lines) if " loaded " in line and "INFO logfs " in line)
    assert " loaded 2 logs from " in lines[second_start]
    stamps = [line[1:24] for line in lines[second_start:second_start + 6]]
    assert stamps == sorted(stamps), lines[second_start:second_start + 6]


def test_cached_names_of_a_deleted_topic_are_dropped_at_once(mount):
    """The kernel caches topic and partition names (logfs.nodes.STABLE_TIMEOUT_S): a deletion drops them."""
    script = ("mkdir t && echo a >> t/0/append && stat t t/0 t/0/append > /dev/null && "
              "echo topic > t/delete && if test -e t || test -e t/0/append; then exit 9; fi && "
              "mkdir t && echo b >> t/0/append && cat t/0/records")
    assert mount.sh(script).stdout == b"b\n"                         # the new topic, not the cached old one
    mount.sh("stat t/0 > /dev/null && rmdir t && if test -e t/0; then exit 9; fi")


def test_stable_attributes_are_served_from_the_kernel_cache(mount):
    """``stat`` of ``append`` does not reach the mount within the cache time (measured by its request count)."""
    mount.sh("mkdir t")
    os.stat(mount / "t/0/append")
    before = _requests(mount)
    for _ in range(50):
        os.stat(mount / "t/0/append")
    assert _requests(mount) - before < 10        # reading stats.json itself costs a few


def _requests(mount: Mount) -> int:
    """lookup and getattr requests the mount served (``.logfs/stats.json``)."""
    return int(json.loads((mount / ".logfs/stats.json").read_bytes())["metadata_requests"])


def test_tail_F_never_prints_a_record_twice_across_deletions(mount, tmp_path):
    """A follower by name keeps its file: `before N` and retention below it re-feed nothing downstream."""
    mount.sh("mkdir t && seq 1 5 > t/0/append")
    out = open(tmp_path / "followed", "wb")
    err = open(tmp_path / "tail.err", "wb")
    # polling, and looking the name up again at every poll that finds nothing new
    tail = subprocess.Popen(["tail", "-F", "-n", "+1", "-s", "0.05", "--max-unchanged-stats=1",
                             "---disable-inotify", "t/0/records"],
                            cwd=mount.path, stdout=out, stderr=err)
    try:
        followed = tmp_path / "followed"
        wait_for(lambda: followed.read_bytes().count(b"\n") == 5, "tail -F printing the five records")
        mount.sh("echo 'before 3' > t/0/delete")                       # DeleteRecords below the follower
        wait_for(lambda: "log start offset is now 3" in mount.log(), "the DeleteRecords logged")
        assert mount.sh("cat t/0/records").stdout == b"4\n5\n"          # a new reader meanwhile: what is left
        mount.sh("seq 6 8 >> t/0/append")
        wait_for(lambda: followed.read_bytes().endswith(b"8\n"), "tail -F printing 8")
        mount.sh("echo 'before 7' > t/0/delete && seq 9 10 >> t/0/append")
        wait_for(lambda: followed.read_bytes().endswith(b"10\n"), "tail -F printing 10")
        assert mount.sh("cat t/0/records && tail -n 1 t/0/records").stdout == b"8\n9\n10\n10\n"
        looked_up = _requests(mount)
        wait_for(lambda: _requests(mount) > looked_up + 20, "tail -F looking the name up again, many times")
    finally:
        tail.terminate()
        tail.wait(timeout=30)
        out.close()
        err.close()
    assert followed.read_bytes() == b"".join(b"%d\n" % i for i in range(1, 11))
    assert b"replaced" not in (tmp_path / "tail.err").read_bytes()
    assert mount.sh("cat t/0/records").stdout == b"8\n9\n10\n"           # closed: a fresh file from the log start
