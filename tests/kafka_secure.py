"""A real Kafka broker with secured listeners, its certificates made at test time (openssl).

One single-node KRaft JVM (``devtools.kafka.KafkaBroker``) carries
every listener a test of a secured cluster needs, to spare the machine a JVM
per setting family:

* ``PLAINTEXT``: the test's own checks (and inter-broker traffic);
* ``SASL_PLAINTEXT``: SASL/PLAIN (user ``alice``) and SASL/SCRAM-SHA-512 (users
  ``bob`` and ``alice``, created with ``kafka-storage format --add-scram`` as KRaft wants);
* ``SASL_SSL``: the same over TLS;
* ACLs (KRaft's ``StandardAuthorizer``): every principal above is a super user
  but ``carol`` (SASL/PLAIN), who is allowed nothing;
* ``TLS`` (SSL): a server certificate for 127.0.0.1 signed by the test CA;
* ``MTLS`` (SSL, ``ssl.client.auth=required``): clients must show a certificate
  the test CA signed;
* ``NOHOST`` (SSL): a certificate signed by the test CA for another host name
  (``broker.invalid``), so only a client that turns hostname verification
  off (``ssl.endpoint.identification.algorithm=``) connects;
* ``EXPIRED`` (SSL): a certificate for 127.0.0.1 signed by the test CA that
  expired on 2020-01-02.

The broker's keystores are PKCS12 (``openssl pkcs12 -export``), the clients'
files PEM: the CA (``ca.pem``), a client certificate and key for mutual TLS,
and a second CA nobody used (``other-ca.pem``) for the untrusted-CA case.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from tests.jvm import free_port
from tests.kafka_broker import KafkaBroker

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

#: distinctive secrets, so a test can search the mount's log and argv for them
ALICE_PASSWORD = "alice-Pw-5b1e9d"
BOB_PASSWORD = "bob-Scram-8c2f4a"
CAROL_PASSWORD = "carol-Pw-0a9e3c"
STORE_PASSWORD = "store-Pw-77d3e1"


@dataclass
class Certificates:
    dir: Path
    ca: Path
    other_ca: Path
    client_cert: Path
    client_key: Path
    client_combined: Path      # cert and key in one PEM file (Kafka's ssl.keystore.type=PEM)
    server_p12: Path
    nohost_p12: Path
    truststore_p12: Path       # the CA as a PKCS12 truststore (what a Java user may hold)
    expired_p12: Path          # a broker certificate for 127.0.0.1 that expired on 2020-01-02


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr}")


def _signed(d: Path, name: str, subject: str, san: str | None) -> None:
    """``name.key`` and ``name.pem``: a key and a certificate signed by ``ca``."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=d)
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-sha256", "-extfile", ext.name, cwd=d)


