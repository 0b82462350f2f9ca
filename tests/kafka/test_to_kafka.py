"""logfs -> Kafka: a data directory written through a mount is served by a real Apache Kafka broker.

The procedure is the documented one (docs/kafka.md, "Moving to Kafka"), run for real:
``logfs to-kafka plan`` prints kafka-topics commands, which Kafka's own
TopicCommand runs against a single-node KRaft broker; the broker is stopped
cleanly; ``logfs to-kafka adopt`` moves the partitions into its log dir; the
broker is started again.  kafka-python, as a consumer of that broker, must
then read every partition from the same log start offset to the same log end
offset, with the same offsets, keys, values, timestamps and timestamp types
the mount showed in ``records.jsonl``: nothing lost, nothing renumbered.

The data covers several topics and partitions, every ``compression.type``,
records imported through ``append.jsonl`` (CreateTime timestamps, headers, null
keys and values, bytes that are not UTF-8), a
compacted topic after our cleaner ran (gaps, a tombstone with its KIP-534
delete horizon), a topic whose log start moved by retention and one moved by
``before N`` (DeleteRecords) inside a segment.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import time
from typing import TYPE_CHECKING

import pytest

from tests.conftest import LOGFS, ROOT, Mount
from tests.docs import doc_section
from tests.helpers import JsonObject, add_config, append_lines, json_object, partition_state, wait_for
from tests.jvm import java_command
from tests.seaweedfs import seaweedfs_server  # noqa: F401  (the seaweedfs fixture)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from devtools.kafka import KafkaBroker
    from tests.seaweedfs import SeaweedFS

pytestmark = pytest.mark.mount

KAFKA_BROKER_OPTIONS = {"log.cleaner.enable": "true"}

MOUNT_OPTIONS = {
    "log.cleaner.backoff.ms": "50",
    "log.initial.task.delay.ms": "0",
    "num.partitions": "1",
}

CODECS = ("gzip", "snappy", "lz4", "zstd")


def _logfs(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run([str(LOGFS), *args], capture_output=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"logfs {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stderr.decode(errors='replace')}")
    return result


def _field(row: JsonObject, name: str) -> bytes | None:
    value = row[name]
    if value is None:
        return None
    if row.get(f"{name}Encoding") == "base64":
        return base64.b64decode(value)
    assert isinstance(value, str)
    return value.encode()


#: (offset, key, value, timestamp, timestamp type, headers) of one record
_Seen = tuple[int, bytes | None, bytes | None, int, int, list[tuple[str, bytes | None]]]


def _mount_view(mount: Mount, topic: str, partition: int) -> tuple[int, int, list[_Seen]]:
    """(log start, log end, records) of one partition as the mount shows them."""
    state = partition_state(mount, topic, partition)
    rows = [json_object(line) for line in (mount / f"{topic}/{partition}/records.jsonl").read_bytes().splitlines()]
    records: list[_Seen] = [(r["offset"], _field(r, "key"), _field(r, "value"), r["timestamp"], r["timestampType"],
                [(h["key"], _field(h, "value")) for h in r.get("headers", [])]) for r in rows]
    return state["log_start_offset"], state["log_end_offset"], records


def _consume(bootstrap: str, topic: str, partition: int) -> tuple[int, int, list[_Seen]]:
    """(beginning offset, end offset, records) of one partition read from the broker by kafka-python."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             fetch_max_wait_ms=100)
    try:
        consumer.assign([tp])
        begin = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
        consumer.seek(tp, begin)
        records: list[_Seen] = []
        deadline = time.monotonic() + 60
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"{topic}-{partition}: stuck at {consumer.position(tp)} of {end}"
            for batch in consumer.poll(timeout_ms=500).values():
                records += [(r.offset, r.key, r.value, r.timestamp, r.timestamp_type,
                             [(k, v) for k, v in (r.headers or [])]) for r in batch]
        return begin, end, records
    finally:
        consumer.close()


