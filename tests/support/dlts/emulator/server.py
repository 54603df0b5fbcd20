"""The DLTS dashboard (`/api`, `/api/v2`) as NNI's DLTS training service called it, plus `/_emulator` controls.

Dashboard behaviour follows microsoft/DLWorkspace@27d3a3a8 src/dashboard/server: Koa app, v1
router (case-insensitive, trailing slash optional) and v2 router (strict), the `clusterId`
param middleware (404 "Cluster is not found") running before the user middleware (403), the
body validators (400), and Koa's plain-text error bodies. RestAPI answers that the dashboard
passes through verbatim (POST jobs, PUT status) keep Koa's text/plain content type.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import secrets
import signal
import uuid
from http import HTTPStatus
from pathlib import Path

from aiohttp import web

from tests.support.emulator_serving import announce, common_control, serve, until_stopped

from tests.support.emulator_faults import Faults, RequestLog
from .jobs import ACTIVE, JobManager, SubmitError
from tests.support.emulator_procs import ProcessRunner

MARK = "DLTS_EMULATOR"
STATUS_ENUM = ["approved", "killing", "pausing", "queued"]


class KoaError(Exception):
    """ctx.throw / ctx.assert: Koa answers the message as text/plain (exposed for 4xx)."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def text(body: str, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, text=body, content_type="text/plain", charset="utf-8", headers=headers)


def koa_json(obj) -> web.Response:
    return web.Response(text=json.dumps(obj, separators=(",", ":")), content_type="application/json", charset="utf-8")


def lenient_hex(s: str) -> bytes:
    """Node's Buffer.from(s, 'hex'): decode pairs up to the first invalid one."""
    out = bytearray()
    for i in range(0, len(s) - 1, 2):
        pair = s[i:i + 2]
        if not all(c in "0123456789abcdefABCDEF" for c in pair):
            break
        out.append(int(pair, 16))
    return bytes(out)


