"""A PAI-DLC OpenAPI (2020-12-03) emulator: CreateJob, GetJob, ListJobs, StopJob and DeleteJob on
the ROA paths /api/v1/jobs[/{JobId}[/stop]], over HTTPS, every request checked for its AccessKey
signature (signature.py) as the gateway does, with the gateway's and DLC's error bodies
({"RequestId", "HostId", "Code", "Message", "Recommend"}).

Jobs run as real processes: each of a job's pods is its `UserCommand` under bash, in a bare
environment (the "image" is a bin directory first on PATH; nothing of the test's environment),
with what DLC sets in a pod: RANK / WORLD_SIZE / MASTER_ADDR for PyTorchJob, TF_CONFIG for TFJob.
States follow DLC: Creating -> Queuing -> Running -> Succeeded | Failed; StopJob: Stopping ->
Stopped. See README.md.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import secrets
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.emulator_faults import Faults
from tests.support.emulator_serving import announce, common_control, make_tls, serve, until_stopped
from tests.support.emulator_procs import ProcessRunner

from . import signature

MARK = "DLC_EMULATOR"
VERSION = "2020-12-03"
JOB_TYPES = ("TFJob", "PyTorchJob", "XGBoostJob", "MPIJob", "ElasticBatchJob", "SlurmJob", "RayJob")
TERMINAL = ("Succeeded", "Failed", "Stopped")
# what Alibaba Cloud's gateway answers for a server fault (its documented common error codes)
FAULT_CODES = {500: ("InternalError", "The request processing has failed due to some unknown error, exception or "
                                      "failure."),
               503: ("ServiceUnavailable", "The request has failed due to a temporary failure of the server.")}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Job:
    id: str
    body: dict[str, Any]
    workspace: str
    owner: str
    status: str = "Creating"
    reason_code: str = ""
    reason_message: str = ""
    created: str = field(default_factory=_now)
    finished: str = ""
    pods: list[str] = field(default_factory=list)  # task keys
    exit_codes: dict[str, int] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> dict[str, Any]:
        """A job as GetJob / ListJobs return it (the fields NNI and this manager read, and their neighbours)."""
        return {"JobId": self.id, "DisplayName": self.body.get("DisplayName"), "JobType": self.body.get("JobType"),
                "Status": self.status, "ReasonCode": self.reason_code, "ReasonMessage": self.reason_message,
                "WorkspaceId": self.workspace, "UserId": self.owner, "GmtCreateTime": self.created,
                "GmtFinishTime": self.finished or None, "JobSpecs": self.body.get("JobSpecs"),
                "DataSources": self.body.get("DataSources"), "ResourceId": self.body.get("ResourceId"),
                "UserCommand": self.body.get("UserCommand"),
                "Pods": [{"PodId": f"{self.id}-{k.rpartition('-')[2]}", "Status": self._pod_status(k)}
                         for k in self.pods]}

    def _pod_status(self, key: str) -> str:
        code = self.exit_codes.get(key)
        return "Running" if code is None else ("Succeeded" if code == 0 else "Failed")


class Dlc:
    def __init__(self, cfg: dict[str, Any], runner: ProcessRunner, state: Path) -> None:
        self.cfg, self.runner, self.state = cfg, runner, state
        self.keys: dict[str, dict[str, Any]] = cfg["accessKeys"]  # id -> {secret, user, workspaces}
        self.workspaces: dict[str, dict[str, Any]] = cfg["workspaces"]  # id -> {dataSources: [...]}
        self.images: dict[str, str] = cfg["images"]
        self.step = float(cfg.get("step", 0.05))
        self.host = cfg.get("host", "pai-dlc.cn-hangzhou.aliyuncs.com")
        self.jobs: dict[str, Job] = {}
        self.nonces: set[str] = set()
        self.requests: list[dict[str, Any]] = []
        self.drivers: list[asyncio.Task[None]] = []
        self.faults = Faults()
        self.hold: str | None = None  # a status jobs stop advancing at (the workspace's quota is full: Queuing)
        self.hold_changed = asyncio.Event()

    # ------------------------------------------------------------------ the gateway
    def error(self, e: ApiError | signature.SignatureError) -> web.Response:
        body = {"RequestId": str(uuid.uuid4()).upper(), "HostId": self.host, "Code": e.code, "Message": e.message,
                "Recommend": f"https://api.aliyun.com/troubleshoot?q={e.code}&product=pai-dlc"}
        return web.json_response(body, status=e.status)

    def authenticate(self, request: web.Request, body: bytes) -> str:
        """The AccessKey id of a correctly signed request (else the gateway's refusal)."""
        ak, signed, sig = signature.parse(request.headers.get("Authorization", ""))
        key = self.keys.get(ak)
        if key is None:
            raise signature.SignatureError(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        if not key.get("active", True):
            raise signature.SignatureError(400, "InvalidAccessKeyId.Inactive", "Specified access key is disabled.")
        raw_path, _, raw_query = request.raw_path.partition("?")
        signature.verify(request.method, raw_path, raw_query, dict(request.headers), body, key["secret"], signed, sig)
        nonce = request.headers.get("x-acs-signature-nonce", "")
        if nonce in self.nonces:
            raise signature.SignatureError(400, "SignatureNonceUsed", "Specified signature nonce was used already.")
        self.nonces.add(nonce)
        if request.headers.get("x-acs-version") != VERSION:
            raise ApiError(400, "InvalidVersion", "Specified parameter Version is not valid.")
        return ak

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read() if request.can_read_body else b""
        fault = self.faults.take(request.method, request.path)  # injected: the gateway's bad day
        try:
            if fault is not None and fault.hang:
                await asyncio.sleep(fault.hang)
            if fault is not None and fault.status is not None:
                code, words = FAULT_CODES.get(fault.status, ("ServiceUnavailable", FAULT_CODES[503][1]))
                raise ApiError(fault.status, code, fault.message or words)
            ak = self.authenticate(request, body)
            resp = await self.route(request, ak, body)
        except (ApiError, signature.SignatureError) as e:
            resp = self.error(e)
            if fault is not None and fault.retry_after is not None:
                resp.headers["Retry-After"] = str(fault.retry_after)
        self.requests.append({"method": request.method, "path": request.path,
                              "action": request.headers.get("x-acs-action"), "status": resp.status})
        return resp

    async def route(self, request: web.Request, ak: str, body: bytes) -> web.Response:
        parts = [p for p in request.path.split("/") if p]
        action = request.headers.get("x-acs-action")
        if parts[:3] != ["api", "v1", "jobs"]:
            raise ApiError(404, "InvalidAction.NotFound", "Specified api is not found, please check your url and method.")
        rest = parts[3:]
        if request.method == "POST" and not rest and action == "CreateJob":
            return self.create(ak, json.loads(body or b"{}"))
        if request.method == "GET" and not rest and action == "ListJobs":
            return self.list(ak, request.query)
        if len(rest) == 1 and request.method == "GET" and action == "GetJob":
            return web.json_response({**self.job(ak, rest[0]).view(), "RequestId": str(uuid.uuid4()).upper()})
        if len(rest) == 2 and rest[1] == "stop" and request.method == "POST" and action == "StopJob":
            return self.stop(ak, rest[0])
        if len(rest) == 1 and request.method == "DELETE" and action == "DeleteJob":
            return await self.delete(ak, rest[0])
        if len(rest) == 4 and rest[1] == "pods" and rest[3] == "logs" and request.method == "GET" \
                and action == "GetPodLogs":
            return self.pod_logs(ak, rest[0], rest[2], request.query)
        raise ApiError(404, "InvalidAction.NotFound", "Specified api is not found, please check your url and method.")

    # ------------------------------------------------------------------ the API
    def _workspace(self, ak: str, workspace: str | None) -> str:
        allowed = self.keys[ak].get("workspaces", list(self.workspaces))
        ws = workspace or self.keys[ak].get("defaultWorkspace") or next(iter(allowed))
        if ws not in self.workspaces:
            raise ApiError(400, "InvalidParameter", f"workspace {ws} does not exist")
        if ws not in allowed:
            raise ApiError(403, "Forbidden.RAM", f"User {self.keys[ak]['user']} is not authorized to operate on "
                                                 f"the specified resource, or this API does not support RAM.")
        return ws

    def create(self, ak: str, body: dict[str, Any]) -> web.Response:
        ws = self._workspace(ak, body.get("WorkspaceId"))
        for name in ("DisplayName", "JobType", "JobSpecs", "UserCommand"):
            if not body.get(name):
                raise ApiError(400, "MissingParameter", f"The input parameter \"{name}\" that is mandatory for "
                                                        "processing this request is not supplied.")
        if body["JobType"] not in JOB_TYPES:
            raise ApiError(400, "InvalidParameter", f"JobType {body['JobType']} is not supported")
        for spec in body["JobSpecs"]:
            if not spec.get("Type") or not spec.get("Image") or not isinstance(spec.get("PodCount"), int):
                raise ApiError(400, "InvalidParameter", "JobSpecs: Type, Image and PodCount are required")
            if not spec.get("EcsSpec") and not spec.get("ResourceConfig"):
                raise ApiError(400, "InvalidParameter", "JobSpecs: one of EcsSpec and ResourceConfig is required")
            if spec.get("ResourceConfig") and not body.get("ResourceId"):
                raise ApiError(400, "InvalidParameter", "ResourceId is required with ResourceConfig")
            if spec["Image"] not in self.images:
                raise ApiError(400, "InvalidParameter", f"image {spec['Image']} cannot be pulled")
        known = {d["DataSourceId"]: d for d in self.workspaces[ws].get("dataSources", [])}
        for src in body.get("DataSources") or []:
            if src.get("DataSourceId") not in known:
                raise ApiError(400, "InvalidParameter", f"DataSource {src.get('DataSourceId')} not found")
        job = Job(f"dlc{secrets.token_hex(7)}", body, ws, self.keys[ak]["user"])
        self.jobs[job.id] = job
        self.drivers.append(asyncio.ensure_future(self.drive(job)))
        return web.json_response({"JobId": job.id, "RequestId": str(uuid.uuid4()).upper()})

    def job(self, ak: str, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None or job.workspace not in self.keys[ak].get("workspaces", list(self.workspaces)):
            raise ApiError(400, "InvalidParameter", f"job {job_id} not found")
        return job

    def pod_logs(self, ak: str, job_id: str, pod_id: str, query: Any) -> web.Response:
        """GetPodLogs: the pod's container output, a line each (stdout, then stderr: the emulator keeps
        them apart where a container runtime interleaves them); the last `MaxLines` when given."""
        job = self.job(ak, job_id)
        if pod_id not in job.pods:
            raise ApiError(400, "InvalidParameter", f"pod {pod_id} not found in job {job_id}")
        d = self.runner.root / pod_id
        lines = [line for name in ("stdout", "stderr") if (d / name).is_file()
                 for line in (d / name).read_text(errors="replace").splitlines()]
        try:
            most = int(query.get("MaxLines") or 0)
        except ValueError:
            raise ApiError(400, "InvalidParameter", "MaxLines must be an integer") from None
        if most > 0:
            lines = lines[-most:]
        return web.json_response({"JobId": job.id, "PodId": pod_id, "Logs": lines,
                                  "RequestId": str(uuid.uuid4()).upper()})

    def list(self, ak: str, query: Any) -> web.Response:
        ws = self._workspace(ak, query.get("WorkspaceId"))
        name = query.get("DisplayName")
        rows = [j for j in self.jobs.values() if j.workspace == ws and (not name or name in j.body["DisplayName"])]
        if query.get("Status"):
            rows = [j for j in rows if j.status == query["Status"]]
        rows.sort(key=lambda j: j.created, reverse=True)
        size = int(query.get("PageSize", 50))
        page = int(query.get("PageNumber", 1))
        if size < 1 or size > 100 or page < 1:
            raise ApiError(400, "InvalidParameter", "PageSize must be in [1, 100] and PageNumber >= 1")
        chosen = rows[(page - 1) * size:page * size]
        return web.json_response({"Jobs": [j.view() for j in chosen], "TotalCount": len(rows),
                                  "RequestId": str(uuid.uuid4()).upper()})

    def stop(self, ak: str, job_id: str) -> web.Response:
        job = self.job(ak, job_id)
        if job.status in TERMINAL:
            raise ApiError(400, "InvalidParameter", f"job {job_id} is already {job.status}, cannot be stopped")
        self.set(job, "Stopping")
        job.stop.set()
        return web.json_response({"JobId": job.id, "RequestId": str(uuid.uuid4()).upper()})

    async def delete(self, ak: str, job_id: str) -> web.Response:
        job = self.job(ak, job_id)
        if job.status not in TERMINAL:
            raise ApiError(400, "InvalidParameter", f"job {job_id} is {job.status}: stop it before deleting it")
        del self.jobs[job.id]
        return web.json_response({"JobId": job.id, "RequestId": str(uuid.uuid4()).upper()})

    # ------------------------------------------------------------------ running jobs
    def set(self, job: Job, status: str, code: str = "", message: str = "") -> None:
        job.status, job.reason_code, job.reason_message = status, code, message
        job.history.append(status)
        if status in TERMINAL:
            job.finished = _now()

    def set_hold(self, status: str | None) -> None:
        self.hold = status
        self.hold_changed.set()

    async def drive(self, job: Job) -> None:
        for status in ("Queuing", "Running"):
            await asyncio.sleep(self.step)
            while self.hold == job.status and not job.stop.is_set():  # held where it is (no room in the quota)
                self.hold_changed.clear()
                waiters = [asyncio.ensure_future(self.hold_changed.wait()), asyncio.ensure_future(job.stop.wait())]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
            if job.stop.is_set():
                self.set(job, "Stopped", "JobStoppedByUser", "Job is stopped by user")
                return
            self.set(job, status)
        spec = job.body["JobSpecs"][0]
        count = spec["PodCount"]
        env_base = {"PATH": f"{self.images[spec['Image']]}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                    "JOB_ID": job.id}
        tasks = []
        for i in range(count):
            key = f"{job.id}-{i}"
            env = {**env_base, "HOME": str(self.state / "tasks" / key)}
            if job.body["JobType"] == "PyTorchJob":
                env.update(RANK=str(i), WORLD_SIZE=str(count), MASTER_ADDR=f"{job.id}-master-0", MASTER_PORT="23456")
            elif job.body["JobType"] == "TFJob":
                env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"{job.id}-worker-{n}:2222" for n in range(count)]},
                                               "task": {"type": "worker", "index": i}})
            job.pods.append(key)
            tasks.append(await self.runner.start(key, job.body["UserCommand"], env))
        waiting = [asyncio.ensure_future(t.done.wait()) for t in tasks]
        stopper = asyncio.ensure_future(job.stop.wait())
        while not all(t.done.is_set() for t in tasks) and not job.stop.is_set():
            await asyncio.wait([stopper, *[w for w in waiting if not w.done()]], return_when=asyncio.FIRST_COMPLETED)
            if any(t.exit_code not in (None, 0) for t in tasks):
                break
        stopper.cancel()
        for t in tasks:
            if t.exit_code is None:
                await self.runner.kill(t.key, reason="job ended")
        for t in tasks:
            job.exit_codes[t.key] = t.exit_code if t.exit_code is not None else -9
        if job.stop.is_set():
            self.set(job, "Stopped", "JobStoppedByUser", "Job is stopped by user")
        elif all(t.exit_code == 0 for t in tasks):
            self.set(job, "Succeeded")
        else:
            bad = next(t for t in tasks if t.exit_code != 0)
            self.set(job, "Failed", "JobFailed", f"pod {bad.key} exited with code {bad.exit_code}")

    async def shutdown(self) -> None:
        for d in self.drivers:
            d.cancel()
        await self.runner.shutdown()


