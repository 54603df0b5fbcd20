"""Alibaba Cloud's V3 request signature (ACS3-HMAC-SHA256), checked as the OpenAPI gateway does.

The client signs: `METHOD \\n path \\n canonical query \\n canonical headers \\n signed header names
\\n hex(sha256(body))`, hashed, then HMAC-SHA256 with the AccessKey secret
(https://help.aliyun.com/zh/sdk/product-overview/v3-request-structure-and-signature). The gateway
rebuilds that from what it received: a request whose body does not match `x-acs-content-sha256`,
whose signature does not match, or that lacks a header the scheme requires, is refused.
"""
from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import quote, unquote

ALGORITHM = "ACS3-HMAC-SHA256"
REQUIRED = ("host", "x-acs-action", "x-acs-version", "x-acs-date", "x-acs-signature-nonce", "x-acs-content-sha256")
_AUTH = re.compile(r"^ACS3-HMAC-SHA256 Credential=([^,]+),SignedHeaders=([^,]+),Signature=([0-9a-f]+)$")


class SignatureError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _canonical_query(raw: str) -> str:
    pairs = []
    for part in raw.split("&") if raw else []:
        k, _, v = part.partition("=")
        pairs.append((unquote(k.replace("+", "%20")), unquote(v.replace("+", "%20"))))
    pairs.sort()
    return "&".join(f"{k}={quote(v, safe='~')}" for k, v in pairs)


def parse(authorization: str) -> tuple[str, list[str], str]:
    m = _AUTH.match(authorization or "")
    if not m:
        raise SignatureError(400, "IncompleteSignature", "The request signature does not conform to Aliyun standards.")
    return m.group(1), m.group(2).split(";"), m.group(3)


def verify(method: str, raw_path: str, raw_query: str, headers: dict[str, str], body: bytes,
           secret: str, signed: list[str], signature: str) -> None:
    """Raise SignatureError unless the request is signed with `secret`."""
    low = {k.lower(): v for k, v in headers.items()}
    missing = [h for h in REQUIRED if h not in low]
    if missing:
        raise SignatureError(400, "MissingParameter", f"The input parameter \"{missing[0]}\" that is mandatory "
                                                      "for processing this request is not supplied.")
    if hashlib.sha256(body).hexdigest() != low["x-acs-content-sha256"]:
        raise SignatureError(400, "IncompleteSignature", "The request signature does not conform to Aliyun standards.")
    if sorted(signed) != signed or any(h not in low for h in signed) or "host" not in signed:
        raise SignatureError(400, "IncompleteSignature", "The request signature does not conform to Aliyun standards.")
    canonical_headers = "".join(f"{h}:{low[h].strip()}\n" for h in signed)
    canonical = "\n".join([method, raw_path or "/", _canonical_query(raw_query), canonical_headers,
                           ";".join(signed), low["x-acs-content-sha256"]])
    to_sign = f"{ALGORITHM}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    expected = hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SignatureError(400, "SignatureDoesNotMatch",
                             f"Specified signature does not match our calculation. server string to sign is:{to_sign}")
