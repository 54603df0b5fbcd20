"""Which proxy reaches the API server, picked as the official client (`kubernetes.aio`) picks it,
so that the hub tunnel's WebSocket goes the same way as every API call: the kubeconfig's
`proxy-url` first, else HTTPS_PROXY unless NO_PROXY names the server (aiohttp's `trust_env`),
else direct. The client reaches a proxy with HTTP CONNECT; SOCKS is refused here in one line,
since the client cannot speak it (it would fail on every call with a bare connector error)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    import aiohttp
    from kubernetes.aio.client import Configuration
    from yarl import URL

SUPPORTED = ("http", "https")


class ProxyError(ValueError):
    """A proxy the client cannot use: one line naming where it was set and what works."""


@dataclass(frozen=True)
class Route:
    proxy: str | None  # the proxy's URL (credentials included, as given), or None: direct
    auth: aiohttp.BasicAuth | None = None  # from the environment's proxy URL or ~/.netrc
    headers: Mapping[str, str] | None = None  # the Configuration's proxy_headers
    server_hostname: str | None = None  # the kubeconfig's tls-server-name: SNI and verification


def _shown(url: URL) -> str:
    """The proxy URL without its password (it may carry one)."""
    return str(url.with_password(None)) if url.password else str(url)


def route(cfg: Configuration) -> Route:
    """The way to the API server of `cfg` (a kubernetes.aio Configuration); ProxyError if unusable."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    auth = None
    if cfg.proxy:
        url, where = URL(cfg.proxy), "the kubeconfig's proxy-url"
    else:
        try:  # the https form of the server's URL: HTTPS_PROXY, NO_PROXY, as for every API call
            url, auth = get_env_proxy_for_url(URL(cfg.host))
        except LookupError:
            return Route(None, server_hostname=cfg.tls_server_name or None)
        where = "HTTPS_PROXY"
    if url.scheme not in SUPPORTED:
        raise ProxyError(f"{where} {_shown(url)}: {url.scheme} proxies are not supported; the Kubernetes client "
                         "reaches the API server through an HTTP proxy (http://host:port, HTTP CONNECT) or "
                         "directly: name your network's HTTP proxy instead, or put an HTTP CONNECT proxy in front "
                         "of the SOCKS one")
    return Route(str(url), auth, cfg.proxy_headers, cfg.tls_server_name or None)


def refusal(e: BaseException) -> str:
    """One line for a proxy that refused the CONNECT (bad credentials, an ACL), else "". Never
    str(e): aiohttp's names the proxy URL, password included."""
    import aiohttp

    if not isinstance(e, aiohttp.ClientHttpProxyError):
        return ""
    return (f"the proxy refused to open a connection to the API server ({e.status} {e.message}): check the user "
            "and password of the proxy URL (the kubeconfig's proxy-url or HTTPS_PROXY, http://user:pass@host:port) "
            "and that the proxy allows CONNECT to the API server's host and port")
