"""The ``-o name=value`` options of a cluster mount: which are the local replica's, which the clients'.

``logfs mount MNT --bootstrap-server ... -o name=value``: a name of the
embedded broker's configuration (SPEC.md section 2: ``log.segment.bytes``,
``log.flush.interval.ms``, ...) configures the local replica's ``LogManager``;
``num.partitions`` and ``default.replication.factor`` are the defaults of
topics the mount creates (the cluster's own when not given); the mount's own
``metadata.max.age.ms``, ``metadata.listing.max.age.ms`` and ``fetch.max.wait.ms`` tune the replica fetcher;
every other name is a Kafka client setting under librdkafka's name
(``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
``ssl.ca.location``, ``delivery.timeout.ms``, ...), given to the producer and
the admin client, and, translated, to the replica fetcher (kafka-python).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import BROKER_CONFIG_NAMES
from engine.errors import InvalidConfigError

__all__ = ["ClusterOptions", "split_options", "LOCAL_TOPIC_NAMES", "REPLICA_DEFAULTS"]

#: topic settings that are logfs's own (how lines become records): kept locally, never sent to the cluster
LOCAL_TOPIC_NAMES = frozenset({"parse.key", "key.separator", "null.marker"})

#: the local replica follows the cluster: no retention or compaction of its own unless -o asks for it
REPLICA_DEFAULTS = {"log.retention.ms": "-1", "log.retention.bytes": "-1", "log.cleaner.enable": "false"}

_CREATE_NAMES = ("num.partitions", "default.replication.factor")
_FETCHER_NAMES = ("metadata.max.age.ms", "metadata.listing.max.age.ms", "fetch.max.wait.ms")

# librdkafka's names -> kafka-python's, for the replica fetcher
_KAFKA_PYTHON_NAMES = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "client.id": "client_id",
}


@dataclass
class ClusterOptions:
    bootstrap: str
    local: list[str] = field(default_factory=list)          # name=value for the local LogManager
    client: dict[str, str] = field(default_factory=dict)    # librdkafka settings
    create: dict[str, str] = field(default_factory=dict)    # num.partitions, default.replication.factor
    fetcher: dict[str, str] = field(default_factory=dict)

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap, **self.client}

    def fetcher_client_config(self) -> dict[str, Any]:
        """The client settings the replica fetcher (kafka-python) understands."""
        out: dict[str, Any] = {}
        for name, value in self.client.items():
            if name in _KAFKA_PYTHON_NAMES:
                out[_KAFKA_PYTHON_NAMES[name]] = value
        if "security_protocol" in out:
            out["security_protocol"] = out["security_protocol"].upper()
        return out

    @property
    def timeout_s(self) -> float:
        """The bound of every call to the cluster: ``delivery.timeout.ms`` (the mount's default 30 s)."""
        return int(self.client.get("delivery.timeout.ms", "30000")) / 1000


def split_options(bootstrap: str, options: Sequence[str]) -> ClusterOptions:
    """Sort ``-o`` options into the local replica's, the topic defaults, the fetcher's and the clients'."""
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    if not servers or any(":" not in s for s in servers):
        raise InvalidConfigError(f"Invalid --bootstrap-server {bootstrap!r}: expected HOST:PORT[,HOST:PORT...]")
    out = ClusterOptions(",".join(servers))
    given: set[str] = set()
    for option in options:
        name, sep, value = option.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name:
            raise InvalidConfigError(f"Invalid -o option {option!r}: expected name=value")
        given.add(name)
        if name in _CREATE_NAMES:
            if not value.lstrip("-").isdigit():
                raise InvalidConfigError(f"Invalid value {value!r} for {name}: expected an integer")
            out.create[name] = value
        elif name in _FETCHER_NAMES:
            if not value.isdigit():
                raise InvalidConfigError(f"Invalid value {value!r} for {name}: expected milliseconds")
            out.fetcher[name] = value
        elif name in BROKER_CONFIG_NAMES:
            out.local.append(f"{name}={value}")
        else:
            out.client[name] = value
    for name, value in REPLICA_DEFAULTS.items():
        if name not in given and not (name == "log.retention.ms" and given & {"log.retention.hours",
                                                                               "log.retention.minutes"}):
            out.local.append(f"{name}={value}")
    return out
