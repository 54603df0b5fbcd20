"""HTTP front end: the rest-server's v2 job API (behind pylon's ``/rest-server`` prefix, and bare
``/api``), with its middleware order (body parsing, rate limits, token check, protocol, controller)
and error bodies; plus ``/_emulator`` test controls."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import re
import secrets
import time
from collections import deque
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.emulator_serving import announce, serve, until_stopped

from . import protocol
from .cluster import RESOURCE_KEYS, Cluster
from .protocol import PaiError

log = logging.getLogger("pai-emulator")
BODY_LIMIT = 100 * 1024            # body-parser default
NGINX = ("<html>\r\n<head><title>{s} {r}</title></head>\r\n<body>\r\n<center><h1>{s} {r}</h1></center>\r\n"
         "<hr><center>nginx/1.19.2</center>\r\n</body>\r\n</html>\r\n")
REASONS = {502: "Bad Gateway", 503: "Service Temporarily Unavailable", 504: "Gateway Time-out", 404: "Not Found"}
DEFAULT_LIMITS = {"api": 600, "list": 60, "submit": 60}        # config/rate-limit.js defaults
WINDOWS = {"api": 60.0, "list": 60.0, "submit": 3600.0}


def json_response(data: Any, status: int = 200) -> web.Response:
    """express res.json with ``json spaces`` 0: compact JSON."""
    return web.json_response(data, status=status, dumps=lambda o: json.dumps(o, separators=(",", ":")))


def pai_error(e: PaiError) -> web.Response:
    return json_response(e.body(), status=e.status)


class RateLimiter:
    """express-rate-limit 5 (MemoryStore): fixed windows, 429 with its default text and
    `Retry-After: windowMs / 1000` (the whole window, e.g. 3600 for submissions, not the time left)."""

    def __init__(self, limits: dict[str, int], windows: dict[str, float] | None = None):
        self.limits, self.hits = limits, {}
        self.windows = {**WINDOWS, **(windows or {})}

    def hit(self, name: str, key: str) -> web.Response | None:
        limit = self.limits.get(name)
        if not limit:
            return None
        now = time.monotonic()
        start, n = self.hits.get((name, key), (now, 0))
        window = self.windows[name]
        if now - start >= window:
            start, n = now, 0
        n += 1
        self.hits[(name, key)] = (start, n)
        if n > limit:
            return web.Response(status=429, text="Too many requests, please try again later.",
                                content_type="text/html", headers={"Retry-After": str(math.ceil(window))})
        return None


class Faults:
    """Injected failures for the PAI API: answer an error, hang, or drop the connection; for the next
    ``count`` matching requests and/or for ``seconds``."""

    def __init__(self):
        self.rules: list[dict] = []
        self._id = 0
        self.closing = asyncio.Event()      # emulator shutdown ends hanging requests

    def add(self, spec: dict) -> dict:
        self._id += 1
        rule = {"id": self._id, "mode": spec.get("mode", "error"), "status": int(spec.get("status", 500)),
                "body": spec.get("body"), "count": spec.get("count"), "method": spec.get("method"),
                "path": spec.get("path"), "hangSeconds": float(spec.get("hangSeconds", 3600)), "hits": 0,
                "until": time.monotonic() + float(spec["seconds"]) if spec.get("seconds") is not None else None}
        if rule["count"] is None and rule["until"] is None:
            rule["count"] = 1
        self.rules.append(rule)
        return self.view(rule)

    @staticmethod
    def view(r: dict) -> dict:
        return {k: v for k, v in r.items() if k != "until"} | {
            "secondsLeft": None if r["until"] is None else max(0.0, r["until"] - time.monotonic())}

    def match(self, method: str, path: str) -> dict | None:
        now = time.monotonic()
        self.rules = [r for r in self.rules if (r["count"] is None or r["count"] > 0)
                      and (r["until"] is None or r["until"] > now)]
        for r in self.rules:
            if r["method"] and r["method"].upper() != method:
                continue
            if r["path"] and not re.search(r["path"], path):
                continue
            if r["count"] is not None:
                r["count"] -= 1
            r["hits"] += 1
            return r
        return None

    async def respond(self, r: dict, request: web.Request) -> web.StreamResponse:
        if r["mode"] == "hang":
            try:
                await asyncio.wait_for(self.closing.wait(), r["hangSeconds"])
            except asyncio.TimeoutError:
                pass
            return web.Response(status=504, text=NGINX.format(s=504, r=REASONS[504]), content_type="text/html")
        if r["mode"] == "reset":
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)
        st = r["status"]
        if r["body"] is not None:
            body = r["body"]
            if isinstance(body, (dict, list)):
                return json_response(body, status=st)
            return web.Response(status=st, text=str(body))
        if st in REASONS and st != 404:
            return web.Response(status=st, text=NGINX.format(s=st, r=REASONS[st]), content_type="text/html")
        return json_response({"code": "UnknownError", "message": "connect ECONNREFUSED 10.0.1.5:9748"},  # not dialed: data only
                                 status=st)


class Server:
    def __init__(self, cluster: Cluster, control_token: str, limits: dict[str, int],
                 windows: dict[str, float] | None = None):
        self.cluster, self.control_token = cluster, control_token
        self.limiter, self.faults = RateLimiter(limits, windows), Faults()
        self.requests: deque = deque(maxlen=2000)

    # ------------------------------------------------------------------ entry
    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path.startswith("/_emulator/"):
            return await self.control(request, path[len("/_emulator"):])
        if path.startswith("/rest-server/api/") or path == "/rest-server/api":
            api = path[len("/rest-server"):]
            raw_url = request.raw_path[len("/rest-server"):]
        elif path.startswith("/api/"):
            api, raw_url = path, request.raw_path
        else:
            return web.Response(status=404, text=NGINX.format(s=404, r="Not Found"), content_type="text/html")
        entry = {"method": request.method, "path": api, "query": dict(request.query),
                 "contentType": request.headers.get("Content-Type"), "status": None, "t": time.time()}
        self.requests.append(entry)
        resp = await self._api(request, api, raw_url)
        entry["status"] = resp.status
        log.info("%s %s -> %s", request.method, api, resp.status)
        return resp

    async def _api(self, request: web.Request, api: str, raw_url: str) -> web.StreamResponse:
        fault = self.faults.match(request.method, api)
        if fault is not None:
            return await self.faults.respond(fault, request)
        limited = self.limiter.hit("api", request.remote or "")
        if limited:
            return limited
        try:
            body = await self._body(request)
            return await self._route(request, api, raw_url, body)
        except PaiError as e:
            return pai_error(e)

    async def _body(self, request: web.Request) -> Any:
        """body-parser: json, urlencoded, text/*; anything else leaves ``{}``."""
        if not request.body_exists:
            return {}
        data = await request.read()
        if len(data) > BODY_LIMIT:
            raise PaiError(413, None, "request entity too large")
        ctype = request.content_type
        if ctype == "application/json" or ctype.endswith("+json"):
            try:
                return json.loads(data or b"null")
            except ValueError as e:
                raise PaiError(400, None, f"Unexpected token in JSON: {e}") from None
        if ctype.startswith("text/"):
            return data.decode(request.charset or "utf-8", errors="replace")
        if ctype == "application/x-www-form-urlencoded":
            return dict((await request.post()).items())
        return {}

    def _user(self, request: web.Request) -> dict:
        """middlewares/token.js check."""
        auth = request.headers.get("Authorization")
        if not auth:
            raise PaiError(401, "UnauthorizedUserError", "Guest is not allowed to do this operation.")
        scheme, _, cred = auth.partition(" ")
        name = self.cluster.tokens.get(cred) if scheme.lower() == "bearer" else None
        if name is None or name not in self.cluster.users:
            raise PaiError(401, "UnauthorizedUserError", "Your token is invalid.")
        return self.cluster.users[name]

    async def _route(self, request: web.Request, api: str, raw_url: str, body: Any) -> web.StreamResponse:
        m, parts = request.method, api.rstrip("/").split("/")[1:]     # ['api','v2','jobs',...]
        if parts[:3] == ["api", "v2", "jobs"]:
            rest = parts[3:]
            if not rest and m == "GET":
                return self.list_jobs(request, self._user(request))
            if not rest and m == "POST":
                return self.submit(request, self._user(request), body)
            if len(rest) == 1 and m == "GET":
                self._user(request)
                return json_response(self._job(rest[0]).detail())
            if len(rest) == 3 and rest[1] == "attempts" and m == "GET":
                self._user(request)
                return json_response(self.attempt(rest[0], rest[2]))
            if len(rest) == 2 and rest[1] == "executionType" and m == "PUT":
                return self.execute(self._user(request), rest[0], body)
            if len(rest) == 2 and rest[1] == "config" and m == "GET":
                self._user(request)
                job = self._job(rest[0])
                cfg = protocol.js_load(job.raw)
                return web.Response(text=json.dumps(cfg, separators=(",", ":")),
                                    content_type="text/yaml", charset="utf-8")
        raise PaiError(404, "NoApiError", f"API {raw_url} is not found.")

    # ------------------------------------------------------------------ controllers
    def _job(self, fw: str):
        job = self.cluster.jobs.get(fw)
        if job is None:
            raise PaiError(404, "NoJobError", f"Job {fw} is not found.")
        return job

    def list_jobs(self, request: web.Request, user: dict) -> web.StreamResponse:
        limited = self.limiter.hit("list", user["username"])
        if limited:
            return limited
        q = request.query
        jobs = sorted(self.cluster.jobs.values(), key=lambda j: (j.submission, j.seq), reverse=True)
        if "username" in q:
            jobs = [j for j in jobs if j.user in q["username"].split(",")]
        if "vc" in q:
            jobs = [j for j in jobs if j.vc in q["vc"].split(",")]
        if "state" in q:
            jobs = [j for j in jobs if j.pai_state in q["state"].split(",")]
        if "keyword" in q:
            k = q["keyword"]
            jobs = [j for j in jobs if k in j.user or k in j.name or k in j.vc]
        limit = 5000
        if "limit" in q:
            limit = _js_int(q["limit"])
            if limit is not None and limit > 50000:
                raise PaiError(400, "InvalidParametersError", "Limit exceeds max number 50000.")
        offset = _js_int(q.get("offset", "0")) or 0
        total = len(jobs)
        data = [j.summary() for j in jobs[offset:offset + (limit if limit is not None else len(jobs))]]
        if q.get("withTotalCount") == "true":
            return json_response({"totalCount": total, "data": data})
        return json_response(data)

    def submit(self, request: web.Request, user: dict, body: Any) -> web.StreamResponse:
        limited = self.limiter.hit("submit", user["username"])
        if limited:
            return limited
        text = body if isinstance(body, str) else "[object Object]"      # js-yaml String(input)
        proto = protocol.render(protocol.validate(text))
        uname, jname = user["username"], proto["name"]
        fw = f"{uname}~{jname}"
        if fw in self.cluster.jobs:
            raise PaiError(409, "ConflictJobError", f"Job {fw} already exists.")
        dflt = proto.get("defaults") or {}
        vc = dflt["virtualCluster"] if dflt.get("virtualCluster") is not None else "default"
        if vc not in user["virtualClusters"] or vc not in self.cluster.vcs:
            raise PaiError(403, "ForbiddenUserError", f"User {uname} is not allowed to do operation in {vc}")
        self._check_storages(user, proto)
        self.cluster.add_job(uname, vc, text, proto)
        return json_response({"status": 202, "message": f"Update job {jname} for user {uname} successfully."},
                                 status=202)

    @staticmethod
    def _check_storages(user: dict, proto: dict) -> None:
        extras = proto.get("extras")
        if not isinstance(extras, dict):
            return
        if not extras.get("storages") and "com.microsoft.pai.runtimeplugin" in extras:
            for p in extras["com.microsoft.pai.runtimeplugin"] or []:
                if isinstance(p, dict) and p.get("plugin") == "teamwise_storage":
                    names = (p.get("parameters") or {}).get("storageConfigNames") or []
                    extras["storages"] = [{"name": n} for n in names]
        storages = extras.get("storages")
        if not storages:
            if isinstance(storages, list):
                storages.extend({"name": n} for n in user["defaultStorages"])
            return
        for s in storages:
            name = s.get("name") if isinstance(s, dict) else None
            if name and name not in user["storages"]:
                raise PaiError(404, "NoStorageError", f"Storage {name} is not found.")

    def execute(self, user: dict, fw: str, body: Any) -> web.StreamResponse:
        err = _joi_execution_type(body)
        if err:
            raise PaiError(400, "InvalidParametersError", err)
        job = self._job(fw)
        if job.user != user["username"] and not user["admin"]:
            raise PaiError(403, "ForbiddenUserError",
                           f"User {user['username']} is not allowed to execute job {fw}.")
        self.cluster.stop(job, body["value"])
        return json_response({"status": 202, "message": f"Execute job {fw} successfully."}, status=202)

    def attempt(self, fw: str, attempt: str) -> dict:
        job = self._job(fw)
        n = _js_number(attempt)
        if n is None or n > job.attempt_id or (n < job.attempt_id and n not in job.history):
            raise PaiError(404, "NoJobError", f"JobAttemptId {attempt} is not found in {fw}.")
        if n == job.attempt_id:
            return job.detail()
        old = json.loads(json.dumps(job.history[n]))
        latest = job.detail()["jobStatus"]
        for k in ("state", "subState", "executionType", "retries", "retryDetails", "createdTime",
                  "launchedTime", "completedTime"):
            old["jobStatus"][k] = latest[k]
        return old

    def vc_view(self) -> dict:
        out = {}
        for name, cap in self.cluster.vcs.items():
            out[name] = {"capacity": cap, "used": self.cluster.used(name)}
        return out

    # ------------------------------------------------------------------ /_emulator controls
    async def control(self, request: web.Request, path: str) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        tok = auth[7:] if auth.lower().startswith("bearer ") else ""
        admin = self.cluster.users.get(self.cluster.tokens.get(tok, ""), {}).get("admin")
        if not (secrets.compare_digest(tok, self.control_token) or admin):
            return web.json_response({"code": "UnauthorizedUserError", "message": "Your token is invalid."},
                                     status=401)
        m = request.method
        body = await request.json() if request.body_exists else {}
        c = self.cluster
        if path == "/faults" and m == "POST":
            return web.json_response(self.faults.add(body))
        if path == "/faults" and m == "GET":
            return web.json_response([self.faults.view(r) for r in self.faults.rules])
        if path == "/faults" and m == "DELETE":
            self.faults.rules.clear()
            return web.json_response({})
        if path == "/jobs" and m == "GET":
            return web.json_response([{**j.summary(), "detail": j.detail()} for j in
                                      sorted(c.jobs.values(), key=lambda j: j.seq)])
        if path == "/pids" and m == "GET":
            return web.json_response({"pids": c.live_pids()})
        if path == "/requests" and m == "GET":
            return web.json_response(list(self.requests))
        mm = re.fullmatch(r"/virtual-clusters/([^/]+)", path)
        if mm and m == "PUT":
            c.set_capacity(mm.group(1), {k: body[k] for k in RESOURCE_KEYS if k in body})
            return web.json_response(self.vc_view()[mm.group(1)])
        if path == "/virtual-clusters" and m == "GET":
            return web.json_response(self.vc_view())
        mm = re.fullmatch(r"/jobs/([^/]+)/taskRoles/([^/]+)/(\d+)/kill", path)
        if mm and m == "POST":
            t = c.find_task(mm.group(1), mm.group(2), int(mm.group(3)))
            if t is None:
                return web.json_response({"message": "no such task"}, status=404)
            ok = await c.kill_task(t, bool(body.get("nodeLost")))
            return web.json_response({"killed": ok}, status=200 if ok else 409)
        return web.json_response({"message": f"unknown control {m} {path}"}, status=404)


def _js_int(s: str) -> int | None:
    m = re.match(r"\s*([+-]?\d+)", s)
    return int(m.group(1)) if m else None


def _js_number(s: str) -> int | None:
    try:
        f = float(s)
    except ValueError:
        return None
    return int(f) if f.is_integer() else None


def _joi_execution_type(body: Any) -> str | None:
    """Joi (v14) message for ``{value: Joi.string().valid('STOP','START').required()}``."""
    if not isinstance(body, dict):
        return '"value" must be an object'
    if "value" not in body:
        return 'child "value" fails because ["value" is required]'
    v = body["value"]
    if not isinstance(v, str):
        return 'child "value" fails because ["value" must be a string]'
    if v == "":
        return 'child "value" fails because ["value" is not allowed to be empty]'
    if v not in ("STOP", "START"):
        return 'child "value" fails because ["value" must be one of [STOP, START]]'
    extra = [k for k in body if k != "value"]
    if extra:
        return f'"{extra[0]}" is not allowed'
    return None


# ---------------------------------------------------------------------------- process
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.support.openpai.emulator")
    p.add_argument("--state", required=True, type=Path, help="state dir (config.json in, port out)")
    p.add_argument("--config", type=Path, help="users/VCs JSON (default STATE/config.json)")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--instance-id", default=None)
    p.add_argument("--rate-limit", action="append", default=[], metavar="NAME=N",
                   help="api|list|submit = N (0 disables); defaults are the rest-server's 600/min, 60/min, 60/h")
    p.add_argument("--rate-window", action="append", default=[], metavar="NAME=S",
                   help="api|list|submit = window in seconds (defaults 60, 60, 3600)")
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> None:
    state: Path = args.state
    state.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((args.config or state / "config.json").read_text())
    limits = dict(DEFAULT_LIMITS)
    for item in args.rate_limit:
        k, _, v = item.partition("=")
        limits[k] = int(v)
    windows = {k: float(v) for k, _, v in (w.partition("=") for w in args.rate_window)}
    instance = args.instance_id or secrets.token_hex(8)
    cluster = Cluster(state, cfg, instance, args.grace)
    server = Server(cluster, cfg.get("controlToken") or secrets.token_hex(16), limits, windows)
    app = web.Application(client_max_size=10 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner, port = await serve(app)
    loop_task = asyncio.ensure_future(cluster.run())
    (state / "instance").write_text(instance)
    announce(state, port)
    log.info("OpenPAI emulator on 127.0.0.1:%d (instance %s)", port, instance)
    await until_stopped()
    server.faults.closing.set()
    await cluster.shutdown()
    loop_task.cancel()
    await runner.cleanup()


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(amain(parse_args(argv)))
