"""The table of Kafka client settings (logfs/cluster/client_settings.py), checked against the real clients.

Every librdkafka name the table gives is one librdkafka accepts (a real
``Producer`` is configured with it), every kafka-python name one kafka-python's
connection manager takes (its own DEFAULT_CONFIG), so no setting is dropped on
the way to a client.  The secured brokers themselves are in
tests/kafka/test_cluster_security.py.
"""

from __future__ import annotations

import logging
import subprocess
from typing import TYPE_CHECKING

import pytest

from engine.errors import InvalidConfigError
from logfs.cluster.client_settings import (
    CLIENT_SETTINGS,
    ClientSettings,
    RedactSecrets,
    client_settings_table,
    parse_jaas_config,
)
from logfs.cluster.config import split_options
from tests.docs import doc_section

if TYPE_CHECKING:
    from pathlib import Path

JAAS_SCRAM = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="bob" '
              'password="p\\"w;=x";')


def _pem(tmp_path: Path) -> Path:
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=t"], check=True, capture_output=True)
    combined = tmp_path / "combined.pem"
    combined.write_text(cert.read_text() + key.read_text())
    return combined


def test_jaas_config_gives_username_and_password() -> None:
    assert parse_jaas_config(JAAS_SCRAM) == ("bob", 'p"w;=x')
    assert parse_jaas_config('org.apache.kafka.common.security.plain.PlainLoginModule required\n'
                             '  username=alice password="a b";') == ("alice", "a b")
    for bad in ('com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;',
                'org.apache.kafka.common.security.plain.PlainLoginModule required username="a";'):
        with pytest.raises(InvalidConfigError, match=r"sasl\.jaas\.config") as info:
            parse_jaas_config(bad)
        assert "useKeyTab" not in str(info.value)


def test_every_client_gets_every_connection_setting(tmp_path: Path) -> None:
    """One table, three clients: the same settings reach librdkafka and kafka-python, under their names."""
    combined = _pem(tmp_path)
    settings = ClientSettings.from_props({
        "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": JAAS_SCRAM,
        "ssl.truststore.location": str(combined), "ssl.truststore.type": "PEM",
        "ssl.keystore.location": str(combined), "ssl.keystore.type": "PEM",
        "ssl.endpoint.identification.algorithm": "", "client.id": "me", "linger.ms": "7"})
    assert settings.librdkafka_config == {
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "bob",
        "sasl.password": 'p"w;=x', "ssl.ca.location": str(combined), "ssl.certificate.location": str(combined),
        "ssl.key.location": str(combined), "ssl.endpoint.identification.algorithm": "none", "client.id": "me",
        "linger.ms": "7"}
    assert settings.kafka_python_config == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "bob",
        "sasl_plain_password": 'p"w;=x', "ssl_cafile": str(combined), "ssl_certfile": str(combined),
        "ssl_keyfile": str(combined), "ssl_check_hostname": False, "client_id": "me"}
    assert 'p"w;=x' in settings.secrets
    assert JAAS_SCRAM in settings.secrets


def test_the_table_names_only_what_the_clients_take(tmp_path: Path) -> None:
    """librdkafka accepts every name the table gives it; kafka-python's connection manager takes every name."""
    from confluent_kafka import Producer
    from kafka.net.manager import KafkaConnectionManager

    combined = _pem(tmp_path)
    crl = tmp_path / "crl.pem"
    crl.write_text("")
    props = {"client.id": "x", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
             "sasl.username": "u", "sasl.password": "p", "ssl.ca.location": str(combined),
             "ssl.certificate.location": str(combined), "ssl.key.location": str(combined),
             "ssl.key.password": "k", "ssl.endpoint.identification.algorithm": "https", "debug": "conf",
             **{row.name: value for row, value in (
                 (CLIENT_SETTINGS["delivery.timeout.ms"], "30000"), (CLIENT_SETTINGS["request.timeout.ms"], "5000"),
                 (CLIENT_SETTINGS["linger.ms"], "5"), (CLIENT_SETTINGS["batch.size"], "100000"),
                 (CLIENT_SETTINGS["batch.num.messages"], "1000"), (CLIENT_SETTINGS["compression.type"], "lz4"),
                 (CLIENT_SETTINGS["message.max.bytes"], "1000000"),
                 (CLIENT_SETTINGS["queue.buffering.max.messages"], "1000"),
                 (CLIENT_SETTINGS["queue.buffering.max.kbytes"], "1000"),
                 (CLIENT_SETTINGS["retry.backoff.ms"], "100"), (CLIENT_SETTINGS["acks"], "all"),
                 (CLIENT_SETTINGS["enable.idempotence"], "true"))}}
    settings = ClientSettings.from_props(props)
    # librdkafka refuses an unknown name or value when the client is created (it does not connect here:
    # the key is not a real one, so only the names are checked, not the files' contents)
    config = {k: v for k, v in settings.librdkafka_config.items()
              if k not in ("ssl.certificate.location", "ssl.key.location", "ssl.key.password")}
    Producer({**config, "bootstrap.servers": "127.0.0.1:1"})
    assert set(settings.kafka_python_config) <= set(KafkaConnectionManager.DEFAULT_CONFIG)
    # every name in the table is one of these, or a form tested elsewhere in this module
    others = {"sasl.jaas.config", "sasl.mechanisms", "ssl.truststore.location", "ssl.truststore.type",
                  "ssl.truststore.password", "ssl.keystore.location", "ssl.keystore.type", "ssl.keystore.password",
                  "ssl.crl.location"}
    assert set(CLIENT_SETTINGS) == set(props) | others


