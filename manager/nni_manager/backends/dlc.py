"""platform: dlc — trials in Alibaba Cloud PAI-DLC jobs, through PAI-DLC's OpenAPI (2020-12-03).

NNI 2.x/3.0 configs run unchanged (`examples/trials/mnist-pytorch/config_dlc.yml`). One DLC job
per environment (`nni_exp_<exp>_env_<n>`, a pool of up to trialConcurrency jobs running trial
after trial, as NNI's reusable DLC environments did), created with the official SDK
(`alibabacloud_pai_dlc20201203`, the client NNI's dlcUtil.py used), signed with the AccessKey
(ACS3-HMAC-SHA256). Each of the job's `podCount` pods runs one agent that dials the manager's
TLS hub at `nniManagerIp`; code and parameters travel over the agent stream, so no NAS copy of
the code is needed (`localStorageMountPoint` / `containerStorageMountPoint` are accepted; the
NAS data source is still mounted in the job for the trial's data, as in NNI).

- The AccessKey pair is a secret: only in the SDK's memory, never in a job, log or error.
- DLC has no secret store a job can mount: the agent's credential in the job's command is
  single-use (the hub accepts it once), as for DLTS and AML.
- Status: one ListJobs call (DisplayName prefix of the experiment) per poll, mapped as NNI
  mapped GetJob's status; StopJob to stop, as NNI did.
"""
from __future__ import annotations

import ast
import asyncio
import json
import logging
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nni_manager.backends.base import EnvironmentRequest, Role, Shape
from nni_manager.backends.jobs import StateTable
from nni_manager.backends.rest_jobs import (Job, JobView, RestError, RestJobBackend, agent_boot, literal_secret_lines,
                                             parse_watch_fields)
from nni_manager.config import ConfigError, ConfigSection, ExperimentConfig

if TYPE_CHECKING:
    from alibabacloud_pai_dlc20201203.client import Client
    from alibabacloud_pai_dlc20201203.models import CreateJobRequest
    from darabonba.runtime import RuntimeOptions

JOB_TYPES = ("TFJob", "PyTorchJob")  # NNI's choices (dlcUtil.py)
# DLC's job states -> the REST-job phases (NNI: dlcEnvironmentService.ts refreshEnvironmentsStatus)
STATES = StateTable.of(
    waiting=["Creating", "Created", "Queuing", "Waiting", "Dequeued", "EnvPreparing", "SanityChecking"],
    running=["Running", "Restarting"], succeeded=["Succeeded", "Completed"], failed=["Failed"],
    stopped=["Stopping", "Stopped"])
PAGE_SIZE = 100
log = logging.getLogger(__name__)
FIXES = {
    "InvalidAccessKeyId.NotFound": "check trainingService.accessKeyId (an AccessKey of the account or a RAM user)",
    "InvalidAccessKeyId.Inactive": "enable that AccessKey in the RAM console, or use an active one",
    "SignatureDoesNotMatch": "check trainingService.accessKeySecret: it does not belong to accessKeyId",
    "IncompleteSignature": "check trainingService.accessKeySecret: it does not belong to accessKeyId",
    "Forbidden.RAM": "grant the RAM user the AliyunPAIDLCFullAccess policy (or the workspace's developer role)",
    "NoPermission": "grant the RAM user the AliyunPAIDLCFullAccess policy (or the workspace's developer role)",
}


@dataclass
class DlcConfig:
    type: str = "Worker"
    image: str = ""
    job_type: str = "TFJob"
    pod_count: int = 1
    ecs_spec: str = ""
    resource: dict[str, object] | None = None  # ecsSpec's "{'resource_id': ..., 'cpu': ...}" form
    region: str = ""
    workspace_id: str | None = None
    nas_data_source_id: str = ""
    oss_data_source_id: str | None = None
    access_key_id: str = ""
    access_key_secret: str = field(default="", repr=False)
    local_storage_mount_point: str = ""
    container_storage_mount_point: str = ""
    endpoint: str = ""  # host[:port] of the OpenAPI endpoint (default: by region)
    ca_file: str | None = None  # PEM trusted for a private endpoint
    poll_interval: float | None = None
    connect_timeout: float | None = None

    def __repr__(self) -> str:
        return (f"DlcConfig(region={self.region!r}, workspace_id={self.workspace_id!r}, job_type={self.job_type!r}, "
                f"pod_count={self.pod_count}, access_key_id={self.access_key_id!r})")


