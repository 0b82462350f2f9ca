"""Why a broker's TLS certificate was refused, in OpenSSL's words (``certificate has expired``, ...).

librdkafka reports every failed verification of the broker's certificate as
``certificate verify failed: ... verify that ssl.ca.location is correctly
configured``, an expired certificate included.  When a mount fails that way,
:func:`broker_certificate_problem` repeats the handshake with Python's ``ssl``
against the same CA and host name rule, which names OpenSSL's verification
result, and reads the certificate's validity itself (no verification) to give
the date it expired.  Nothing is sent beyond the handshake.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["broker_certificate_problem"]

#: OpenSSL's X509_V_ERR_CERT_HAS_EXPIRED and X509_V_ERR_CERT_NOT_YET_VALID
_EXPIRED, _NOT_YET_VALID = 10, 9


def broker_certificate_problem(bootstrap: str, client: Mapping[str, str],
                               timeout_s: float = 5.0) -> tuple[bool, str] | None:
    """What is wrong with the first answering broker's certificate, for the mount's error (``client``: the
    mount's client settings, whose CA and host name check are used): (whether it is its validity dates,
    the text); None when it verifies or no broker of ``bootstrap`` completes a TCP connection."""
    cafile = client.get("ssl.ca.location") or client.get("ssl.truststore.location") or None
    check_hostname = client.get("ssl.endpoint.identification.algorithm", "https").lower() == "https"
    for server in (s.strip() for s in bootstrap.split(",") if s.strip()):
        host, _, port = server.rpartition(":")
        context = ssl.create_default_context(cafile=cafile)
        context.check_hostname = check_hostname
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s) as sock, \
                    context.wrap_socket(sock, server_hostname=host):
                return None
        except ssl.SSLCertVerificationError as exc:
            if exc.verify_code in (_EXPIRED, _NOT_YET_VALID):
                validity = _validity(host, int(port), timeout_s)
                when = f" (notBefore {validity[0]}, notAfter {validity[1]}; now {_utc(time.time())})" \
                    if validity else ""
                return True, (f"broker {server}'s certificate: {exc.verify_message}{when}; renew the "
                              "broker's certificate (its ssl.keystore.location): the mount's ssl.ca.location "
                              "is not the cause")
            return False, f"OpenSSL: {exc.verify_message} (broker {server})"
        except (OSError, ssl.SSLError, ValueError):
            continue
    return None


def _validity(host: str, port: int, timeout_s: float) -> tuple[str, str] | None:
    """(notBefore, notAfter) of the broker's certificate, read without verifying it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock, \
                context.wrap_socket(sock, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    if not der:
        return None
    try:
        return _der_validity(der)
    except (IndexError, ValueError):
        return None


def _tlv(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the DER element at ``pos``."""
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[pos:pos + count], "big")
        pos += count
    return tag, pos, pos + length


def _der_validity(der: bytes) -> tuple[str, str]:
    """X.509: Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
    signature, issuer, validity SEQUENCE { notBefore, notAfter }, ... }, ... }."""
    _, cert, _ = _tlv(der, 0)
    _, pos, _ = _tlv(der, cert)                    # tbsCertificate's content
    fields: list[tuple[int, int, int]] = []
    while len(fields) < 4:
        tag, start, end = _tlv(der, pos)
        if not (tag == 0xA0 and not fields):       # the explicit version is not one of the four
            fields.append((tag, start, end))
        pos = end
    _, validity, _ = fields[3]
    times = []
    for _ in range(2):
        tag, start, end = _tlv(der, validity)
        text = der[start:end].decode("ascii")
        if tag == 0x17:                            # UTCTime YYMMDDHHMMSSZ
            text = ("19" if int(text[:2]) >= 50 else "20") + text
        times.append(f"{text[0:4]}-{text[4:6]}-{text[6:8]} {text[8:10]}:{text[10:12]}:{text[12:14]} UTC")
        validity = end
    return times[0], times[1]


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
