"""TLS for a hub that agents reach over a network (cluster platforms).

Each experiment gets its own CA and a server certificate for the addresses the hub is
reached at; agents trust that CA alone (it reaches them beside their token), so no public
PKI and no user step is needed. A user may bring their own certificate instead. The CA
key never leaves the experiment directory (mode 0600 there, directory 0700).
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 3650


@dataclass(frozen=True)
class TlsMaterial:
    """What the hub serves with and what agents verify against (all PEM)."""

    certificate: bytes  # the hub's certificate chain
    private_key: bytes = b""
    ca_certificate: bytes = b""  # what agents trust; the certificate itself when self-signed

    def __repr__(self) -> str:  # never print the key
        return f"TlsMaterial(certificate={len(self.certificate)} bytes, ca={len(self.ca_certificate)} bytes)"


def _names(addresses: list[str]) -> list[str]:
    seen: list[str] = []
    for a in [*addresses, "127.0.0.1", "localhost", socket.gethostname()]:
        if a and a not in seen:
            seen.append(a)
    return seen


def _san(names: list[str]):  # -> x509.SubjectAlternativeName
    from cryptography import x509

    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def experiment_tls(directory: Path, addresses: list[str], experiment_id: str) -> TlsMaterial:
    """The experiment's CA and hub certificate, made once and reused by a restarted manager
    (a certificate missing one of `addresses` is re-issued by the same CA, so running agents
    keep trusting it)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_crt, ca_key, crt, key = (directory / n for n in ("ca.crt", "ca.key", "hub.crt", "hub.key"))
    names = _names(addresses)
    now = datetime.datetime.now(datetime.timezone.utc)
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    if ca_crt.exists() and ca_key.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
        ca_private = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    else:
        ca_private = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nni-manager CA {experiment_id}")])
        ca_cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(ca_private.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(ca_private, hashes.SHA256())
        )
        _write_private(ca_key, ca_private.private_bytes(pem, pkcs8, serialization.NoEncryption()))
        ca_crt.write_bytes(ca_cert.public_bytes(pem))
    if crt.exists() and key.exists():
        existing = x509.load_pem_x509_certificate(crt.read_bytes())
        san = existing.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        if set(_san(names)) <= set(san):
            return TlsMaterial(crt.read_bytes(), key.read_bytes(), ca_crt.read_bytes())
    private = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"nni-manager hub {experiment_id}")]))
        .issuer_name(ca_cert.subject).public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(_san(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_private, hashes.SHA256())  # type: ignore[arg-type]
    )
    _write_private(key, private.private_bytes(pem, pkcs8, serialization.NoEncryption()))
    crt.write_bytes(cert.public_bytes(pem))
    return TlsMaterial(crt.read_bytes(), key.read_bytes(), ca_crt.read_bytes())


def user_tls(cert_file: Path, key_file: Path, ca_file: Path | None) -> TlsMaterial:
    """A certificate the user brings (`hubCertFile`, `hubKeyFile`, optional `hubCaFile`)."""
    cert = cert_file.read_bytes()
    return TlsMaterial(cert, key_file.read_bytes(), ca_file.read_bytes() if ca_file else cert)