class Dashboard:
    def __init__(self, config: dict, master_token: str, jobs: JobManager, faults: Faults, log: RequestLog):
        self.config, self.master_token, self.jobs, self.faults, self.log = config, master_token, jobs, faults, log
        self.clusters: list[str] = list(config["clusters"])
        self.teams: dict[str, dict] = config["teams"]
        v1 = [("GET", "/teams/:teamId/clusters/:clusterId", self.get_team),
              ("POST", "/clusters/:clusterId/jobs", self.post_job),
              ("GET", "/clusters/:clusterId/jobs/:jobId/status", self.get_status),
              ("PUT", "/clusters/:clusterId/jobs/:jobId/status", self.put_status)]
        v2 = [("GET", "/clusters/:clusterId/jobs/:jobId", self.get_job_v2),
              ("GET", "/clusters/:clusterId/teams/:teamId/jobs", self.list_jobs_v2)]
        self.routes = [(m, self._pattern("/v2" + p, strict=True), h) for m, p, h in v2]
        self.routes += [(m, self._pattern(p, strict=False), h) for m, p, h in v1]

    @staticmethod
    def _pattern(path: str, strict: bool) -> re.Pattern:
        rx = re.sub(r":(\w+)", r"(?P<\1>[^/]+)", path)
        return re.compile("^" + rx + ("$" if strict else "/?$"), 0 if strict else re.IGNORECASE)

    # ------------------------------------------------------------ access rules (AuthorizationManager)
    def has_access(self, user: str, team: str) -> bool:
        t = self.teams.get(team)
        return t is not None and any(m == "*" or m.lower() == user.lower() for m in t.get("members", ["*"]))

    def is_admin(self, user: str, team: str) -> bool:
        t = self.teams.get(team)
        return t is not None and any(m.lower() == user.lower() for m in t.get("admins", []))

    def cluster(self, cluster_id: str) -> str:
        if cluster_id == ".default":
            cluster_id = self.clusters[0]
        if cluster_id not in self.clusters:
            raise KoaError(404, "Cluster is not found")
        return cluster_id

    def user(self, request: web.Request) -> str:
        """middlewares/user.js + services/user.js fromPassword; no cookie sessions here."""
        q = request.query
        if "email" in q:
            email_addr = q["email"]
            password = q.get("password")
            if password is None:
                password = q.get("token")
            if password:
                expected = hashlib.md5(f"{email_addr}:{self.master_token}".encode()).digest()
                if lenient_hex(password) != expected:
                    raise KoaError(403, "Invalid token")
                return email_addr
        raise KoaError(403, "Forbidden")

    # ------------------------------------------------------------ dispatch
    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if not path.startswith("/api/") and path != "/api":
            raise KoaError(404, "Not Found")
        sub = path[len("/api"):]
        allowed = []
        for method, rx, handler in self.routes:
            m = rx.match(sub)
            if m is None:
                continue
            if method != request.method:
                allowed.append(method)
                continue
            params = m.groupdict()
            cluster = self.cluster(params.pop("clusterId")) if "clusterId" in params else None
            user = self.user(request)
            return await handler(request, user, cluster, **params)
        if allowed:
            if request.method == "OPTIONS":
                return web.Response(status=200, headers={"Allow": ", ".join(sorted(set(allowed)))})
            raise KoaError(405, "Method Not Allowed", {"Allow": ", ".join(sorted(set(allowed)))})
        raise KoaError(404, "Not Found")

    async def json_body(self, request: web.Request):
        """koa-bodyparser with enableTypes ['json'] (co-body in strict mode)."""
        if request.content_type not in ("application/json", "application/json-patch+json",
                                        "application/vnd.api+json", "application/csp-report"):
            return {}
        raw = await request.text()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as e:
            ch = raw[e.pos] if e.pos < len(raw) else ""
            raise KoaError(400, f"Unexpected token {ch} in JSON at position {e.pos}" if ch else
                           "Unexpected end of JSON input") from None
        if not isinstance(body, (dict, list)):
            raise KoaError(400, "invalid JSON, only supports object and array")
        return body

    # ------------------------------------------------------------ handlers
    async def get_team(self, request, user, cluster, teamId):
        """GET /api/teams/:teamId/clusters/:clusterId -> the VC record of RestAPI /GetVC."""
        t = self.teams.get(teamId)
        if t is None or not self.has_access(user, teamId):
            raise KoaError(404, "Team is not found")
        gpu, per_node, nodes = t.get("gpuType", "P40"), int(t.get("numGpuPerNode", 4)), int(t.get("nodes", 2))
        total = per_node * nodes
        used = sum(int(j.params.get("resourcegpu", 0)) for j in self.jobs.jobs.values()
                   if j.vc == teamId and j.status == "running")
        metadata = t.get("metadata") or {gpu: {"num_gpu_per_node": per_node}}
        rec = {"vcName": teamId, "quota": json.dumps({gpu: total}), "metadata": json.dumps(metadata),
               "resourceQuota": json.dumps({"gpu": {gpu: total}}),
               "resourceMetadata": json.dumps({"gpu": {gpu: {"per_node": per_node}}}),
               "gpu_capacity": {gpu: total}, "gpu_used": {gpu: used}, "gpu_preemptable_used": {},
               "gpu_available": {gpu: total - used}, "gpu_unschedulable": {gpu: 0},
               "available_job_num": sum(1 for j in self.jobs.jobs.values() if j.vc == teamId and j.status in ACTIVE),
               "node_status": [], "user_status": [], "user_status_preemptable": []}
        rec["gpu_avaliable"] = rec["gpu_available"]
        rec["AvaliableJobNum"] = rec["available_job_num"]
        return koa_json(rec)

    async def post_job(self, request, user, cluster):
        body = await self.json_body(request)
        if not isinstance(body, dict):
            raise KoaError(400, " should be object")
        if not body.get("team") and body.get("vcName"):
            body["team"] = body["vcName"]
        if "team" not in body:
            raise KoaError(400, " should have required property 'team'")
        if not isinstance(body["team"], str):
            raise KoaError(400, ".team should be string")
        job = dict(body, userName=user, familyToken=str(uuid.uuid4()), isParent=1)
        try:
            created = self.jobs.submit(job, cluster, self.has_access)
            ret = {"jobId": created.id}
        except SubmitError as e:
            ret = {"error": "Cannot create job!" + str(e)}
        return text(json.dumps(ret) + "\n")

    def _visible(self, user: str, job_id: str):
        job = self.jobs.jobs.get(job_id)
        if job is None or not (job.user == user or self.is_admin(user, job.vc)):
            return None
        return job

    async def get_job_v2(self, request, user, cluster, jobId):
        job = self._visible(user, jobId)
        return koa_json(job.record() if job is not None else {})

    async def get_status(self, request, user, cluster, jobId):
        job = self.jobs.jobs.get(jobId)
        if job is None:
            raise KoaError(404, "Not Found")
        out = {"status": job.status}
        if job.error_msg:
            out["message"] = job.error_msg
        return koa_json(out)

    async def put_status(self, request, user, cluster, jobId):
        body = await self.json_body(request)
        if not isinstance(body, dict):
            raise KoaError(400, " should be object")
        if "status" not in body:
            raise KoaError(400, " should have required property 'status'")
        if body["status"] not in STATUS_ENUM:
            raise KoaError(400, ".status should be equal to one of the allowed values")
        result = self.jobs.operate(jobId, user, body["status"], self.is_admin)
        return text(json.dumps({"result": result}) + "\n")

    async def list_jobs_v2(self, request, user, cluster, teamId):
        """GET /api/v2/clusters/:clusterId/teams/:teamId/jobs?user=all&limit=N (ListJobsV2):
        every active job plus the latest `limit` others, newest first."""
        try:
            limit = int(float(request.query.get("limit", "10"))) or 10
        except ValueError:
            limit = 10
        everyone = request.query.get("user") == "all" and self.is_admin(user, teamId)
        jobs = [j for j in self.jobs.jobs.values()
                if j.vc == teamId and j.cluster == cluster and (everyone or j.user == user)]
        jobs.sort(key=lambda j: j.created, reverse=True)
        active = [j for j in jobs if j.status in ACTIVE - {"killing"}]
        others = [j for j in jobs if j.status not in ACTIVE - {"killing"}][:limit]
        out = sorted(active + others, key=lambda j: j.created, reverse=True)
        return koa_json([{k: v for k, v in j.record().items() if k != "insight"} for j in out])


