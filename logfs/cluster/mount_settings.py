"""``.logfs/config`` of a cluster mount: the settings it runs with, secrets redacted.

An embedded mount's ``.logfs/config`` is its broker configuration.  A cluster
mount's is, in four sections: where the cluster is (``bootstrap.servers``), the
Kafka client settings every client of the mount is built from (the mount's
defaults, then ``--config`` and ``-o``; ``acks`` and idempotence forced), the
replica fetcher's, the topics ``mkdir`` creates, and the local replica's
engine settings.  A secret (``SECRET_NAMES``: passwords, ``sasl.jaas.config``)
is shown as ``[redacted]``, never its value.  The cluster's own broker and
topic settings are not here: each topic's ``config`` is its DescribeConfigs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from logfs.cluster.client_settings import SECRET_NAMES
from logfs.cluster.config import FETCHER_DEFAULTS, ClusterOptions
from logfs.cluster.producer import PRODUCER_DEFAULTS

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["mount_settings_text"]

REDACTED = "[redacted]"
_CREATE_NAMES = ("num.partitions", "default.replication.factor")


def _lines(props: Mapping[str, str]) -> list[str]:
    return [f"{name}={REDACTED if name in SECRET_NAMES else value}" for name, value in sorted(props.items())]


def mount_settings_text(options: ClusterOptions, replica: Mapping[str, str]) -> bytes:
    """The text of ``.logfs/config``: ``name=value`` lines under ``#`` headings (``replica``: the local
    engine's effective settings)."""
    clients = {**PRODUCER_DEFAULTS, **options.client, "acks": "all", "enable.idempotence": "true"}
    out = ["# The Kafka cluster (--bootstrap-server)", f"bootstrap.servers={options.bootstrap}", "",
           "# Kafka client settings of the admin client, producer and replica fetcher (defaults, --config, -o)",
           *_lines(clients), "",
           "# The replica fetcher", *_lines({**FETCHER_DEFAULTS, **options.fetcher}), "",
           "# Topics mkdir creates"]
    out.extend(f"{name}={options.create[name]}" if name in options.create else f"#{name}: the cluster's default"
               for name in _CREATE_NAMES)
    # the engine's topic-creation defaults are not the replica's: the section above says what mkdir creates
    out += ["", "# The local replica (the engine's settings; each topic's own are in <topic>/config)",
            *_lines({k: v for k, v in replica.items() if k not in _CREATE_NAMES})]
    return ("\n".join(out) + "\n").encode()
