"""An OpenID Connect issuer on the emulator's TLS listener, and the API server's OIDC authenticator.

The issuer (`https://127.0.0.1:PORT/oidc`, as Dex or Keycloak serve one under a path) answers what a
kubeconfig's `auth-provider: oidc` client uses: the discovery document
(`/.well-known/openid-configuration`), the JWKS and the token endpoint with the `refresh_token`
grant (RFC 6749 §6: client authentication by `client_secret_basic` or `client_secret_post`; errors as
§5.2 bodies, `{"error": "invalid_grant", ...}` for a reused, revoked or unknown refresh token;
refresh tokens rotate: each is good for one grant, as Dex and Keycloak with rotation do). Id-tokens
are RS256 JWTs (PyJWT) with `iss`, `aud` (the client id), `sub`, `iat`, `exp`, and `email`,
`email_verified`, `groups` when the login named them.

The authenticator checks a bearer JWT as kube-apiserver's `--oidc-*` flags do: signature, issuer,
audience (`--oidc-client-id`), expiry (no leeway); the user is the `--oidc-username-claim` (`sub` by
default, prefixed `<issuer>#` as the API server does for claims other than `email`; `email` needs
`email_verified` true when present), groups from `--oidc-groups-claim`. Users are authorized by RBAC.
"""
from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import unquote

from aiohttp import web

from . import rbac


@dataclass
class Session:
    """One login: the refresh token now valid for it, and the claims its id-tokens carry."""

    client_id: str
    sub: str
    email: str | None
    groups: list[str]
    lifetime: float  # of each id-token, in seconds
    refresh_token: str = ""
    refresh_lifetime: float | None = None  # of the id-tokens refreshes return (None: `lifetime`)
    revoked: bool = False


@dataclass
class ApiServerFlags:
    """kube-apiserver's --oidc-client-id, --oidc-username-claim, --oidc-username-prefix, --oidc-groups-claim."""

    client_id: str = "kubernetes"
    username_claim: str = "sub"
    username_prefix: str | None = None  # None: the API server's default (`<issuer>#` unless the claim is email)
    groups_claim: str | None = "groups"


@dataclass
class Counters:
    grants: int = 0  # refresh grants answered with new tokens
    refused: dict[str, int] = field(default_factory=dict)  # error code -> count


def _error(status: int, error: str, description: str, basic: bool = False) -> web.Response:
    headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
    if basic and status == 401:
        headers["WWW-Authenticate"] = 'Basic realm="oidc"'
    return web.json_response({"error": error, "error_description": description}, status=status, headers=headers)


