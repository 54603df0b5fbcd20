"""The Kubernetes client (official `kubernetes.aio`), its credentials, and its errors in one line."""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from nni_manager.backends.base import BackendError
from nni_manager.backends.kubernetes import oidc, proxy
from nni_manager.backends.kubernetes.config import KubeConfig
from nni_manager.config import ConfigError

if TYPE_CHECKING:
    import ssl
    from collections.abc import Awaitable, Callable, Mapping

    from kubernetes.aio.client import ApiClient, Configuration
    from kubernetes.aio.client.rest import RESTResponse
    from kubernetes.aio.config.kube_config import KubeConfigLoader

log = logging.getLogger(__name__)


class KubeError(BackendError):
    """One clear line about a Kubernetes API error."""


# the authorizer's own words (RBAC, webhook authorizers): `User "u" cannot create resource "pods" ...`
RBAC_DENIAL = re.compile(r'cannot [a-z]+ resource "')
# the quota admission plug-in's refusal of one more object (`count/<resource>`, or the older names)
QUOTA_COUNT = re.compile(r"exceeded quota: (?P<quota>[^,\s]+), requested: (?P<key>[a-z0-9./-]+)=1, "
                         r"used: (?P=key)=(?P<used>\d+), limited: (?P=key)=(?P<limit>\d+)")
COUNTED = frozenset({"pods", "secrets", "configmaps", "services", "persistentvolumeclaims", "replicationcontrollers",
                     "resourcequotas"})


def admission_fix(message: str) -> str:
    """A 403 from admission (the request was authorized): which plug-in refused it, and the fix."""
    if "violates PodSecurity" in message:
        return (f"the namespace's Pod Security admission refuses the pod (403): {message}; set what it names "
                "through podSpec (securityContext, and per container under podSpec.containers; see "
                "docs/platforms/kubernetes.md, Pod Security and OpenShift)")
    if "security context constraint" in message:
        return (f"OpenShift's security context constraints refuse the pod (403): {message}; leave runAsUser / "
                "fsGroup out of podSpec (the namespace's range is assigned) or use values inside the ranges of "
                "its annotations openshift.io/sa.scc.uid-range and openshift.io/sa.scc.supplemental-groups")
    if "failed quota" in message:
        return (f"the namespace's ResourceQuota refuses it (403): {message}; every container must state the "
                "quota's resources (cpuNumber / memorySize set them; a podSpec container must too)")
    if "LimitRange" in message or "per Container is" in message or "per Pod is" in message:
        return (f"the namespace's LimitRange refuses it (403): {message}; keep cpuNumber / memorySize / "
                "gpuNumber within its limits (`kubectl describe limitrange`)")
    if "admission webhook" in message:
        return f"an admission webhook refuses it (403): {message}; ask the cluster's administrator what it requires"
    return f"the cluster's admission refuses it (403): {message}"


def api_error(e: Exception, doing: str) -> KubeError:
    """ApiException -> one line naming the status and the likely fix."""
    status = getattr(e, "status", None)
    body: object = getattr(e, "body", None)
    message = ""
    if isinstance(e, KubeError):  # the credentials could not be renewed: that line already says why
        return KubeError(f"{doing}: {e}")
    if isinstance(body, (bytes, str)):
        try:
            parsed = json.loads(body)
            message = parsed.get("message", "") if isinstance(parsed, dict) else ""
        except ValueError:
            message = (body.decode(errors="replace") if isinstance(body, bytes) else body).strip()
    message = message or getattr(e, "reason", "") or str(e)
    if status == 401:
        return KubeError(f"{doing}: the cluster refused the credentials (401 Unauthorized): check the token or "
                         "certificate in your kubeconfig (`kubectl auth whoami`)")
    counted = QUOTA_COUNT.search(message) if status == 403 else None
    if counted and (counted["key"].startswith("count/") or counted["key"] in COUNTED):
        quota, key, used, limit = counted["quota"], counted["key"], counted["used"], counted["limit"]
        what = key.removeprefix("count/").split(".")[0]
        return KubeError(f"{doing}: the namespace's ResourceQuota {quota} allows no more {what} ({key}: {used} used "
                         f"of {limit}; 403 from quota admission, not RBAC): delete what other experiments left "
                         f"(`nni-manager cleanup`, `kubectl get {what}`) or ask for a higher {key} "
                         f"(`kubectl describe resourcequota {quota}`)")
    if status == 403 and "exceeded quota" in message:
        return KubeError(f"{doing}: the namespace's ResourceQuota refuses it (403): {message}; raise the quota "
                         "(`kubectl describe resourcequota`) or lower cpuNumber / memorySize / gpuNumber")
    if status == 403 and "error looking up service account" in message:
        return KubeError(f"{doing}: {message} (403): create the service account or fix serviceAccountName")
    if status == 403 and RBAC_DENIAL.search(message):
        return KubeError(f"{doing}: forbidden (403): {message}; grant that verb on that resource to your user "
                         "or service account (RBAC)")
    if status == 403:  # authorized, then refused by an admission plug-in or webhook: not an RBAC matter
        return KubeError(f"{doing}: {admission_fix(message)}")
    if status == 404 and message.startswith("404 page not found"):
        return KubeError(f"{doing}: the API server does not serve this resource (404): is the operator "
                         "installed, and does it serve this apiVersion?")
    if status is None:
        return KubeError(f"{doing}: cannot reach the API server: {e}")
    return KubeError(f"{doing}: {status} {message}")


