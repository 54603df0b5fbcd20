"""Access tokens: JWTs shaped like Entra ID's ARM tokens, signed with the emulator's HMAC key.

Real ARM verifies RS256 signatures against Entra ID's published keys; here the fake `az`
(az_cli.py) and the emulator share a key file in the state dir, so only tokens minted for
this emulator are accepted, and audience, tenant and expiry are checked as ARM checks them.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

# The audiences ARM (public cloud) accepts; see the InvalidAuthenticationTokenAudience message.
ARM_AUDIENCES = ("https://management.core.windows.net/", "https://management.core.windows.net",
                 "https://management.azure.com/", "https://management.azure.com")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def mint(key: bytes, *, audience: str, tenant: str, oid: str, upn: str | None, appid: str | None = None,
         lifetime: float = 3600.0, now: float | None = None) -> tuple[str, int]:
    """A signed token and its expiry (epoch seconds)."""
    now = time.time() if now is None else now
    exp = int(now + lifetime)
    claims = {"aud": audience, "iss": f"https://sts.windows.net/{tenant}/", "iat": int(now) - 5,
              "nbf": int(now) - 5, "exp": exp, "oid": oid, "tid": tenant, "ver": "1.0",
              "appid": appid or "04b07795-8ddb-461a-bbee-02f9e1bf7b46",          # the Azure CLI's client id
              "idtyp": "user" if upn else "app", "scp": "user_impersonation" if upn else None}
    if upn:
        claims["upn"] = claims["unique_name"] = upn
    header = {"typ": "JWT", "alg": "HS256", "kid": "aml-emulator"}
    signing_input = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    sig = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + _b64(sig), exp


def verify(key: bytes, token: str) -> dict | None:
    """The token's claims if its signature is ours and it is well formed; None otherwise."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        sig = _unb64(parts[2])
        claims = json.loads(_unb64(parts[1]))
    except (ValueError, json.JSONDecodeError):
        return None
    good = hmac.new(key, (parts[0] + "." + parts[1]).encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(sig, good) or not isinstance(claims, dict):
        return None
    return claims
