"""The storage account's data-plane authorization, in front of Azurite.

Azurite's `--oauth basic` checks a bearer token's issuer, audience and expiry but, as its README
says, neither its signature nor the caller's permission. Azure Storage grants data access to an
Azure AD identity only through a Storage Blob Data role on the account (or container): without
one it answers 403 AuthorizationPermissionMismatch. This front does that part: it verifies the
token with the emulator's signing key and its audience (so a role-less caller with a wrong token
gets storage's authentication error first, as from Azure), looks the principal's roles up in the emulated directory
(the roles `Aml.set_roles` sets) and forwards what is allowed, unchanged, to Azurite over HTTPS.
Requests signed with the account key (the emulated AML runtime's) pass through to Azurite.
"""
from __future__ import annotations

import datetime as dt
import re
import ssl
import uuid

import aiohttp
from aiohttp import web

from .arm import Gate
from .tokens import verify

WRITERS = ("Storage Blob Data Contributor", "Storage Blob Data Owner")
READERS = WRITERS + ("Storage Blob Data Reader",)
# the audiences Azure Storage (and Azurite) accept for blob data: https://storage.azure.com or the account's URL
AUDIENCE = re.compile(r"^(https://storage\.azure\.com|https://[a-z0-9]+\.blob\.core\.windows\.net)/?$")
HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


def _storage_error(status: int, code: str, message: str) -> web.Response:
    rid = str(uuid.uuid4())
    text = (f'\ufeff<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}\n'
            f"RequestId:{rid}\nTime:{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%S.%f0Z}</Message></Error>")
    return web.Response(status=status, body=text.encode(), content_type="application/xml",
                        headers={"x-ms-error-code": code, "x-ms-request-id": rid})


def make_front(gate: Gate, upstream: str, ca_file: str | None) -> web.Application:
    """upstream: Azurite's scheme://host:port (paths name the account, as here)."""
    ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
    session: dict[str, aiohttp.ClientSession] = {}

    async def forward(request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer":
            claims = verify(gate.key, token.strip())
            if claims is None:  # not a token this directory issued: Azure Storage's answer to a bad signature
                return _storage_error(401, "InvalidAuthenticationInfo",
                                      "Server failed to authenticate the request. Please refer to the information "
                                      "in the www-authenticate header.")
            if not AUDIENCE.match(str(claims.get("aud", ""))):  # authentication comes before authorization
                return _storage_error(403, "AuthenticationFailed",
                                      "Server failed to authenticate the request. Make sure the value of "
                                      "Authorization header is formed correctly including the signature.")
            roles = gate.principals.get(claims.get("oid", ""), {}).get("roles", [])
            needed = READERS if request.method in ("GET", "HEAD") else WRITERS
            if not any(r in needed for r in roles):
                return _storage_error(403, "AuthorizationPermissionMismatch",
                                      "This request is not authorized to perform this operation using this "
                                      "permission.")
        if "s" not in session:
            session["s"] = aiohttp.ClientSession()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read() if request.can_read_body else None
        async with session["s"].request(request.method, upstream + request.path_qs, headers=headers, data=body,
                                        ssl=ctx if ctx is not None else True, auto_decompress=False,
                                        allow_redirects=False) as r:
            data = await r.read()
            out = {k: v for k, v in r.headers.items() if k.lower() not in HOP}
            return web.Response(status=r.status, body=data, headers=out)

    async def close(_app: web.Application) -> None:
        if "s" in session:
            await session["s"].close()

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_cleanup.append(close)
    return app
