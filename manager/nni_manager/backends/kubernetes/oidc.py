"""`auth-provider: oidc` kubeconfig users, refreshed as kubectl's oidc plugin does (and the expiry
of client certificates that exec plugins return, which the official loader drops).

The official client's own OIDC refresh cannot be used: `kubernetes.aio` hands aiohttp the CA file's
path as an SSL context (a TypeError whenever `idp-certificate-authority-data` is set), turns TLS
verification off when it is not, drops the issuer's error body, never writes the rotated tokens back
(its persister is called at load time) and, with its 5-minute skew, refreshes any token living less
than that on every load. So: discovery (`<idp-issuer-url>/.well-known/openid-configuration`), the
`refresh_token` grant at its token endpoint (client_secret_basic, or client_id alone for a public
client), verification against `idp-certificate-authority(-data)` or the system's CAs, and the new
`id-token` / `refresh-token` written back to the kubeconfig file that defines the user (refresh
tokens rotate: the old one is spent, so kubectl and the next experiment need the new one)."""
from __future__ import annotations

import base64
import datetime
import json
import os
import ssl
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.aio.client import Configuration
    from kubernetes.aio.config.kube_config import KubeConfigLoader
from urllib.parse import quote

import yaml

TIMEOUT_S = 30.0


class OidcError(Exception):
    """The id-token could not be refreshed; the message names the cause (no token in it)."""

    user = context = "?"  # the kubeconfig user and context, set by the loader

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused  # the issuer said no (not a network problem): asking again will not help


def expiry(id_token: str) -> datetime.datetime | None:
    """The `exp` claim of a JWT (unverified: the API server verifies), or None."""
    parts = id_token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        return datetime.datetime.fromtimestamp(float(claims["exp"]), datetime.timezone.utc)
    except (ValueError, KeyError, TypeError):
        return None


def needs_refresh(config: dict, skew_s: float) -> bool:
    token = config.get("id-token")
    if not token:
        return True
    exp = expiry(str(token))
    return exp is not None and datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=skew_s) >= exp


def _ssl_context(config: dict, base: Path) -> ssl.SSLContext:
    data = config.get("idp-certificate-authority-data")
    if data:
        return ssl.create_default_context(cadata=base64.b64decode(data).decode())
    path = config.get("idp-certificate-authority")
    if path:
        return ssl.create_default_context(cafile=str(base / os.path.expanduser(str(path))))
    return ssl.create_default_context()  # the system's CAs: verification is never switched off