def _expired(d: Path, name: str) -> None:
    """``name.key`` and ``name.pem``: a certificate for 127.0.0.1 signed by ``ca``, valid on 2020-01-01 only
    (``openssl ca`` takes explicit dates, ``openssl x509`` only a number of days from now)."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", cwd=d)
    db = d / f"{name}-ca"
    db.mkdir()
    (db / "index.txt").write_text("")
    (db / "serial").write_text("1000\n")
    (d / f"{name}-ca.cnf").write_text(
        f"[ca]\ndefault_ca = this\n[this]\ndatabase = {db}/index.txt\nserial = {db}/serial\n"
        f"new_certs_dir = {db}\ncertificate = {d}/ca.pem\nprivate_key = {d}/ca.key\ndefault_md = sha256\n"
        "policy = any\ncopy_extensions = copy\n[any]\ncommonName = supplied\n")
    _openssl("ca", "-batch", "-config", f"{name}-ca.cnf", "-in", f"{name}.csr", "-out", f"{name}.pem", "-notext",
             "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", cwd=d)


def make_certificates(d: Path) -> Certificates:
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                 "-days", "2", "-subj", f"/CN=logfs test {ca}", cwd=d)
    _signed(d, "server", "/CN=127.0.0.1", "IP:127.0.0.1,DNS:localhost")
    _signed(d, "nohost", "/CN=broker.invalid", "DNS:broker.invalid")
    _signed(d, "client", "/CN=logfs-client", None)
    _expired(d, "expired")
    for name in ("server", "nohost", "expired"):
        _openssl("pkcs12", "-export", "-in", f"{name}.pem", "-inkey", f"{name}.key", "-certfile", "ca.pem",
                 "-name", "broker", "-out", f"{name}.p12", "-passout", f"pass:{STORE_PASSWORD}", cwd=d)
    _openssl("pkcs12", "-export", "-nokeys", "-in", "ca.pem", "-out", "truststore.p12",
             "-passout", f"pass:{STORE_PASSWORD}", cwd=d)
    combined = d / "client-combined.pem"
    combined.write_text((d / "client.pem").read_text() + (d / "client.key").read_text())
    for key in d.glob("*.key"):
        key.chmod(0o600)
    combined.chmod(0o600)
    return Certificates(d, d / "ca.pem", d / "other-ca.pem", d / "client.pem", d / "client.key", combined,
                        d / "server.p12", d / "nohost.p12", d / "truststore.p12", d / "expired.p12")


class SecureKafkaBroker(KafkaBroker):
    """``KafkaBroker`` with the secured listeners of the module docstring."""

    def __init__(self, base: Path) -> None:
        self.certs = make_certificates(base / "certs")
        self.ports = {name: free_port() for name in ("SASL_PLAINTEXT", "SASL_SSL", "TLS", "MTLS", "NOHOST",
                                                     "EXPIRED")}
        super().__init__(base)
        listeners = {"PLAINTEXT": self.port, **self.ports}
        protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT", "SASL_PLAINTEXT": "SASL_PLAINTEXT",
                     "SASL_SSL": "SASL_SSL", "TLS": "SSL", "MTLS": "SSL", "NOHOST": "SSL", "EXPIRED": "SSL"}
        advertised = ",".join(f"{name}://127.0.0.1:{port}" for name, port in listeners.items())
        jaas_plain = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
                      f'user_alice="{ALICE_PASSWORD}" user_carol="{CAROL_PASSWORD}";')
        self.properties.update({
            "listeners": f"{advertised},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": advertised,
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas_plain,
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas_plain,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.certs.server_p12),
            "ssl.keystore.password": STORE_PASSWORD,
            "ssl.key.password": STORE_PASSWORD,
            "listener.name.mtls.ssl.client.auth": "required",
            "listener.name.mtls.ssl.truststore.type": "PEM",
            "listener.name.mtls.ssl.truststore.location": str(self.certs.ca),
            "listener.name.nohost.ssl.keystore.location": str(self.certs.nohost_p12),
            "listener.name.expired.ssl.keystore.location": str(self.certs.expired_p12),
            # ACLs: every principal of the tests is a super user but carol, who may do nothing
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS;User:alice;User:bob;User:CN=logfs-client",
            # one partition of __consumer_offsets, loaded by warm_up_group_coordinator before any test
            "offsets.topic.num.partitions": "1",
        })

    def warm_up_group_coordinator(self) -> None:
        """Create and load ``__consumer_offsets`` (a commit through kafka-python, which retries
        COORDINATOR_LOAD_IN_PROGRESS), before any mount asks for a group.

        librdkafka 2.16.0 crashes (SIGSEGV in ``rd_kafka_cgrp_op`` from ``rd_kafka_handle_OffsetFetch``) when
        an admin client's ListConsumerGroupOffsets meets a coordinator still loading; that is the groups'
        own finding of issue 25, not these tests' subject, so they start with the coordinator ready.
        """
        from kafka import KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        self.create_topic("warm-up")
        tp = TopicPartition("warm-up", 0)
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id="warm-up", enable_auto_commit=False)
        try:
            consumer.commit({tp: OffsetAndMetadata(0, "", -1)})
            assert consumer.committed(tp) == 0
        finally:
            consumer.close()

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def format(self, *extra: str) -> None:
        """``kafka-storage format --add-scram``: the SCRAM users exist from the first start (KRaft)."""
        super().format("--add-scram", f"SCRAM-SHA-512=[name=bob,password={BOB_PASSWORD}]",
                       "--add-scram", f"SCRAM-SHA-512=[name=alice,password={ALICE_PASSWORD}]", *extra)


@pytest.fixture(scope="module")
def secure_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafkaBroker]:
    """One broker with every secured listener for the test module."""
    broker = SecureKafkaBroker(tmp_path_factory.mktemp("kafka-secure"))
    broker.start()
    try:
        broker.warm_up_group_coordinator()
        yield broker
    finally:
        if broker.proc is not None:
            broker.stop()
