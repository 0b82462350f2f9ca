"""Kafka's error codes, as the errno the mount answers with (SPEC.md sections 7 and 10).

The cluster's refusal is kept as the message (the broker's own words), so the
one log line of ``logfs.fs`` names it.
"""

from __future__ import annotations

import errno as _errno
import logging

from engine.errors import (
    InvalidConfigError,
    InvalidPartitionError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTopicError,
    LogfsError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)


class ClusterError(LogfsError):
    """The cluster failed a request or could not be reached (EIO)."""

    errno = _errno.EIO
    #: logged at DEBUG only (logfs.fs): set on a failure while the cluster is known to be unreachable, which
    #: the mount logged once when it happened (and logs again when the cluster answers)
    quiet = False
    #: it names records the cluster stored before the request failed (a write cut short): never quiet
    partial = False


class ClusterTimeoutError(ClusterError):
    """No answer from the cluster within the mount's bound (ETIMEDOUT)."""

    errno = _errno.ETIMEDOUT


class ClusterAuthenticationError(ClusterError):
    """The cluster refused the mount's credentials or its TLS handshake failed (EACCES)."""

    errno = _errno.EACCES


class ClusterAuthorizationError(ClusterError):
    """The cluster's ACLs do not allow the mount's principal the request (EACCES)."""

    errno = _errno.EACCES


class GroupBusyError(LogfsError):
    """The group coordinator refused a commit for a group that has active members (EBUSY): Kafka lets an
    admin commit only for an empty group (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS...)."""

    errno = _errno.EBUSY


# Kafka error names (librdkafka's KafkaError.name()) -> the engine's error of the same meaning
_BY_NAME: dict[str, type[LogfsError]] = {
    "TOPIC_ALREADY_EXISTS": TopicExistsError,
    "UNKNOWN_TOPIC_OR_PART": UnknownTopicOrPartitionError,
    "_UNKNOWN_TOPIC": UnknownTopicOrPartitionError,
    "_UNKNOWN_PARTITION": UnknownTopicOrPartitionError,
    "UNKNOWN_TOPIC_ID": UnknownTopicOrPartitionError,
    "INVALID_TOPIC_EXCEPTION": InvalidTopicError,
    "INVALID_PARTITIONS": InvalidPartitionError,
    "INVALID_REPLICATION_FACTOR": InvalidRequestError,
    "INVALID_REPLICA_ASSIGNMENT": InvalidRequestError,
    "INVALID_CONFIG": InvalidConfigError,
    "POLICY_VIOLATION": InvalidRequestError,
    "INVALID_REQUEST": InvalidRequestError,
    "OFFSET_OUT_OF_RANGE": InvalidRequestError,
    "MSG_SIZE_TOO_LARGE": RecordTooLargeError,
    "RECORD_LIST_TOO_LARGE": RecordTooLargeError,
    "INVALID_RECORD": InvalidRequestError,
    "INVALID_TIMESTAMP": InvalidRecordError,
    "_MSG_TIMED_OUT": ClusterTimeoutError,
    "_TIMED_OUT": ClusterTimeoutError,
    "REQUEST_TIMED_OUT": ClusterTimeoutError,
    "_TRANSPORT": ClusterError,
    "_ALL_BROKERS_DOWN": ClusterError,
    "TOPIC_AUTHORIZATION_FAILED": ClusterAuthorizationError,
    "GROUP_AUTHORIZATION_FAILED": ClusterAuthorizationError,
    "CLUSTER_AUTHORIZATION_FAILED": ClusterAuthorizationError,
    # the group has members: only they may commit (or delete) its offsets
    "UNKNOWN_MEMBER_ID": GroupBusyError,
    "ILLEGAL_GENERATION": GroupBusyError,
    "REBALANCE_IN_PROGRESS": GroupBusyError,
    "FENCED_INSTANCE_ID": GroupBusyError,
    "STALE_MEMBER_EPOCH": GroupBusyError,
    "NON_EMPTY_GROUP": GroupBusyError,
    "GROUP_SUBSCRIBED_TO_TOPIC": GroupBusyError,
}

#: the group coordinator is moving or loading: a request is retried (within the mount's bound), not failed
RETRIABLE_COORDINATOR_ERRORS = frozenset({"COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
                                          "NOT_COORDINATOR"})


class ClientLog:
    """Where librdkafka's and kafka-python's own log lines go: DEBUG of the mount's log.

    Both clients log every failed reconnect at ERROR; the mount says once
    that the cluster cannot be reached (and when it answers again) and names
    each failed request, so their lines only matter with ``--log-level DEBUG``.
    Passed to librdkafka as its ``logger``.
    """

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def log(self, level: int, message: str, *args: object) -> None:
        self._log.debug(message, *args)