def _describe(status: int, body: bytes) -> str:
    """An RFC 6749 §5.2 error body as `error: description`, else the status and a short text."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("error"):
        desc = parsed.get("error_description")
        return f"{parsed['error']}: {desc}" if desc else str(parsed["error"])
    text = body.decode(errors="replace").strip().splitlines()
    return f"HTTP {status}" + (f" {text[0][:200]}" if text else "")


async def refresh(config: dict, base: Path) -> None:
    """Trade `config`'s refresh-token for a new id-token (and refresh-token), in place."""
    import aiohttp

    for key in ("idp-issuer-url", "client-id", "refresh-token"):
        if not config.get(key):
            raise OidcError(f"the id-token has expired and the auth-provider config has no {key} to refresh it")
    issuer = str(config["idp-issuer-url"]).rstrip("/")
    client_id, secret = str(config["client-id"]), config.get("client-secret")
    form = {"grant_type": "refresh_token", "refresh_token": str(config["refresh-token"])}
    headers = {"Accept": "application/json"}
    if secret:  # client_secret_basic (RFC 6749 §2.3.1: form-encode each part, then HTTP Basic)
        pair = f"{quote(client_id, safe='')}:{quote(str(secret), safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    else:
        form["client_id"] = client_id
    try:
        ctx = _ssl_context(config, base)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise OidcError(f"cannot read idp-certificate-authority: {e}") from None
    try:
        # trust_env: HTTPS_PROXY / NO_PROXY, as kubectl's oidc auth-provider (the cluster's proxy-url is not its)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), trust_env=True) as http:
            async with http.get(f"{issuer}/.well-known/openid-configuration", ssl=ctx) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise OidcError(f"the issuer {issuer} answered its discovery document with "
                                    f"{_describe(resp.status, body)}")
                endpoint = json.loads(body).get("token_endpoint")
            if not endpoint:
                raise OidcError(f"the issuer {issuer} names no token_endpoint")
            async with http.post(endpoint, data=form, ssl=ctx, headers=headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise OidcError(f"the issuer {issuer} refused the refresh token ({_describe(resp.status, body)})",
                                    refused=400 <= resp.status < 500)
                answer = json.loads(body)
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as e:
        raise OidcError(f"cannot refresh at the issuer {issuer}: {type(e).__name__}: {e}") from None
    if not isinstance(answer, dict) or not answer.get("id_token"):
        raise OidcError(f"the issuer {issuer} returned no id_token (does the client have the openid scope?)")
    config["id-token"] = answer["id_token"]
    if answer.get("refresh_token"):
        config["refresh-token"] = answer["refresh_token"]


def write_back(path: str, content: dict) -> None:
    """Replace the kubeconfig file atomically, keeping its mode (kubectl rewrites it the same way)."""
    target = Path(path).resolve()  # a symlinked ~/.kube/config stays a symlink
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o600
    fd, tmp = tempfile.mkstemp(dir=str(target.parent), prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(content, f, default_flow_style=False)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def certificate_expiry(path: str) -> datetime.datetime | None:
    """A PEM certificate's notAfter (an exec plugin's; its expirationTimestamp is not kept), or None."""
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None


def loader_class() -> Any:
    """The official KubeConfigLoader with OIDC users refreshed by `refresh` above."""
    from kubernetes.aio.config.kube_config import KubeConfigLoader

    class OidcKubeConfigLoader(KubeConfigLoader):
        files: dict[str, Any] = {}  # path -> that file's parsed content (shared with the merged config)
        force_refresh = False  # after a 401: the id-token looks valid but the API server refused it
        skew_s = 1.0
        oidc_expiry: datetime.datetime | None = None

        async def load_from_exec_plugin(self) -> Any:
            """The official exec provider, and the expiry of the client certificate a plugin returned
            (Pinniped, Teleport): it keeps only a token's, so an expiring certificate was never renewed."""
            done = await super().load_from_exec_plugin()
            cert_file = self.__dict__.get("cert_file")
            if done and cert_file and getattr(self, "exec_plugin_expiry", None) is None:
                self.exec_plugin_expiry = certificate_expiry(cert_file)
            return done

        async def _load_oid_token(self) -> str:
            current: Any = self._current_context  # set by set_active_context before authentication loads
            try:
                return await self._oid_token()
            except OidcError as e:
                e.user = current["context"].safe_get("user") or "?"
                e.context = current.safe_get("name") or "?"
                raise

        async def _oid_token(self) -> str:
            user: Any = self._user
            provider = user["auth-provider"]
            if "config" not in provider:
                raise OidcError("the oidc auth-provider has no config")
            config = provider["config"].value
            if self.force_refresh or needs_refresh(config, self.skew_s):
                path = user.path
                await refresh(config, Path(path).parent if path else Path.cwd())
                if path in self.files:  # the user's dict is the file's own: write the rotated tokens back
                    write_back(path, self.files[path])
            self.oidc_expiry = expiry(str(config["id-token"]))
            self.token = f"Bearer {config['id-token']}"
            return self.token

    return OidcKubeConfigLoader


async def load(source: str, context: str | None, cfg: Configuration, force_refresh: bool,
               skew_s: float) -> KubeConfigLoader:
    """Load `source` (one path or several joined by os.pathsep) into `cfg`, as load_kube_config does."""
    from kubernetes.aio.config.config_exception import ConfigException
    from kubernetes.aio.config.kube_config import KubeConfigMerger

    merger = KubeConfigMerger(source)
    if merger.config is None:
        raise ConfigException(f"no kubeconfig file found at {source}")
    loader = loader_class()(config_dict=merger.config, active_context=context, config_base_path=None)
    loader.files = merger.config_files
    loader.force_refresh, loader.skew_s = force_refresh, skew_s
    await loader.load_and_set(cfg)
    return loader
