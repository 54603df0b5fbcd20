"""How `nni-manager run` and `nni-manager view` start, keep and stop the web server."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from nni_manager.webui.server import DEFAULT_BIND, DEFAULT_PORT, WebServer
from nni_manager.webui.sides import LiveExperiment, StoredExperiment

if TYPE_CHECKING:
    from nni_manager.experiment import Experiment


@dataclass
class WebOptions:
    port: int = DEFAULT_PORT
    bind: str = DEFAULT_BIND
    url_prefix: str = ""


def _announce(server: WebServer, out: TextIO | None = None) -> None:
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
        self._reopened = False
        if side is not None:
            side.on_reopen = self._reopen

    def finish(self, phase: str, error: str | None = None) -> None:
        """How the run ended; a DONE run whose limit was raised while it still closed runs on
        (reading DONE in between would end the waits of those who raised it)."""
        if self.side is not None and not (phase == "DONE" and self._reopened):
            self.side.finish(phase, error)

    def _reopen(self) -> None:
        self._reopened = True
        self._released.set()

    def end_without_serving(self) -> bool:
        """`--no-keep-serving`: the run ends here, unless its limit was raised while it closed
        (True: run on). A raise after this leaves it DONE (with the new limit stored, for a resume)
        rather than RUNNING in a manager about to exit."""
        reopened, self._reopened = self._reopened, False
        if not reopened and self.side is not None:
            self.side.on_reopen = None
        return reopened

    def release(self) -> None:
        """End `serve_until_stopped` (Ctrl-C, SIGTERM or DELETE /experiment after the end)."""
        self._released.set()

    async def serve_until_stopped(self, ended: str = "is done", until: str = "Ctrl-C (or `nnictl stop`)") -> bool:
        """NNI's manager stays up after its experiment is DONE (or in ERROR): so do we, until
        stopped. True when the experiment was reopened instead (maxTrialNumber raised): run it on."""
        if self.server is None:
            return False
        if not self._reopened:  # not raised already, while the run still closed
            self.serving_after_end = True
            await self.server.sync_manifest()
            print(f"nni-manager: the experiment {ended}; the WebUI stays at {self.server.url} until {until}",
                  flush=True)
            await self._released.wait()
        self._released.clear()
        reopened, self._reopened = self._reopened, False
        self.serving_after_end = not reopened
        if reopened:
            print("nni-manager: the limit was raised: the experiment runs on", flush=True)
            await self.server.sync_manifest()
        return reopened


@contextlib.asynccontextmanager
async def live_webui(experiment: Experiment, experiment_id: str, options: WebOptions | None,
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
        await asyncio.to_thread(_write_nni_db, directory)


# Past this many metric rows the export would make stopping slow (about 5 s per 100,000 rows
# on a loaded 2-core machine): the user is told how to write it instead.
NNI_DB_AT_STOP_MAX_METRICS = 100_000


def _write_nni_db(directory: Path) -> None:
    """NNI's db/nni.sqlite next to our store, so that `nnictl view ID` (which reads only that)
    opens the stopped experiment, as it opens NNI's own (`nni-manager export --nni-db`)."""
    from nni_manager.store import DB_NAME
    from nni_manager.webui.nni_db import export_nni_db

    try:
        db = sqlite3.connect(f"file:{directory / DB_NAME}?mode=ro", uri=True)
        try:
            rows = int(db.execute("select count(*) from metrics").fetchone()[0])
        finally:
            db.close()
        if rows > NNI_DB_AT_STOP_MAX_METRICS:
            print(f"nni-manager: note: for `nnictl view {directory.name}`, run `nni-manager export --nni-db "
                  f"{directory.name}` (not written at stop: {rows:,} metrics take a while)", file=sys.stderr)
            return
        done = export_nni_db(directory, register=False)
        if done.kept is not None:
            print(f"nni-manager: note: {done.db} held trials that NNI's own manager ran (`nnictl resume`), which "
                  f"this experiment does not have: kept as {done.kept}", file=sys.stderr)
    except (OSError, ValueError, sqlite3.Error) as exc:
        print(f"nni-manager: warning: cannot write {directory}/db/nni.sqlite for `nnictl view`: {exc}; "
              "`nni-manager view` works without it", file=sys.stderr)


async def serve_stored(experiment_dir: Path, options: WebOptions, *, stopped: asyncio.Event | None = None,
                       on_ready: Callable[[WebServer], None] | None = None) -> None:
    """`nni-manager view DIR`: a stored experiment, read-only, until Ctrl-C, SIGTERM or
    DELETE /experiment (or `stopped` is set: the Python API's `Experiment.view()`, which
    installs no signal handler: it runs outside the main thread)."""
    from nni_manager.store import Store
    from nni_manager.webui.server import experiment_end_time

    store = Store.open_readonly(experiment_dir)
    try:
        stored = store.experiment()
    finally:
        store.close()
    if not stored:
        raise FileNotFoundError(f"{experiment_dir} holds no experiment record")
    stopped = stopped or asyncio.Event()
    side = StoredExperiment(experiment_dir, stored, await asyncio.to_thread(experiment_end_time, experiment_dir),
                            stopped.set)
    name = (stored["config"] or {}).get("experiment_name")
    server = WebServer(side, port=options.port, bind=options.bind, url_prefix=options.url_prefix,
                       experiment_name=name)
    await server.start()
    _announce(server)
    if on_ready is not None:
        on_ready(server)
    else:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
    try:
        await stopped.wait()
    finally:
        await server.stop("STOPPED")