def manager_ip_for(url: str) -> str:
    """The address this machine uses to reach `url` (a UDP 'connect' sends no packet)."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or (443 if parsed.scheme == "https" else 80)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


# Where a pod finds its service account (token, ca.crt, namespace); tests point it elsewhere.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Answers worth waiting out: throttling (429, API Priority and Fairness) and the server's own trouble.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_BUDGET_S = 120.0  # one call keeps retrying this long (an API server restart takes tens of seconds)
IN_CLUSTER_REREAD_S = 60.0  # projected service-account tokens rotate: re-read the file this often
RETIRE_S = 600.0  # a connection pool made with a replaced client certificate is closed this much later
EXPIRY_SKEW_S = 1.0  # renew an exec plugin's or OIDC id-token this long before it expires


class Credentials:
    """Where the client's identity comes from, and how to renew it: an explicit `kubeConfig`, else
    the files in KUBECONFIG that exist, else the pod's service account (in a cluster), else
    ~/.kube/config. Exec-plugin tokens are re-run when their `expirationTimestamp` passes, OIDC
    id-tokens refreshed when their `exp` does (oidc.py; the rotated tokens are written back to the
    kubeconfig), and anything is reloaded once after a 401 (a revoked id-token, a rotated token
    file). A refresh the identity provider refused is not retried until the kubeconfig changes."""

    def __init__(self, kube: KubeConfig) -> None:
        self.kube = kube
        self.in_cluster = False
        self.namespace: str | None = None  # the context's namespace, or the pod's own in a cluster
        self._loader: KubeConfigLoader | None = None
        self._expiry: datetime.datetime | None = None  # an exec plugin's expirationTimestamp or an id-token's exp
        self._refused: tuple[tuple[tuple[str, int | None], ...], KubeError] | None = None  # (files' state, refusal)
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    def _source(self) -> str | None:
        """The kubeconfig path(s) to load, or None for the in-cluster service account."""
        if self.kube.kube_config is not None:
            return str(self.kube.kube_config)
        present = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p and Path(p).is_file()]
        if present:
            return os.pathsep.join(present)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        return str(Path("~/.kube/config").expanduser())

    def check_present(self) -> None:
        """ConfigError when there is nothing to load: no kubeconfig file and not inside a cluster."""
        source = self._source()
        if source is not None and not any(Path(p).is_file() for p in source.split(os.pathsep)):
            raise ConfigError("trainingService.kubeConfig", f"no kubeconfig: {source} does not exist, KUBECONFIG "
                              "names no file, and this is not a pod in a cluster",
                              "set `kubeConfig: /path/to/kubeconfig` (or KUBECONFIG), or run `kubectl config view` "
                              "to check that your cluster's login wrote ~/.kube/config")

    def _files_state(self, source: str) -> tuple[tuple[str, int | None], ...]:
        out: list[tuple[str, int | None]] = []
        for p in source.split(os.pathsep):
            try:
                out.append((p, Path(p).stat().st_mtime_ns))
            except OSError:
                out.append((p, None))
        return tuple(out)

    async def load(self, cfg: Configuration, force_refresh: bool = False) -> None:
        source = self._source()
        try:
            if source is None:
                from kubernetes.aio.config.incluster_config import InClusterConfigLoader

                InClusterConfigLoader(str(SERVICE_ACCOUNT_DIR / "token"), str(SERVICE_ACCOUNT_DIR / "ca.crt"),
                                      try_refresh_token=False).load_and_set(cfg)
                self.in_cluster = True
                ns_file = SERVICE_ACCOUNT_DIR / "namespace"
                self.namespace = ns_file.read_text().strip() if ns_file.is_file() else None
            else:
                if self._refused is not None and self._refused[0] == self._files_state(source):
                    raise self._refused[1]  # the same refresh token again: not until the user logs in again
                self._loader = await oidc.load(source, self.kube.context, cfg, force_refresh, EXPIRY_SKEW_S)
                self._refused = None
                self._expiry = (getattr(self._loader, "exec_plugin_expiry", None)
                                or getattr(self._loader, "oidc_expiry", None))
                context = (self._loader.current_context or {}).get("context") or {}
                self.namespace = context.get("namespace")
        except KubeError:
            raise
        except oidc.OidcError as e:
            assert source is not None
            fix = ("log in again with the tool that wrote this kubeconfig's oidc auth-provider (kubelogin, your "
                   "cluster's login page) so that it holds a new refresh-token" if e.refused else
                   "check the auth-provider's idp-issuer-url and idp-certificate-authority and that the issuer "
                   "is reachable from here")
            err = KubeError(f"cannot refresh the OIDC credentials of user {e.user!r} (context {e.context!r}) in "
                            f"{source}: {e}; {fix}, then check with `kubectl --context {e.context} auth whoami`")
            if e.refused:
                self._refused = (self._files_state(source), err)
            raise err from None
        except Exception as e:  # ConfigException, missing files, bad YAML, a failing exec plugin
            where = "the pod's service account" if source is None else source
            raise KubeError(f"cannot load Kubernetes credentials from {where}: {e} (set trainingService.kubeConfig, "
                            "KUBECONFIG, or run inside a cluster)") from None
        self._read_at = time.monotonic()
        _set_hook(cfg, self._before_request)

    def stale(self) -> bool:
        """Whether the credentials are about to expire (or, in a cluster, are due to be re-read)."""
        return self._stale()

    def _stale(self) -> bool:
        if self.in_cluster:
            return time.monotonic() - self._read_at > IN_CLUSTER_REREAD_S
        if self._expiry is None:
            return False
        now = datetime.datetime.now(datetime.timezone.utc)
        return bool(now + datetime.timedelta(seconds=EXPIRY_SKEW_S) >= self._expiry)

    async def _before_request(self, cfg: Configuration) -> None:
        if self._stale():
            await self.refresh(cfg, stale_only=True)

    async def refresh(self, cfg: Configuration, stale_only: bool = False, refused: str | None = None) -> None:
        """Load the credentials again (runs the exec plugin, refreshes OIDC, re-reads token files);
        `refused`: the token a 401 answered (no reload when another call has replaced it meanwhile)."""
        async with self._lock:
            if stale_only and not self._stale():  # another call refreshed them meanwhile
                return
            if refused is not None and cfg.api_key.get("BearerToken") != refused:
                return
            cfg.refresh_api_key_hook = None  # the loader reads api_key itself
            try:
                await self.load(cfg, force_refresh=refused is not None)
            finally:
                _set_hook(cfg, self._before_request)
            log.info("Kubernetes credentials reloaded")


def _set_hook(cfg: Configuration, hook: Callable[[Configuration], Awaitable[None]]) -> None:
    """`cfg.refresh_api_key_hook = hook`: setattr, since the client declares the attribute by its
    default (None) only, so mypy would type it `None`."""
    setattr(cfg, "refresh_api_key_hook", hook)  # noqa: B010


class _Pool(Protocol):
    """A connection pool the client retired (aiohttp's ClientSession, aiohttp_retry's RetryClient)."""

    async def close(self) -> None: ...


def _retry_after(headers: Mapping[str, str] | None, default: float) -> float:
    value = (headers or {}).get("Retry-After", "")
    try:
        return min(max(float(value), 0.0), 60.0)
    except ValueError:
        return default


_CLIENT_CLASS: type[ApiClient] | None = None


def _tls_context(cfg: Configuration) -> ssl.SSLContext:
    """The TLS context the official client builds from `cfg` (CA, client certificate, verification)."""
    from kubernetes.aio.client.rest import RESTClientObject

    return RESTClientObject(cfg).ssl_context  # builds no session: that is made on the first request


def _client_class() -> Any:  # built on first use (no kubernetes.aio import before); its instances are ApiClients
    """ApiClient that refreshes credentials on 401 and waits out 429 / 5xx / a dropped connection."""
    global _CLIENT_CLASS
    if _CLIENT_CLASS is not None:
        return _CLIENT_CLASS
    import aiohttp
    from kubernetes.aio import client

    class RetryingApiClient(client.ApiClient):
        credentials: Credentials
        cert_pair: tuple[str | None, str | None] = (None, None)  # the client certificate and key files the TLS context holds
        retired: list[tuple[float, _Pool]]  # (when to close it, a pool made with an earlier certificate)
        # False while the experiment starts: a server that cannot be reached then is a wrong
        # address or a network problem to report at once, not a restart to wait out
        retry_connections = True

        async def _auth_headers(self, headers: dict[str, str] | None) -> dict[str, str] | None:
            if headers is None:
                return headers
            for setting in (await self.configuration.auth_settings()).values():
                if setting.get("in") == "header" and setting.get("key") in headers:
                    headers[setting["key"]] = setting["value"]
            return headers

        async def fresh_credentials(self) -> None:
            """Client certificates (an exec plugin's: Pinniped, Teleport) renewed before they expire, and
            in use: a token is renewed by the configuration's hook, a certificate is not (no header), and
            the TLS context holds it. A new pool (session) with a new context keeps new requests off
            the connections opened with the old certificate, which the API server refuses (401) on
            their next request once it has expired. The old pool is closed RETIRE_S later (its watches may still stream)."""
            cfg = self.configuration
            if cfg.cert_file and self.credentials.stale():
                await self.credentials.refresh(cfg, stale_only=True)
            pair = (cfg.cert_file, cfg.key_file)
            now = time.monotonic()
            while self.retired and (closing := self.retired[0])[0] <= now:
                self.retired.pop(0)
                await closing[1].close()
            if pair == self.cert_pair:
                return
            rest = self.rest_client
            rest.ssl_context = _tls_context(cfg)
            if rest.pool_manager is not None:
                self.retired.append((now + RETIRE_S, rest.pool_manager))
                rest.pool_manager = None  # the next request makes a new one with the new context
            if rest.retry_client is not None:  # bound to the old pool (only with configuration.retries)
                self.retired.append((now + RETIRE_S, rest.retry_client))
                rest.retry_client = None
            self.cert_pair = pair

        async def close(self) -> None:
            for _, pool in self.retired:
                await pool.close()
            self.retired.clear()
            await super().close()

        async def call_api(self, method: str, url: str, header_params: dict[str, str] | None = None,
                           body: object = None, post_params: object = None, _request_timeout: object = None,
                           _preload_content: bool = True) -> RESTResponse:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + RETRY_BUDGET_S
            delay, refreshed = 0.5, False
            while True:
                await self.fresh_credentials()
                sent_token = self.configuration.api_key.get("BearerToken")
                try:
                    resp = await super().call_api(method, url, header_params, body, post_params,
                                                  _request_timeout, _preload_content)
                except aiohttp.ClientHttpProxyError as e:  # the proxy's 401/407/403, not the cluster's; and
                    raise KubeError(proxy.refusal(e)) from None  # its text would carry the proxy's password
                except (aiohttp.ClientConnectionError, asyncio.TimeoutError, ConnectionError) as e:
                    if not self.retry_connections or loop.time() + delay > deadline:
                        raise
                    log.warning("Kubernetes API %s %s: %s; retrying in %.1f s", method, url.split("?")[0], e or
                                type(e).__name__, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                if resp.status == 401 and not refreshed:
                    await resp.read()
                    refreshed = True
                    await self.credentials.refresh(self.configuration, refused=sent_token)
                    header_params = await self._auth_headers(header_params)
                    continue
                if resp.status not in RETRY_STATUSES:
                    return resp
                await resp.read()  # the body stays readable for the caller's error
                wait = _retry_after(resp.headers, delay) if resp.status == 429 else delay
                if loop.time() + wait > deadline:
                    return resp
                # a warning, as the REST platforms' retries: the log says what the cluster answered
                log.warning("Kubernetes API %s %s answered %s; retrying in %.1f s", method, url.split("?")[0],
                            resp.status, wait)
                await asyncio.sleep(wait)
                delay = min(delay * 2, 10.0)

    _CLIENT_CLASS = RetryingApiClient
    return _CLIENT_CLASS


async def load_client(kube: KubeConfig) -> ApiClient:
    """An ApiClient from the credentials (see `Credentials`); the namespace, when the config names
    none, becomes the context's or (in a cluster) the pod's own."""
    from kubernetes.aio import client

    cfg = client.Configuration()
    credentials = Credentials(kube)
    await credentials.load(cfg)
    try:
        proxy.route(cfg)  # a proxy the client cannot speak fails here, in one line, not on every call
    except proxy.ProxyError as e:
        raise KubeError(f"cannot reach the API server {cfg.host}: {e}") from None
    if not kube.namespace_given and credentials.namespace:
        kube.namespace = credentials.namespace
    api = _client_class()(configuration=cfg)
    api.credentials = credentials
    api.cert_pair = (cfg.cert_file, cfg.key_file)  # what its TLS context was built with
    api.retired = []
    return api