def _resource(spec: str, ts: ConfigSection) -> dict[str, object] | None:
    """NNI's second ecsSpec form: a Python dict literal naming a resource group's quota."""
    if not (spec.startswith("{") and spec.endswith("}")):
        return None
    try:
        value = ast.literal_eval(spec)
    except (ValueError, SyntaxError) as e:
        raise ConfigError(ts.at("ecsSpec"), f"is not a valid mapping ({e})",
                          "write e.g. \"{'resource_id': 'rg...', 'cpu': 2, 'memory': 8, 'gpu': 0}\"") from None
    if not isinstance(value, dict) or not value.get("resource_id"):
        raise ConfigError(ts.at("ecsSpec"), "names no resource_id", "add 'resource_id': '<your resource group id>'")
    return value


def parse_dlc(ts: ConfigSection, config: ExperimentConfig) -> DlcConfig:
    out = DlcConfig()
    out.type = ts.str_("type") or "Worker"
    out.image = ts.str_("image", required=True) or ""
    out.job_type = ts.str_("jobType") or "TFJob"
    if out.job_type not in JOB_TYPES:
        raise ConfigError(ts.at("jobType"), f"must be one of {', '.join(JOB_TYPES)}, got {out.job_type!r}",
                          "write jobType: PyTorchJob or TFJob")
    out.pod_count = ts.int_("podCount", minimum=1, required=True) or 1
    out.ecs_spec = ts.str_("ecsSpec", required=True) or ""
    out.resource = _resource(out.ecs_spec, ts)
    out.region = ts.str_("region", required=True) or ""
    workspace = ts.str_("workspaceId", required=True) or ""
    out.workspace_id = None if workspace == "None" else workspace  # NNI's dlcUtil.py: the string None = no workspace
    out.nas_data_source_id = ts.str_("nasDataSourceId", required=True) or ""
    out.oss_data_source_id = ts.str_("ossDataSourceId") or None
    out.access_key_id = ts.str_("accessKeyId", required=True) or ""
    out.access_key_secret = ts.str_("accessKeySecret", required=True) or ""
    for name in ("localStorageMountPoint", "containerStorageMountPoint"):
        value = ts.str_(name, required=True) or ""
        if not value.startswith("/"):
            raise ConfigError(ts.at(name), f"must be a full path, got {value!r}", "write an absolute path, e.g. /root/data/")
        setattr(out, "local_storage_mount_point" if name.startswith("local") else "container_storage_mount_point", value)
    out.endpoint = ts.str_("endpoint") or (
        "pai-dlc-share.aliyuncs.com" if out.region == "share" else f"pai-dlc.{out.region}.aliyuncs.com")
    ca = ts.path_("caFile")
    out.ca_file = str(ca) if ca is not None else None
    out.poll_interval, out.connect_timeout = parse_watch_fields(ts)
    return out


