"""platform: dlts — trials as DLTS (DLWorkspace) jobs, submitted through its dashboard's REST API.

NNI 1.5-2.3 configs run unchanged (v1 only: `trainingServicePlatform: dlts`, `dltsConfig` and
`trial.image`); one DLTS job per trial (`nni_exp_<exp>_trial_<trial>`), as NNI ran it, whose agent
runs `--single-trial` and dials the manager's TLS hub at `nniManagerIp`. No shared work directory is
needed: code and parameters travel over the agent stream.

- Auth: the dashboard's query string `?email=&password=` (the password is DLTS's job token,
  md5(email:masterToken)); it is never logged: errors name the path without the query.
- The job JSON is NNI's (`DLTSJobConfig`), with the agent's start in `cmd`. DLTS has no secret
  store and shows `cmd` to the team, so the agent's credential there is single-use: the hub
  accepts it once and then only that agent's session.
- Status: one listing of the team's jobs per poll (`/api/v2/clusters/{c}/teams/{t}/jobs`), the job
  detail for a job the listing no longer shows; states mapped as NNI mapped them. A paused job
  is stopped (NNI's rule: a trial cannot resume) and its trial ends SYS_CANCELED.

    trainingServicePlatform: dlts
    trial: {command: python3 mnist.py, codeDir: ., gpuNum: 1, image: msranni/nni}
    dltsConfig:
      dashboard: http://dlts-dashboard.example/
      cluster: .default      # optional (DLTS's first cluster)
      team: my-team          # optional: $DLWS_VC_NAME
      email: me@example.com  # optional: $DLWS_USER_EMAIL
      password: <job token>  # optional: $DLTS_JOB_TOKEN
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, TypedDict
from urllib.parse import quote

from nni_manager.backends.base import EnvironmentRequest
from nni_manager.backends.rest_jobs import (Job, JobView, RestClient, RestError, RestJobBackend, StateTable, agent_boot,
                                             literal_secret_lines, parse_watch_fields)
from nni_manager.config import ConfigError, ConfigSection, ExperimentConfig

STATES = StateTable({"unapproved": "waiting", "queued": "waiting", "scheduling": "waiting", "running": "running",
          "finished": "succeeded", "failed": "failed", "error": "failed", "killing": "stopped", "killed": "stopped",
          "pausing": "stopped", "paused": "stopped"})
LIST_LIMIT = 100  # finished jobs the listing returns beside the active ones
# DLTS runs jobs as Kubernetes pods and shows a failed pod's termination message in the job's
# jobStatusDetail: the boot step writes its one line there, the only channel back from a job whose
# image cannot run the agent
TERMINATION_LOG = "/dev/termination-log"


@dataclass
class DltsConfig:
    dashboard: str = ""
    cluster: str = ".default"
    team: str = ""
    email: str = ""
    password: str = field(default="", repr=False)  # the job token: a secret (config.is_secret)
    image: str = "msranni/nni"
    gpus: int = 0
    poll_interval: float | None = None
    connect_timeout: float | None = None

    def __repr__(self) -> str:
        return f"DltsConfig(dashboard={self.dashboard!r}, cluster={self.cluster!r}, team={self.team!r})"


def parse_dlts(ts: ConfigSection, config: ExperimentConfig) -> DltsConfig:
    out = DltsConfig()
    dashboard = ts.str_("dashboard", required=True) or ""
    if not dashboard.startswith(("http://", "https://")):
        raise ConfigError(ts.at("dashboard"), f"is not a URL: {dashboard!r}", "write e.g. http://dlts-dashboard.example/")
    out.dashboard = dashboard if dashboard.endswith("/") else dashboard + "/"  # NNI's URLs are `${dashboard}api/...`
    out.cluster = ts.str_("cluster") or ".default"
    for name, env in (("email", "DLWS_USER_EMAIL"), ("password", "DLTS_JOB_TOKEN"), ("team", "DLWS_VC_NAME")):
        value = ts.str_(name) or os.environ.get(env, "")
        if not value:  # NNI's own words, and the fix
            raise ConfigError(ts.at(name), f"`{name}` field in `dltsConfig` is not configured.",
                              f"set `{name}` in dltsConfig or the {env} environment variable")
        setattr(out, name, value)
    out.image = ts.str_("image", "dockerImage", required=True) or ""
    out.gpus = config.trial_gpu_number or 0
    out.poll_interval, out.connect_timeout = parse_watch_fields(ts)
    return out


def _dlts_error_words(status: int, body: object) -> tuple[str, str]:
    """The dashboard answers Koa's text bodies (403 "Invalid token") or RestAPI's {"error": ...}."""
    if isinstance(body, dict):
        return "", str(body.get("error") or body.get("result") or body)[:400]
    return "", str(body or "").strip()[:400]


def _fix_for(status: int, code: str) -> str:
    if status == 403:
        return "check dltsConfig.email and password (the job token: $DLTS_JOB_TOKEN in a DLTS job)"
    if status == 404:
        return "check dltsConfig.cluster and team"
    return ""


class DltsJobRequest(TypedDict):
    """NNI's DLTSJobConfig, field for field (the dashboard's POST api/clusters/{cluster}/jobs)."""

    team: str
    vcName: str  # noqa: N815 - the dashboard's keys
    userName: str  # noqa: N815
    gpuType: str  # noqa: N815
    jobName: str  # noqa: N815
    resourcegpu: int
    image: str
    cmd: str
    interactivePorts: list[int]  # noqa: N815
    jobType: str  # noqa: N815
    jobtrainingtype: str
    ssh: bool
    ipython: bool
    tensorboard: bool
    workPath: str  # noqa: N815
    enableworkpath: bool
    dataPath: str  # noqa: N815
    enabledatapath: bool
    jobPath: str  # noqa: N815
    enablejobpath: bool
    mountpoints: list[dict[str, str]]
    env: list[dict[str, str]]
    hostNetwork: bool  # noqa: N815
    useGPUTopology: bool  # noqa: N815
    isPrivileged: bool  # noqa: N815
    hostIPC: bool  # noqa: N815
    preemptionAllowed: str  # noqa: N815


class DltsBackend(RestJobBackend[DltsConfig, DltsJobRequest]):
    platform = "dlts"
    service = "DLTS"
    states = STATES
    single_use_credentials = True
    secret_words = RestJobBackend.LITERAL_SECRET_WORDS

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.client: RestClient | None = None
        self.gpu_type = "<gpuType>"

    options_type = DltsConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> DltsConfig:
        return parse_dlts(section, config)

    @property
    def reuse(self) -> bool:
        return False  # NNI's DLTS service ran one job per trial

    async def _get(self, path: str, **params: str) -> Any:  # the dashboard's answers, shaped per API
        assert self.client is not None
        return (await self.client.request("GET", path, params={**self._auth_query(), **params})).body

    def _auth_query(self) -> dict[str, str]:
        return {"email": self.opts.email, "password": self.opts.password}

    async def open(self) -> None:
        o = self.opts
        self.client = RestClient(o.dashboard, self.service, error_words=_dlts_error_words, fix_for=_fix_for)
        # D1: the team's cluster record; its metadata (a JSON string) names the GPU type first
        record = await self._get(f"/api/teams/{quote(o.team, safe='')}/clusters/{quote(o.cluster, safe='')}")
        try:
            metadata = json.loads((record or {}).get("metadata") or "{}")
        except (TypeError, ValueError):
            metadata = {}
        if not metadata:
            raise RestError(f"DLTS team {o.team} on cluster {o.cluster} has no GPU type in its metadata "
                            "(the dashboard's virtual cluster record): ask the cluster's administrator")
        self.gpu_type = next(iter(metadata))

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    def job_request(self, env: EnvironmentRequest, name: str) -> DltsJobRequest:
        o = self.opts
        m = env.members[0]
        token_lines, ca_lines = literal_secret_lines(m.token, m.ca_certificate)
        cmd = agent_boot(hub_address=m.hub_address, agent_id=env.env_id, token_lines=token_lines,
                         tls=bool(m.ca_certificate), ca_lines=ca_lines, orphan_timeout=self.orphan_timeout,
                         single_trial=bool(env.trial_id), env=self.agent_env, image=o.image,
                         message_file=TERMINATION_LOG)
        return {  # NNI's DLTSJobConfig, field for field
            "team": o.team, "vcName": o.team, "userName": o.email, "gpuType": self.gpu_type,
            "jobName": name, "resourcegpu": o.gpus, "image": o.image, "cmd": "\n".join(cmd),
            "interactivePorts": [], "jobType": "training", "jobtrainingtype": "RegularJob",
            "ssh": False, "ipython": False, "tensorboard": False,
            "workPath": "", "enableworkpath": True, "dataPath": "", "enabledatapath": False,
            "jobPath": "", "enablejobpath": True, "mountpoints": [],
            "env": [{"name": "TMPDIR", "value": "$HOME/tmp"}],
            "hostNetwork": False, "useGPUTopology": False, "isPrivileged": False, "hostIPC": False,
            "preemptionAllowed": "False",
        }

    def render_request(self, request: DltsJobRequest) -> str:
        return (f"# POST {self.opts.dashboard}api/clusters/{self.opts.cluster}/jobs?email=...&password=...\n"
                "# (the agent's credential in `cmd` is single-use: spent when the agent enrols)\n"
                + json.dumps(request, indent=2))

    async def submit(self, job: Job, request: DltsJobRequest) -> None:
        assert self.client is not None
        # not retried: DLTS job names are not unique, so a retry could start a second job
        reply = await self.client.request("POST", f"/api/clusters/{quote(self.opts.cluster, safe='')}/jobs",
                                          params=self._auth_query(), json=request, retry=False)
        body = reply.body if isinstance(reply.body, dict) else {}
        if not body.get("jobId"):
            raise RestError(f"DLTS POST api/clusters/{self.opts.cluster}/jobs: "
                            f"{body.get('error') or reply.body or 'no jobId in the answer'}")
        job.ref = str(body["jobId"])

    async def cancel(self, job: Job) -> None:
        assert self.client is not None
        if not job.ref:
            return
        await self.client.request("PUT", f"/api/clusters/{quote(self.opts.cluster, safe='')}/jobs/"
                                          f"{quote(job.ref, safe='')}/status", params=self._auth_query(),
                                  json={"status": "killing"})

    def job_url(self, job: Job) -> str:
        # the 2020 dashboard's route (NNI linked the older /job/{team}/{cluster}/{id})
        return (f"{self.opts.dashboard}jobs/{quote(self.opts.cluster, safe='')}/{quote(job.ref, safe='')}"
                if job.ref else "")

    async def list_jobs(self) -> dict[str, JobView]:
        o = self.opts
        rows = await self._get(f"/api/v2/clusters/{quote(o.cluster, safe='')}/teams/{quote(o.team, safe='')}/jobs",
                               limit=str(LIST_LIMIT))
        return {str(r.get("jobName")): self._view(r) for r in rows or []
                if str(r.get("jobName", "")).startswith(self.prefix) and r.get("userName") in (None, o.email)}

    async def describe(self, job: Job) -> JobView | None:
        """A job the listing no longer shows (it keeps the newest LIST_LIMIT): its detail, by id."""
        if not job.ref:
            return None
        row = await self._get(f"/api/v2/clusters/{quote(self.opts.cluster, safe='')}/jobs/{quote(job.ref, safe='')}")
        return self._view(row) if row else None

    def _view(self, row: dict[str, Any]) -> JobView:
        name, state, ref = str(row.get("jobName")), str(row.get("jobStatus") or ""), str(row.get("jobId") or "")
        detail = row.get("jobStatusDetail") or []
        # a pod's message (k8sUtils.get_pod_status) is "<reason>:\n<termination message>": the boot step's
        # line, for an image that cannot run the agent (it writes /dev/termination-log); one line here
        said = " ".join("; ".join(str(d.get("message")) for d in detail
                                  if isinstance(d, dict) and d.get("message")).split())[:800]
        phase = self.states.phase(state)
        if phase == "stopped":
            words = (f"DLTS job {name} was {'paused' if state.startswith('paus') else 'killed'} outside this "
                     "experiment (by a user or an administrator)")
            if state.startswith("paus"):
                words += "; a paused trial cannot resume, so its job is stopped"
        else:
            words = f"DLTS job {name} ({ref}) is {state}" + (f": {said}" if said else "")
        return JobView(name, phase, words, ref, settled=state not in ("killing", "pausing"))

    async def ended_words(self, job: Job, view: JobView) -> str:
        if "paused" in view.words:
            await self.cancel(job)  # NNI killed paused jobs
        return view.words
