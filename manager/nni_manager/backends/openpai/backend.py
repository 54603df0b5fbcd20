"""platform: openpai — trials in OpenPAI jobs, submitted over PAI's REST API (v2).

Elastic, on the REST-job pattern (`rest_jobs`): one environment = one PAI job whose task role
instances each run one `nni-agent` that dials the manager's TLS hub at `nniManagerIp`. With
reuseMode (the default) a pool of up to trialConcurrency jobs runs trial after trial; without it,
one job per trial (`nni_exp_<exp>_trial_<trial>`), whose agents run `--single-trial` so the job's
state follows the trial's.

- The job protocol is NNI's (`generateJobConfigInYamlFormat`), or a deep copy of the user's own
  (`openpaiConfig`): its task roles become the environment's roles, each instance an agent, the
  role's commands the trial command there; PAI's environment (PAI_CURRENT_TASK_ROLE_NAME, peer
  hosts and ports) reaches the trial through the agent.
- Secrets: each agent's token and the experiment's CA go in the protocol's `secrets`, which PAI
  keeps out of the job config it shows and renders into the command only inside the container;
  the command writes them to 0600 files. The user's PAI token is only ever a request header.
- Status: one `GET /api/v2/jobs?username=` per poll, mapped as NNI mapped PAI's states; a
  FAILED job's exit diagnostics come from its detail, with the agent boot's own one line (image
  without Python or nni-agent) picked from the runtime's error log.
- Rate limit: PAI takes 60 job submissions per hour per user and answers more with 429 and
  `Retry-After: 3600`; the trial then waits (WAITING, saying so and when it is submitted again),
  it is never failed for that.
- Storage: `storageConfigName` is mounted at `containerStorageMountPoint` (PAI's default is
  /mnt/<name>). With `localStorageMountPoint` too (the same storage as this machine mounts it),
  the agent and its dependencies travel through it (`ship_through_storage`): the image needs only
  Python >= 3.8. Without, the image must have them (or install them in the task's own commands
  of a user protocol); the boot step says in one line what it lacks.
"""
from __future__ import annotations

import asyncio
import copy
import datetime as dt
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from nni_manager.backends import agent_deps
from nni_manager.backends.agent_wheel import build_agent_wheel
from nni_manager.backends.base import Completion, EnvironmentRequest, Role, Shape
from nni_manager.backends.openpai.config import OpenpaiConfig, parse_openpai
from nni_manager.backends.rest_jobs import (Job, JobView, Reply, RestClient, RestError, RestJobBackend, StateTable,
                                             agent_boot)
from nni_manager.config import ConfigSection, ExperimentConfig

log = logging.getLogger(__name__)

DEFAULT_ROLE = "taskrole"  # NNI's task role name
API = "/rest-server/api/v2"  # PAI's pylon routes /rest-server/api/* to the rest-server
STATES = StateTable({"WAITING": "waiting", "RUNNING": "running", "STOPPING": "stopped", "STOPPED": "stopped",
               "SUCCEEDED": "succeeded", "FAILED": "failed"})


def _pai_error_words(status: int, body: object) -> tuple[str, str]:
    """PAI's error body is {"code", "message"}; rate limiting answers plain text."""
    if isinstance(body, dict):
        return str(body.get("code", "")), str(body.get("message", ""))[:400]
    return "", str(body or "").strip()[:400]


def _fix_for(status: int, code: str) -> str:
    if status == 401:
        return "check trainingService.token (an application token from the portal's Profile > Tokens)"
    if status == 403:
        return "check trainingService.username and virtualCluster (the user must be allowed to use it)"
    if code == "NoStorageError":
        return "check trainingService.storageConfigName against your storages in the portal"
    return ""


@dataclass(frozen=True)
class Shipped:
    """What lies in the storage, relative to its mount point."""

    wheel: str  # nni-agent/nni_agent-<tag>.whl
    deps: str  # nni-agent/deps-<hash>: one directory per CPython (cp311/...); "" when no wheels were found
    pythons: tuple[str, ...]
    copied: int  # bytes copied now (0: an earlier experiment did)
    sha256: tuple[tuple[str, str], ...] = ()  # the job command's --sha256 (agent wheel, cp311/<wheel>, ...)


def _same_files(directory: Path, want: dict[str, str]) -> bool:
    """`directory` holds exactly `want` ({relative path: sha256}), read back, never taken by its name."""
    try:
        got = {p.relative_to(directory).as_posix(): agent_deps.sha256_file(p)
               for p in directory.rglob("*") if p.is_file() or p.is_symlink()}
    except OSError:
        return False
    return got == want


