"""DLWorkspace's job table, RestAPI job rules and job manager, with jobs run as local processes.

Rules follow microsoft/DLWorkspace@27d3a3a8: src/utils/JobRestAPIUtils.py (SubmitJob, op_job),
src/utils/job_op.py (which states each operation accepts), src/ClusterManager/job_manager.py
and job_launcher.py (state flow, jobStatusDetail), framework.py (environment of a job's pod).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import hashlib
import os
import posixpath
import uuid
from dataclasses import dataclass, field
from tests.support.emulator_procs import ProcessRunner

ACTIVE = {"unapproved", "queued", "scheduling", "running", "pausing", "paused", "killing"}
TERMINAL = {"finished", "failed", "killed", "error"}
# job_op.py: operation -> (states it accepts, state it sets)
OPS = {
    "killing": ({"unapproved", "queued", "scheduling", "running", "pausing", "paused"}, "killing"),
    "pausing": ({"unapproved", "queued", "scheduling", "running"}, "pausing"),
    "queued": ({"paused"}, "unapproved"),          # resume
    "approved": ({"unapproved"}, "queued"),
}
# RestAPI answers (dlwsrestapi.py KillJob / PauseJob / ResumeJob / ApproveJob)
OP_RESULTS = {
    "killing": ("Success, the job is scheduled to be terminated.", "Cannot Kill the job. Job ID:"),
    "pausing": ("Success, the job is scheduled to be paused.", "Cannot pause the job. Job ID:"),
    "queued": ("Success, the job is scheduled to be resumed.", "Cannot resume the job. Job ID:"),
    "approved": ("Success, the job has been approved.", "Cannot approve the job. Job ID:"),
}


def job_token(email_addr: str, master_token: str) -> str:
    """hex(md5('<email>:<masterToken>')): the dashboard password and the job's DLTS_JOB_TOKEN."""
    return hashlib.md5(f"{email_addr}:{master_token}".encode()).hexdigest()


def localized_now() -> str:
    """k8sUtils.localize_time(datetime.now()): ISO 8601 with +00:00."""
    return dt.datetime.now(dt.timezone.utc).isoformat()


def with_finished_time(detail: list | None, status: str, msg: str = "") -> list:
    """job_launcher.job_status_detail_with_finished_time."""
    detail = [dict(d) for d in detail] if detail else [{}]
    at = localized_now()
    change = f"{status} at {at}. {msg}"
    for d in detail:
        d.setdefault("startedAt", at)
        d.setdefault("finishedAt", at)
        d["message"] = d["message"] + "\n" + change if "message" in d else change
    return detail


@dataclass
class Job:
    id: str
    name: str
    user: str
    vc: str
    cluster: str
    params: dict
    status: str = "unapproved"
    detail: list | None = None
    error_msg: str | None = None
    created: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    history: list[dict] = field(default_factory=list)
    attempt: int = 0
    exit_code: int | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self) -> dict:
        """A row of GetJobDetailV2 (MySQLDataHandler.GetJobV2), as Flask's jsonify renders it."""
        return {"jobId": self.id, "jobName": self.name, "userName": self.user, "vcName": self.vc,
                "jobStatus": self.status, "jobStatusDetail": self.detail,
                "jobType": self.params.get("jobType", "training"),
                "jobTime": email.utils.format_datetime(self.created, usegmt=True),
                "jobParams": self.params, "insight": None}


class SubmitError(Exception):
    pass


def _check_path(params: dict, key: str, what: str, user_alias: str, default: str) -> None:
    """The jobPath/workPath/dataPath rules of SubmitJob."""
    value = params.get(key)
    if value is None or len(str(value).strip()) == 0:
        value = params[key] = default
    if ".." in value:
        raise SubmitError(f"ERROR: '..' cannot be used in {what} directory")
    if "\\." in value:
        raise SubmitError(f"ERROR: invalided {what} directory")
    if value.startswith("/") or value.startswith("\\"):
        raise SubmitError(f"ERROR: {what} directory should not start with '/' or '\\' ")
    if key != "dataPath" and not value.startswith(user_alias):
        params[key] = os.path.join(user_alias, value)


def _to_bool(value) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1", "yes", "y")


