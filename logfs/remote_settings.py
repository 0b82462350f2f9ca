"""The ``rsm.config.*`` settings of tiered storage's store, as the ``logfs`` commands take them.

``logfs mount``, ``logfs check`` and ``logfs to-kafka restore`` read them the
same way: the ``--config`` properties file's, then ``-o``'s.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

log = logging.getLogger("logfs")


#: the prefix of the remote storage's settings (Kafka's ``remote.log.storage.manager.impl.prefix``)
RSM_PREFIX = "rsm.config."


def remote_storage_settings(args: argparse.Namespace) -> dict[str, str]:
    """The ``rsm.config.*`` settings of tiered storage: the ``--config`` file's, then ``-o``'s.

    Their secret (``rsm.config.s3.secret.access.key``) is redacted from every
    log line from now on; a ``--config`` file holding it that the group or
    others can read is warned about, as a cluster mount's client settings are.
    """
    from engine.config import BrokerConfig
    from engine.remote.storage import RSM_SECRETS
    from logfs.cluster.client_settings import RedactSecrets

    settings: dict[str, str] = {}
    file_secrets = []
    if args.config:
        for name, value in BrokerConfig.read_properties_file(args.config).items():
            if name.strip().startswith(RSM_PREFIX):
                settings[name.strip()] = value.strip()
                if name.strip() in RSM_SECRETS and value.strip():
                    file_secrets.append(name.strip())
    for option in args.options:
        name, sep, value = option.partition("=")
        if sep and name.strip().startswith(RSM_PREFIX):
            settings[name.strip()] = value.strip()
    secrets = [settings[n] for n in RSM_SECRETS if settings.get(n)]
    if secrets:
        RedactSecrets(secrets).install()
    if file_secrets:
        mode = os.stat(args.config).st_mode
        if mode & 0o077:
            log.warning("Settings file %s holds secrets (%s) and can be read by %s (mode %03o): chmod 600 it",
                        args.config, ", ".join(file_secrets), "its group and others" if mode & 0o007 else "its group",
                        stat.S_IMODE(mode))
    return settings
