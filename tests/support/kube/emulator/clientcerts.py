"""Client-certificate authentication, as kube-apiserver's `--client-ca-file` does it, and the issuer
of short-lived client certificates that exec plugins such as Pinniped's or Teleport's hand to
kubectl (an ExecCredential with clientCertificateData / clientKeyData).

The TLS handshake only asks for a certificate (Go's `tls.RequestClientCert`); the x509 authenticator
then verifies it on every request against the client CA at the current time
(`staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go`): a connection opened
with a certificate that has expired since is refused with 401 on its next request, not at the
handshake. The user is the subject's CommonName, its groups the Organizations. Python's TLS
cannot request a certificate without verifying it, so the handshake verifies the chain without
the time check (X509_V_FLAG_NO_CHECK_TIME) and `identify` checks the validity period per request.
"""
from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

from aiohttp import web

from .rbac import Identity

X509_V_FLAG_NO_CHECK_TIME = 0x200000  # OpenSSL's; the ssl module has no name for it


class ClientCA:
    def __init__(self, state: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = dt.datetime.now(dt.timezone.utc)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-emulator-client-ca")])
        self._cert = (x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM).decode()
        (state / "client-ca.crt").write_text(self.pem)
        self.issued = 0

    def configure(self, ctx: ssl.SSLContext) -> None:
        """The API server's TLS: ask for a client certificate (optional), signed by this CA."""
        ctx.load_verify_locations(cadata=self.pem)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.verify_flags = ctx.verify_flags | X509_V_FLAG_NO_CHECK_TIME

    def issue(self, user: str, groups: list[str], lifetime: float) -> tuple[str, str, float]:
        """(certificate PEM, key PEM, expiry as a UNIX time) for `user`, valid `lifetime` seconds."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = dt.datetime.now(dt.timezone.utc)
        expires = now + dt.timedelta(seconds=lifetime)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]
                            + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(self._name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(seconds=30)).not_valid_after(expires)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(self._key, hashes.SHA256()))
        self.issued += 1
        pem = serialization.Encoding.PEM
        key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        return cert.public_bytes(pem).decode(), key_pem, expires.timestamp()

    @staticmethod
    def identify(request: web.Request) -> Identity | None:
        """The client certificate's user, if one was presented and is valid now (else None: 401)."""
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        if not cert:
            return None
        now = dt.datetime.now(dt.timezone.utc).timestamp()
        if not ssl.cert_time_to_seconds(cert["notBefore"]) <= now < ssl.cert_time_to_seconds(cert["notAfter"]):
            return None  # "x509: certificate has expired or is not yet valid"
        names = [(k, v) for rdn in cert.get("subject", ()) for k, v in rdn]
        user = next((v for k, v in names if k == "commonName"), "")
        groups = [v for k, v in names if k == "organizationName"]
        return Identity(user, None, False, groups + ["system:authenticated"]) if user else None
