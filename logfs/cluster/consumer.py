"""One record read from the cluster at an offset: ``offset/<N>`` below the local replica's log start.

A replica bounded by ``--from`` or its own retention starts later than the
cluster's log; a lookup of ``offset/<N>`` below it is a one-off read, as
``kafka-console-consumer --partition P --offset N --max-messages 1`` does it:
a consumer (librdkafka, no group membership, no commits) assigned to the
partition at ``N``, closed after the first message.  Nothing is stored in the
replica.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from engine.records import Record
from logfs.cluster.errors import ClientLog, ClusterTimeoutError, from_kafka

if TYPE_CHECKING:
    from collections.abc import Mapping

    from engine.topic import TopicPartition

__all__ = ["read_one_record"]


def read_one_record(client_config: Mapping[str, str], tp: TopicPartition, offset: int,
                    timeout_s: float) -> Record | None:
    """The record at exactly ``offset`` on the cluster; None when there is none (below the cluster's log
    start, at or past its end, or removed by compaction). ClusterTimeoutError if no answer in ``timeout_s``."""
    consumer = Consumer({
        **client_config,
        "group.id": "logfs-offset-reader",      # required by the client; never joined (assign, no commits)
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
        "logger": ClientLog("logfs.cluster.librdkafka"),
    })
    what = f"Reading offset {offset} of {tp} from the cluster"
    try:
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset)])
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterTimeoutError(f"{what}: no answer within {timeout_s:g} s")
            message = consumer.poll(min(left, 1.0))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() in (KafkaError._PARTITION_EOF, KafkaError.OFFSET_OUT_OF_RANGE,
                                    KafkaError._AUTO_OFFSET_RESET):
                    return None
                if error.retriable():
                    continue
                raise from_kafka(KafkaException(error), what, str(client_config.get("bootstrap.servers")))
            if message.offset() != offset:
                return None     # compacted away, or a control record's offset
            headers = tuple(_header(entry) for entry in (message.headers() or []))
            return Record(offset, message.timestamp()[1], message.key(), message.value(), headers)
    finally:
        consumer.close()



def _header(entry: object) -> tuple[str, bytes | None]:
    """A librdkafka header ``(name, value)`` as a Record's."""
    # cast: librdkafka's headers are (str, value) pairs; its stub says object
    name, value = cast("tuple[str, bytes | str | None]", entry)
    if isinstance(value, str):
        return name, value.encode()
    return name, value