def _plan(mount: Mount, broker: KafkaBroker) -> str:
    """``logfs to-kafka plan`` of the mount's data dir: a script running Kafka's own kafka-topics (TopicCommand)."""
    kafka_topics = shlex.join(java_command("org.apache.kafka.tools.TopicCommand",
                                           jvm_opts=["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]))
    return _logfs("to-kafka", "plan", str(mount.data), "--node-id", "1",
                  "--bootstrap-server", broker.bootstrap, "--kafka-topics", kafka_topics).stdout.decode()


def _create_topics(plan: str, tmp_path: Path, broker: KafkaBroker, partitions: Iterable[tuple[str, int]]) -> None:
    """Run the plan's script against the broker, and wait until the broker made every one of ``partitions``."""
    script = tmp_path / "create-topics.sh"
    script.write_text(plan)
    run = subprocess.run(["sh", str(script)], capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
    broker.wait_for(lambda: all((broker.log_dir / f"{t}-{p}" / "partition.metadata").exists() for t, p in partitions),
                    "the broker to create every partition")


def _write_data(mount: Mount) -> None:
    """Topics of every kind the procedure must carry over, written through the mount."""
    # Several partitions, unkeyed lines spread over them, small segments: many segments each.
    (mount / "events").mkdir()
    add_config(mount / "events/config", "internal.segment.bytes=2048\n")
    for p in (1, 2):
        (mount / f"events/{p}").mkdir()
    for turn in range(20):
        append_lines(mount / "events/append", [b"event %d-%d %s" % (turn, i, b"x" * (i % 7)) for i in range(30)])
    append_lines(mount / "events/2/append", [bytes(range(1, 10)) + b"\xff\xfe not utf-8"])

    # One topic per codec, keyed lines (parse.key) with a tab.
    for codec in CODECS:
        topic = f"codec-{codec}"
        (mount / topic).mkdir()
        add_config(mount / f"{topic}/config",
                   f"compression.type={codec}\nparse.key=true\ninternal.segment.bytes=4096\n")
        for turn in range(10):
            append_lines(mount / f"{topic}/0/append", [b"k%d\t%s value %d %s" % (i, codec.encode(), turn, b"y" * i)
                                                 for i in range(25)])

    # JSON lines in: CreateTime timestamps, headers, null keys and values, bytes that are not UTF-8.
    (mount / "imported").mkdir()
    lines = []
    an_hour_ago = int(time.time() * 1000) - 3_600_000     # within retention.ms, which applies to CreateTime
    for i in range(40):
        row: dict[str, object] = {"key": None if i % 5 == 0 else f"key {i}",
                                  "value": None if i % 7 == 3 else f"value {i}", "timestamp": an_hour_ago + 1000 * i}
        if i % 3 == 0:
            row["headers"] = [{"key": "trace", "value": f"t{i}"}, {"key": "empty", "value": None},
                              {"key": "bin", "value": base64.b64encode(bytes([255, i])).decode(),
                               "valueEncoding": "base64"}]
        if i % 4 == 1:
            row["value"], row["valueEncoding"] = base64.b64encode(b"\x00\xff raw " + bytes([i])).decode(), "base64"
        lines.append(json.dumps(row).encode())
    append_lines(mount / "imported/0/append.jsonl", lines)

    # A compacted topic cleaned by our cleaner, with a tombstone that keeps its delete horizon.
    (mount / "table").mkdir()
    add_config(mount / "table/config", "cleanup.policy=compact\nparse.key=true\nnull.marker=NULL\n"
                                        "internal.segment.bytes=2048\nmin.cleanable.dirty.ratio=0.01\n"
                                        "delete.retention.ms=86400000\n")
    for turn in range(15):
        append_lines(mount / "table/0/append", [b"row%d\tversion %d of row %d" % (i, turn, i) for i in range(12)])
    (mount / "table/0/delete").write_bytes(b"key row3\n")
    append_lines(mount / "table/0/append", [b"row5\tNULL"])
    for turn in range(15, 30):           # more updates, so the tombstones are cleaned past
        append_lines(mount / "table/0/append", [b"row%d\tversion %d of row %d" % (i, turn, i) for i in range(12)
                                          if i not in (3, 5)])

    # Log start moved by retention (whole segments) and by DeleteRecords inside a segment.
    (mount / "retained").mkdir()
    add_config(mount / "retained/config", "internal.segment.bytes=1024\n")
    for turn in range(30):
        append_lines(mount / "retained/0/append", [b"old %d-%d" % (turn, i) for i in range(10)])
    (mount / "deleted").mkdir()
    add_config(mount / "deleted/config", "internal.segment.bytes=4096\n")
    for turn in range(10):
        append_lines(mount / "deleted/0/append", [b"line %d-%d" % (turn, i) for i in range(10)])
    (mount / "deleted/0/delete").write_bytes(b"before 37\n")


@pytest.mark.kafka
def test_a_logfs_data_dir_is_served_by_kafka_after_the_procedure(kafka_broker, logfs_mount, tmp_path):
    mount = logfs_mount(MOUNT_OPTIONS)
    _write_data(mount)
    add_config(mount / "retained/config", "internal.segment.bytes=1024\nretention.bytes=3000\n")
    wait_for(lambda: json.loads((mount / "retained/0/state").read_bytes())["log_start_offset"] > 0,
             "retention to move the log start of 'retained'", timeout=60, interval=0.1)

    def table_cleaned() -> bool:
        state = json.loads((mount / "table/0/state").read_bytes())
        rows = [json.loads(line) for line in (mount / "table/0/records.jsonl").read_bytes().splitlines()]
        tombstones = [r for r in rows if r["key"] in ("row3", "row5")]
        return (state["cleaner_position"] or 0) > max(r["offset"] for r in tombstones) \
            and all(r["value"] is None for r in tombstones)
    wait_for(table_cleaned, "the cleaner to compact 'table' past its tombstones", timeout=60, interval=0.1)

    topics = {"events": 3, **{f"codec-{c}": 1 for c in CODECS}, "imported": 1, "table": 1, "retained": 1,
              "deleted": 1}
    expected = {(t, p): _mount_view(mount, t, p) for t, n in topics.items() for p in range(n)}
    assert expected[("deleted", 0)][0] == 37
    assert expected[("retained", 0)][0] > 0
    table = expected[("table", 0)][2]
    assert [r[0] for r in table] != list(range(table[0][0], table[0][0] + len(table))), "no gaps: not cleaned"
    imported = expected[("imported", 0)][2]
    assert {r[4] for r in imported} == {0}
    assert any(r[5] for r in imported)
    assert any(r[1] is None for r in imported)
    assert mount.stop() == 0
    assert list(mount.data.glob("*/*.viewindex")), "the mount wrote no view index file"

    # Step 1: the plan, run by Kafka's own kafka-topics (TopicCommand) against the broker.
    plan = _plan(mount, kafka_broker)
    assert "internal.segment.bytes=4096 is below Kafka 4's minimum" in plan
    assert "parse.key=true is a logfs mount setting" in plan
    _create_topics(plan, tmp_path, kafka_broker, expected)

    # Step 2: stop the broker; step 3: adopt; step 4: start it again.
    kafka_broker.stop()     # SIGTERM: the JVM's exit status is 143 after a clean shutdown
    assert (kafka_broker.log_dir / ".kafka_cleanshutdown").exists()
    adopted = _logfs("to-kafka", "adopt", str(mount.data), "--broker-log-dir", str(kafka_broker.log_dir))
    assert f"Adopted {len(expected)} partitions" in adopted.stdout.decode()
    # the mount's view index sidecars stay behind: the broker's log dir holds Kafka's files only
    assert not list(kafka_broker.log_dir.glob("*/*.viewindex*"))
    kafka_broker.start()

    for (topic, partition), (start, end, records) in sorted(expected.items()):
        begin, stop, consumed = _consume(kafka_broker.bootstrap, topic, partition)
        assert (begin, stop) == (start, end), f"{topic}-{partition}: log start/end offsets differ"
        assert consumed == records, f"{topic}-{partition}: records differ"
    # Kafka loaded the logs as they were: no stray log, no recovery of the adopted partitions.
    log = (kafka_broker.base / "broker.log").read_text(errors="replace")
    assert "stray" not in log.lower()


@pytest.mark.kafka
def test_a_tiered_topic_is_restored_from_s3_then_served_by_kafka(kafka_broker, logfs_mount, seaweedfs: SeaweedFS,
                                                                 tmp_path):
    """Tiered storage (docs/tiering.md) against a real S3 server: most records of a topic only in the store.
    The plan names its partitions and refuses; ``to-kafka restore`` brings them back; the procedure then hands
    every record, byte for byte, to the broker."""
    settings = seaweedfs.settings(prefix="to-kafka")
    mount = logfs_mount({**MOUNT_OPTIONS, "remote.log.storage.system.enable": "true",
                         "remote.log.manager.task.interval.ms": "200", "log.retention.check.interval.ms": "200",
                         "internal.log.segment.bytes": "4096", **settings})
    (mount / "tiered").mkdir()
    add_config(mount / "tiered/config", "remote.storage.enable=true\nlocal.retention.bytes=12000\n")
    (mount / "tiered/1").mkdir()
    for p in (0, 1):
        for turn in range(20):
            append_lines(mount / f"tiered/{p}/append", [b"tiered %d-%d-%d %s" % (p, turn, i, b"z" * (i % 40))
                                                        for i in range(50)])
    append_lines(mount / "tiered/0/append.jsonl", [json.dumps(
        {"key": "k", "value": base64.b64encode(b"\x00\xff raw").decode(), "valueEncoding": "base64",
         "headers": [{"key": "h", "value": "v"}]}).encode()])

    def trimmed() -> bool:
        states = [json.loads((mount / f"tiered/{p}/state").read_bytes()) for p in (0, 1)]
        return all(s["log_start_offset"] == 0 and s["local_log_start_offset"] > 500 for s in states)
    wait_for(trimmed, "local retention to delete the copied segments of 'tiered'", timeout=60, interval=0.1)
    expected = {("tiered", p): _mount_view(mount, "tiered", p) for p in (0, 1)}     # the store's records too
    assert [len(records) for _, _, records in expected.values()] == [1001, 1000]
    assert mount.stop() == 0

    # The plan refuses, naming the partitions and the command; the restore brings the records back.
    refused = _logfs("to-kafka", "plan", str(mount.data), check=False)
    assert refused.returncode == 1
    for p in (0, 1):
        assert re.search(rb"tiered-%d: offsets 0 to \d+ only in remote storage \(\d+ remote log segments" % p,
                         refused.stderr), refused.stderr
    assert b"logfs to-kafka restore" in refused.stderr
    properties = tmp_path / "tiered.properties"
    properties.write_text("".join(f"{name}={value}\n" for name, value in settings.items()))
    properties.chmod(0o600)
    restored = _logfs("to-kafka", "restore", str(mount.data), "--config", str(properties)).stdout.decode()
    assert "remote.storage.enable turned off for tiered" in restored
    assert "tiered-0 restored_segments=" in restored
    assert not list(mount.data.glob("*/*.restore.tmp"))
    checked = _logfs("check", str(mount.data), "--config", str(properties), check=False)
    assert checked.returncode == 0, checked.stdout.decode()

    plan = _plan(mount, kafka_broker)
    assert "stay in the mount's remote storage, every record of them is in the local segments" in plan
    _create_topics(plan, tmp_path, kafka_broker, expected)
    kafka_broker.stop()
    adopted = _logfs("to-kafka", "adopt", str(mount.data), "--broker-log-dir", str(kafka_broker.log_dir))
    assert "Adopted 2 partitions" in adopted.stdout.decode()
    kafka_broker.start()
    for (topic, partition), (start, end, records) in sorted(expected.items()):
        assert _consume(kafka_broker.bootstrap, topic, partition) == (start, end, records), f"{topic}-{partition}"


def test_adopt_refuses_what_it_cannot_carry_over_and_changes_nothing(logfs_mount, tmp_path):
    mount = logfs_mount(MOUNT_OPTIONS)
    (mount / "t").mkdir()
    append_lines(mount / "t/0/append", [b"a", b"b"])
    broker_dir = tmp_path / "broker-logs"
    broker_dir.mkdir()

    # A data dir that is still mounted: said so (its clean-shutdown marker is gone too, but that is not the cause).
    result = _logfs("to-kafka", "adopt", str(mount.data), "--broker-log-dir", str(broker_dir), check=False)
    assert result.returncode == 1
    assert b"is in use" in result.stderr
    assert b"logfs umount" in result.stderr
    assert mount.stop() == 0
    before = {p: p.read_bytes() for p in mount.data.rglob("*") if p.is_file()}
    plan = json.loads(_logfs("to-kafka", "plan", "--json", "--node-id", "3", str(mount.data)).stdout)
    assert plan["topics"] == [{"name": "t", "partitions": 1, "replica_assignment": {"0": [3]}, "configs": {},
                               "notes": []}]
    assert plan["partitions"] == [{"topic": "t", "partition": 0, "log_start_offset": 0, "log_end_offset": 2}]

    # Not a formatted Kafka log dir; then a formatted one where the topic was never created.
    result = _logfs("to-kafka", "adopt", str(mount.data), "--broker-log-dir", str(broker_dir), check=False)
    assert result.returncode == 1
    assert b"not a formatted Kafka log dir" in result.stderr
    (broker_dir / "meta.properties").write_text("version=1\ncluster.id=x\nnode.id=1\n")
    (broker_dir / ".kafka_cleanshutdown").write_text('{"version":0,"brokerEpoch":1}')
    result = _logfs("to-kafka", "adopt", str(mount.data), "--broker-log-dir", str(broker_dir), check=False)
    assert result.returncode == 1
    assert b"t-0 does not exist in" in result.stderr
    assert {p: p.read_bytes() for p in mount.data.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in broker_dir.iterdir()) == [".kafka_cleanshutdown", "meta.properties"]


def test_the_plan_creates_the_group_commits_first_and_says_what_to_do_when_the_broker_has_them(tmp_path):
    """A broker that has hosted a group has __consumer_offsets: the script stops before creating anything."""
    from logfs.to_kafka import DataDirState, TopicState, plan_script

    state = DataDirState({"A": TopicState("A", 1), "__consumer_offsets": TopicState("__consumer_offsets", 2),
                          "b": TopicState("b", 1)}, [])
    fake = tmp_path / "kafka-topics"
    fake.write_text("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n"
                    "case \"$*\" in *__consumer_offsets*) exit 1;; esac\n")
    fake.chmod(0o755)
    script = tmp_path / "create-topics.sh"
    script.write_text(plan_script(state, node_id=1, bootstrap_server="localhost:9092", kafka_topics=str(fake)))
    result = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "remove the __consumer_offsets-* directories" in result.stderr
    assert (tmp_path / "calls").read_text().count("--create") == 1      # nothing else was created


def _readme_moving_to_kafka_block() -> list[str]:
    """The commands of the block of "Moving to Kafka" (docs/kafka.md), continuation lines joined, comments
    kept for bash."""
    section = doc_section("Moving to Kafka")
    body = re.search(r"```sh\n(.*?)```", section, re.S)
    assert body is not None, "the Moving to Kafka section has no sh block"
    commands: list[str] = []
    for line in body.group(1).splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        elif commands and commands[-1].rstrip().endswith("\\"):
            commands[-1] = commands[-1].rstrip()[:-1] + " " + line.strip()
    assert any("kafka-broker.sh" in c for c in commands)
    return commands


@pytest.mark.kafka
def test_readme_moving_to_kafka_runs_as_written(logfs_mount, tmp_path):
    """docs/kafka.md's block, command by command, in a directory laid out as scripts/run.sh lays it out (./mnt,
    ./data, scripts/, .venv/): the broker it starts (localhost:9092) then serves what the mount stored."""
    mount = logfs_mount(MOUNT_OPTIONS)
    (mount / "events").mkdir()
    (mount / "events/1").mkdir()
    for turn in range(5):
        append_lines(mount / "events/append", [b"event %d-%d" % (turn, i) for i in range(10)])
    expected = {p: _mount_view(mount, "events", p) for p in (0, 1)}
    assert sum(len(records) for _, _, records in expected.values()) == 50

    for name in ("scripts", ".venv"):
        (mount.base / name).symlink_to(ROOT / name)
    shell = subprocess.Popen(["bash", "--norc", "--noprofile", "-e"], cwd=mount.base, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        script = "".join(f"{command}\n" for command in _readme_moving_to_kafka_block())
        out, _ = shell.communicate(script.encode(), timeout=600)
        assert shell.returncode == 0, out.decode(errors="replace")[-5000:]
        assert mount.proc is not None
        assert mount.proc.wait(timeout=60) == 0                               # step 1 unmounted it
        mount.proc = None
        for partition, (start, end, records) in expected.items():
            assert _consume("localhost:9092", "events", partition) == (start, end, records)
    finally:
        if shell.poll() is None:
            shell.kill()
        subprocess.run(["bash", "scripts/kafka-broker.sh", "--stop", "./kafka-logs"], cwd=mount.base,
                       capture_output=True, timeout=180)
