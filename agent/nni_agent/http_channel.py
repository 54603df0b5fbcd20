"""NNI v3 HTTP trial command channel (nni-training-service.md §1.7), served on 127.0.0.1.

URL `/env/<envId>/<trialId>`: the trial PUTs JSON commands (metric, request_parameter)
and long-polls GET for replies (200 with one queued command, 408 after ~1 s without one,
410 once the trial is unregistered or the server closed). The stdlib server runs in a
daemon thread; commands hop to the asyncio loop of the trial that registered. It starts
with the first trial that asks for its URL, so an idle agent carries none of it.

Any local user can find the port, and trial ids are short: a request is served only on the
exact URL handed to that trial (`url(env_id, trial_id)`), so `env_id` should be a per-trial
secret (Trial passes a random one); any other env segment is answered as an unknown trial.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections import deque
from http import HTTPStatus
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

log = logging.getLogger(__name__)

LONG_POLL_S = 1.0
MAX_BODY = 2 * 1024 * 1024  # a metric is at most 1,000,000 bytes, plus JSON quoting
_PATH = re.compile(r"^(?:/[^?]*)?/env/([^/?]+)/([^/?]+)/?(?:\?.*)?$")


class ChannelHandler(Protocol):
    def on_command(self, command: dict[str, object]) -> None: ...


class _Registration:
    def __init__(self, handler: ChannelHandler, loop: asyncio.AbstractEventLoop) -> None:
        self.handler = handler
        self.loop = loop
        self.outgoing: deque[dict[str, object]] = deque()


class HttpChannelServer:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._trials: dict[str, _Registration] = {}
        self._env_ids: dict[str, str] = {}  # trial id -> the env segment of the URL it was given (kept)
        self._closed = False
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        """Listen on 127.0.0.1 (idempotent; `port` and `url` call it too)."""
        if self._server is not None:
            return
        from http.server import ThreadingHTTPServer  # only agents that run trials pay for it

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
            name="nni-http-channel", daemon=True,
        ).start()

    @property
    def port(self) -> int:
        self.start()
        assert self._server is not None
        return self._server.server_address[1]

    def url(self, env_id: str, trial_id: str) -> str:
        """The trial's channel URL; from now on only this URL reaches `trial_id`."""
        port = self.port
        with self._cond:
            self._env_ids[trial_id] = env_id
        return f"http://127.0.0.1:{port}/env/{env_id}/{trial_id}"

    def register(self, trial_id: str, handler: ChannelHandler) -> None:
        """Accept commands for `trial_id`; `handler.on_command` runs on the calling loop."""
        with self._cond:
            self._trials[trial_id] = _Registration(handler, asyncio.get_running_loop())

    def send(self, trial_id: str, command: dict[str, object]) -> None:
        """Queue a command for the trial's next GET (dropped if the trial is not registered)."""
        with self._cond:
            reg = self._trials.get(trial_id)
            if reg is not None:
                reg.outgoing.append(command)
                self._cond.notify_all()

    def unregister(self, trial_id: str) -> None:
        with self._cond:
            self._trials.pop(trial_id, None)  # its URL stays known: 410 Gone, as NNI answers, not 404
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._trials.clear()
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- called from server threads

    def _url_given(self, env_id: str, trial_id: str) -> bool:
        with self._cond:
            expected = self._env_ids.get(trial_id)
        if expected is None:
            return False
        import hmac  # here, not at import: hmac pulls in hashlib and libcrypto, an idle agent's megabyte

        return hmac.compare_digest(env_id.encode(), expected.encode())

    def _deliver(self, trial_id: str, command: dict[str, object]) -> bool:
        with self._cond:
            reg = None if self._closed else self._trials.get(trial_id)
        if reg is None:
            return False
        try:
            reg.loop.call_soon_threadsafe(reg.handler.on_command, command)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def _next_command(self, trial_id: str) -> tuple[int, dict[str, object] | None]:
        with self._cond:
            reg = self._trials.get(trial_id)
            if reg is not None and not self._closed and not reg.outgoing:
                self._cond.wait_for(
                    lambda: self._closed or self._trials.get(trial_id) is not reg or bool(reg.outgoing),
                    timeout=LONG_POLL_S,
                )
            if self._closed or reg is None or self._trials.get(trial_id) is not reg:
                return HTTPStatus.GONE, None
            if reg.outgoing:
                return HTTPStatus.OK, reg.outgoing.popleft()
            return HTTPStatus.REQUEST_TIMEOUT, None


def _handler_class(channel: HttpChannelServer) -> type:
    """The request handler class, bound to `channel` (http.server is imported lazily)."""
    from http.server import BaseHTTPRequestHandler

    class _RequestHandler(BaseHTTPRequestHandler):
        server_channel = channel

        def do_PUT(self) -> None:
            trial_id = self._trial_id()
            if trial_id is None:
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
                return
            try:
                command = json.loads(self.rfile.read(length))
            except (ValueError, RecursionError):  # nested deeper than the decoder goes: no command
                self._reply(HTTPStatus.BAD_REQUEST, {"error": "the body must be a JSON object"})
                return
            if not isinstance(command, dict):
                self._reply(HTTPStatus.BAD_REQUEST, {"error": "the body must be a JSON object"})
                return
            ok = self.server_channel._deliver(trial_id, command)
            self._reply(HTTPStatus.OK if ok else HTTPStatus.GONE)

        def do_GET(self) -> None:
            trial_id = self._trial_id()
            if trial_id is None:
                return
            status, command = self.server_channel._next_command(trial_id)
            self._reply(status, command)

        def _trial_id(self) -> str | None:
            match = _PATH.match(self.path)
            if match is None:
                self._reply(HTTPStatus.NOT_FOUND, {"error": "expected /env/<envId>/<trialId>"})
                return None
            if not self.server_channel._url_given(match.group(1), match.group(2)):
                self._reply(HTTPStatus.NOT_FOUND, {"error": "no such trial channel"})
                return None
            return match.group(2)

        def _reply(self, status: int, body: dict[str, object] | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (stdlib signature)
            pass  # request lines carry the trial's secret URL: never logged

    return _RequestHandler