def ship_through_storage(wheel_dir: Path, wheelhouse: Path | None, local: Path, where: str = "") -> Shipped:
    """The agent wheel and the dependency wheels for every CPython the sources provide, under
    `<local>/nni-agent/` (0700), named for their content, so every experiment after the first copies
    nothing. PAI runs nothing cheaper than a job to learn an image's Python, so each Python's
    wheels lie in their own directory and the job's shell picks its own (agent_deps.PICK_PYTHON_DIR).
    Each directory appears whole or not at all (copied beside, then renamed). What is there already
    is reused only when its content is what would be copied (else it is replaced); the job's
    command carries every file's sha256 besides, which the boot step checks before unpacking."""
    root = local / "nni-agent"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():  # another user's: nothing in it is trusted
        raise agent_deps.DependencyError(
            f"{root} in the storage is not your directory (owner uid {st.st_uid}): the agent is not shipped "
            "through it. Fix: remove it, or use another storageConfigName")
    root.chmod(0o700)
    wheel = build_agent_wheel(wheel_dir)
    copied = 0
    target = root / f"nni_agent-{wheel.tag}.whl"
    wheel_sha = agent_deps.sha256_file(wheel.path)
    if not (target.is_file() and not target.is_symlink() and agent_deps.sha256_file(target) == wheel_sha):
        tmp = root / f".{target.name}.{os.getpid()}.tmp"
        shutil.copyfile(wheel.path, tmp)
        os.replace(tmp, target)
        copied += target.stat().st_size
    per_python = agent_deps.resolve_for_pythons(wheelhouse, where=where)  # none: said on the console
    if not per_python:
        return Shipped(f"nni-agent/{target.name}", "", (), copied, ((target.name, wheel_sha),))
    digests = agent_deps.per_python_digests(per_python)
    digest = hashlib.sha256("".join(f"{n}={d}\n" for n, d in digests).encode()).hexdigest()[:16]
    deps = root / f"deps-{digest}"
    want = {f"{n}.000": d for n, d in digests}  # per_python_layout: cp311/<wheel>.000
    if deps.exists() and not _same_files(deps, want):
        log.warning("%s does not hold the wheels the manager ships (changed or incomplete): replacing it", deps)
        stale = root / f".stale-{os.getpid()}-{deps.name}"
        os.rename(deps, stale)
        shutil.rmtree(stale, ignore_errors=True)
    if not deps.is_dir():
        tmp_dir = Path(tempfile.mkdtemp(prefix=".deps-", dir=root))
        try:
            for rel, f in agent_deps.per_python_layout(per_python):
                (tmp_dir / rel).parent.mkdir(mode=0o700, exist_ok=True)
                shutil.copyfile(f, tmp_dir / rel)
                copied += f.stat().st_size
            os.rename(tmp_dir, deps)
        except OSError:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            if not deps.is_dir():
                raise
            copied = 0  # another experiment got there first
    return Shipped(f"nni-agent/{target.name}", f"nni-agent/{deps.name}", tuple(sorted(per_python)), copied,
                   ((target.name, wheel_sha), *digests))