class DlcBackend(RestJobBackend[DlcConfig, "CreateJobRequest"]):
    platform = "dlc"
    service = "PAI-DLC"
    states = STATES
    single_use_credentials = True
    secret_words = RestJobBackend.LITERAL_SECRET_WORDS

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.client: Client | None = None

    options_type = DlcConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> DlcConfig:
        return parse_dlc(section, config)

    def shape(self) -> Shape:
        return Shape((Role("", self.opts.pod_count),))

    # ------------------------------------------------------------------ the SDK
    def _runtime(self, retry: bool) -> RuntimeOptions:
        from darabonba.runtime import RuntimeOptions

        return RuntimeOptions(autoretry=retry, max_attempts=3 if retry else 1, read_timeout=30000,
                              connect_timeout=10000, ca=self.opts.ca_file)

    async def _call(self, action: str, method: str, *args: object, retry: bool = True) -> Any:  # the SDK's models
        """One OpenAPI call through the SDK; its errors become one line in DLC's words."""
        from alibabacloud_tea_openapi.exceptions import AlibabaCloudException
        from darabonba.exceptions import DaraException

        try:
            reply = await getattr(self.client, f"{method}_with_options_async")(*args, {}, self._runtime(retry))
        except (AlibabaCloudException, DaraException) as e:
            data = getattr(e, "data", None) or {}
            code = str(data.get("Code") or getattr(e, "code", "") or "")
            words = str(data.get("Message") or getattr(e, "message", "") or e)
            # one line: the gateway appends its string-to-sign (two lines) to a signature mismatch
            words = " ".join(words.partition(" server string to sign is:")[0].split())
            status = int(getattr(e, "status_code", 0) or 0)
            fix = FIXES.get(code, "")
            raise RestError(f"PAI-DLC {action}: {code or 'error'}: {words}" + (f"; {fix}" if fix else ""),
                            status, code) from None
        except (OSError, asyncio.TimeoutError) as e:
            raise RestError(f"PAI-DLC {action}: cannot reach {self.opts.endpoint} ({type(e).__name__}: {e})") from None
        return reply.body

    def preflight(self) -> None:
        try:
            import alibabacloud_pai_dlc20201203.client  # noqa: F401 - what open() needs, imported once here
            import alibabacloud_tea_openapi.models  # noqa: F401
        except ImportError as e:
            raise ConfigError("trainingService.platform", f"dlc needs Alibaba Cloud's PAI-DLC SDK, which cannot be "
                              f"imported ({e})", "`pip install 'nni-agent[dlc]'` (alibabacloud_pai_dlc20201203) "
                              "next to nni-manager") from None

    async def open(self) -> None:
        from alibabacloud_pai_dlc20201203.client import Client
        from alibabacloud_pai_dlc20201203.models import ListJobsRequest
        from alibabacloud_tea_openapi.models import Config

        o = self.opts
        self.client = Client(Config(access_key_id=o.access_key_id, access_key_secret=o.access_key_secret,
                                    region_id=None if o.region == "share" else o.region, endpoint=o.endpoint,
                                    protocol="https", ca=o.ca_file))
        # the credentials and workspace, checked once: a wrong key is one line now, not a failed trial later
        await self._call("ListJobs", "list_jobs", ListJobsRequest(workspace_id=o.workspace_id, page_size=1))

    async def close(self) -> None:
        self.client = None

    async def manager_address(self) -> str | None:
        """Without `nniManagerIp` (NNI then took this machine's default address): the address this
        machine reaches the DLC endpoint from, which jobs in the same VPC can dial back."""
        host, _, port = self.opts.endpoint.rpartition(":")
        if not port.isdigit():
            host, port = self.opts.endpoint, "443"

        def probe() -> str:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((host, int(port)))  # a UDP "connect" sends nothing
                return str(s.getsockname()[0])

        try:
            address = await asyncio.to_thread(probe)
        except OSError:
            return None
        log.warning("nniManagerIp is not set: the agents in PAI-DLC jobs will dial %s (where this machine reaches "
                    "%s from); set nniManagerIp if the jobs cannot reach it", address, self.opts.endpoint)
        return address

    # ------------------------------------------------------------------ jobs
    def _agent_id(self, env: EnvironmentRequest) -> str:
        """The agent id a pod can tell on its own: one pod, the environment; several, its rank."""
        if len(env.members) == 1:
            return env.members[0].agent_id
        if self.opts.job_type == "PyTorchJob":
            return f"{env.env_id}-${{RANK:-0}}"
        return f"{env.env_id}-$NNI_DLC_INDEX"

    def job_request(self, env: EnvironmentRequest, name: str) -> CreateJobRequest:
        from alibabacloud_pai_dlc20201203.models import CreateJobRequest, DataSourceItem, JobSpec, ResourceConfig

        o = self.opts
        m = env.members[0]
        token_lines, ca_lines = literal_secret_lines(m.token, m.ca_certificate)
        if len(env.members) > 1:  # several pods: each its own single-use credential, by index
            token_lines = ["case \"$NNI_DLC_INDEX\" in"] + [
                f"  {i}) {literal_secret_lines(s.token, b'')[0][0]} ;;" for i, s in enumerate(env.members)] + ["esac"]
        lines = []
        if len(env.members) > 1 and o.job_type == "TFJob":  # TF_CONFIG's task index, without Python
            lines.append('NNI_DLC_INDEX=$(printf "%s" "$TF_CONFIG" | sed -n \'s/.*"index": *\\([0-9]*\\).*/\\1/p\')')
        elif len(env.members) > 1:
            lines.append('NNI_DLC_INDEX=${RANK:-0}')
        lines += agent_boot(hub_address=m.hub_address, agent_id=self._agent_id(env), token_lines=token_lines,
                            tls=bool(m.ca_certificate), ca_lines=ca_lines, orphan_timeout=self.orphan_timeout,
                            single_trial=bool(env.trial_id), env=self.agent_env, image=o.image)
        if o.resource is not None:
            r = o.resource
            spec = JobSpec(type=o.type, image=o.image, pod_count=o.pod_count, resource_config=ResourceConfig(
                cpu=str(r.get("cpu", 1)), memory=f"{r.get('memory', 2)}Gi", gpu=str(r.get("gpu", 0)),
                gputype=str(r.get("gputype", "")), shared_memory=str(r.get("shared_memory", ""))))
        else:
            spec = JobSpec(type=o.type, image=o.image, pod_count=o.pod_count, ecs_spec=o.ecs_spec)
        sources = [DataSourceItem(data_source_type="nas", data_source_id=o.nas_data_source_id)]
        if o.oss_data_source_id:
            sources.append(DataSourceItem(data_source_type="oss", data_source_id=o.oss_data_source_id))
        return CreateJobRequest(display_name=name, job_type=o.job_type, job_specs=[spec], data_sources=sources,
                                user_command="set -eu\n" + "\n".join(lines), workspace_id=o.workspace_id,
                                resource_id=str(o.resource["resource_id"]) if o.resource else None)

    def render_request(self, request: CreateJobRequest) -> str:
        body = request.to_map()
        command = body.get("UserCommand", "")
        for line in command.splitlines():
            if "NNI_AGENT_DIR/token" in line and "printf" in line:
                command = command.replace(line, line.split("printf")[0] + 'printf "%s" <single-use credential> '
                                          '> "$NNI_AGENT_DIR/token"')
        body["UserCommand"] = command
        return (f"# POST https://{self.opts.endpoint}/api/v1/jobs (CreateJob, signed with accessKeyId "
                f"{self.opts.access_key_id})\n" + json.dumps(body, indent=2))

    async def _find(self, name: str) -> dict[str, Any] | None:
        from alibabacloud_pai_dlc20201203.models import ListJobsRequest

        body = await self._call("ListJobs", "list_jobs", ListJobsRequest(
            workspace_id=self.opts.workspace_id, display_name=name, page_size=PAGE_SIZE))
        found = [j.to_map() for j in body.jobs or [] if j.display_name == name]
        return found[0] if found else None

    async def submit(self, job: Job, request: CreateJobRequest) -> None:
        # CreateJob is not idempotent (display names are not unique): after an unclear failure the
        # job may exist, so look for it by name first, and never retry the call itself
        known = await self._find(job.name)
        if known is not None:
            job.ref = str(known.get("JobId", ""))
            return
        body = await self._call("CreateJob", "create_job", request, retry=False)
        if not body.job_id:
            raise RestError(f"PAI-DLC CreateJob: no JobId in the answer (request id {body.request_id})")
        job.ref = str(body.job_id)

    async def cancel(self, job: Job) -> None:
        if not job.ref:
            known = await self._find(job.name)
            job.ref = str(known.get("JobId", "")) if known else ""
            if not job.ref:
                return
        try:
            await self._call("StopJob", "stop_job", job.ref)
        except RestError as e:
            if e.status != 404 and "already" not in str(e).lower():
                raise

    async def ended_words(self, job: Job, view: JobView) -> str:
        """A failed job's words and its failed pod's last line (GetPodLogs): the agent's boot step
        says there in one line why it could not start (a Python without its dependencies), which
        DLC's own reason ("exited with code 3") does not."""
        if view.phase != "failed" or not job.ref:
            return view.words
        from alibabacloud_pai_dlc20201203.models import GetJobRequest, GetPodLogsRequest

        try:
            detail = await self._call("GetJob", "get_job", job.ref, GetJobRequest())
            failed = [p.pod_id for p in detail.pods or [] if p.status == "Failed" and p.pod_id]
            if not failed:
                return view.words
            logs = await self._call("GetPodLogs", "get_pod_logs", job.ref, failed[0], GetPodLogsRequest(max_lines=50))
        except RestError as e:
            log.info("PAI-DLC job %s: cannot read its failed pod's log: %s", job.name, e)
            return view.words
        lines = [line.strip() for line in logs.logs or [] if line.strip()]
        line = next((x for x in reversed(lines) if x.startswith("nni-agent: ")), lines[-1] if lines else "")
        return f"{view.words}: {line[-500:]}" if line else view.words

    def job_url(self, job: Job) -> str:
        # NNI's tracking URL (dlcUtil.py)
        return (f"https://pai-dlc.console.aliyun.com/#/jobs/detail?jobId={job.ref}&regionId={self.opts.region}"
                if job.ref else "")

    async def list_jobs(self) -> dict[str, JobView]:
        from alibabacloud_pai_dlc20201203.models import ListJobsRequest

        out: dict[str, JobView] = {}
        page = 1
        while True:
            body = await self._call("ListJobs", "list_jobs", ListJobsRequest(
                workspace_id=self.opts.workspace_id, display_name=self.prefix, page_number=page, page_size=PAGE_SIZE))
            rows = [j.to_map() for j in body.jobs or []]
            for row in rows:
                name = str(row.get("DisplayName", ""))
                if name.startswith(self.prefix):
                    out[name] = self._view(row)
            if len(rows) < PAGE_SIZE or page * PAGE_SIZE >= int(body.total_count or 0):
                return out
            page += 1

    def _view(self, row: dict[str, Any]) -> JobView:
        name, state, ref = str(row.get("DisplayName")), str(row.get("Status") or ""), str(row.get("JobId") or "")
        reason = " ".join(str(row.get(k)) for k in ("ReasonCode", "ReasonMessage") if row.get(k))
        phase = self.states.phase(state)
        if phase == "stopped":
            words = f"PAI-DLC job {name} ({ref}) was stopped outside this experiment" + (f": {reason}" if reason else "")
        else:
            words = f"PAI-DLC job {name} ({ref}) is {state}" + (f": {reason}" if reason else "")
        return JobView(name, phase, words, ref, settled=state != "Stopping")
