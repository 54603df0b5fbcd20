"""The web server of one experiment: binds the port, serves the API and the WebUI, keeps the
`~/nni-experiments/.experiment` entry current.

Security: NNI's REST API has no authentication and `DELETE /experiment` stops the
experiment, so we bind 127.0.0.1 unless the user names another address (`--bind`); from
another machine, use `ssh -L 8080:127.0.0.1:8080 host`, as NNI's users do. Every request is
checked by `access.Access`: its Host, then its caller (our own user's processes, or the token
that exists when `--bind` is not loopback; `login_url` carries it, `url` never does).
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import sys
from pathlib import Path
from typing import cast

from aiohttp import web

from nni_manager.jsontypes import JSONValue
from nni_manager.webui import DEFAULT_BIND, DEFAULT_PORT, access, manifest
from nni_manager.webui.api import Api, make_app
from nni_manager.webui.model import DataModel, LiveTrials
from nni_manager.webui.sides import ExperimentSide
from nni_manager.webui.static import webui_dir

_PORT_TRIES = 100
_WATCH_S = 1.0
log = logging.getLogger(__name__)


def normalise_prefix(prefix: str | None) -> str:
    """NNI strips leading and trailing slashes from urlPrefix."""
    return (prefix or "").strip("/")


class WebServer:
    """`await WebServer(side).start()` ... `await server.stop()`.

    `port` is where to start looking: taken ports are skipped (NNI's default 8080, then 8081,
    ...); `port=0` lets the system choose. `register=False` keeps the manifest untouched.
    """

    def __init__(self, side: ExperimentSide, *, port: int = DEFAULT_PORT, bind: str = DEFAULT_BIND,
                 url_prefix: str | None = None, register: bool = True, experiment_name: str | None = None,
                 require_token: bool | None = None) -> None:
        self.side = side
        self.bind = bind
        need_token = access.token_required(bind) if require_token is None else require_token
        self.access = access.Access(bind, access.new_token() if need_token else None)
        self.url_prefix = normalise_prefix(url_prefix)
        self.port = port
        self.register = register
        self.experiment_name = experiment_name
        self.static_dir = webui_dir()
        live = side.trials()
        # a side whose trials() answers is a running manager's, and always answers
        self.model = DataModel(side.experiment_dir, None if live is None else cast(LiveTrials, side.trials))
        self._runner: web.AppRunner | None = None
        self._watch: asyncio.Task[None] | None = None
        self._entry: dict[str, JSONValue] = {}
        self._written: tuple[JSONValue, ...] = ()

    @property
    def url(self) -> str:
        """What to open in a browser (NNI prints its `Web portal URLs` likewise)."""
        host = self.bind if self.bind not in ("0.0.0.0", "::", "") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/" + (self.url_prefix + "/" if self.url_prefix else "")

    @property
    def login_url(self) -> str:
        """`url` with the token where one is required: for the user's terminal only, never a log."""
        return self.url if self.access.token is None else f"{self.url}?token={self.access.token}"

    def base_url(self) -> str:
        return self.url.rstrip("/")

    async def start(self) -> None:
        api = Api(self.side, self.model, self.static_dir, self.entry, self.base_url)
        app = make_app(api, self.url_prefix, self.access)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        sock = _listen(self.bind, self.port)
        self.port = sock.getsockname()[1]
        self.access.set_port(self.port)
        await web.SockSite(self._runner, sock).start()
        self._entry = self._make_entry()
        if self.register:
            await asyncio.to_thread(manifest.register, dict(self._entry))
            self._written = (self._entry["status"], self._entry["endTime"])
        self._watch = asyncio.create_task(self._keep_manifest())

    def entry(self) -> dict[str, JSONValue]:
        """Our `.experiment` entry (`/experiment-metadata`), with the status of now."""
        entry = dict(self._entry)
        entry["status"] = self.side.status()[0]
        entry["endTime"] = self.side.end_time if self.side.end_time is not None else "N/A"
        return entry

    def _make_entry(self) -> dict[str, JSONValue]:
        return {
            "id": self.side.experiment_id, "port": self.port, "startTime": self.side.start_time,
            "endTime": "N/A", "status": self.side.status()[0], "platform": self.side.platform,
            "experimentName": self.experiment_name or "", "tag": [], "pid": os.getpid(),
            "webuiUrl": [self.url.rstrip("/")], "logDir": str(self.side.experiment_dir.parent),
            "prefixUrl": self.url_prefix or None,
        }

    async def sync_manifest(self) -> None:
        """Write status and endTime to the manifest when they changed."""
        if not self.register:
            return
        entry = self.entry()
        now = (entry["status"], entry["endTime"])
        if now != self._written:
            self._written = now
            await asyncio.to_thread(manifest.set_fields, self.side.experiment_id, status=now[0], endTime=now[1])

    async def _keep_manifest(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_S)
            try:
                await self.sync_manifest()
            except OSError as exc:  # a full or read-only home must not end the experiment
                log.warning("cannot update %s: %s", manifest.manifest_path(), exc)

    async def stop(self, final_status: str = "STOPPED") -> None:
        """Close the port; the manifest says STOPPED (no port), as NNI leaves it."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.register:
            end = self.side.end_time or self._entry.get("startTime")
            with contextlib.suppress(OSError):
                await asyncio.to_thread(manifest.set_fields, self.side.experiment_id, status=final_status,
                                        endTime=end, port=None)
        await asyncio.to_thread(self.model.close)


def _listen(bind: str, port: int) -> socket.socket:
    """A listening socket on `port` or the next free one after it."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    last: OSError | None = None
    for candidate in ([0] if port == 0 else range(port, min(port + _PORT_TRIES, 65536))):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind, candidate))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            last = exc
            continue
        sock.setblocking(False)
        if port and candidate != port:
            print(f"nni-manager: port {port} is taken; the WebUI uses {candidate}", file=sys.stderr)
        return sock
    raise OSError(f"no free port from {port} to {port + _PORT_TRIES - 1} on {bind}: {last}")


def experiment_end_time(experiment_dir: Path) -> int | None:
    """When a stored experiment ended: its last trial's end (the store keeps no end time)."""
    from nni_manager.store import Store

    store = Store.open_readonly(experiment_dir)
    try:
        ends = [t.end_time or t.start_time or t.submit_time for t in store.trials()]
    finally:
        store.close()
    return max(ends) if ends else None