class Controls:
    """`/_emulator/...`: test controls outside the real API."""

    def __init__(self, dash: Dashboard):
        self.dash = dash

    async def handle(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p][1:]
        jobs = self.dash.jobs
        body = await request.json() if request.can_read_body else {}
        m = request.method
        common = common_control(parts, m, body, jobs=lambda: [jobs.view(j) for j in jobs.jobs.values()],
                                pids=jobs.runner.pids, requests=lambda: self.dash.log.entries, faults=self.dash.faults)
        if common is not None:
            return common
        if parts == ["hold"] and m == "POST":
            jobs.set_hold(body.get("state"))
            return web.json_response({"ok": True})
        if parts == ["step"] and m == "POST":
            jobs.step = float(body["seconds"])
            return web.json_response({"ok": True})
        if len(parts) == 3 and parts[0] == "jobs" and m == "POST":
            job = jobs.jobs.get(parts[1])
            if job is None:
                return web.json_response({"error": "no such job"}, status=404)
            action = parts[2]
            if action == "pause":          # an administrator pauses the job (dashboard: status pausing)
                if job.status not in ("unapproved", "queued", "scheduling", "running"):
                    return web.json_response({"error": f"cannot pause a {job.status} job"}, status=409)
                jobs.force(job, "pausing")
                return web.json_response({"ok": True})
            if action == "status":
                jobs.force(job, body["status"])
                return web.json_response({"ok": True})
            if action == "kill-task":      # the workload dies from outside (OOM killer, node lost)
                jobs.runner.signal(f"{job.id}-{job.attempt}", int(body.get("signal", signal.SIGKILL)))
                return web.json_response({"ok": True})
        return web.json_response({"error": "unknown control"}, status=404)


def make_app(dash: Dashboard) -> web.Application:
    controls = Controls(dash)

    @web.middleware
    async def front(request: web.Request, handler) -> web.StreamResponse:
        if request.path.startswith("/_emulator/"):
            return await controls.handle(request)
        fault = dash.faults.take(request.method, request.path)
        try:
            if fault is not None and fault.hang:
                await asyncio.sleep(fault.hang)
            if fault is not None and fault.status is not None:
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
                msg = fault.message or HTTPStatus(fault.status).phrase
                resp = text(msg, fault.status, headers)
            else:
                resp = await dash.handle(request)
        except KoaError as e:
            resp = text(e.message, e.status, e.headers)
        dash.log.add(request.method, request.path, dict(request.query), resp.status)
        return resp

    app = web.Application(middlewares=[front], client_max_size=4 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", lambda r: web.Response(status=500))
    return app


# ------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.support.dlts.emulator")
    p.add_argument("--state", required=True, help="state dir: config.json and master_token are read from it")
    p.add_argument("--port", type=int, default=0)
    return p.parse_args(argv)


async def amain(args) -> None:
    state = Path(args.state).resolve()
    config = json.loads((state / "config.json").read_text())
    master_token = (state / "master_token").read_text().strip()
    instance = config.get("instance") or secrets.token_hex(8)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(MARK)}
    runner = ProcessRunner(state / "tasks", MARK, instance)
    jobs = JobManager(runner, master_token, config.get("images", {}), float(config.get("step", 0.05)), base_env)
    jobs.hold = config.get("hold")
    dash = Dashboard(config, master_token, jobs, Faults(), RequestLog())
    runner_app, port = await serve(make_app(dash), port=args.port)
    announce(state, port)
    await until_stopped()
    await jobs.shutdown()
    await runner_app.cleanup()


def main(argv=None) -> None:
    asyncio.run(amain(parse_args(argv)))