class OpenpaiBackend(RestJobBackend[OpenpaiConfig, "dict[str, Any]"]):
    platform = "openpai"
    service = "OpenPAI"
    states = STATES
    trial_command_required = False  # task roles of openpaiConfig carry their own commands

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.client: RestClient | None = None
        self._wheel_path: str | None = None  # the agent wheel's path inside containers (shipped through storage)
        self._deps_path = ""  # the dependency wheels' directory (one per CPython) inside containers
        self._sha256: tuple[tuple[str, str], ...] = ()  # of every shipped file: the boot step checks them
        self.shipped_bytes = 0  # copied into the storage by this experiment (benchmarks read it)

    options_type = OpenpaiConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> OpenpaiConfig:
        return parse_openpai(section, config)

    @property
    def reuse(self) -> bool:
        return self.opts.reuse_mode

    def shape(self) -> Shape:
        roles = (self.opts.protocol or {}).get("taskRoles")
        if not roles:
            return Shape()
        shape_roles, min_failed, min_succeeded = [], {}, {}
        for name, role in roles.items():
            shape_roles.append(Role(name, replicas=int(role.get("instances", 1)), command=ROLE_COMMAND))
            completion = role.get("completion") or {}
            # PAI's defaults (0 or null): one failed instance fails the job; all must succeed
            if completion.get("minFailedInstances"):
                min_failed[name] = int(completion["minFailedInstances"])
            if completion.get("minSucceededInstances"):
                min_succeeded[name] = int(completion["minSucceededInstances"])
        return Shape(tuple(shape_roles), Completion(min_failed=min_failed, min_succeeded=min_succeeded))

    # ------------------------------------------------------------------ client
    async def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.opts.token}"}

    async def open(self) -> None:
        self.client = RestClient(self.opts.host, self.service, auth=self._auth, error_words=_pai_error_words,
                                 fix_for=_fix_for)
        # the credentials, now: a wrong token is one clear line at start, not a failed trial later
        await self.client.request("GET", f"{API}/jobs", params={"username": self.opts.username, "limit": "1"})
        o = self.opts
        if o.local_storage_mount_point is not None and o.container_storage_mount_point:
            assert self.ctx is not None
            shipped = await asyncio.to_thread(ship_through_storage, self.ctx.experiment_dir / "agent-wheel",
                                              self.config.agent_wheelhouse, o.local_storage_mount_point,
                                              f"OpenPAI jobs of the image {o.docker_image}")
            inside = o.container_storage_mount_point.rstrip("/")
            self._wheel_path = f"{inside}/{shipped.wheel}"
            self._deps_path = f"{inside}/{shipped.deps}" if shipped.deps else ""
            self._sha256 = shipped.sha256
            self.shipped_bytes = shipped.copied
            log.info("OpenPAI: the agent and its dependencies (for %s) are in the storage at %s (%s)",
                     ", ".join(shipped.pythons) or "no Python", inside,
                     f"copied {shipped.copied / 1e6:.1f} MB" if shipped.copied else "already there")

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    # ------------------------------------------------------------------ the job
    def _agent_lines(self, env: EnvironmentRequest, role: str, members: list[tuple[int, str]]) -> list[str]:
        """Shell that starts this instance's agent: its token picked by task index from the
        secrets PAI renders only inside the container."""
        first = env.members[0]
        index = "${PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX:-${PAI_TASK_INDEX:-0}}"
        token_lines = [f'case "{index}" in']
        for idx, key in members:
            token_lines.append(f"  {idx}) NNI_AGENT_TOKEN_VALUE='<% $secrets.{key} %>' ;;")
        token_lines += ['  *) echo "nni-agent: no agent token for task index $PAI_TASK_INDEX" >&2; exit 3 ;;', "esac",
                        'printf "%s" "$NNI_AGENT_TOKEN_VALUE" > "$NNI_AGENT_DIR/token"; unset NNI_AGENT_TOKEN_VALUE']
        if self.opts.protocol is not None:  # the role's own commands, rendered by PAI, for its trials
            token_lines += role_command_lines(self.opts.protocol["taskRoles"][role]["commands"])
        image = self.opts.docker_image if self.opts.protocol is None else f"of task role {role or DEFAULT_ROLE}"
        ca_lines = ['printf "%s\\n" \'<% $secrets.nni_ca_crt %>\' > "$NNI_AGENT_DIR/ca.crt"']
        return agent_boot(hub_address=first.hub_address, agent_id=f"{env.env_id}-{role}-{index}" if role else env.env_id,
                          token_lines=token_lines, tls=bool(first.ca_certificate), ca_lines=ca_lines,
                          orphan_timeout=self.orphan_timeout, single_trial=bool(env.trial_id),
                          env=self.agent_env, image=image, wheel=self._wheel_path or "", deps_dir=self._deps_path,
                          sha256=self._sha256)

    def job_request(self, env: EnvironmentRequest, name: str) -> dict[str, Any]:
        o = self.opts
        secrets: dict[str, str] = {}
        by_role: dict[str, list[tuple[int, str]]] = {}
        for m in env.members:
            key = f"nni_agent_token_{m.role or DEFAULT_ROLE}_{m.index}"
            secrets[key] = m.token
            by_role.setdefault(m.role, []).append((m.index, key))
        if env.members and env.members[0].ca_certificate:
            secrets["nni_ca_crt"] = env.members[0].ca_certificate.decode().strip()
        if o.protocol is None:
            job: dict[str, Any] = {
                "protocolVersion": 2, "name": name, "type": "job", "jobRetryCount": 0,
                "prerequisites": [{"type": "dockerimage", "uri": o.docker_image, "name": "docker_image_0"}],
                "taskRoles": {DEFAULT_ROLE: {
                    "instances": 1,
                    "completion": {"minFailedInstances": 1},
                    "taskRetryCount": 0,
                    "dockerImage": "docker_image_0",
                    "resourcePerInstance": {"gpu": o.gpus, "cpu": o.cpus, "memoryMB": o.memory_mb},
                    "commands": self._agent_lines(env, "", by_role.get("", [])),
                }},
            }
        else:  # the user's protocol: name replaced, each role's commands run by its agents
            job = copy.deepcopy(o.protocol)
            job["name"] = name
            for role_name, role in job["taskRoles"].items():
                role["commands"] = self._agent_lines(env, role_name, by_role.get(role_name, []))
            job.setdefault("protocolVersion", 2)
            job.setdefault("type", "job")
        given = job.get("secrets")
        user_secrets = given if isinstance(given, dict) else {}
        job["secrets"] = {**user_secrets, **secrets}
        extras = job.setdefault("extras", {})
        if o.storage_config_name:
            storages = extras.setdefault("storages", [])
            if not any(isinstance(s, dict) and s.get("name") == o.storage_config_name for s in storages):
                storage: dict[str, str] = {"name": o.storage_config_name}
                if o.container_storage_mount_point:  # else PAI mounts it at /mnt/<name>
                    storage["mountPath"] = o.container_storage_mount_point
                storages.append(storage)
        extras.setdefault("submitFrom", "nni-manager")
        if o.virtual_cluster:
            job.setdefault("defaults", {})["virtualCluster"] = o.virtual_cluster
        return job

    def render_request(self, request: dict[str, Any]) -> str:
        shown = copy.deepcopy(request)
        shown["secrets"] = {k: "<masked>" for k in shown.get("secrets", {})}
        return (f"# POST {self.opts.host}{API}/jobs  (Content-Type: text/yaml)\n"
                + yaml.safe_dump(shown, sort_keys=False, width=1000))

    async def submit(self, job: Job, request: dict[str, Any]) -> None:
        assert self.client is not None
        body = yaml.safe_dump(request, sort_keys=False, width=1000)
        while not job.released:
            # retried: the name is unique, so a retry after an unclear failure answers 409, not a second job
            # (job names carry the experiment id and a fresh environment id: a 409 is this very job)
            reply = await self.client.request("POST", f"{API}/jobs", data=body, content_type="text/yaml",
                                              retry=True, accept=(409, 429))
            if reply.status != 429:
                return
            await self._rate_limited(job, reply)

    async def _rate_limited(self, job: Job, reply: Reply) -> None:
        """PAI's per-user submission limit (60 an hour): the trial waits, saying why and until when,
        and the job is submitted again then (or as soon as it is released, not at all)."""
        wait = _seconds(reply.headers.get("Retry-After")) or SUBMIT_WINDOW
        at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=wait)
        text = _first_line(reply.body if isinstance(reply.body, str) else str(reply.body)) or "429"
        self._say(job, f"OpenPAI job {job.name} waits for OpenPAI's submission rate limit (60 jobs an hour per "
                       f"user): \"{text}\"; it is submitted again at {at:%H:%M:%S} UTC (Retry-After {wait:g} s)")
        log.warning("OpenPAI refused job %s for its rate limit (429, Retry-After %g s): submitting again at "
                    "%s UTC", job.name, wait, f"{at:%H:%M:%S}")
        deadline = time.monotonic() + wait
        while not job.released and time.monotonic() < deadline:
            await asyncio.sleep(min(1.0, deadline - time.monotonic()))

    def _job_path(self, name: str) -> str:
        return f"{API}/jobs/{quote(self.opts.username, safe='')}~{quote(name, safe='')}"

    async def cancel(self, job: Job) -> None:
        assert self.client is not None
        await self.client.request("PUT", self._job_path(job.name) + "/executionType", json={"value": "STOP"},
                                  accept=(404,))

    def job_url(self, job: Job) -> str:
        return (f"{self.opts.host}/job-detail.html?username={quote(self.opts.username)}"
                f"&jobName={quote(job.name)}")

    async def list_jobs(self) -> dict[str, JobView]:
        assert self.client is not None
        reply = await self.client.request("GET", f"{API}/jobs", params={"username": self.opts.username})
        items = reply.body if isinstance(reply.body, list) else (reply.body or {}).get("data", [])
        out: dict[str, JobView] = {}
        for item in items:
            name = str(item.get("name", ""))
            if name.startswith(self.prefix):
                out[name] = self._view(name, item)
        return out

    def _view(self, name: str, item: dict[str, Any]) -> JobView:
        state = str(item.get("state") or "")
        sub = item.get("subState") or ""
        if not state:  # NNI: an item without a state is a failed job
            return JobView(name, "failed", f"OpenPAI job {name} has no state")
        phase = self.states.phase(state)
        if phase == "running" and item.get("executionType") == "STOP":
            phase = "stopped"
        vc = item.get("virtualCluster") or self.opts.virtual_cluster or "default"
        if phase == "waiting":
            words = (f"OpenPAI job {name} is WAITING{f' ({sub})' if sub else ''} in virtual cluster {vc}: not "
                     f"scheduled yet, the virtual cluster may be full ({self._request_words()})")
        elif phase == "stopped":
            words = (f"OpenPAI job {name} was {state} outside this experiment "
                     "(stopped by a user or an administrator in OpenPAI)")
        elif phase == "unknown":
            words = f"OpenPAI job {name} is {state}{f' ({sub})' if sub else ''}"
        else:
            words = f"OpenPAI job {name} is {state} in virtual cluster {vc}"
        return JobView(name, phase, words, settled=state in ("STOPPED", "SUCCEEDED", "FAILED"))

    def _request_words(self) -> str:
        o = self.opts
        if o.protocol is not None:
            return "the task roles of openpaiConfig"
        return f"asked for {o.gpus} GPU(s), {o.cpus} CPU(s), {o.memory_mb} MB"

    async def ended_words(self, job: Job, view: JobView) -> str:
        if view.phase != "failed" or self.client is None:
            return view.words
        try:
            detail = (await self.client.request("GET", self._job_path(job.name))).body or {}
        except RestError as e:
            return f"{view.words} (its exit diagnostics could not be read: {e})"
        status = detail.get("jobStatus") or {}
        words = f"OpenPAI job {job.name} FAILED"
        if status.get("appExitCode") not in (None, 0):
            words += f" with exit code {status['appExitCode']}"
        spec = status.get("appExitSpec") or {}
        reason = spec.get("reason") or spec.get("phrase") or ""
        boot = _boot_line(status)
        if boot:  # the image lacks Python or nni-agent: the agent boot's own one line says which
            return f"OpenPAI job {job.name} FAILED: {boot}"
        diag = _first_line(status.get("appExitDiagnostics") or "")
        for role in (detail.get("taskRoles") or {}).values():
            for task in role.get("taskStatuses") or []:
                if task.get("containerExitCode") not in (None, 0) and task.get("containerExitDiagnostics"):
                    diag = diag or _first_line(task["containerExitDiagnostics"])
        if reason:
            words += f": {reason}"
        if diag:
            words += f" ({diag[:400]})"
        return words


