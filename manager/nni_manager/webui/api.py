"""NNI 3.0's REST API (`<prefix>/api/v1/nni/...`) and WebUI routes, on aiohttp.web.

Behaviour follows NNI's rest_server (restHandler.ts): JSON bodies, errors as
`{"error": message}` with status 500 (404 for an unknown trial), `undefined` answered as an
empty 200, `/version` as raw text. Every other GET under the prefix is a WebUI file or
index.html (React Router routes in the browser); outside the prefix, 404.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from nni_manager.jsontypes import JSONValue
from nni_manager.local_files import SERVE_LIMIT, open_in, open_trial_log, read_capped
from nni_manager.types import TrialJobDetail
from nni_manager.webui import manifest
from nni_manager.webui.access import Access
from nni_manager.webui.model import DataModel
from nni_manager.webui.sides import ExperimentSide, WebError
from nni_manager.webui.static import NO_WEBUI_PAGE, nni_version
from nni_manager.webui.views import TrialJobInfo, dumps, export_entry, job_statistics, trial_job, trial_job_json

API = "/api/v1/nni"
_CORS = {"Access-Control-Allow-Headers": "Origin, X-Requested-With, Content-Type, Accept",
         "Access-Control-Allow-Methods": "PUT,POST,GET,DELETE,OPTIONS"}
# trial-file names NNI's WebUI asks for -> our files (stdout and stderr kept by the agent;
# `trial.log` is NNI's SDK log where the trial wrote one, else the trial's stdout)
_TRIAL_FILES = {"trial.log": ("trial.log", "trial.stdout"), "stdout": ("trial.stdout",),
                "stderr": ("trial.stderr",)}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,200}")
_MANAGER_LOGS = ("nnimanager.log", "dispatcher.log")
_TOO_LARGE = f"[not shown: larger than {SERVE_LIMIT} bytes]\n".encode()


def _json(obj: object) -> web.Response:
    return web.Response(text=dumps(obj), content_type="application/json", headers=_CORS)


def _raw_json(text: str) -> web.Response:
    return web.Response(text=text, content_type="application/json", headers=_CORS)


def _empty() -> web.Response:
    return web.Response(content_type="application/json", headers=_CORS)


def _error(message: str, status: int = 500) -> web.Response:
    return web.Response(text=dumps({"error": message}), status=status, content_type="application/json",
                        headers=_CORS)


class Api:
    """The handlers; `entry()` is this experiment's manifest entry as the server keeps it."""

    def __init__(self, side: ExperimentSide, model: DataModel, static_dir: Path | None,
                 entry: Callable[[], dict[str, JSONValue]], base_url: Callable[[], str]) -> None:
        self.side = side
        self.model = model
        self.static_dir = static_dir
        self.entry = entry
        self.base_url = base_url

    # ------------------------------------------------------------------ helpers
    def _trials(self) -> list[TrialJobDetail]:
        live = self.side.trials()
        return self.model.trials() if live is None else list(live)

    def _log_path(self, t: TrialJobDetail) -> str:
        """Where NNI's WebUI shows a trial's files: the trial's directory for local agents, a
        trial-file URL elsewhere (the WebUI renders it as a link)."""
        if self.side.platform == "local":
            return t.working_directory or str(self.side.experiment_dir / "trials" / t.id)
        return f"{self.base_url()}{API}/trial-file/{t.id}/stdout"

    def _job(self, t: TrialJobDetail) -> TrialJobInfo:
        return trial_job(t, self.model.parameters.get(t.id, {}), self.model.final(t.id), self._log_path(t))

    def _find(self, trial_id: str) -> TrialJobDetail | None:
        return next((t for t in self._trials() if t.id == trial_id), None)

    # ------------------------------------------------------------------ experiment
    async def version(self, request: web.Request) -> web.Response:
        return web.Response(text=nni_version(), content_type="application/json", headers=_CORS)

    async def check_status(self, request: web.Request) -> web.Response:
        status, errors = self.side.status()
        return _json({"status": status, "errors": errors})

    async def get_experiment(self, request: web.Request) -> web.Response:
        await self.model.refresh(finals_only=True)
        trials = self._trials()
        next_sequence = max((t.sequence_id for t in trials), default=-1) + 1
        return _json(self.side.profile(next_sequence))

    async def put_experiment(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error("Error: the body is not JSON")
        params = body.get("params") if isinstance(body, dict) else None
        if not isinstance(params, dict):
            return _error("Error: the body must be the experiment profile, with `params`")
        try:
            await self.side.update(request.query.get("update_type", ""), params)
        except WebError as exc:
            return _error(str(exc), exc.status)
        return _empty()

    async def delete_experiment(self, request: web.Request) -> web.StreamResponse:
        """NNI's `Experiment.stop()`: answer, then stop; the caller waits for our pid to exit."""
        response = _empty()
        await response.prepare(request)
        await response.write_eof()
        self.side.stop()
        return response

    async def metadata(self, request: web.Request) -> web.Response:
        return _json(self.entry())

    async def experiments_info(self, request: web.Request) -> web.Response:
        entries = await asyncio.to_thread(manifest.experiments_info)
        # our own entry as of now (the file is synced once a second)
        own = self.entry()
        if not any(e.get("id") == own["id"] for e in entries):
            entries.append(own)
        return _json([own if e.get("id") == own["id"] else e for e in entries])

    async def imported_data(self, request: web.Request) -> web.Response:
        return _raw_json("[]")

    # ------------------------------------------------------------------ trials
    async def trial_jobs(self, request: web.Request) -> web.Response:
        await self.model.refresh(finals_only=True)
        status = request.query.get("status")
        model, log_path = self.model, self._log_path
        return _raw_json("[" + ",".join([trial_job_json(t, model.parameters.get(t.id, {}), model.final_json.get(t.id),
                                                        log_path(t))
                                         for t in self._trials() if status is None or t.status.value == status]) + "]")

    async def trial_job(self, request: web.Request) -> web.Response:
        await self.model.refresh(finals_only=True)
        t = self._find(request.match_info["id"])
        return _empty() if t is None else _json(self._job(t))

    async def kill_trial(self, request: web.Request) -> web.Response:
        try:
            await self.side.cancel_trial(request.match_info["id"])
        except WebError as exc:
            return _error(str(exc), exc.status)
        return _empty()

    async def add_trial(self, request: web.Request) -> web.Response:
        return _error("Error: customized trials are not supported by nni-manager yet")

    async def job_statistics(self, request: web.Request) -> web.Response:
        await self.model.refresh(finals_only=True)
        return _json(job_statistics(self._trials()))

    async def export_data(self, request: web.Request) -> web.Response:
        await self.model.refresh(finals_only=True)
        out = []
        for t in self._trials():
            final = self.model.final(t.id)
            if final is not None and t.status.value == "SUCCEEDED":
                entry = export_entry(t, self.model.parameters.get(t.id, {}), final)
                if entry is not None:
                    out.append(entry)
        return _json(out)

    # ------------------------------------------------------------------ metrics
    async def metric_data(self, request: web.Request) -> web.Response:
        kind = request.query.get("type")
        trial_id = request.match_info.get("id")
        return _raw_json(await self.model.metrics_json(None if trial_id is None else [trial_id], kind))

    async def metric_range(self, request: web.Request) -> web.Response:
        await self.model.refresh()
        try:
            low, high = int(request.match_info["min"]), int(request.match_info["max"])
        except ValueError:
            return _error("Error: metric-data-range takes two integers")
        ids = [t.id for t in self._trials() if low <= t.sequence_id <= high]
        # Past 100 trials the WebUI asks for every 20-trial range every 10 s; ranges of ended
        # trials never change, so the browser's cache answers them (ETag -> 304, no query).
        newest = max((self.model.last_rowid.get(i, 0) for i in ids), default=0)
        etag = f'"{low}-{high}-{len(ids)}-{newest}-{hash(tuple(ids)) & 0xFFFFFFFF:x}"'
        headers = {**_CORS, "ETag": etag, "Cache-Control": "no-cache"}
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        body = await self.model.metrics_json(ids) if ids else "[]"
        return web.Response(text=body, content_type="application/json", headers=headers)

    async def metric_latest(self, request: web.Request) -> web.Response:
        await self.model.refresh()
        return _json(self.model.latest_records())

    # ------------------------------------------------------------------ files
    async def trial_file(self, request: web.Request) -> web.Response:
        trial_id, name = request.match_info["id"], request.match_info["filename"]
        await self.model.refresh(finals_only=True)
        t = self._find(trial_id)
        if t is None:
            return _error(f"Error: no trial {trial_id!r}", 404)
        if name in _TRIAL_FILES:
            candidates = _TRIAL_FILES[name]
        elif _PLAIN_NAME.fullmatch(name) and ".." not in name:
            candidates = (name,)
        else:
            return _error(f"Error: {name!r} is not a trial file name (trial.log, stdout, stderr or a plain file name)")
        data = await asyncio.to_thread(self._read_trial_file, t, candidates, name in _TRIAL_FILES)
        if data is None:
            return _error(f"ENOENT: no {name} for trial {trial_id}")
        if data is _TOO_LARGE:
            return _error(f"Error: {name} of trial {trial_id} is larger than {SERVE_LIMIT} bytes, too large to show")
        if name not in _TRIAL_FILES:
            return web.Response(body=data, content_type="application/octet-stream", headers=_CORS)
        text = data.decode("utf-8", "replace") or f"{name} is empty."
        return web.Response(text=text, content_type="text/plain", headers=_CORS)

    def _read_trial_file(self, t: TrialJobDetail, candidates: tuple[str, ...], tail: bool) -> bytes | None:
        """The file from the manager's copies (or a local trial's own directory), never from a
        path an agent reported elsewhere; capped (a log's tail beyond SERVE_LIMIT)."""
        experiment_dir = self.side.experiment_dir
        replicas = experiment_dir / "trials" / t.id / "replicas"
        if replicas.is_dir():  # a trial on several agents: each replica's file, with a header
            labels = sorted(p.name for p in replicas.iterdir())
            parts = []
            for label in labels:
                for name in candidates:
                    f = open_in(experiment_dir, replicas / label, name)
                    if f is not None:
                        data = read_capped(f, SERVE_LIMIT // max(1, len(labels)), tail)
                        parts.append(f"==> {label} <==\n".encode() + (data if data is not None else _TOO_LARGE))
                        break
            return b"".join(parts) if parts else None
        for name in candidates:
            f = open_trial_log(experiment_dir, t, name, self.side.platform)
            if f is not None:
                data = read_capped(f, SERVE_LIMIT, tail)
                return data if data is not None else _TOO_LARGE
        return None

    async def manager_log(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in _MANAGER_LOGS:
            return web.Response(status=404, text="Not Found")
        log_dir = self.side.experiment_dir / "log"
        f = open_in(self.side.experiment_dir, log_dir, name)
        if f is not None:
            return web.Response(body=await asyncio.to_thread(read_capped, f), content_type="text/plain")
        return web.Response(text=f"nni-manager writes no {name}: its messages are in the terminal running it\n",
                            content_type="text/plain")

    async def tensorboard_tasks(self, request: web.Request) -> web.Response:
        return _raw_json("[]")

    async def unsupported(self, request: web.Request) -> web.Response:
        return _error("Error: TensorBoard and data import are not supported by nni-manager yet")

    async def unknown_api(self, request: web.Request) -> web.Response:
        return _error(f"Error: no such API {request.path}", 404)

    # ------------------------------------------------------------------ WebUI files
    async def webui(self, request: web.Request) -> web.StreamResponse:
        if self.static_dir is None:
            return web.Response(text=NO_WEBUI_PAGE, content_type="text/html")
        tail = request.match_info.get("tail", "")
        if tail and ".." not in tail.split("/"):
            path = (self.static_dir / tail).resolve()
            if path.is_file() and path.is_relative_to(self.static_dir.resolve()):
                return web.FileResponse(path)
        return web.FileResponse(self.static_dir / "index.html", headers={"Cache-Control": "no-cache"})


def make_app(api: Api, url_prefix: str = "", access: Access | None = None) -> web.Application:
    """The application; `url_prefix` without slashes ("" for none), as NNI's urlPrefix;
    `access` guards every route (WebServer always passes one)."""
    p = f"/{url_prefix}" if url_prefix else ""
    app = web.Application(client_max_size=50 * 1024 * 1024)  # express.json({limit: '50mb'})
    if access is not None:
        access.install(app)
    r = app.router
    a = p + API
    get: list[tuple[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
        ("/version", api.version), ("/check-status", api.check_status), ("/experiment", api.get_experiment),
        ("/experiment-metadata", api.metadata), ("/experiments-info", api.experiments_info),
        ("/experiment/imported-data", api.imported_data), ("/job-statistics", api.job_statistics),
        ("/trial-jobs", api.trial_jobs), ("/trial-jobs/{id}", api.trial_job), ("/metric-data", api.metric_data),
        ("/metric-data/{id}", api.metric_data), ("/metric-data-range/{min}/{max}", api.metric_range),
        ("/metric-data-latest", api.metric_latest), ("/metric-data-latest/", api.metric_latest),
        ("/export-data", api.export_data), ("/trial-file/{id}/{filename}", api.trial_file),
        ("/tensorboard-tasks", api.tensorboard_tasks),
    ]
    for path, handler in get:
        r.add_get(a + path, handler, allow_head=False)
    r.add_put(a + "/experiment", api.put_experiment)
    r.add_delete(a + "/experiment", api.delete_experiment)
    r.add_post(a + "/trial-jobs", api.add_trial)
    r.add_delete(a + "/trial-jobs/{id}", api.kill_trial)
    for method, path in (("POST", "/tensorboard"), ("POST", "/experiment/import-data"),
                         ("DELETE", "/tensorboard-tasks"), ("GET", "/tensorboard/{id}"),
                         ("PUT", "/tensorboard/{id}"), ("DELETE", "/tensorboard/{id}"),
                         ("PUT", "/experiment/cluster-metadata")):
        r.add_route(method, a + path, api.unsupported)
    r.add_route("*", a + "/{rest:.*}", api.unknown_api)
    r.add_get(p + "/logs/{name}", api.manager_log, allow_head=False)
    if p:
        async def to_slash(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(p + "/")
        r.add_get(p, to_slash, allow_head=False)
    r.add_get(p + "/{tail:.*}", api.webui)

    async def outside(request: web.Request) -> web.StreamResponse:
        return web.Response(status=404, text=f'Outside prefix "{p}"' if p else "Not Found")
    if p:
        r.add_route("*", "/{any:.*}", outside)
    return app
