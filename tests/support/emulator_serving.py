"""What the emulators' own processes share (AML, DLTS, DLC, OpenPAI and the Kubernetes API server):
a throw-away CA with a server certificate for 127.0.0.1, serving an aiohttp app on loopback, telling
the fixture the port (tests/support/emulators.py waits for STATE/port, written atomically), running
until SIGTERM or SIGINT, and the `/_emulator` test controls the REST emulators answer alike. Their
faults and request log: emulator_faults.py; their workloads: emulator_procs.py."""
from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import signal
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web


def make_tls(state: Path, *, ca_name: str, server_name: str, extra_ips: tuple[str, ...] = ()) -> ssl.SSLContext:
    """Write STATE/ca.crt (what clients trust), server.crt (for 127.0.0.1, localhost and
    `extra_ips`) and a 0600 server.key; return the server's context."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca = (x509.CertificateBuilder().subject_name(ca_subject).issuer_name(ca_subject)
          .public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", *extra_ips)]
    names.append(x509.DNSName("localhost"))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name)]))
            .issuer_name(ca_subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (state / "ca.crt").write_bytes(ca.public_bytes(pem))
    (state / "server.crt").write_bytes(cert.public_bytes(pem))
    kp = state / "server.key"
    kp.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    os.chmod(kp, 0o600)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(state / "server.crt", kp)
    return ctx


async def serve(app: web.Application, *, port: int = 0,
                ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """`app` listening on 127.0.0.1:`port` (0: any free one); returns its runner and the port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context, shutdown_timeout=0.5)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def hold_port(port: int) -> socket.socket:
    """A socket bound to 127.0.0.1:`port`, not listening: connections are refused, as while a server
    restarts, and no other process (another test's emulator asking for any free port) can take the
    port meanwhile. Close it just before listening on the port again."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its connections' TIME_WAITs do not count
    sock.bind(("127.0.0.1", port))
    return sock


def announce(state: Path, port: int) -> None:
    """STATE/pid, then STATE/port written atomically: the fixture starts talking once it exists."""
    (state / "pid").write_text(str(os.getpid()))
    (state / "port.tmp").write_text(str(port))
    os.replace(state / "port.tmp", state / "port")


async def until_stopped() -> None:
    """Return on SIGTERM (the fixture's stop) or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class _Faults(Protocol):
    def add(self, spec: dict) -> Any: ...
    def clear(self) -> None: ...


def common_control(parts: list[str], method: str, body: dict, *, jobs: Callable[[], list[Any]],
                   pids: Callable[[], list[int]], requests: Callable[[], list[Any]],
                   faults: _Faults | None = None) -> web.Response | None:
    """`/_emulator/<parts>` controls every REST emulator answers alike (tests/support/emulators.py
    `RestControls`): GET jobs, pids and requests; POST and DELETE faults (when it takes them); POST
    shutdown (a SIGTERM to itself, as the fixture's stop). None: not one of these."""
    if method == "GET" and parts == ["jobs"]:
        return web.json_response(jobs())
    if method == "GET" and parts == ["pids"]:
        return web.json_response({"pids": pids()})
    if method == "GET" and parts == ["requests"]:
        return web.json_response(requests())
    if faults is not None and parts == ["faults"] and method == "POST":
        try:
            f = faults.add(body)
        except (TypeError, ValueError) as e:
            return web.json_response({"error": str(e)}, status=400)
        return web.json_response({"ok": True, "count": f.count})
    if faults is not None and parts == ["faults"] and method == "DELETE":
        faults.clear()
        return web.json_response({"ok": True})
    if parts == ["shutdown"] and method == "POST":
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)
        return web.json_response({"ok": True})
    return None