def make_app(dlc: Dlc) -> web.Application:
    async def controls(request: web.Request) -> web.Response:
        common = common_control(
            [request.match_info["what"]], request.method, await request.json() if request.can_read_body else {},
            jobs=lambda: [{**j.view(), "history": j.history, "exitCodes": j.exit_codes} for j in dlc.jobs.values()],
            pids=dlc.runner.pids, requests=lambda: dlc.requests, faults=dlc.faults)
        if common is None and request.match_info["what"] == "hold" and request.method == "POST":
            dlc.set_hold((await request.json()).get("status"))
            return web.json_response({"ok": True})
        return common if common is not None else web.json_response({"error": "unknown control"}, status=404)

    async def api(request: web.Request) -> web.Response:
        return await dlc.handle(request)

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_route("*", "/_emulator/{what}", controls)
    app.router.add_route("*", "/{tail:.*}", api)
    return app


async def amain(state: Path) -> None:
    cfg = json.loads((state / "config.json").read_text())
    dlc = Dlc(cfg, ProcessRunner(state / "tasks", MARK, cfg["instance"]), state)
    tls = make_tls(state, ca_name="dlc-emulator-ca", server_name="pai-dlc.emulator")
    runner, port = await serve(make_app(dlc), ssl_context=tls)
    announce(state, port)
    await until_stopped()
    await dlc.shutdown()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.support.dlc.emulator")
    p.add_argument("--state", required=True)
    asyncio.run(amain(Path(p.parse_args(argv).state).resolve()))