class JobManager:
    """The job table plus ClusterManager's job manager, one coroutine per job."""

    def __init__(self, runner: ProcessRunner, master_token: str, images: dict[str, str], step: float,
                 base_env: dict[str, str]):
        self.runner, self.master_token, self.images, self.step = runner, master_token, images, step
        self.base_env = base_env
        self.jobs: dict[str, Job] = {}
        self.hold: str | None = None
        self.hold_changed = asyncio.Event()
        self.drivers: list[asyncio.Task] = []

    # ------------------------------------------------------------ RestAPI /PostJob
    def submit(self, params: dict, cluster: str, has_access) -> Job:
        """JobRestAPIUtils.SubmitJob; raises SubmitError with the RestAPI's message."""
        params = dict(params)
        if "jobName" not in params or len(str(params["jobName"]).strip()) == 0:
            raise SubmitError("ERROR: Job name cannot be empty")
        if "vcName" not in params or len(str(params["vcName"]).strip()) == 0:
            raise SubmitError("ERROR: VC name cannot be empty")
        params["preemptionAllowed"] = _to_bool(params.get("preemptionAllowed", False))
        job_id = str(params.get("jobId") or uuid.uuid4())
        params["jobId"] = job_id
        gpus = params.get("resourcegpu", 0)
        if isinstance(gpus, str):
            gpus = int(gpus) if gpus.strip() else 0
        params["resourcegpu"] = gpus
        alias = params["userName"].split("@")[0]
        if not has_access(params["userName"], params["vcName"].strip()):
            raise SubmitError("Access Denied!")
        params.setdefault("cmd", "")
        _check_path(params, "jobPath", "job", alias,
                    f"{alias}/jobs/{dt.datetime.now():%y%m%d}/{job_id}")
        _check_path(params, "workPath", "work", alias, ".")
        _check_path(params, "dataPath", "data", alias, ".")
        for k in ("dataPath", "workPath", "jobPath"):
            params[k] = posixpath.normpath(posixpath.join("/", params[k].replace("\\", "/")))[1:]
        job = Job(job_id, params["jobName"], params["userName"], params["vcName"].strip(), cluster, params)
        self.jobs[job_id] = job
        self._set(job, "unapproved", None)
        self.drivers.append(asyncio.ensure_future(self._drive(job)))
        return job

    # ------------------------------------------------------------ RestAPI job operations
    def operate(self, job_id: str, user: str, status: str, is_admin) -> str:
        """op_job: the RestAPI's `result` string for a status change asked through the dashboard."""
        ok, fail = OP_RESULTS[status]
        job = self.jobs.get(job_id)
        if job is None or not (job.user.lower() == user.lower() or is_admin(user, job.vc)):
            return fail + job_id
        from_states, to_state = OPS[status]
        if job.status not in from_states:
            return fail + job_id
        self._set(job, to_state, job.detail)
        return ok

    def force(self, job: Job, status: str) -> None:
        """Test control: put a job into any state (e.g. `error`, or `pausing` as an admin would)."""
        self._set(job, status, job.detail)

    # ------------------------------------------------------------ the job manager
    def _set(self, job: Job, status: str, detail: list | None) -> None:
        job.status, job.detail = status, detail
        job.history.append({"status": status, "time": dt.datetime.now(dt.timezone.utc).isoformat()})
        job.changed.set()

    def set_hold(self, state: str | None) -> None:
        self.hold = state
        self.hold_changed.set()

    async def _wait_change(self, job: Job, *others: asyncio.Future) -> None:
        job.changed.clear()
        hold = asyncio.ensure_future(self.hold_changed.wait())
        changed = asyncio.ensure_future(job.changed.wait())
        waiters = [hold, changed, *others]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in (hold, changed):
                w.cancel()

    async def _pause_step(self, job: Job) -> bool:
        """Sleep one scheduling step, then wait while the job's state is held; True if it changed."""
        before = job.status
        job.changed.clear()
        try:
            await asyncio.wait_for(job.changed.wait(), self.step)
        except asyncio.TimeoutError:
            pass
        while job.status == before and self.hold == before:
            self.hold_changed.clear()
            await self._wait_change(job)
        return job.status != before

    def env_for(self, job: Job, image_bin: str) -> dict[str, str]:
        """framework.gen_container_envs + the job's `env` list (values verbatim, as Kubernetes does)."""
        alias = job.user.split("@")[0]
        env = dict(self.base_env)
        env["PATH"] = image_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        gpus = str(job.params.get("resourcegpu", 0))
        for prefix in ("DLWS", "DLTS"):
            env.update({f"{prefix}_JOB_ID": job.id, f"{prefix}_USER_NAME": alias, f"{prefix}_USER_EMAIL": job.user,
                        f"{prefix}_VC_NAME": job.vc, f"{prefix}_ROLE_NAME": "master", f"{prefix}_NUM_PS": "0",
                        f"{prefix}_NUM_WORKER": "1", f"{prefix}_NUM_GPU_PER_WORKER": gpus,
                        f"{prefix}_UID": "1000", f"{prefix}_GID": "1000"})
        env.update({"FAMILY_TOKEN": str(job.params.get("familyToken", "")), "POD_NAME": job.id,
                    "POD_IP": "127.0.0.1", "DLTS_JOB_TOKEN": job_token(job.user, self.master_token)})
        for item in job.params.get("env") or []:
            if isinstance(item, dict) and "name" in item:
                env[str(item["name"])] = str(item.get("value", ""))
        return env

    async def _drive(self, job: Job) -> None:
        while job.status not in TERMINAL:
            if await self._pause_step(job):
                continue
            st = job.status
            if st == "unapproved":
                self._set(job, "queued", [{"message": "waiting for available resource."}])
            elif st == "queued":
                self._set(job, "scheduling", [{"podName": job.id, "message": "Pod is pending"}])
            elif st == "scheduling":
                await self._launch(job)
            elif st == "running":
                await self._watch(job)
            elif st in ("killing", "pausing"):
                target = "killed" if st == "killing" else "paused"
                await self.runner.kill(f"{job.id}-{job.attempt}", reason=st)
                self._set(job, target, with_finished_time(job.detail, target))
            elif st == "paused":
                await self._wait_change(job)

    async def _launch(self, job: Job) -> None:
        image = str(job.params.get("image", ""))
        image_bin = self.images.get(image) or self.images.get("*")
        if image_bin is None:          # the pod never starts: ErrImagePull keeps it Pending
            job.detail = [{"podName": job.id, "message": f'Back-off pulling image "{image}"',
                           "reason": "ImagePullBackOff"}]
            await self._wait_change(job)
            return
        job.attempt += 1
        await self.runner.start(f"{job.id}-{job.attempt}", str(job.params.get("cmd", "")), self.env_for(job, image_bin),
                                termination_log=True)
        if job.status != "scheduling":          # killed or paused while the pod started
            return
        at = localized_now()
        self._set(job, "running", [{"startedAt": at, "message": f"started at: {at}"}])

    async def _watch(self, job: Job) -> None:
        task = self.runner.tasks[f"{job.id}-{job.attempt}"]
        done = asyncio.ensure_future(task.done.wait())
        await self._wait_change(job, done)
        done.cancel()
        if job.status != "running" or not task.done.is_set():
            return
        job.exit_code = task.exit_code
        # k8sUtils.get_pod_status: a terminated container's reason, then its termination message
        said = self.runner.termination_message(task.key)
        reason = "Completed" if task.exit_code == 0 else "Error"
        job.detail = [{**d, "message": reason + (":\n" + said if said else "")} for d in (job.detail or [{}])]
        if task.exit_code == 0:
            self._set(job, "finished", with_finished_time(job.detail, "finished"))
        else:
            job.error_msg = f"The job failed with exit code {task.exit_code}"
            self._set(job, "failed", with_finished_time(job.detail, "failed"))
        await self.runner.kill(task.key, grace=0.5, reason="pod deleted")   # launcher.delete_job

    async def shutdown(self) -> None:
        for d in self.drivers:
            d.cancel()
        await self.runner.shutdown()

    def view(self, job: Job) -> dict:
        """What /_emulator/jobs shows: the record plus what the real dashboard does not expose."""
        key = f"{job.id}-{job.attempt}"
        task = self.runner.tasks.get(key)
        return {**job.record(), "history": job.history, "attempt": job.attempt, "exitCode": job.exit_code,
                "errorMsg": job.error_msg, "pids": self.runner.pids(key) if task else [],
                "taskDir": str(task.dir) if task else None}
