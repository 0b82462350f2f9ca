"""A cluster mount of a secured Kafka broker: SASL (PLAIN, SCRAM-SHA-512), TLS, mutual TLS (issue 25).

One real broker for the module (tests/kafka_secure.py) carries a listener per
setting family.  Each family is mounted with ``logfs mount --bootstrap-server
... --config client.properties`` (the password in the file, never in argv)
and driven end to end: mkdir a topic, append, read back, commit a group's
offset and remove it (OffsetDelete), read the topic's config.  A wrong
password, an untrusted CA, a missing client certificate or a certificate for
another host fails the mount within 15 s, naming the setting to check; no
secret ever reaches the log.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from engine.properties import parse_properties
from tests.docs import doc_section
from tests.helpers import wait_for
from tests.kafka_secure import ALICE_PASSWORD, BOB_PASSWORD, CAROL_PASSWORD, SecureKafkaBroker

if TYPE_CHECKING:
    from tests.conftest import Mount, MountFactory

pytestmark = [pytest.mark.kafka, pytest.mark.mount]

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required \\\n'
              f'    username="alice" password="{ALICE_PASSWORD}";')
SECRETS = (ALICE_PASSWORD, BOB_PASSWORD, CAROL_PASSWORD)


def _families(broker: SecureKafkaBroker) -> dict[str, tuple[str, dict[str, str]]]:
    """family -> (listener, client.properties) that connect."""
    c = broker.certs
    return {
        "sasl-plain-jaas": ("SASL_PLAINTEXT", {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                               "sasl.jaas.config": PLAIN_JAAS}),
        "sasl-scram-sha-512": ("SASL_PLAINTEXT", {"security.protocol": "SASL_PLAINTEXT",
                                                  "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bob",
                                                  "sasl.password": BOB_PASSWORD, "client.id": "logfs-scram"}),
        "tls-truststore": ("TLS", {"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                                   "ssl.truststore.location": str(c.ca),
                                   "ssl.endpoint.identification.algorithm": "https"}),
        "mutual-tls": ("MTLS", {"security.protocol": "SSL", "ssl.ca.location": str(c.ca),
                                "ssl.keystore.type": "PEM", "ssl.keystore.location": str(c.client_combined)}),
        "mutual-tls-cert-and-key": ("MTLS", {"security.protocol": "SSL", "ssl.ca.location": str(c.ca),
                                             "ssl.certificate.location": str(c.client_cert),
                                             "ssl.key.location": str(c.client_key)}),
        # the case librdkafka's admin client reached and the replica fetcher did not (issue 25)
        "tls-no-hostname-check": ("NOHOST", {"security.protocol": "SSL", "ssl.ca.location": str(c.ca),
                                             "ssl.endpoint.identification.algorithm": ""}),
    }


def _write_properties(path: Path, props: dict[str, str], mode: int = 0o600) -> Path:
    # written raw: sasl.jaas.config above already carries a Java properties line continuation
    path.write_text("# a Kafka client properties file\n" + "".join(f"{k}={v}\n" for k, v in props.items()))
    path.chmod(mode)
    return path


def _mount(logfs_mount: MountFactory, broker: SecureKafkaBroker, tmp_path: Path, name: str, listener: str,
           props: dict[str, str], *, mode: int = 0o600, start: bool = True, args: tuple[str, ...] = ()) -> Mount:
    config = _write_properties(tmp_path / f"{name}.properties", props, mode)
    return logfs_mount(name=name, start=start,
                       extra_args=["--bootstrap-server", broker.address(listener), "--config", str(config), *args])


def _assert_no_secret(m: Mount) -> None:
    text = m.log()
    for secret in SECRETS:
        assert secret not in text, f"a password is in the mount's log:\n{text[-3000:]}"


def _committed(broker: SecureKafkaBroker, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets as the cluster holds them (asked on the PLAINTEXT listener)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions or [] if tp.offset >= 0}


@pytest.mark.parametrize("family", ["sasl-plain-jaas", "sasl-scram-sha-512", "tls-truststore", "mutual-tls",
                                   "mutual-tls-cert-and-key", "tls-no-hostname-check"])
def test_a_secured_cluster_mounts_with_its_settings_in_a_file(family: str, secure_kafka_broker: SecureKafkaBroker,
                                                               logfs_mount, tmp_path: Path) -> None:
    broker = secure_kafka_broker
    listener, props = _families(broker)[family]
    readable = family == "sasl-plain-jaas"        # this one's file is left readable by others: warned about
    m = _mount(logfs_mount, broker, tmp_path, "m", listener, props, mode=0o644 if readable else 0o600)
    # ps shows no password: it is in the file
    assert m.proc is not None                        # started
    argv = Path(f"/proc/{m.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert not any(s.encode() in arg for s in SECRETS for arg in argv)
    # .logfs/config shows the settings the mount runs with, its secrets redacted
    settings = (m / ".logfs/config").read_text()
    assert f"security.protocol={props['security.protocol']}" in settings.splitlines(), settings
    assert not any(s in settings for s in SECRETS), settings
    topic = f"sec-{family}"
    (m / topic).mkdir()
    with open(m / topic / "0/append", "ab", buffering=0) as f:
        f.write(b"one\ntwo\n")
    assert (m / topic / "0/records").read_bytes() == b"one\ntwo\n"
    # a group commit and its removal (OffsetDelete, through kafka-python) on the secured cluster
    (m / topic / "groups/g").write_text("0 1\n")
    assert _committed(broker, "g").get((topic, 0)) == 1
    assert (m / topic / "groups/g").read_text().split() == ["0", "1", "2", "1"]
    started = time.monotonic()
    os.remove(m / topic / "groups/g")
    assert time.monotonic() - started < 15
    assert (topic, 0) not in _committed(broker, "g")
    assert "g" not in os.listdir(m / topic / "groups")
    assert "message.timestamp.type=CreateTime" in (m / topic / "config").read_text()
    assert m.stop() == 0
    log = m.log()
    _assert_no_secret(m)
    warnings = [line for line in log.splitlines() if "can be read by" in line]
    if readable:
        assert len(warnings) == 1, log[-3000:]
        assert "holds secrets (sasl.jaas.config)" in warnings[0], log[-3000:]
    else:
        assert not warnings, warnings


@pytest.mark.parametrize(("family", "listener", "props", "message"), [
    ("wrong-plain-password", "SASL_PLAINTEXT",
     {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": PLAIN_JAAS.replace(ALICE_PASSWORD, "not-" + BOB_PASSWORD)},
     "Authentication failed at the Kafka cluster .* check sasl.username and sasl.password \\(or sasl.jaas.config\\)"),
    ("wrong-scram-password", "SASL_PLAINTEXT",
     {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bob",
      "sasl.password": ALICE_PASSWORD},
     "Authentication failed at the Kafka cluster .* invalid credentials with SASL mechanism SCRAM-SHA-512.* "
     "check sasl.username and sasl.password"),
    ("untrusted-ca", "TLS", {"security.protocol": "SSL", "ssl.truststore.location": "{other_ca}"},
     "The TLS handshake with the Kafka cluster at .* failed: .*certificate verify failed.* check ssl.ca.location "
     "\\(or ssl.truststore.location\\)"),
    ("no-client-certificate", "MTLS", {"security.protocol": "SSL", "ssl.ca.location": "{ca}"},
     "refused the mount's TLS client certificate: .* check ssl.keystore.location \\(or ssl.certificate.location and "
     "ssl.key.location\\)"),
    ("certificate-for-another-host", "NOHOST", {"security.protocol": "SSL", "ssl.ca.location": "{ca}"},
     "The TLS handshake .* failed: .* ssl.endpoint.identification.algorithm"),
    # librdkafka says "check ssl.ca.location" for it too: the mount asks OpenSSL and names the expiry
    ("expired-broker-certificate", "EXPIRED", {"security.protocol": "SSL", "ssl.ca.location": "{ca}"},
     "The TLS handshake with the Kafka cluster at .* failed: broker 127.0.0.1:[0-9]+'s certificate: certificate "
     "has expired \\(notBefore 2020-01-01 00:00:00 UTC, notAfter 2020-01-02 00:00:00 UTC; now .*\\); renew the "
     "broker's certificate"),
])
def test_a_refused_login_or_handshake_fails_the_mount_at_once_naming_the_setting(
        family: str, listener: str, props: dict[str, str], message: str, secure_kafka_broker: SecureKafkaBroker,
        logfs_mount, tmp_path: Path) -> None:
    broker = secure_kafka_broker
    props = {k: v.format(ca=broker.certs.ca, other_ca=broker.certs.other_ca) for k, v in props.items()}
    m = _mount(logfs_mount, broker, tmp_path, "bad", listener, props, start=False)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 1"):
        m.start(timeout=15)       # not mounted and not exited within 15 s: a failure of its own
    m.proc = None
    elapsed = time.monotonic() - started
    assert elapsed < 15, elapsed
    errors = [line for line in m.log().splitlines() if " ERROR " in line]
    assert len(errors) == 1, m.log()[-3000:]
    assert re.search(message, errors[0]), m.log()[-3000:]
    _assert_no_secret(m)
    assert "not-" + BOB_PASSWORD not in m.log()


def test_what_the_acls_do_not_allow_is_eacces_naming_the_acl(secure_kafka_broker: SecureKafkaBroker, logfs_mount,
                                                            tmp_path: Path) -> None:
    """carol authenticates (the mount serves) but may do nothing: mkdir is EACCES with one line saying so."""
    props = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "carol",
             "sasl.password": CAROL_PASSWORD}
    m = _mount(logfs_mount, secure_kafka_broker, tmp_path, "acl", "SASL_PLAINTEXT", props)
    with pytest.raises(PermissionError) as info:
        (m / "denied").mkdir()
    assert info.value.errno == errno.EACCES
    lines = [line for line in m.log().splitlines() if "ACLs do not allow" in line]
    assert len(lines) == 1, m.log()
    assert "Creating topic denied" in lines[0], m.log()
    assert "AUTHORIZATION_FAILED" in lines[0], m.log()
    assert m.stop() == 0
    _assert_no_secret(m)


def test_a_store_the_clients_cannot_read_or_an_unknown_setting_is_refused_naming_it(
        secure_kafka_broker: SecureKafkaBroker, logfs_mount, tmp_path: Path) -> None:
    broker = secure_kafka_broker
    cases = [
        ({"security.protocol": "SSL", "ssl.truststore.location": str(broker.certs.truststore_p12),
          "ssl.truststore.type": "PKCS12", "ssl.truststore.password": "x"},
         f"ssl.truststore.location {broker.certs.truststore_p12}: a PKCS12 truststore cannot be read by the mount's "
         "Kafka clients (librdkafka and kafka-python read PEM); give ssl.ca.location"),
        ({"security.protocol": "SSL", "ssl.ca.location": str(broker.certs.ca), "ssl.cipher.suites": "x"},
         "Unsupported Kafka client setting ssl.cipher.suites"),
    ]
    for i, (props, message) in enumerate(cases):
        m = _mount(logfs_mount, broker, tmp_path, f"r{i}", "TLS", props, start=False)
        with pytest.raises(RuntimeError, match="exited with 2"):
            m.start(timeout=15)
        m.proc = None
        assert f"ERROR Invalid configuration: {message}" in m.log()


def test_no_secret_in_a_debug_log_of_every_client(secure_kafka_broker: SecureKafkaBroker, logfs_mount,
                                                   tmp_path: Path) -> None:
    """--log-level DEBUG with librdkafka's own config dump (debug=conf) and kafka-python's wire dumps."""
    broker = secure_kafka_broker
    props = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.jaas.config": PLAIN_JAAS,
             "debug": "conf,security"}
    m = _mount(logfs_mount, broker, tmp_path, "d", "SASL_PLAINTEXT", props, args=("--log-level", "DEBUG"))
    (m / "dbg").mkdir()
    (m / "dbg/0/append").write_bytes(b"x\n")
    wait_for(lambda: (m / "dbg/0/records").read_bytes() == b"x\n", "the record")
    assert m.stop() == 0
    log = m.log()
    assert "sasl.password = [redacted]" in log          # librdkafka's dump ran, and said nothing
    assert "SaslAuthenticateRequest" in log             # kafka-python's frames were logged, redacted
    _assert_no_secret(m)
    assert stat.S_IMODE((tmp_path / "d.properties").stat().st_mode) == 0o600


def test_the_readme_client_properties_mount_as_written(secure_kafka_broker: SecureKafkaBroker, logfs_mount,
                                                       tmp_path: Path) -> None:
    """docs/cluster.md, "Mounting a Kafka cluster": its two client.properties (SASL/SCRAM over TLS, mutual
    TLS), with this broker's CA, client certificate and password in place of the doc's."""
    broker = secure_kafka_broker
    section = doc_section("Mounting a Kafka cluster")
    blocks = re.findall(r"```properties\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    for i, (block, listener) in enumerate(zip(blocks, ("SASL_SSL", "MTLS"), strict=True)):
        text = (block.replace("/etc/kafka/ca.pem", str(broker.certs.ca))
                .replace("/etc/kafka/client.pem", str(broker.certs.client_combined))
                .replace("alice-secret", ALICE_PASSWORD))
        config = tmp_path / f"readme{i}.properties"
        config.write_text(text)         # as written: the jaas line continued with a backslash
        config.chmod(0o600)
        assert parse_properties(text)["security.protocol"] in ("SASL_SSL", "SSL")
        m = logfs_mount(name=f"readme{i}", extra_args=["--bootstrap-server", broker.address(listener),
                                                       "--config", str(config)])
        (m / f"readme{i}").mkdir()
        (m / f"readme{i}/0/append").write_bytes(b"x\n")
        assert (m / f"readme{i}/0/records").read_bytes() == b"x\n"
        assert m.stop() == 0
        _assert_no_secret(m)
