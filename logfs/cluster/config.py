"""The settings of a cluster mount: which are the local replica's, which the Kafka clients'.

``logfs mount MNT --bootstrap-server ... [--config FILE] -o name=value``: the
file (a Kafka client properties file, as Kafka's tools take with
``--command-config``; it may also hold the replica's settings) first, then
``-o``.  A name of the embedded broker's configuration (SPEC.md section 2:
``log.segment.bytes``, ``log.flush.interval.ms``, ...) configures the local
replica's ``LogManager``; ``num.partitions`` and ``default.replication.factor``
are the defaults of topics the mount creates (the cluster's own when not
given); the mount's own ``metadata.max.age.ms``, ``metadata.listing.max.age.ms`` and
``fetch.max.wait.ms`` tune the replica fetcher; every other name must be a Kafka client setting of
logfs.cluster.client_settings (``security.protocol``, ``sasl.jaas.config``,
``ssl.truststore.location``, ``delivery.timeout.ms``, ...), from which every
client the mount connects with is configured.  Any other name is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import BROKER_CONFIG_NAMES
from engine.errors import InvalidConfigError
from logfs.cluster.client_settings import ClientSettings

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["ClusterOptions", "split_options", "LOCAL_TOPIC_NAMES", "REPLICA_DEFAULTS"]

#: topic settings that are logfs's own (how lines become records): kept locally, never sent to the cluster
LOCAL_TOPIC_NAMES = frozenset({"parse.key", "key.separator", "null.marker"})

#: the local replica follows the cluster: no retention or compaction of its own unless -o asks for it
REPLICA_DEFAULTS = {"log.retention.ms": "-1", "log.retention.bytes": "-1", "log.cleaner.enable": "false"}

_CREATE_NAMES = ("num.partitions", "default.replication.factor")
#: the replica fetcher's settings when ``-o`` gives none: its metadata poll, full listing and long poll
FETCHER_DEFAULTS = {"metadata.max.age.ms": "2000", "metadata.listing.max.age.ms": "10000", "fetch.max.wait.ms": "500"}
_FETCHER_NAMES = tuple(FETCHER_DEFAULTS)


@dataclass
class ClusterOptions:
    bootstrap: str
    local: list[str] = field(default_factory=list)          # name=value for the local LogManager
    client: dict[str, str] = field(default_factory=dict)    # Kafka client settings, as the user named them
    create: dict[str, str] = field(default_factory=dict)    # num.partitions, default.replication.factor
    fetcher: dict[str, str] = field(default_factory=dict)
    #: the client settings checked and translated for each client (logfs.cluster.client_settings)
    settings: ClientSettings = field(default_factory=ClientSettings)

    def client_config(self) -> dict[str, str]:
        """librdkafka's configuration (the admin client and the producer)."""
        return {"bootstrap.servers": self.bootstrap, **self.settings.librdkafka_config}

    def fetcher_client_config(self) -> dict[str, Any]:     # Any: kafka-python's settings
        """kafka-python's configuration (the replica fetcher, OffsetDelete), without the bootstrap servers."""
        return dict(self.settings.kafka_python_config)

    @property
    def timeout_s(self) -> float:
        """The bound of every call to the cluster: ``delivery.timeout.ms`` (the mount's default 30 s)."""
        return int(self.client.get("delivery.timeout.ms", "30000")) / 1000


def split_options(bootstrap: str, options: Sequence[str],
                  file_props: Mapping[str, str] | None = None) -> ClusterOptions:
    """Sort the ``--config`` file's settings, then the ``-o`` options, into the local replica's, the topic
    defaults, the fetcher's and the clients' (refusing a name none of them knows)."""
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    if not servers or any(":" not in s for s in servers):
        raise InvalidConfigError(f"Invalid --bootstrap-server {bootstrap!r}: expected HOST:PORT[,HOST:PORT...]")
    out = ClusterOptions(",".join(servers))
    given: set[str] = set()
    pairs: list[tuple[str, str]] = [(k.strip(), v.strip()) for k, v in (file_props or {}).items()
                                    if k.strip() != "bootstrap.servers"]   # --bootstrap-server says where
    for option in options:
        name, sep, value = option.partition("=")
        if not sep:
            raise InvalidConfigError(f"Invalid -o option {option!r}: expected name=value")
        if not name.strip():     # the value may be a secret: never shown
            raise InvalidConfigError("Invalid -o option: no name before '=' (expected name=value)")
        pairs.append((name.strip(), value.strip()))
    for name, value in pairs:
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
    out.settings = ClientSettings.from_props(out.client)
    for name, value in REPLICA_DEFAULTS.items():
        if name not in given and not (name == "log.retention.ms" and given & {"log.retention.hours",
                                                                               "log.retention.minutes"}):
            out.local.append(f"{name}={value}")
    return out
