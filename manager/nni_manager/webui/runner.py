"""How `nni-manager run` and `nni-manager view` start, keep and stop the web server."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nni_manager.webui.server import DEFAULT_BIND, DEFAULT_PORT, WebServer
from nni_manager.webui.sides import LiveExperiment, StoredExperiment


@dataclass
class WebOptions:
    port: int = DEFAULT_PORT
    bind: str = DEFAULT_BIND
    url_prefix: str = ""


def _announce(server: WebServer, out: Any = None) -> None:
    """The one line that shows the token (where one is required): printed, never logged."""
    out = out or sys.stdout
    if server.static_dir is None:
        print(f"WebUI: {server.login_url}  (NNI's REST API only: `pip install nni==3.0` for NNI's WebUI)", file=out,
              flush=True)
    else:
        print(f"WebUI: {server.login_url}", file=out, flush=True)


class LiveWebUI:
    """The web side of a running experiment; `finish()` records how the run ended."""

    def __init__(self, side: LiveExperiment | None, server: WebServer | None) -> None:
        self.side = side
        self.server = server
        self.serving_after_end = False
        self._released = asyncio.Event()

    def finish(self, phase: str, error: str | None = None) -> None:
        if self.side is not None:
            self.side.finish(phase, error)

    def release(self) -> None:
        """End `serve_until_stopped` (Ctrl-C, SIGTERM or DELETE /experiment after the end)."""
        self._released.set()

    async def serve_until_stopped(self, ended: str = "is done") -> None:
        """NNI's manager stays up after its experiment is DONE (or in ERROR): so do we, until stopped."""
        if self.server is None:
            return
        self.serving_after_end = True
        if self.server is not None:
            await self.server.sync_manifest()
        print(f"nni-manager: the experiment {ended}; the WebUI stays at {self.server.url} until Ctrl-C "
              "(or `nnictl stop`)", flush=True)
        await self._released.wait()


@contextlib.asynccontextmanager
async def live_webui(experiment: Any, experiment_id: str, options: WebOptions | None,
                     stop: Callable[[], None]) -> AsyncIterator[LiveWebUI]:
    """Serve `experiment` while the block runs; `stop` is what DELETE /experiment calls."""
    if options is None:
        yield LiveWebUI(None, None)
        return
    directory = Path(experiment.config.experiment_working_directory).expanduser() / experiment_id
    side = LiveExperiment(experiment, experiment_id, directory, stop)
    server = WebServer(side, port=options.port, bind=options.bind, url_prefix=options.url_prefix,
                       experiment_name=experiment.config.experiment_name)
    await server.start()
    _announce(server)
    side.phase = "RUNNING"
    web = LiveWebUI(side, server)
    try:
        yield web
    finally:
        await server.stop("STOPPED")


async def serve_stored(experiment_dir: Path, options: WebOptions) -> None:
    """`nni-manager view DIR`: a stored experiment, read-only, until Ctrl-C, SIGTERM or
    DELETE /experiment."""
    from nni_manager.store import Store
    from nni_manager.webui.server import experiment_end_time

    store = Store.open_readonly(experiment_dir)
    try:
        stored = store.experiment()
    finally:
        store.close()
    if not stored:
        raise FileNotFoundError(f"{experiment_dir} holds no experiment record")
    stopped = asyncio.Event()
    side = StoredExperiment(experiment_dir, stored, await asyncio.to_thread(experiment_end_time, experiment_dir),
                            stopped.set)
    name = (stored["config"] or {}).get("experiment_name")
    server = WebServer(side, port=options.port, bind=options.bind, url_prefix=options.url_prefix,
                       experiment_name=name)
    await server.start()
    _announce(server)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await stopped.wait()
    finally:
        await server.stop("STOPPED")