class Issuer:
    """The identity provider and the API server's view of it (see the module docstring)."""

    def __init__(self, base_url: Callable[[], str]) -> None:
        self._base_url = base_url
        self._key: Any = None
        self.kid = secrets.token_hex(8)
        self.clients: dict[str, str] = {}  # client id -> secret
        self.sessions: dict[str, Session] = {}  # refresh token -> session (spent ones too, marked by rotation)
        self.spent: set[str] = set()
        self.flags = ApiServerFlags()
        self.counters = Counters()

    @property
    def key(self) -> Any:
        """The signing key, made on first use: most emulators never issue an ID token, and an RSA key
        is a tenth of an emulator's start."""
        if self._key is None:
            from cryptography.hazmat.primitives.asymmetric import rsa

            self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return self._key

    @property
    def url(self) -> str:
        return self._base_url() + "/oidc"

    # -------------------------------------------------------------- tokens
    def _id_token(self, s: Session) -> str:
        import jwt

        now = int(time.time())
        claims: dict = {"iss": self.url, "aud": s.client_id, "sub": s.sub, "iat": now,
                        "exp": now + max(1, int(round(s.lifetime)))}
        if s.email is not None:
            claims.update(email=s.email, email_verified=True)
        if s.groups:
            claims["groups"] = list(s.groups)
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})

    def _rotate(self, s: Session) -> None:
        if s.refresh_token:
            self.spent.add(s.refresh_token)
        s.refresh_token = "rt-" + secrets.token_urlsafe(24)
        self.sessions[s.refresh_token] = s

    def login(self, body: dict) -> dict:
        """What a user's login (browser, `kubectl oidc-login`) leaves in the kubeconfig."""
        client_id = str(body.get("clientId", "kubernetes"))
        secret = body.get("clientSecret")
        self.clients[client_id] = str(secret) if secret is not None else self.clients.get(client_id, "")
        s = Session(client_id, str(body["user"]), body.get("email"), list(body.get("groups") or []),
                    float(body.get("lifetime", 3600)))
        if body.get("refreshLifetime") is not None:  # a test's short first token, then ones that outlive it
            s.refresh_lifetime = float(body["refreshLifetime"])
        self._rotate(s)
        return {"issuer": self.url, "idToken": self._id_token(s), "refreshToken": s.refresh_token}

    def revoke(self, user: str) -> int:
        """An administrator ends the user's sessions: their refresh tokens stop working."""
        n = 0
        for s in {id(s): s for s in self.sessions.values()}.values():
            if s.sub == user and not s.revoked:
                s.revoked, n = True, n + 1
        return n

    # -------------------------------------------------------------- HTTP (the issuer's own endpoints)
    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path[len("/oidc"):]
        if path == "/.well-known/openid-configuration" and request.method == "GET":
            return web.json_response({
                "issuer": self.url, "authorization_endpoint": self.url + "/auth",
                "token_endpoint": self.url + "/token", "jwks_uri": self.url + "/keys",
                "response_types_supported": ["code"], "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                "scopes_supported": ["openid", "email", "groups", "offline_access"],
                "claims_supported": ["iss", "sub", "aud", "iat", "exp", "email", "email_verified", "groups"]})
        if path == "/keys" and request.method == "GET":
            from jwt.algorithms import RSAAlgorithm

            jwk = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
            return web.json_response({"keys": [{**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}]})
        if path == "/token":
            if request.method != "POST":
                return web.Response(status=405, text="method not allowed")
            return await self._token(request)
        return web.Response(status=404, text="404 page not found\n")

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        client_id = secret = None
        scheme, _, cred = request.headers.get("Authorization", "").partition(" ")
        basic = scheme.lower() == "basic"
        if basic:
            try:
                user, _, pw = base64.b64decode(cred.strip()).decode().partition(":")
            except ValueError:
                return _error(401, "invalid_client", "Invalid client credentials.", basic)
            client_id, secret = unquote(user), unquote(pw)  # RFC 6749 §2.3.1: form-encoded, then Basic
        elif "client_id" in form:
            client_id, secret = str(form["client_id"]), str(form.get("client_secret", ""))
        if client_id is None or client_id not in self.clients or not secrets.compare_digest(
                self.clients[client_id], secret or ""):
            self._count("invalid_client")
            return _error(401, "invalid_client", "Invalid client credentials.", basic)
        grant = form.get("grant_type")
        if grant != "refresh_token":
            self._count("unsupported_grant_type")
            return _error(400, "unsupported_grant_type", f"Unsupported grant type {grant!r}.")
        token = str(form.get("refresh_token", ""))
        if not token:
            self._count("invalid_request")
            return _error(400, "invalid_request", "Required param: refresh_token.")
        s = self.sessions.get(token)
        if s is None or token in self.spent or s.revoked or s.client_id != client_id:
            self._count("invalid_grant")
            return _error(400, "invalid_grant", "Refresh token is invalid or has already been claimed by another client.")
        self._rotate(s)
        self.counters.grants += 1
        if s.refresh_lifetime is not None:
            s.lifetime = s.refresh_lifetime
        id_token = self._id_token(s)
        return web.json_response({"access_token": "at-" + secrets.token_urlsafe(16), "token_type": "bearer",
                                  "expires_in": int(s.lifetime), "refresh_token": s.refresh_token,
                                  "id_token": id_token}, headers={"Cache-Control": "no-store", "Pragma": "no-cache"})

    def _count(self, error: str) -> None:
        self.counters.refused[error] = self.counters.refused.get(error, 0) + 1

    # -------------------------------------------------------------- the API server's authenticator
    def authenticate(self, token: str) -> rbac.Identity | None:
        """The identity of a bearer id-token, or None (the API server then answers 401)."""
        import jwt

        if token.count(".") != 2:
            return None
        try:
            claims = jwt.decode(token, self.key.public_key(), algorithms=["RS256"], audience=self.flags.client_id,
                                issuer=self.url, options={"require": ["iss", "aud", "exp", "sub"]})
        except jwt.InvalidTokenError:
            return None
        claim = self.flags.username_claim
        value = claims.get(claim)
        if not isinstance(value, str) or not value:
            return None
        if claim == "email" and claims.get("email_verified", True) is not True:
            return None  # "email not verified"
        prefix = self.flags.username_prefix
        if prefix is None:
            prefix = "" if claim == "email" else self.url + "#"
        elif prefix == "-":
            prefix = ""
        groups = ["system:authenticated"]
        if self.flags.groups_claim and isinstance(claims.get(self.flags.groups_claim), list):
            groups = [str(g) for g in claims[self.flags.groups_claim]] + groups
        return rbac.Identity(prefix + value, None, True, groups, float(claims["exp"]))

    # -------------------------------------------------------------- /emulator/v1/oidc controls
    def control(self, method: str, parts: list[str], body: dict) -> web.Response | None:
        if parts == ["login"] and method == "POST":
            return web.json_response(self.login(body))
        if parts == ["revoke"] and method == "POST":
            return web.json_response({"revoked": self.revoke(str(body.get("user")))})
        if parts == ["apiserver"] and method == "PUT":
            self.flags = ApiServerFlags(str(body.get("clientId", "kubernetes")), str(body.get("usernameClaim", "sub")),
                                        body.get("usernamePrefix"), body.get("groupsClaim", "groups"))
            return web.json_response({"ok": True})
        if parts == [] and method == "GET":
            return web.json_response({"issuer": self.url, "refreshGrants": self.counters.grants,
                                      "refused": self.counters.refused})
        return None
