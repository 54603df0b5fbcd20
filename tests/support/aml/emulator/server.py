"""Azure Resource Manager paths of one Azure ML workspace over HTTPS, plus `/_emulator` controls.

Served (any api-version accepted, each one received recorded with the operation it was for):
  GET  {ws}                                         workspace
  GET  {ws}/computes/{name}                         compute (404 ARM envelope when unknown)
  PUT  {ws}/environments/{name}/versions/{version}  201 create, 200 same content, 409 changed
  GET  {ws}/environments/{name}/versions/{version}
  PUT  {ws}/jobs/{name}                             201 create, 200 update
  GET  {ws}/jobs/{name}, GET {ws}/jobs              job, paged list
  POST {ws}/jobs/{name}/cancel                      202 + Location (+ Retry-After); 200 when already ended
  GET  /subscriptions/{sub}/providers/Microsoft.MachineLearningServices/locations/{region}/mfeOperationResults/{id}
with {ws} = /subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/workspaces/{name}.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import signal
import time
import uuid
from pathlib import Path

from aiohttp import web

from tests.support.emulator_faults import Faults, RequestLog
from tests.support.emulator_procs import ProcessRunner

from .arm import ArmError, Gate, fault_error, user_error
from .jobs import Workspace
from tests.support.emulator_serving import announce, common_control, make_tls, serve, until_stopped
from .tokens import ARM_AUDIENCES, verify

MARK = "AML_EMULATOR"
PROVIDER = "microsoft.machinelearningservices"
ACTIONS = {
    "workspaces.get": "Microsoft.MachineLearningServices/workspaces/read",
    "computes.get": "Microsoft.MachineLearningServices/workspaces/computes/read",
    "environments.versions.put": "Microsoft.MachineLearningServices/workspaces/environments/versions/write",
    "environments.versions.get": "Microsoft.MachineLearningServices/workspaces/environments/versions/read",
    "datastores.list": "Microsoft.MachineLearningServices/workspaces/datastores/read",
    "datastores.get": "Microsoft.MachineLearningServices/workspaces/datastores/read",
    "datastores.listSecrets": "Microsoft.MachineLearningServices/workspaces/datastores/listsecrets/action",
    "codes.versions.put": "Microsoft.MachineLearningServices/workspaces/codes/versions/write",
    "codes.versions.get": "Microsoft.MachineLearningServices/workspaces/codes/versions/read",
    "jobs.put": "Microsoft.MachineLearningServices/workspaces/jobs/write",
    "jobs.get": "Microsoft.MachineLearningServices/workspaces/jobs/read",
    "jobs.list": "Microsoft.MachineLearningServices/workspaces/jobs/read",
    "jobs.cancel": "Microsoft.MachineLearningServices/workspaces/jobs/cancel/action",
    "operationResults.get": "*any*",
}


def arm_json(obj, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(obj), content_type="application/json", charset="utf-8",
                        headers=headers)


class Route:
    """What a request path names: the operation kind, its scope and its path parameters."""

    def __init__(self, kind: str, scope: str, **params: str):
        self.kind, self.scope, self.params = kind, scope, params


class Arm:
    def __init__(self, ws: Workspace, gate: Gate, faults: Faults, log: RequestLog, page_size: int):
        self.ws, self.gate, self.faults, self.log, self.page_size = ws, gate, faults, log, page_size

    def route(self, method: str, path: str) -> Route:
        p = [x for x in path.split("/") if x]
        low = [x.lower() for x in p]
        if len(p) < 2 or low[0] != "subscriptions":
            raise ArmError(404, "InvalidRequestUri", f"The request URI '{path}' is not valid.")
        sub = p[1]
        if low[2:4] == ["providers", PROVIDER] and len(p) == 8 and low[4] == "locations" and \
                low[6] == "mfeoperationresults" and method == "GET":
            return Route("operationResults.get", f"/subscriptions/{sub}", sub=sub, op=p[7])
        if len(p) < 8 or low[2] != "resourcegroups" or low[4:7] != ["providers", PROVIDER, "workspaces"]:
            raise ArmError(404, "InvalidResourceType", f"The resource type could not be found for path '{path}'.")
        rg, wsname, rest, lrest = p[3], p[7], p[8:], low[8:]
        base = dict(sub=sub, rg=rg, ws=wsname)
        scope = path
        if not rest and method == "GET":
            return Route("workspaces.get", scope, **base)
        if lrest[:1] == ["computes"] and len(rest) == 2 and method == "GET":
            return Route("computes.get", scope, name=rest[1], **base)
        if lrest[:1] == ["environments"] and len(rest) == 4 and lrest[2] == "versions" and method in ("PUT", "GET"):
            return Route(f"environments.versions.{method.lower()}", scope, name=rest[1], version=rest[3], **base)
        if lrest[:1] == ["datastores"]:
            if len(rest) == 1 and method == "GET":
                return Route("datastores.list", scope, **base)
            if len(rest) == 2 and method == "GET":
                return Route("datastores.get", scope, name=rest[1], **base)
            if len(rest) == 3 and lrest[2] == "listsecrets" and method == "POST":
                return Route("datastores.listSecrets", scope, name=rest[1], **base)
        if lrest[:1] == ["codes"] and len(rest) == 4 and lrest[2] == "versions" and method in ("PUT", "GET"):
            return Route(f"codes.versions.{method.lower()}", scope, name=rest[1], version=rest[3], **base)
        if lrest[:1] == ["jobs"]:
            if len(rest) == 1 and method == "GET":
                return Route("jobs.list", scope, **base)
            if len(rest) == 2 and method in ("PUT", "GET"):
                return Route(f"jobs.{method.lower()}", scope, name=rest[1], **base)
            if len(rest) == 3 and lrest[2] == "cancel" and method == "POST":
                return Route("jobs.cancel", scope, name=rest[1], **base)
        if method not in ("GET", "PUT", "POST", "DELETE", "PATCH"):
            raise ArmError(405, "MethodNotAllowed", f"The requested method '{method}' is not allowed.")
        raise ArmError(404, "InvalidResourceType", f"The resource type '{'/'.join(rest[:1]) or 'workspaces'}' could "
                       f"not be found in the namespace 'Microsoft.MachineLearningServices' for this request.")

    def check_scope(self, route: Route, claims: dict) -> None:
        """Subscription, RBAC, then resource group and workspace, in ARM's order."""
        ws = self.ws
        if route.params["sub"].lower() != ws.sub.lower():
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{route.params['sub']}' could not be found.")
        self.gate.authorize(claims, ACTIONS[route.kind], route.scope)
        if "rg" in route.params and route.params["rg"].lower() != ws.rg.lower():
            raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{route.params['rg']}' could not be found.")
        if "ws" in route.params and route.params["ws"].lower() != ws.ws.lower():
            raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.MachineLearningServices/workspaces/"
                           f"{route.params['ws']}' under resource group '{route.params['rg']}' was not found. For more "
                           "details please go to https://aka.ms/ARMResourceNotFoundFix")

    async def handle(self, request: web.Request) -> tuple[web.StreamResponse, Route | None]:
        route = None
        try:
            route = self.route(request.method, request.path)
            claims = self.gate.authenticate(request)
            if "api-version" not in request.query:
                raise ArmError(400, "MissingApiVersionParameter",
                               "The api-version query parameter (?api-version=) is required for all requests.")
            self.check_scope(route, claims)
            who = claims.get("upn") or claims.get("appid") or "unknown"
            return await getattr(self, route.kind.replace(".", "_"))(request, route, who), route
        except ArmError as e:
            return e.response(str(uuid.uuid4())), route

    async def body(self, request: web.Request) -> dict:
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ArmError(400, "InvalidRequestContent",
                           "The request content was invalid and could not be deserialized.") from None
        if not isinstance(data, dict):
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid and could not be deserialized.")
        return data

    # ------------------------------------------------------------ operations
    async def workspaces_get(self, request, route, who):
        ws = self.ws
        return arm_json({"id": ws.base, "name": ws.ws, "type": "Microsoft.MachineLearningServices/workspaces",
                         "location": ws.region, "kind": "Default",
                         "properties": {"friendlyName": ws.ws, "workspaceId": ws.workspace_id,
                                        "provisioningState": "Succeeded", "mlFlowTrackingUri": ws.tracking_uri(),
                                        "discoveryUrl": f"https://{ws.region}.api.azureml.ms/discovery",
                                        "publicNetworkAccess": "Enabled"}})

    async def computes_get(self, request, route, who):
        ws, name = self.ws, route.params["name"]
        c = ws.computes.get(name)
        if c is None:
            raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.MachineLearningServices/workspaces/"
                           f"{ws.ws}/computes/{name}' under resource group '{ws.rg}' was not found. For more details "
                           "please go to https://aka.ms/ARMResourceNotFoundFix")
        return arm_json({"id": f"{ws.base}/computes/{name}", "name": name, "location": ws.region,
                         "type": "Microsoft.MachineLearningServices/workspaces/computes",
                         "properties": {"computeType": "AmlCompute", "provisioningState": "Succeeded",
                                        "computeLocation": ws.region, "isAttachedCompute": False,
                                        "properties": {"vmSize": c.get("vmSize", "STANDARD_DS3_V2"),
                                                       "vmPriority": "Dedicated", "osType": "Linux",
                                                       "scaleSettings": {"minNodeCount": 0,
                                                                         "maxNodeCount": c.get("maxNodes", 4),
                                                                         "nodeIdleTimeBeforeScaleDown": "PT120S"},
                                                       "allocationState": "Steady", "currentNodeCount": 0,
                                                       "targetNodeCount": 0}}})

    async def environments_versions_put(self, request, route, who):
        status, env = self.ws.put_environment(route.params["name"], route.params["version"],
                                              await self.body(request), who)
        return arm_json(env, status)

    async def environments_versions_get(self, request, route, who):
        env = self.ws.environments.get((route.params["name"], route.params["version"]))
        if env is None:
            raise user_error(404, f"Could not find asset with ID: {self.ws.base}/environments/{route.params['name']}"
                                  f"/versions/{route.params['version']}")
        return arm_json(env)

    def _datastore(self, name: str):
        ds = self.ws.datastore
        if ds is None or ds.name != name:
            raise user_error(404, f"DatastoreNotFound: {name} datastore does not exists.")
        return ds

    def _system(self) -> dict:
        return self.ws.system_data("workspace", self.ws.created_at, self.ws.created_at)

    async def datastores_list(self, request, route, who):
        ds = self.ws.datastore
        value = [ds.resource(self.ws.base, self._system())] if ds is not None else []
        default = request.query.get("isDefault")
        if default is not None and default.lower() == "false":
            value = []
        return arm_json({"value": value})

    async def datastores_get(self, request, route, who):
        return arm_json(self._datastore(route.params["name"]).resource(self.ws.base, self._system()))

    async def datastores_listSecrets(self, request, route, who):
        return arm_json(self._datastore(route.params["name"]).secrets())

    async def codes_versions_put(self, request, route, who):
        status, code = self.ws.put_code_version(route.params["name"], route.params["version"],
                                                await self.body(request), who)
        return arm_json(code, status)

    async def codes_versions_get(self, request, route, who):
        code = self.ws.codes.get((route.params["name"], route.params["version"]))
        if code is None:
            raise user_error(404, f"Could not find asset with ID: {self.ws.base}/codes/{route.params['name']}"
                                  f"/versions/{route.params['version']}")
        return arm_json(code)

    async def jobs_put(self, request, route, who):
        status, job = self.ws.put_job(route.params["name"], await self.body(request), who)
        return arm_json(self.ws.job_resource(job), status)

    def _job(self, name: str):
        job = self.ws.jobs.get(name)
        if job is None:
            raise user_error(404, f"Job {name} not found.")
        return job

    async def jobs_get(self, request, route, who):
        return arm_json(self.ws.job_resource(self._job(route.params["name"])))

    async def jobs_list(self, request, route, who):
        try:
            skip = int(request.query.get("$skipToken", "0"))
        except ValueError:
            raise user_error(400, "Invalid $skipToken.") from None
        view = request.query.get("listViewType", "ActiveOnly")
        jobs = sorted(self.ws.jobs.values(), key=lambda j: j.created_at, reverse=True)
        if view == "ArchivedOnly":
            jobs = []
        tag = request.query.get("tag")
        if tag is not None:  # Jobs_List: "Jobs returned will have this tag key."
            jobs = [j for j in jobs if tag in (j.properties.get("tags") or {})]
        page = jobs[skip:skip + self.page_size]
        out: dict = {"value": [self.ws.job_resource(j) for j in page]}
        if skip + self.page_size < len(jobs):
            query = {**request.query, "$skipToken": str(skip + self.page_size)}
            out["nextLink"] = str(request.url.with_query(query))
        return arm_json(out)

    async def jobs_cancel(self, request, route, who):
        job = self._job(route.params["name"])
        if not self.ws.cancel(job):
            return arm_json({}, 200)
        version = request.query.get("api-version")
        loc = (f"{request.url.origin()}/subscriptions/{self.ws.sub}/providers/Microsoft.MachineLearningServices/"
               f"locations/{self.ws.region}/mfeOperationResults/jc:{self.ws.workspace_id}:{job.name}"
               f"?api-version={version}&type=location")
        return web.Response(status=202, headers={"Location": loc, "Retry-After": str(self.ws.retry_after)})

    async def operationResults_get(self, request, route, who):
        op = route.params["op"]
        prefix = f"jc:{self.ws.workspace_id}:"
        job = self.ws.jobs.get(op[len(prefix):]) if op.startswith(prefix) else None
        if job is None:
            raise ArmError(404, "NotFound", f"The operation '{op}' could not be found.")
        if job.status != "Canceled":
            return web.Response(status=202, headers={"Location": str(request.url),
                                                     "Retry-After": str(self.ws.retry_after)})
        return web.Response(status=200)


