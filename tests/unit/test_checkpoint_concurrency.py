"""A checkpoint read for a stale entry is never torn by a concurrent write of the same checkpoint."""

from __future__ import annotations

import threading

from engine.checkpoint import OffsetCheckpointFile
from engine.log_checkpoints import _mentions
from engine.topic import TopicPartition


def test_a_concurrent_checkpoint_write_is_never_read_torn_as_a_stale_entry(tmp_path) -> None:
    path = str(tmp_path / "log-start-offset-checkpoint")
    checkpoint = OffsetCheckpointFile(path)
    checkpoint.write({TopicPartition("a", 0): 1})
    stop = threading.Event()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            # sizes change, so an in-place write of .prev read halfway does not parse
            checkpoint.write({TopicPartition(f"topic{i}", 0): n for i in range(1 + n % 200)})

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        missing = TopicPartition("never-created", 0)
        seen = [_mentions(path, missing) for _ in range(3000)]
    finally:
        stop.set()
        thread.join()
    assert not any(seen), f"{sum(seen)} of {len(seen)} reads took a checkpoint being written for a stale entry"
