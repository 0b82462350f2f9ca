"""Kafka client settings of a cluster mount: one table, every client built from it.

A user writes Kafka's client settings as for any Kafka client (a
``client.properties`` given to Kafka's tools with ``--command-config``), under
the Java client's names, or under librdkafka's where those differ
(``sasl.username``, ``ssl.ca.location``).  The mount connects with three
clients: librdkafka's admin client and producer (confluent-kafka) and
kafka-python (the replica fetcher, and the group coordinator's OffsetDelete).
:data:`CLIENT_SETTINGS` says, for each setting, what each of them gets; a
setting that a connecting client cannot honour is refused (EINVAL, naming it)
rather than dropped, and a name in none of the table's rows is refused too.

Secrets (passwords, ``sasl.jaas.config``, key passwords) are never written to
the log: :class:`RedactSecrets` replaces their values in every log line and
traceback of the process, librdkafka's own ``debug=conf`` dump included.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["CLIENT_SETTINGS", "ClientSetting", "ClientSettings", "RedactSecrets", "client_settings_table"]


@dataclass(frozen=True)
class ClientSetting:
    """One row of the table: a setting as the user writes it and what each client gets."""

    name: str
    #: librdkafka's name (admin client and producer); how it is derived when the name alone does not say
    librdkafka: str
    #: kafka-python's name (replica fetcher, OffsetDelete); "" when it does not take it
    kafka_python: str
    secret: bool = False
    #: only the producer's (not a connection setting: the fetcher does not produce)
    producer_only: bool = False


_ROWS = [
    ClientSetting("client.id", "client.id", "client_id"),
    ClientSetting("security.protocol", "security.protocol", "security_protocol"),
    ClientSetting("sasl.mechanism", "sasl.mechanisms", "sasl_mechanism"),
    ClientSetting("sasl.mechanisms", "sasl.mechanisms", "sasl_mechanism"),
    ClientSetting("sasl.jaas.config", "sasl.username + sasl.password (PlainLoginModule, ScramLoginModule)",
                  "sasl_plain_username + sasl_plain_password", secret=True),
    ClientSetting("sasl.username", "sasl.username", "sasl_plain_username"),
    ClientSetting("sasl.password", "sasl.password", "sasl_plain_password", secret=True),
    ClientSetting("ssl.truststore.location", "ssl.ca.location (PEM only)", "ssl_cafile (PEM only)"),
    ClientSetting("ssl.truststore.type", "PEM only: JKS and PKCS12 are refused", "PEM only"),
    ClientSetting("ssl.truststore.password", "refused (a PEM truststore has none)", "refused", secret=True),
    ClientSetting("ssl.ca.location", "ssl.ca.location", "ssl_cafile"),
    ClientSetting("ssl.keystore.location", "ssl.certificate.location + ssl.key.location (PEM only)",
                  "ssl_certfile (PEM only)"),
    ClientSetting("ssl.keystore.type", "PEM only: JKS and PKCS12 are refused", "PEM only"),
    ClientSetting("ssl.keystore.password", "refused (a PEM keystore has none; ssl.key.password)", "refused",
                  secret=True),
    ClientSetting("ssl.key.password", "ssl.key.password", "ssl_password", secret=True),
    ClientSetting("ssl.certificate.location", "ssl.certificate.location", "ssl_certfile"),
    ClientSetting("ssl.key.location", "ssl.key.location", "ssl_keyfile"),
    ClientSetting("ssl.crl.location", "ssl.crl.location", "ssl_crlfile"),
    ClientSetting("ssl.endpoint.identification.algorithm", "ssl.endpoint.identification.algorithm (https, none)",
                  "ssl_check_hostname (True for https, False for empty or none)"),
    ClientSetting("debug", "debug", "its loggers, with --log-level DEBUG"),
    # the producer's own (librdkafka's names are Kafka's), passed through under the same name
    *(ClientSetting(name, name, "", producer_only=True) for name in (
        "delivery.timeout.ms", "request.timeout.ms", "linger.ms", "batch.size", "batch.num.messages",
        "compression.type", "message.max.bytes", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
        "retry.backoff.ms")),
    ClientSetting("acks", "acks (all only)", "", producer_only=True),
    ClientSetting("enable.idempotence", "enable.idempotence (true only)", "", producer_only=True),
]

#: every Kafka client setting a cluster mount takes, by the name the user writes
CLIENT_SETTINGS: dict[str, ClientSetting] = {row.name: row for row in _ROWS}

#: the settings whose value is a secret: never logged
SECRET_NAMES = frozenset(row.name for row in _ROWS if row.secret)

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_LOGIN_MODULES = ("org.apache.kafka.common.security.plain.PlainLoginModule",
                  "org.apache.kafka.common.security.scram.ScramLoginModule")
# one option of a JAAS entry: name=value, the value quoted (with \" escapes) or bare
_JAAS_OPTION = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')


def client_settings_table() -> str:
    """The table as docs/cluster.md shows it (Markdown)."""
    lines = ["| setting | librdkafka (admin client, producer) | kafka-python (replica fetcher, OffsetDelete) |",
             "|---|---|---|"]
    lines.extend(f"| `{row.name}` | {row.librdkafka} | {row.kafka_python} |"
                 for row in _ROWS if not row.producer_only)
    producer = [row for row in _ROWS if row.producer_only]
    lines.append(f"| {', '.join(f'`{row.name}`' for row in producer)} | the same names (`acks` all only, "
                 "`enable.idempotence` true only) | not used: the fetcher does not produce |")
    return "\n".join(lines)


def parse_jaas_config(text: str) -> tuple[str, str]:
    """(username, password) of a ``sasl.jaas.config`` of PlainLoginModule or ScramLoginModule.

    ``org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";``
    """
    words = [*text.strip().split(None, 2), "", ""]
    module, flag, options = words[0], words[1], words[2]
    if module not in _LOGIN_MODULES:
        raise InvalidConfigError(
            f"Invalid sasl.jaas.config: login module {module or '(none)'} is not supported (supported: "
            f"{', '.join(_LOGIN_MODULES)}; or give sasl.username and sasl.password)")
    if flag.rstrip(";") not in ("required", "requisite", "sufficient", "optional"):
        raise InvalidConfigError("Invalid sasl.jaas.config: expected 'LoginModule required username=\"...\" "
                                 "password=\"...\";'")
    found: dict[str, str] = {}
    position = 0
    options = options.strip()
    while position < len(options) and options[position:].strip() not in ("", ";"):
        match = _JAAS_OPTION.match(options, position)
        if match is None:
            raise InvalidConfigError("Invalid sasl.jaas.config: cannot parse its options (expected "
                                     "name=\"value\" pairs ending with ';')")
        quoted, bare = match.group(2), match.group(3)
        found[match.group(1)] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        position = match.end()
    if "username" not in found or "password" not in found:
        raise InvalidConfigError("Invalid sasl.jaas.config: it must give username=\"...\" and password=\"...\"")
    return found["username"], found["password"]


def _sniff(path: str) -> str:
    """The format of a key or trust store file: PEM, JKS or PKCS12 (from its first bytes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise InvalidConfigError(f"Cannot read {path}: {exc.strerror or exc}") from None
    if head.startswith((b"\xfe\xed\xfe\xed", b"\xce\xce\xce\xce")):
        return "JKS"
    if b"-----BEGIN" in head:
        return "PEM"
    return "PKCS12" if head[:1] == b"\x30" else "unknown"


_SASL_NAMES = ("sasl.mechanism", "sasl.mechanisms", "sasl.jaas.config", "sasl.username", "sasl.password")
_SSL_NAMES = ("ssl.truststore.location", "ssl.ca.location", "ssl.keystore.location", "ssl.certificate.location",
              "ssl.key.location", "ssl.key.password", "ssl.crl.location", "ssl.endpoint.identification.algorithm")


_FILE_NAMES = ("ssl.truststore.location", "ssl.ca.location", "ssl.keystore.location", "ssl.certificate.location",
               "ssl.key.location", "ssl.crl.location")


def _check_readable(name: str, path: str) -> None:
    """A file setting names a file this process can read (librdkafka's own message would not say which)."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise InvalidConfigError(f"{name} {path}: {exc.strerror or exc}") from None


def _check_protocol(given: Mapping[str, str], rd: Mapping[str, str]) -> None:
    """SASL and TLS settings only with a ``security.protocol`` that uses them: one given for nothing is a
    mistake (the mount would connect without them and wait for a broker that never answers)."""
    protocol = rd.get("security.protocol", "PLAINTEXT")
    sasl = [n for n in _SASL_NAMES if n in given]
    ssl = [n for n in _SSL_NAMES if n in given]
    if protocol.startswith("SASL_"):
        if "sasl.mechanisms" not in rd:
            raise InvalidConfigError(f"security.protocol={protocol} needs sasl.mechanism ({', '.join(_MECHANISMS)}; "
                                     "Kafka's default GSSAPI is not supported)")
        if "sasl.username" not in rd or "sasl.password" not in rd:
            raise InvalidConfigError(f"security.protocol={protocol} needs sasl.jaas.config (or sasl.username and "
                                     "sasl.password)")
    elif sasl:
        raise InvalidConfigError(f"{', '.join(sasl)} given with security.protocol={protocol}, which does not use "
                                 "them: set security.protocol=SASL_SSL or SASL_PLAINTEXT")
    if ssl and not protocol.endswith("SSL"):
        raise InvalidConfigError(f"{', '.join(ssl)} given with security.protocol={protocol}, which does not use "
                                 "them: set security.protocol=SSL or SASL_SSL")


@dataclass
class ClientSettings:
    """The mount's Kafka client settings, checked, and each client's configuration from them."""

    #: the settings as librdkafka names them (secrets included)
    librdkafka_config: dict[str, str] = field(default_factory=dict)
    #: the same for kafka-python
    kafka_python_config: dict[str, Any] = field(default_factory=dict)
    #: the secret values, for :class:`RedactSecrets`
    secrets: list[str] = field(default_factory=list)

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> ClientSettings:
        """Check ``props`` (name -> value, the user's names) against the table and translate them."""
        out = cls()
        given = dict(props)
        for name, value in given.items():
            if name not in CLIENT_SETTINGS:
                raise InvalidConfigError(
                    f"Unsupported Kafka client setting {name}: a cluster mount takes the client settings listed in "
                    "docs/cluster.md (\"Settings\")")
            if CLIENT_SETTINGS[name].secret and value:
                out.secrets.append(value)
        if "sasl.jaas.config" in given:
            username, password = parse_jaas_config(given["sasl.jaas.config"])
            out.secrets.append(password)
            for name, value in (("sasl.username", username), ("sasl.password", password)):
                if name in given and given[name] != value:
                    raise InvalidConfigError(f"sasl.jaas.config and {name} disagree: give one of them")
                given[name] = value
        rd: dict[str, str] = {}
        kp: dict[str, Any] = {}     # Any: kafka-python's settings (str, int, bool, an SSLContext)
        for name, value in given.items():
            row = CLIENT_SETTINGS[name]
            if name == "security.protocol":
                upper = value.upper()
                if upper not in _PROTOCOLS:
                    raise InvalidConfigError(f"Invalid security.protocol {value!r}: expected one of "
                                             f"{', '.join(_PROTOCOLS)}")
                rd[name], kp["security_protocol"] = upper, upper
            elif name in ("sasl.mechanism", "sasl.mechanisms"):
                upper = value.upper()
                if upper not in _MECHANISMS:
                    raise InvalidConfigError(f"Unsupported {name} {value!r}: a cluster mount supports "
                                             f"{', '.join(_MECHANISMS)}")
                rd["sasl.mechanisms"], kp["sasl_mechanism"] = upper, upper
            elif name == "ssl.endpoint.identification.algorithm":
                algorithm = value.strip().lower()
                if algorithm not in ("https", "", "none"):
                    raise InvalidConfigError(f"Invalid ssl.endpoint.identification.algorithm {value!r}: expected "
                                             "https, or empty (or none) to skip the broker's host name check")
                rd[name] = "https" if algorithm == "https" else "none"
                kp["ssl_check_hostname"] = algorithm == "https"
            elif name in ("acks", "enable.idempotence"):
                wanted = ("all", "-1") if name == "acks" else ("true",)
                if value.lower() not in wanted:
                    raise InvalidConfigError(f"{name}={value} is not allowed: a cluster mount produces with "
                                             "acks=all and enable.idempotence=true (docs/SPEC.md section 10)")
            elif name in ("sasl.username", "sasl.password", "ssl.ca.location", "ssl.certificate.location",
                          "ssl.key.location", "ssl.key.password", "ssl.crl.location", "client.id",
                          "debug") or row.producer_only:
                rd[name] = value
                if row.kafka_python and not row.producer_only and name != "debug":
                    kp[row.kafka_python] = value
            # sasl.jaas.config was resolved above, the truststore and keystore rows are below
        _check_protocol(given, rd)
        for name in _FILE_NAMES:
            if name in given:
                _check_readable(name, given[name])
        out._stores(given, rd, kp)
        out.librdkafka_config, out.kafka_python_config = rd, kp
        return out

    # Any: kafka-python's settings
    def _stores(self, given: Mapping[str, str], rd: dict[str, str], kp: dict[str, Any]) -> None:
        """``ssl.truststore.*`` and ``ssl.keystore.*`` (Java's) as the PEM files both clients read."""
        for kind, location_name in (("truststore", "ssl.truststore.location"), ("keystore", "ssl.keystore.location")):
            type_name, password_name = f"ssl.{kind}.type", f"ssl.{kind}.password"
            location = given.get(location_name)
            if location is None:
                for other in (type_name, password_name):
                    if other in given:
                        raise InvalidConfigError(f"{other} is given without {location_name}")
                continue
            declared = given.get(type_name, "").upper()
            actual = _sniff(location)
            if declared and declared != actual and actual != "unknown":
                raise InvalidConfigError(f"{location_name} {location} is a {actual} file, not {type_name}={declared}")
            if actual != "PEM" or (declared and declared != "PEM"):
                found = declared or actual
                hint = ("ssl.ca.location (a PEM file of the CA certificates; `keytool -exportcert -rfc` writes one "
                        "from a JKS or PKCS12 truststore)" if kind == "truststore" else
                        "ssl.keystore.type=PEM, or ssl.certificate.location and ssl.key.location (PEM files; "
                        "`openssl pkcs12 -nodes` writes them from a PKCS12 keystore)")
                raise InvalidConfigError(
                    f"{location_name} {location}: a {found} {kind} cannot be read by the mount's Kafka clients "
                    f"(librdkafka and kafka-python read PEM); give {hint}")
            if password_name in given:
                raise InvalidConfigError(f"{password_name} cannot be given with a PEM {kind} (Kafka refuses it too)"
                                         + ("; a key's password is ssl.key.password" if kind == "keystore" else ""))
            if kind == "truststore":
                if "ssl.ca.location" in given and given["ssl.ca.location"] != location:
                    raise InvalidConfigError("ssl.truststore.location and ssl.ca.location disagree: give one of them")
                rd["ssl.ca.location"], kp["ssl_cafile"] = location, location
            else:
                for other in ("ssl.certificate.location", "ssl.key.location"):
                    if other in given:
                        raise InvalidConfigError(f"ssl.keystore.location and {other} both given: give one of them")
                rd["ssl.certificate.location"] = rd["ssl.key.location"] = location
                kp["ssl_certfile"], kp["ssl_keyfile"] = location, location


class RedactSecrets(logging.Filter):
    """A filter on every log handler: the values of secret settings appear as ``[redacted]``.

    The mount's own messages never include a secret; this also covers the
    clients' own lines (librdkafka's ``debug=conf`` dump, kafka-python's
    DEBUG) and exception texts.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        # as written, and as a bytes repr shows it (kafka-python's DEBUG dumps of SASL frames)
        forms = {form for s in secrets if s for form in (s, repr(s.encode())[2:-1])}
        self.secrets = sorted(forms, key=len, reverse=True)

    def _redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "[redacted]")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        redacted = self._redact(message)
        if redacted != message or record.args:
            record.msg, record.args = redacted, None
        if record.exc_text:
            record.exc_text = self._redact(record.exc_text)
            record.exc_info = None
        return True

    def install(self) -> None:
        """On every handler of the root logger (where every logger's lines end)."""
        for handler in logging.getLogger().handlers:
            handler.addFilter(self)
