"""Azure ML command jobs: validation of PUT bodies, the status timeline, and real local processes.

Statuses are the REST JobStatus values. The timeline is NotStarted -> Queued -> Preparing ->
Running (the command's processes start) -> Finalizing -> Completed | Failed; a cancel goes
CancelRequested -> Canceled after the process trees are killed. An image the emulator does not
know fails the job while Preparing, as an image pull failure does on Azure.
"""
from __future__ import annotations

import asyncio
import copy
import datetime as dt
import os
import re
import secrets
import uuid
from dataclasses import dataclass, field

from .arm import user_error
from .assets import Datastore, validate_code_version
from tests.support.emulator_procs import ProcessRunner

NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9\-_]{0,254}$")
TERMINAL = {"Completed", "Failed", "Canceled"}
UPDATABLE = {"description", "tags", "displayName", "properties", "isArchived"}
SERVER_SET = {"status", "services", "isArchived"}


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass
class Job:
    name: str
    properties: dict
    created_by: str
    status: str = "NotStarted"
    created_at: str = field(default_factory=now_iso)
    modified_at: str = field(default_factory=now_iso)
    history: list[dict] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)
    error: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_requested: bool = False


class Workspace:
    """One workspace's environments, computes and jobs, with the job driver coroutines."""

    def __init__(self, cfg: dict, runner: ProcessRunner, base_env: dict[str, str]):
        self.sub, self.rg, self.ws = cfg["subscription"], cfg["resourceGroup"], cfg["workspace"]
        self.region, self.tenant = cfg.get("region", "eastus"), cfg["tenant"]
        self.workspace_id: str = cfg.get("workspaceId") or str(uuid.uuid4())
        self.images: dict[str, str] = cfg.get("images", {})
        self.computes: dict[str, dict] = {c["name"]: c for c in cfg.get("computes", [])}
        self.step = float(cfg.get("step", 0.05))
        self.retry_after = int(cfg.get("retryAfter", 1))      # seconds, on 202s of cancel and its Location
        self.runner, self.base_env = runner, base_env
        self.environments: dict[tuple[str, str], dict] = {}
        self.datastore = Datastore(cfg["datastore"]) if cfg.get("datastore") else None
        self.codes: dict[tuple[str, str], dict] = {}
        self.created_at = now_iso()
        self.jobs: dict[str, Job] = {}
        self.hold: str | None = cfg.get("hold")
        self.hold_changed = asyncio.Event()
        self.drivers: list[asyncio.Task] = []

    @property
    def base(self) -> str:
        return (f"/subscriptions/{self.sub}/resourceGroups/{self.rg}/providers/"
                f"Microsoft.MachineLearningServices/workspaces/{self.ws}")

    def system_data(self, created_by: str, created_at: str, modified_at: str) -> dict:
        return {"createdAt": created_at, "createdBy": created_by, "createdByType": "User",
                "lastModifiedAt": modified_at, "lastModifiedBy": created_by, "lastModifiedByType": "User"}

    # ------------------------------------------------------------ environments
    def put_environment(self, name: str, version: str, body: dict, who: str) -> tuple[int, dict]:
        if not re.match(r"^[a-zA-Z0-9][a-zA-Z0-9\-_.]{0,254}$", name):
            raise user_error(400, f"Invalid asset name '{name}'.")
        props = body.get("properties") if isinstance(body, dict) else None
        if not isinstance(props, dict):
            raise user_error(400, "The request body must contain 'properties'.")
        if not props.get("image") and not props.get("build"):
            raise user_error(400, "Either an image or a build context must be provided for an environment.")
        key = (name, version)
        existing = self.environments.get(key)
        stored = {k: v for k, v in props.items() if k not in ("provisioningState",)}
        stored.setdefault("osType", "Linux")
        stored.setdefault("isAnonymous", False)
        stored.setdefault("isArchived", False)
        stored.setdefault("autoRebuild", "OnBaseImageUpdate")
        stored["environmentType"] = "UserCreated"
        stored["provisioningState"] = "Succeeded"
        if existing is not None:
            if existing["properties"].get("image") != props.get("image") or \
                    existing["properties"].get("build") != props.get("build"):
                raise user_error(409, f"Conflict: environment {name}:{version} already exists with different "
                                      "content; environment versions are immutable.")
            existing["properties"].update({k: stored[k] for k in ("description", "tags", "properties") if k in stored})
            existing["systemData"]["lastModifiedAt"] = now_iso()
            return 200, existing
        t = now_iso()
        env = {"id": f"{self.base}/environments/{name}/versions/{version}", "name": version,
               "type": "Microsoft.MachineLearningServices/workspaces/environments/versions",
               "properties": stored, "systemData": self.system_data(who, t, t)}
        self.environments[key] = env
        return 201, env

    def environment_by_id(self, arm_id: str) -> dict | None:
        """The environment version an ARM id of this workspace names, if it exists."""
        prefix = self.base.lower() + "/environments/"
        if not arm_id.lower().startswith(prefix):
            return None
        parts = arm_id[len(prefix):].split("/")
        if len(parts) != 3 or parts[1].lower() != "versions":
            return None
        return self.environments.get((parts[0], parts[2]))

    # ------------------------------------------------------------ code assets
    def put_code_version(self, name: str, version: str, body: dict, who: str) -> tuple[int, dict]:
        props = validate_code_version(name, body)
        key = (name, version)
        existing = self.codes.get(key)
        if existing is not None:
            if existing["properties"].get("codeUri") != props.get("codeUri"):
                raise user_error(409, f"Conflict: code {name}:{version} already exists with a different codeUri; "
                                      "asset versions are immutable.")
            existing["properties"].update({k: props[k] for k in ("description", "tags", "properties") if k in props})
            existing["systemData"]["lastModifiedAt"] = now_iso()
            return 200, existing
        t = now_iso()
        stored = {**{k: copy.deepcopy(v) for k, v in props.items() if k != "provisioningState"},
                  "isAnonymous": bool(props.get("isAnonymous", False)), "isArchived": False,
                  "provisioningState": "Succeeded"}
        code = {"id": f"{self.base}/codes/{name}/versions/{version}", "name": version,
                "type": "Microsoft.MachineLearningServices/workspaces/codes/versions",
                "properties": stored, "systemData": self.system_data(who, t, t)}
        self.codes[key] = code
        return 201, code

    def code_by_id(self, arm_id: str) -> dict | None:
        prefix = self.base.lower() + "/codes/"
        if not arm_id.lower().startswith(prefix):
            return None
        parts = arm_id[len(prefix):].split("/")
        if len(parts) != 3 or parts[1].lower() != "versions":
            return None
        return self.codes.get((parts[0], parts[2]))

    # ------------------------------------------------------------ jobs
    def validate(self, name: str, body: dict) -> dict:
        if not NAME_RE.match(name):
            raise user_error(400, f"Job name '{name}' is invalid: it must match ^[a-zA-Z0-9][a-zA-Z0-9\\-_]{{0,254}}$.")
        props = body.get("properties") if isinstance(body, dict) else None
        if not isinstance(props, dict):
            raise user_error(400, "The request body must contain 'properties'.")
        if props.get("jobType") is None:
            raise user_error(400, "The JobType field is required.")
        if props["jobType"] != "Command":
            raise user_error(400, f"Job type '{props['jobType']}' is not emulated (only Command jobs are).")
        if not isinstance(props.get("command"), str) or not props["command"].strip():
            raise user_error(400, "The Command field is required.")
        if not isinstance(props.get("environmentId"), str) or not props["environmentId"]:
            raise user_error(400, "The EnvironmentId field is required.")
        if self.environment_by_id(props["environmentId"]) is None:
            raise user_error(404, f"Could not find asset with ID: {props['environmentId']}")
        if props.get("codeId") is not None and (not isinstance(props["codeId"], str)
                                                  or self.code_by_id(props["codeId"]) is None):
            raise user_error(404, f"Could not find asset with ID: {props['codeId']}")
        compute = props.get("computeId")
        if compute is not None:
            cname = str(compute).rstrip("/").split("/")[-1]
            if not str(compute).lower().startswith(self.base.lower() + "/computes/") or cname not in self.computes:
                raise user_error(400, f"Compute target '{compute}' was not found in workspace '{self.ws}'.")
        env_vars = props.get("environmentVariables") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise user_error(400, "EnvironmentVariables must be a map of strings to strings.")
        count = (props.get("resources") or {}).get("instanceCount", 1)
        if not isinstance(count, int) or count < 1:
            raise user_error(400, "Resources.InstanceCount must be a positive integer.")
        return props

    def put_job(self, name: str, body: dict, who: str) -> tuple[int, Job]:
        props = self.validate(name, body)
        existing = self.jobs.get(name)
        if existing is not None:
            # a job is immutable but for these: a re-PUT after a lost answer must resend the same body
            for k, v in props.items():
                if k not in UPDATABLE and k not in SERVER_SET and v != existing.properties.get(k):
                    raise user_error(400, "Only description, tags, displayName, properties, and isArchived can be "
                                          f"updated (job '{name}', field '{k}' differs).")
            for k in ("description", "displayName", "tags", "properties"):
                if k in props:
                    existing.properties[k] = props[k]
            existing.modified_at = now_iso()
            return 200, existing
        stored = {k: copy.deepcopy(v) for k, v in props.items() if k not in SERVER_SET}
        stored.setdefault("experimentName", "Default")
        stored.setdefault("displayName", name)
        stored.setdefault("environmentVariables", {})
        stored.setdefault("resources", {"instanceCount": 1})
        stored.setdefault("tags", {})
        stored.setdefault("properties", {})
        stored.setdefault("inputs", {})
        stored.setdefault("outputs", {"default": {"jobOutputType": "uri_folder", "mode": "ReadWriteMount",
                                                  "uri": f"azureml://datastores/workspaceartifactstore/ExperimentRun/"
                                                         f"dcid.{name}"}})
        job = Job(name, stored, who)
        self.jobs[name] = job
        self._set(job, "NotStarted")
        self.drivers.append(asyncio.ensure_future(self._drive(job)))
        return 201, job

    def studio_url(self, name: str) -> str:
        return (f"https://ml.azure.com/runs/{name}?wsid=/subscriptions/{self.sub}/resourcegroups/{self.rg}/"
                f"workspaces/{self.ws}&tid={self.tenant}")

    def tracking_uri(self) -> str:
        return (f"azureml://{self.region}.api.azureml.ms/mlflow/v1.0/subscriptions/{self.sub}/resourceGroups/"
                f"{self.rg}/providers/Microsoft.MachineLearningServices/workspaces/{self.ws}")

    def job_resource(self, job: Job) -> dict:
        """JobBase as GET/PUT return it."""
        props = {**copy.deepcopy(job.properties), "status": job.status, "isArchived": False,
                 "services": {"Studio": {"jobServiceType": "Studio", "port": None, "endpoint": self.studio_url(job.name),
                                         "status": None, "errorMessage": None, "properties": None, "nodes": None},
                              "Tracking": {"jobServiceType": "Tracking", "port": None,
                                           "endpoint": self.tracking_uri() + "?", "status": None,
                                           "errorMessage": None, "properties": None, "nodes": None}}}
        return {"id": f"{self.base}/jobs/{job.name}", "name": job.name,
                "type": "Microsoft.MachineLearningServices/workspaces/jobs", "properties": props,
                "systemData": self.system_data(job.created_by, job.created_at, job.modified_at)}

    def cancel(self, job: Job) -> bool:
        """True when a cancel starts (202); False when the job has already ended (200)."""
        if job.status in TERMINAL:
            return False
        if not job.cancel_requested:
            job.cancel_requested = True
            self._set(job, "CancelRequested")
        return True

    def _set(self, job: Job, status: str) -> None:
        job.status = status
        job.modified_at = now_iso()
        job.history.append({"status": status, "time": job.modified_at})
        job.changed.set()

    def set_hold(self, status: str | None) -> None:
        self.hold = status
        self.hold_changed.set()

    async def _step(self, job: Job) -> bool:
        """Wait one step, then while the job's status is held; True if the job changed meanwhile."""
        before = job.status
        job.changed.clear()
        try:
            await asyncio.wait_for(job.changed.wait(), self.step)
        except asyncio.TimeoutError:
            pass
        while job.status == before and self.hold == before:
            self.hold_changed.clear()
            job.changed.clear()
            waiters = [asyncio.ensure_future(self.hold_changed.wait()), asyncio.ensure_future(job.changed.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
        return job.status != before

    def env_for(self, job: Job, image_bin: str, rank: int) -> dict[str, str]:
        p = job.properties
        env = dict(self.base_env)
        env["PATH"] = image_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env.update({"AZUREML_RUN_ID": job.name, "AZUREML_ARM_SUBSCRIPTION": self.sub,
                    "AZUREML_ARM_RESOURCEGROUP": self.rg, "AZUREML_ARM_WORKSPACE_NAME": self.ws,
                    "AZUREML_ARM_PROJECT_NAME": p["experimentName"], "AZUREML_WORKSPACE_ID": self.workspace_id,
                    "AZUREML_EXPERIMENT_ID": str(uuid.uuid5(uuid.NAMESPACE_URL, p["experimentName"])),
                    "AZUREML_SERVICE_ENDPOINT": f"https://{self.region}.api.azureml.ms",
                    "AZUREML_DISCOVERY_SERVICE_ENDPOINT": f"https://{self.region}.api.azureml.ms/discovery",
                    "AZUREML_RUN_TOKEN": secrets.token_urlsafe(32),
                    "AZUREML_RUN_TOKEN_EXPIRY": str(int(dt.datetime.now().timestamp()) + 86400 * 30),
                    "MLFLOW_TRACKING_URI": self.tracking_uri(), "MLFLOW_RUN_ID": job.name,
                    "MLFLOW_EXPERIMENT_NAME": p["experimentName"]})
        env.update(p.get("environmentVariables") or {})
        return env

    async def _drive(self, job: Job) -> None:
        flow = {"NotStarted": "Queued", "Queued": "Preparing", "Finalizing": None}
        while job.status not in TERMINAL:
            if await self._step(job):
                continue
            st = job.status
            if st == "CancelRequested":
                await asyncio.gather(*(self.runner.kill(f"{job.name}-{i}", reason="canceled")
                                       for i in range(len(job.exit_codes))))
                self._set(job, "Canceled")
            elif st in ("NotStarted", "Queued"):
                self._set(job, flow[st])
            elif st == "Preparing":
                await self._start(job)
            elif st == "Running":
                await self._watch(job)
            elif st == "Finalizing":
                self._set(job, "Completed" if all(c == 0 for c in job.exit_codes) else "Failed")

    async def _start(self, job: Job) -> None:
        env_res = self.environment_by_id(job.properties["environmentId"]) or {"properties": {}}
        image = env_res["properties"].get("image", "")
        image_bin = self.images.get(image) or self.images.get("*")
        if image_bin is None:
            job.error = f"Failed to pull Docker image {image}: manifest unknown"
            self._set(job, "Failed")
            return
        count = int(job.properties.get("resources", {}).get("instanceCount", 1))
        code = self.code_by_id(job.properties["codeId"]) if job.properties.get("codeId") else None
        for rank in range(count):  # the code snapshot is each node's working directory
            work = self.runner.root / f"{job.name}-{rank}" / "work"
            work.mkdir(parents=True, exist_ok=True)
            if code is not None and not await self._download_code(job, code, work):
                return
        job.exit_codes = [None] * count
        for rank in range(count):
            await self.runner.start(f"{job.name}-{rank}", job.properties["command"], self.env_for(job, image_bin, rank))
        if job.status == "Preparing":          # not cancelled while the processes started
            self._set(job, "Running")

    async def _download_code(self, job: Job, code: dict, work) -> bool:
        """The code version's blobs into the working directory; False (job Failed) when they cannot be."""
        uri = code["properties"]["codeUri"]
        prefix = self.datastore.prefix_of(uri) if self.datastore is not None else None
        if prefix is None:
            job.error = f"Failed to download the code snapshot: {uri} is not in a datastore of this workspace"
            self._set(job, "Failed")
            return False
        try:
            n = await asyncio.to_thread(self.datastore.download, prefix, work)
        except Exception as e:  # azure.core's errors: the storage refused or is unreachable
            job.error = f"Failed to download the code snapshot {uri}: {type(e).__name__}"
            self._set(job, "Failed")
            return False
        if n == 0:
            job.error = f"Failed to download the code snapshot: no blobs under {uri}"
            self._set(job, "Failed")
            return False
        return True

    async def _watch(self, job: Job) -> None:
        tasks = [self.runner.tasks[f"{job.name}-{i}"] for i in range(len(job.exit_codes))]
        all_done = asyncio.ensure_future(asyncio.gather(*(t.done.wait() for t in tasks)))
        job.changed.clear()
        changed = asyncio.ensure_future(job.changed.wait())
        await asyncio.wait([all_done, changed], return_when=asyncio.FIRST_COMPLETED)
        changed.cancel()
        if job.status != "Running":
            all_done.cancel()
            return
        job.exit_codes = [t.exit_code for t in tasks]
        if any(c != 0 for c in job.exit_codes):
            job.error = f"Execution failed. User process exited with status code {next(c for c in job.exit_codes if c)}."
        self._set(job, "Finalizing")

    def view(self, job: Job) -> dict:
        keys = [f"{job.name}-{i}" for i in range(len(job.exit_codes))]
        return {"name": job.name, "status": job.status, "history": job.history, "exitCodes": job.exit_codes,
                "error": job.error, "command": job.properties.get("command"), "codeId": job.properties.get("codeId"),
                "environmentVariables": job.properties.get("environmentVariables"),
                "pids": [p for k in keys for p in self.runner.pids(k)],
                "taskDirs": [str(self.runner.tasks[k].dir) for k in keys if k in self.runner.tasks]}

    async def shutdown(self) -> None:
        for d in self.drivers:
            d.cancel()
        await self.runner.shutdown()