class Controls:
    """`/_emulator/...`: test controls outside the real API."""

    def __init__(self, arm: Arm):
        self.arm = arm

    async def handle(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p][1:]
        ws, m = self.arm.ws, request.method
        body = await request.json() if request.can_read_body else {}
        common = common_control(parts, m, body, jobs=lambda: [ws.view(j) for j in ws.jobs.values()],
                                pids=ws.runner.pids, requests=lambda: self.arm.log.entries, faults=self.arm.faults)
        if common is not None:
            return common
        if parts == ["api-versions"] and m == "GET":
            seen: dict[str, set] = {}
            for e in self.arm.log.entries:
                if e.get("kind"):
                    seen.setdefault(e["kind"], set()).add(e["query"].get("api-version"))
            return web.json_response({k: sorted(v, key=str) for k, v in seen.items()})
        if parts == ["revoke-tokens"] and m == "POST":
            self.arm.gate.revoked_at = time.time()
            return web.json_response({"ok": True})
        if parts == ["hold"] and m == "POST":
            ws.set_hold(body.get("status"))
            return web.json_response({"ok": True})
        if parts == ["step"] and m == "POST":
            ws.step = float(body["seconds"])
            return web.json_response({"ok": True})
        if len(parts) == 2 and parts[0] == "principals" and m == "PUT":
            self.arm.gate.principals.setdefault(parts[1], {})["roles"] = list(body.get("roles", []))
            return web.json_response({"ok": True})
        if len(parts) == 3 and parts[0] == "jobs" and parts[2] == "kill-task" and m == "POST":
            job = ws.jobs.get(parts[1])
            if job is None:
                return web.json_response({"error": "no such job"}, status=404)
            for i in range(len(job.exit_codes)):
                ws.runner.signal(f"{job.name}-{i}", int(body.get("signal", signal.SIGKILL)))
            return web.json_response({"ok": True})
        return web.json_response({"error": "unknown control"}, status=404)