SUBMIT_WINDOW = 3600.0  # seconds: the rest-server's submission rate-limit window

# A user protocol's role commands stay in the PAI job's command, where PAI renders its template
# variables (<% $parameters.x %>, $script, $data, $output at the rest-server, $secrets in the
# container) as it did for NNI; the agent's boot writes the rendered text to a file, and each
# trial of the role runs that file.
ROLE_COMMAND_ENV = "NNI_PAI_ROLE_COMMAND"
ROLE_COMMAND = f'exec /bin/sh "${ROLE_COMMAND_ENV}"'


def role_command_lines(commands: list[str]) -> list[str]:
    """Shell that writes the role's commands, joined as NNI joined them (` && `), to a private file
    and names it in $NNI_PAI_ROLE_COMMAND: a quoted here-document, so the job's shell expands
    nothing in it (the trial's shell does, with the trial's environment)."""
    text = " && ".join(c.strip() for c in commands)
    end = "NNI_PAI_ROLE_COMMAND_END"
    while end in text.splitlines():
        end += "_"
    return [f"cat > \"$NNI_AGENT_DIR/role-command.sh\" <<'{end}'\n{text}\n{end}",
            f'export {ROLE_COMMAND_ENV}="$NNI_AGENT_DIR/role-command.sh"']


def _seconds(value: str | None) -> float | None:
    try:
        return max(1.0, float(value)) if value else None
    except ValueError:
        return None


def _boot_line(status: dict[str, Any]) -> str:
    """The agent boot's report ("nni-agent: ...") in the runtime's error log of a failed job
    (`appExitMessages.runtime.errorLogs.user`, the tail of the user command's output)."""
    runtime = ((status.get("appExitMessages") or {}).get("runtime") or {})
    logs = (runtime.get("errorLogs") or {}) if isinstance(runtime, dict) else {}
    for line in reversed(str(logs.get("user") or "").splitlines()):
        if line.strip().startswith("nni-agent: "):
            return line.strip()[:500]
    return ""


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return "; ".join(lines[-3:]) if lines else ""