@pytest.mark.parametrize(("props", "message"), [
    ({"sasl.mechanism": "GSSAPI"}, "Unsupported sasl.mechanism 'GSSAPI'"),
    ({"security.protocol": "TLS"}, "Invalid security.protocol"),
    ({"acks": "1"}, "acks=1 is not allowed"),
    ({"ssl.truststore.password": "x"}, "ssl.truststore.password is given without ssl.truststore.location"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"},
     "Invalid ssl.endpoint.identification.algorithm"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"},
     "ssl.ca.location /nonexistent/ca.pem: No such file or directory"),
    ({"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p"},
     "security.protocol=SASL_SSL needs sasl.mechanism"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"},
     "security.protocol=SASL_PLAINTEXT needs sasl.jaas.config"),
    ({"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"},
     "sasl.mechanism, sasl.username, sasl.password given with security.protocol=PLAINTEXT"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p",
      "ssl.ca.location": "/x"}, "ssl.ca.location given with security.protocol=SASL_PLAINTEXT"),
])
def test_a_setting_no_client_can_honour_is_refused(props: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        ClientSettings.from_props(props)


def test_a_setting_no_client_knows_is_refused_naming_it_without_its_value() -> None:
    with pytest.raises(InvalidConfigError, match=r"Unsupported Kafka client setting sasl\.pasword") as info:
        split_options("127.0.0.1:9092", ["sasl.pasword=s3cret-value"])
    assert "s3cret-value" not in str(info.value)
    with pytest.raises(InvalidConfigError, match=r"Unsupported Kafka client setting key\.serializer"):
        split_options("127.0.0.1:9092", [], {"key.serializer": "org.apache.kafka.common.serialization.X"})


def test_java_key_and_trust_stores_are_refused_with_the_pem_alternative(tmp_path: Path) -> None:
    """librdkafka and kafka-python read PEM: a JKS or PKCS12 store is refused (EINVAL) saying what to give."""
    combined = _pem(tmp_path)
    p12 = tmp_path / "trust.p12"
    subprocess.run(["openssl", "pkcs12", "-export", "-nokeys", "-in", str(combined), "-out", str(p12),
                    "-passout", "pass:pw"], check=True, capture_output=True)
    jks = tmp_path / "trust.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + b"\x00" * 60)
    for store, kind in ((p12, "PKCS12"), (jks, "JKS")):
        with pytest.raises(InvalidConfigError, match=f"ssl.truststore.location {store}: a {kind} truststore cannot "
                                                     "be read .* give ssl.ca.location") as info:
            ClientSettings.from_props({"security.protocol": "SSL", "ssl.truststore.location": str(store),
                                       "ssl.truststore.password": "pw"})
        assert info.value.errno == 22
    with pytest.raises(InvalidConfigError, match=r"a PKCS12 keystore cannot be read .* ssl\.keystore\.type=PEM"):
        ClientSettings.from_props({"security.protocol": "SSL", "ssl.keystore.location": str(p12),
                                   "ssl.keystore.type": "PKCS12"})
    with pytest.raises(InvalidConfigError, match=r"is a PEM file, not ssl\.truststore\.type=JKS"):
        ClientSettings.from_props({"security.protocol": "SSL", "ssl.truststore.location": str(combined),
                                   "ssl.truststore.type": "JKS"})


def test_secrets_are_redacted_from_log_lines_and_tracebacks() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "auth %s and %r", ("pw-1", b"u\x00pw\\2"), None)
    try:
        raise ValueError("bad pw-1")
    except ValueError:
        import sys
        record.exc_info = sys.exc_info()
    redactor = RedactSecrets(["pw-1", "pw\\2"])
    assert redactor.filter(record)
    formatted = logging.Formatter().format(record)
    assert "pw-1" not in formatted
    assert "pw\\\\2" not in formatted
    assert "pw\\2" not in formatted
    assert formatted.startswith("auth [redacted] and b'u\\x00[redacted]'")
    assert "ValueError: bad [redacted]" in formatted


def test_the_docs_show_the_table_the_clients_are_built_from() -> None:
    assert client_settings_table() in doc_section("Mounting a Kafka cluster")


def test_a_refusal_of_the_credentials_or_the_acls_during_a_request_is_eacces_naming_the_settings() -> None:
    """librdkafka's own errors (KafkaError objects as its admin client returns them) -> EACCES."""
    import errno

    from confluent_kafka import KafkaError

    from logfs.cluster.errors import from_kafka

    login = from_kafka(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed"),
                       "Creating topic t", "b:9092")
    assert login.errno == errno.EACCES
    assert "check sasl.username and sasl.password (or sasl.jaas.config)" in str(login)
    acl = from_kafka(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "Group authorization failed"),
                     "Reading the committed offsets of group g", "b:9092")
    assert acl.errno == errno.EACCES
    assert "the cluster's ACLs do not allow it" in str(acl)
    other = from_kafka(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"), "Creating topic t", "b:9092")
    assert other.errno == errno.EIO