def quiet_kafka_python() -> None:
    """kafka-python's loggers at DEBUG of the mount only (see :class:`ClientLog`)."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


def security_failure(name: str, text: str, brokers: str) -> ClusterAuthenticationError | None:
    """The error naming the setting to check, when librdkafka's error ``name``/``text`` is a refused
    authentication or a failed TLS handshake; None for any other error."""
    lowered = text.lower()
    if name == "_AUTHENTICATION":
        if "mechanism handshake failed" in lowered or "unsupported sasl mechanism" in lowered:
            check = "security.protocol and sasl.mechanism (the mechanisms the broker's listener enables)"
        else:
            check = "sasl.username and sasl.password (or sasl.jaas.config), and sasl.mechanism"
        return ClusterAuthenticationError(f"Authentication failed at the Kafka cluster at {brokers}: {text}; "
                                          f"check {check}")
    if name == "_SSL":
        return ClusterAuthenticationError(
            f"The TLS handshake with the Kafka cluster at {brokers} failed: {text}; check ssl.ca.location (or "
            "ssl.truststore.location): the CA that signed the broker's certificate, and "
            "ssl.endpoint.identification.algorithm: whether that certificate must name the host connected to")
    if name == "_TRANSPORT" and "alert" in lowered and "certificate" in lowered:
        return ClusterAuthenticationError(
            f"The Kafka cluster at {brokers} refused the mount's TLS client certificate: {text}; check "
            "ssl.keystore.location (or ssl.certificate.location and ssl.key.location) and ssl.key.password: a "
            "client certificate signed by a CA the broker trusts (its listener has ssl.client.auth=required)")
    if name == "_TRANSPORT" and ("plaintext broker listener" in lowered or "incorrect security.protocol" in lowered):
        return ClusterAuthenticationError(f"The Kafka cluster at {brokers} closed the connection: {text}; "
                                          "check security.protocol (the broker listener's)")
    return None
def quiet_while_unreachable(exc: LogfsError, reachable: bool) -> LogfsError:
    """``exc``, logged at DEBUG if the cluster is known to be unreachable: one line per outage, not per request."""
    if not reachable and isinstance(exc, ClusterError) and not exc.partial:
        exc.quiet = True
    return exc


def error_name(error: object) -> str:
    """Kafka's name of an error: librdkafka's ``KafkaError.name()`` or kafka-python's error class ``message``."""
    inner = error.args[0] if isinstance(error, Exception) and error.args and hasattr(error.args[0], "name") \
        else error
    if hasattr(inner, "name") and callable(inner.name):
        return str(inner.name())
    name = getattr(inner, "message", None)      # kafka-python: the class (per-partition errors) or an instance
    if isinstance(name, str) and name:
        return name
    return inner.__name__ if isinstance(inner, type) else type(inner).__name__


def refused(items: dict[str, str], what: str, brokers: str) -> LogfsError:
    """The error for per-item refusals of one request (``item -> Kafka error name``), all named in its message;
    the errno is the first item's."""
    first = next(iter(items.values()))
    cls = _BY_NAME.get(first, ClusterError)
    listed = ", ".join(f"{item}: {name}" for item, name in items.items())
    if issubclass(cls, ClusterError):
        return cls(f"{what}: {listed} (bootstrap servers {brokers})")
    return cls(f"{what}: the cluster refused it: {listed}")


def from_kafka(error: object, what: str, brokers: str) -> LogfsError:
    """The engine error for a librdkafka ``KafkaError`` (or a ``KafkaException`` holding one).

    ``what`` says what the mount was doing; transport failures and timeouts name
    the brokers the mount was given.
    """
    inner = error.args[0] if isinstance(error, Exception) and error.args and hasattr(error.args[0], "name") \
        else error
    name = inner.name() if hasattr(inner, "name") else type(inner).__name__
    text = inner.str() if hasattr(inner, "str") else str(inner)
    security = security_failure(name, text, brokers)
    if security is not None:        # credentials or a certificate no longer accepted: say which settings
        return ClusterAuthenticationError(f"{what}: {security}")
    cls = _BY_NAME.get(name, ClusterError)
    if cls is ClusterAuthorizationError:
        return cls(f"{what}: the cluster's ACLs do not allow it to the mount's principal: {text} ({name})")
    if issubclass(cls, ClusterError):
        return cls(f"{what}: {text} ({name}; bootstrap servers {brokers})")
    return cls(f"{what}: the cluster refused it: {text} ({name})")