def _digest(body: bytes) -> str | None:
    """A body's sha256 (bodies hold credentials: the log keeps only what compares them)."""
    return hashlib.sha256(body).hexdigest() if body else None


def make_app(arm: Arm) -> web.Application:
    controls = Controls(arm)

    @web.middleware
    async def front(request: web.Request, handler) -> web.StreamResponse:
        if request.path.startswith("/_emulator/"):
            return await controls.handle(request)
        fault = arm.faults.take(request.method, request.path)
        route = None
        body = await request.read() if request.can_read_body else b""
        if fault is not None and fault.hang:
            await asyncio.sleep(fault.hang)
        if fault is not None and fault.lose_answer:
            # ARM does the work, then the answer is lost on the way back (a reset connection)
            resp, route = await arm.handle(request)
            arm.log.add(request.method, request.path, dict(request.query), resp.status,
                        kind=route.kind if route else None, body_sha256=_digest(body), answer_lost=True)
            if request.transport is not None:
                request.transport.abort()
            return resp
        if fault is not None and fault.status is not None:
            token = request.headers.get("Authorization", "").partition(" ")[2]
            claims = verify(arm.gate.key, token) or {}
            err = fault_error(fault.status, arm.ws.sub, claims.get("oid", "-"), fault.retry_after, fault.message)
            resp = err.response(str(uuid.uuid4()))
        else:
            resp, route = await arm.handle(request)
        corr = request.headers.get("x-ms-correlation-request-id") or str(uuid.uuid4())
        resp.headers.setdefault("x-ms-request-id", str(uuid.uuid4()))
        resp.headers["x-ms-correlation-request-id"] = corr
        resp.headers["x-ms-routing-request-id"] = f"EASTUS:{corr}"
        arm.log.add(request.method, request.path, dict(request.query), resp.status,
                    kind=route.kind if route else None, body_sha256=_digest(body))
        return resp

    app = web.Application(middlewares=[front], client_max_size=8 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", lambda r: web.Response(status=500))
    return app


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.support.aml.emulator")
    p.add_argument("--state", required=True, help="state dir: config.json and token-signing.key are read from it")
    p.add_argument("--port", type=int, default=0)
    return p.parse_args(argv)


async def amain(args) -> None:
    state = Path(args.state).resolve()
    cfg = json.loads((state / "config.json").read_text())
    key = (state / "token-signing.key").read_bytes()
    instance = cfg.get("instance") or secrets.token_hex(8)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(MARK)}
    ws = Workspace(cfg, ProcessRunner(state / "tasks", MARK, instance), base_env)
    gate = Gate(key, cfg["tenant"], cfg["subscription"], cfg.get("principals", {}),
                list(cfg.get("audiences") or ARM_AUDIENCES))
    arm = Arm(ws, gate, Faults(), RequestLog(), int(cfg.get("pageSize", 20)))
    tls = make_tls(state, ca_name="aml-emulator-ca", server_name="management.azure.emulator")
    runner, port = await serve(make_app(arm), port=args.port, ssl_context=tls)
    front = None
    if ws.datastore is not None and ws.datastore.identity_based:
        from urllib.parse import urlsplit

        from .storage_front import make_front
        up = urlsplit(ws.datastore.blob_endpoint)
        front, front_port = await serve(make_front(gate, f"{up.scheme}://{up.netloc}", ws.datastore.blob_ca_file),
                                        ssl_context=tls)
        (state / "storage-front-port").write_text(str(front_port))
    announce(state, port)
    await until_stopped()
    await ws.shutdown()
    if front is not None:
        await front.cleanup()
    await runner.cleanup()


def main(argv=None) -> None:
    asyncio.run(amain(parse_args(argv)))
