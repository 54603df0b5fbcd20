"""Who may use the REST API and the WebUI.

NNI's API has no authentication, and `DELETE /experiment`, trial kills and profile writes act
at once. Three guards, checked on every request before any handler runs:

- the `Host` header must name this server (loopback names, the `--bind` address, or for a
  wildcard bind the address the connection arrived at and this machine's names): a web page
  whose domain was re-pointed at 127.0.0.1 (DNS rebinding) sends its own name and is refused;
  a cross-site `Origin` on a write is refused likewise;
- the caller must run as our user: a loopback peer's socket owner is found in /proc/net/tcp
  (`peers`), so other users of a shared machine are refused while `nnictl` and
  `Experiment.connect()` of the same user work unchanged;
- or it must show the token (`?token=` once, then a cookie; or `Authorization: token ...`),
  which exists only when the server is reachable from elsewhere (`--bind` not loopback) or
  this system cannot tell socket owners. The token is never logged nor echoed.
"""
from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from nni_manager.webui import peers
from nni_manager.webui.views import dumps

log = logging.getLogger(__name__)

WILDCARDS = ("0.0.0.0", "::", "")
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_LOG_ONCE_MAX = 100
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bind_is_loopback(bind: str) -> bool:
    return bind.lower() == "localhost" or peers.is_loopback(bind)


def token_required(bind: str) -> bool:
    """A token is needed where other machines can connect, or where peers cannot be identified."""
    return not bind_is_loopback(bind) or not peers.owners_known()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _host_name(header: str) -> str:
    """`Host` without its port, lower case, addresses in canonical form (`[::1]:80` -> `::1`)."""
    header = header.strip().lower()
    if header.startswith("["):
        name = header[1:].split("]", 1)[0]
    else:
        name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    addr = peers.normal_address(name)
    return str(addr) if addr is not None else name.rstrip(".")


def _refuse(message: str) -> web.Response:
    return web.Response(status=403, text=dumps({"error": f"Error: {message}"}), content_type="application/json")


class Access:
    """The guards of one server; `cookie_name` is set once its port is known."""

    def __init__(self, bind: str, token: str | None, uid: int | None = None) -> None:
        self.bind = bind
        self.token = token
        self.uid = os.geteuid() if uid is None else uid
        self.cookie_name = "nni-manager-token"
        self._hosts = set(_LOOPBACK_NAMES)
        if bind in WILDCARDS:
            self._hosts |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        else:
            self._hosts.add(_host_name(bind))
        self._owners: weakref.WeakKeyDictionary[object, int | None] = weakref.WeakKeyDictionary()
        self._logged: set[str] = set()  # refusals already logged: a polling page logs once

    def set_port(self, port: int) -> None:
        self.cookie_name = f"nni-manager-token-{port}"  # cookies ignore ports: one per server

    def __repr__(self) -> str:  # never the token
        return f"Access(bind={self.bind!r}, token={'set' if self.token else 'none'}, uid={self.uid})"

    # ------------------------------------------------------------------ the guards
    def _host_refusal(self, request: web.Request) -> str | None:
        header = request.headers.get("Host")
        if not header:
            return "a Host header is required"
        name = _host_name(header)
        if name in self._hosts:
            return None
        if self.bind in WILDCARDS and request.transport is not None:
            ours = request.transport.get_extra_info("sockname")
            if ours and name == str(peers.normal_address(ours[0])):
                return None
        return (f"Host {header!r} is not served here: nni-manager answers requests for localhost, 127.0.0.1, "
                "[::1] or its --bind address only (a guard against DNS rebinding)")

    def _origin_refusal(self, request: web.Request) -> str | None:
        origin = request.headers.get("Origin")
        if request.method in ("GET", "HEAD") or not origin:
            return None
        netloc = urlsplit(origin).netloc
        if netloc and netloc.lower() == request.headers.get("Host", "").lower():
            return None
        return f"a write from another site ({origin!r}) is refused"

    def _token_from_query(self, request: web.Request) -> bool:
        offered = request.query.get("token")
        return (self.token is not None and offered is not None
                and hmac.compare_digest(offered.encode(), self.token.encode()))

    def _token_ok(self, request: web.Request) -> bool:
        if self.token is None:
            return False
        if self._token_from_query(request):
            return True
        auth = request.headers.get("Authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() in ("token", "bearer") and hmac.compare_digest(value.strip().encode(), self.token.encode()):
            return True
        cookie = request.cookies.get(self.cookie_name)
        return cookie is not None and hmac.compare_digest(cookie.encode(), self.token.encode())

    def peer_uid(self, request: web.Request) -> int | None:
        """The uid owning the client's socket (loopback peers only; cached per connection)."""
        transport = request.transport
        if transport is None:
            return None
        try:
            return self._owners[transport]
        except KeyError:
            pass
        peer, ours = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        uid = None
        if peer and ours and peers.is_loopback(peer[0]):
            uid = peers.socket_owner((peer[0], peer[1]), (ours[0], ours[1]))
        if uid is not None:  # an unknown owner is looked up again on the next request
            self._owners[transport] = uid
        return uid

    def _caller_refusal(self, request: web.Request) -> str | None:
        if self._token_ok(request):
            return None
        uid = self.peer_uid(request)
        if uid == self.uid:
            return None
        tail = " or the token printed with the WebUI URL" if self.token else ""
        if uid is None:
            if self.token:
                return "the token printed with the WebUI URL is required (missing or wrong)"
            return ("the user of this connection cannot be identified; nni-manager serves its own user's "
                    "processes on this machine only")
        return (f"this experiment is served to its owner's processes only (uid {self.uid}); this connection "
                f"belongs to uid {uid}. Use the owner's account{tail}")

    # ------------------------------------------------------------------ aiohttp glue
    def install(self, app: web.Application) -> None:
        app.middlewares.insert(0, self._middleware)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        why = self._host_refusal(request) or self._origin_refusal(request) or self._caller_refusal(request)
        if why is not None:
            if why not in self._logged and len(self._logged) < _LOG_ONCE_MAX:
                self._logged.add(why)
                log.warning("refused %s %s: %s", request.method, request.path, why)
            return _refuse(why)
        if not self._token_from_query(request):
            return await handler(request)
        if request.method == "GET" and "/api/" not in request.path:  # a browser: the token leaves the address bar
            query = request.rel_url.query.copy()
            query.popall("token", None)
            redirect = web.HTTPFound(request.rel_url.with_query(query))
            self._set_cookie(redirect)
            raise redirect
        response = await handler(request)
        if not response.prepared:
            self._set_cookie(response)
        return response

    def _set_cookie(self, response: web.StreamResponse) -> None:
        """The token as a cookie: the WebUI's own requests carry it from now on."""
        assert self.token is not None
        response.set_cookie(self.cookie_name, self.token, httponly=True, samesite="Lax", path="/")
