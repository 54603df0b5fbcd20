"""platform: slurm — trials on an HPC cluster through `sbatch`, `squeue` and `scancel`.

Elastic: one environment = one Slurm job (an allocation of `nodes` nodes) whose batch script
`srun`s one `nni-agent` per node (agent ids `<env>` or `<env>-<SLURM_PROCID>`). With reuseMode
(the default) a pool of up to trialConcurrency allocations runs trial after trial, so the
queue wait is paid once per allocation; without it, one job per trial, whose agents run with
`--single-trial` so the job's own state follows the trial.

- Submission: `sbatch --parsable` with the batch script on stdin; no secret in argv or in the
  script: each agent's token and the experiment's CA are files (0600) in a per-job directory
  (0700) under the experiment directory, which the compute nodes must see (a shared home or
  project file system, as on most clusters). Job names: `nni_exp_<exp>_env_<n>` (reuse) and
  `nni_exp_<exp>_trial_<trial>`, so cleanup finds every job by name prefix, after a manager
  restart too.
- Watching: one `squeue --me -t all` call per poll for all the experiment's jobs. A PENDING
  job's reason (Priority, Resources, QOSMaxGRESPerUser, ...) becomes the WAITING trial's
  message; a job that ends on its own says how in Slurm's words (CANCELLED by someone else,
  TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, BOOT_FAIL); a job RUNNING for
  `agentConnectTimeout` whose agents never dialled the hub is failed and cancelled. Naming,
  re-attach, polling and stop-all are the job pattern of `backends/jobs.py`; this module is its
  submit / list / cancel trio and Slurm's state table.
- A request no partition can satisfy fails at start with Slurm's words (`sbatch --test-only`).
- Where: the Slurm commands run on this host (`hosts.LocalHost`), or with `loginNode` on a login
  node over SSH (`login.LoginNodeHost`): job files go there by SFTP, and the agents reach the hub
  through a relay on the login node and the same SSH connection (TLS end to end).
"""
from __future__ import annotations

import asyncio
import logging
import shlex
import sys
from pathlib import Path
from typing import Any, Dict

from nni_agent.compat import MIN_PYTHON_TEXT
from nni_manager.backends.agent_command import DRY_RUN_SHA256, AgentCommand, Sh
from nni_manager.backends.agent_deps import sha256_file
from nni_manager.backends.agent_wheel import build_agent_wheel
from nni_manager.backends.base import AgentSpec, BackendError, DryRun, EnvironmentRequest, Role, Shape
from nni_manager.backends.jobs import Job, JobBackend, JobView, StateTable
from nni_manager.backends.slurm import deps
from nni_manager.backends.slurm.config import SlurmConfig, parse_slurm
from nni_manager.backends.slurm.hosts import LocalHost, SlurmHost, command_line
from nni_manager.backends.slurm.login import LoginNodeHost
from nni_manager.config import ConfigError, ConfigSection, ExperimentConfig
from nni_manager.hub.relay_token import FILE as RELAY_TOKEN_FILE, relay_token
from nni_manager.ssh.connection import (
    known_hosts_path,
    machine_label,
    proxy_command_line,
)

log = logging.getLogger(__name__)

SEP = "\x1f"  # squeue field separator (unit separator: never in job names or reasons)
# Slurm's job states. An ended job ends its trials FAILED (the trial's own doing: failed, out of
# memory, time limit) or SYS_CANCELED (cancelled by someone else, node failure, preemption); a
# state Slurm adds later counts as ended.
STATES = StateTable.of(
    waiting=("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"),
    running=("RUNNING",),
    unknown=("COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"),  # live, not running
    succeeded=("COMPLETED",),
    failed=("FAILED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE"),
    stopped=("CANCELLED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "SPECIAL_EXIT", "REVOKED"),
    default="stopped",
)

class SlurmError(BackendError):
    """A Slurm command refused something: one line, in Slurm's words."""


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return "; ".join(lines[-3:]) if lines else ""


# What one environment submits: `argv` run in `cwd` with `script` on stdin (`job_name`, `runs_on` for people)
SlurmRequest = Dict[str, Any]


class SlurmBackend(JobBackend[SlurmConfig, SlurmRequest]):
    """The job pattern of `jobs.py` over `sbatch` / `squeue` / `scancel`."""

    platform = "slurm"
    service = "Slurm"
    states = STATES
    errors = (SlurmError,)

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self._host: SlurmHost | None = None
        self._wheel: str | None = None  # the agent wheel as the jobs see it (shipped when set)
        self._wheel_sha256 = ""  # ... and its digest, which the batch script carries
        self._deps: deps.Shipped | None = None  # the agent's dependencies, shipped for pythonPath
        self._relay: str | None = None  # loginNode: host:port of the relay the agents dial
        self._relay_lock = asyncio.Lock()

    options_type = SlurmConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> SlurmConfig:
        return parse_slurm(section, config)

    @property
    def reuse(self) -> bool:
        return self.opts.reuse_mode

    def shape(self) -> Shape:
        return Shape(roles=(Role("", replicas=self.opts.nodes),))

    def preflight(self) -> None:
        if not self.opts.login_node and not self.config.training_service.nni_manager_ip:  # as hub_setup.plan says
            raise ConfigError("nniManagerIp", f"is required for platform {self.platform}",
                              "set it to an address or DNS name of this machine that the workers can reach")

    async def manager_address(self) -> str | None:
        """With loginNode the hub needs no network address: only the SSH forward reaches it."""
        return "127.0.0.1" if self.opts.login_node else None

    def hub_names(self) -> list[str]:
        """The agents dial the relay on the login node: the certificate must carry its name."""
        node = self.opts.login_node
        return [node.relay_address] if node else []

    @property
    def python(self) -> str:
        """The Python that runs the agent in the job: pythonPath; else the manager's own (a shared
        file system), or the compute node's python3 when the manager is elsewhere (loginNode)."""
        return self.opts.python_path or ("python3" if self.opts.login_node else sys.executable)

    # ------------------------------------------------------------------ names and files
    def base_dir(self) -> str:
        if self._host is not None:
            return self._host.base_dir()
        # dry run: the login node's $HOME is read at start (sbatch does not expand ~ in #SBATCH lines)
        return f"<$HOME on the login node>/nni-experiments/{self.experiment_id}" if self.opts.login_node \
            else "<experiment dir>"

    def deps_root(self) -> str:
        """The experiments directory (the experiment's parent): shipped dependencies live there, for
        every experiment."""
        base = self.base_dir()
        return base.rsplit("/", 1)[0] if "/" in base else "<experimentWorkingDirectory>"

    def job_dir(self, name: str) -> str:
        return f"{self.base_dir()}/slurm/{name}"

    def request_words(self) -> str:
        o = self.opts
        words = [f"{o.nodes} node(s)", f"{o.cpus} CPU(s) per node"]
        if o.memory_mb:
            words.append(f"{o.memory_mb} MB per node")
        if o.gpus:
            words.append(f"gpu:{o.gpus} per node")
        if o.time_limit:
            words.append(f"time limit {o.time_limit}")
        where = f"partition {o.partition}" if o.partition else "the default partition"
        return f"{', '.join(words)} in {where}"

    def batch_script(self, env: EnvironmentRequest, name: str, job_dir: str, hub: str, tls: bool) -> str:
        o = self.opts
        q = shlex.quote
        directives = [f"--job-name={name}", f"--nodes={o.nodes}", "--ntasks-per-node=1", f"--cpus-per-task={o.cpus}",
                      f"--output={job_dir}/job.out", "--open-mode=append"]
        if o.memory_mb:
            directives.append(f"--mem={o.memory_mb}M")
        if o.gpus:
            directives.append(f"--gres=gpu:{o.gpus}")
        if o.partition:
            directives.append(f"--partition={o.partition}")
        if o.account:
            directives.append(f"--account={o.account}")
        if o.qos:
            directives.append(f"--qos={o.qos}")
        if o.time_limit:
            directives.append(f"--time={o.time_limit}")
        directives += [opt.strip() for opt in o.sbatch_options]
        # member names (Backend.member_names): <env> alone, or <env>-<index> with index = SLURM_PROCID
        agent = f"{env.env_id}-$SLURM_PROCID" if o.nodes > 1 else env.members[0].agent_id
        # the manager's own agent code, from its wheel (else the manager's own Python has it), verified by
        # the digest this script carries and unpacked into the job's private directory
        wheel = (self._wheel or f"{self.base_dir()}/agent-wheel/nni_agent-<version>-py3-none-any.whl"
                 if self.ships_wheel else "")
        digests = ((Path(wheel).name, self._wheel_sha256 or DRY_RUN_SHA256),) if wheel else ()
        command = AgentCommand(
            agent_id=Sh('"$id"'), manager=hub, token_file=Sh('"$NNI_SLURM_JOB_DIR/$id.token"'),
            relay_token_file=Sh(f'"$NNI_SLURM_JOB_DIR/{RELAY_TOKEN_FILE}"') if self.opts.login_node else "",
            work_dir=Sh('"$NNI_SLURM_JOB_DIR/work-$SLURM_PROCID"'), orphan_timeout=self.orphan_timeout,
            ca_file=Sh('"$NNI_SLURM_JOB_DIR/ca.crt"') if tls else "", single_trial=bool(env.trial_id),
            python=self.python, where=deps.WHERE, wheel=wheel,
            unpack_to=Sh('"$NNI_SLURM_JOB_DIR/agent"') if wheel else "",
            parts=(self._deps.wheels,) if self._deps else (), deps_to=self._deps.lib if self._deps else "",
            sha256=digests + (self._deps.sha256 if self._deps else ()))
        # the boot step inline: one line in the job's log, then the trial's message, for a Python that cannot
        inner = f'id="{agent}"\n' + command.shell()
        lines = ["#!/bin/bash"] + [f"#SBATCH {d}" for d in directives]
        lines.append(f"# nni-agent of experiment {self.experiment_id}, environment {env.env_id}"
                     + (f" (trial {env.trial_id} only)" if env.trial_id else ""))
        lines += o.prologue
        for k, v in self.agent_env.items():
            lines.append(f"export {k}={q(v)}")
        lines.append(f"export NNI_SLURM_JOB_DIR={q(job_dir)}  # tokens (0600), CA, logs; no secret in this script")
        lines.append(f'exec srun --nodes={o.nodes} --ntasks={o.nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 '
                     f'--output="$NNI_SLURM_JOB_DIR/agent-%t.log" /bin/sh -c {q(inner)}')
        return "\n".join(lines) + "\n"

    @property
    def ships_wheel(self) -> bool:
        """Whether jobs run the agent from the manager's wheel (pythonPath, or a login node's Python)."""
        return bool(self.opts.python_path or self.opts.login_node)

    # ------------------------------------------------------------------ the job pattern's trio
    async def open(self) -> None:
        """Reach Slurm (here or on the login node), ship the agent wheel, and ask Slurm whether a
        trial's request fits a partition at all."""
        assert self.ctx is not None
        ctx, node = self.ctx, self.opts.login_node
        max_agents = self.config.trial_concurrency * self.opts.nodes
        host: SlurmHost = (LoginNodeHost(node, ctx.experiment_id, self.orphan_timeout, max_agents,
                                         relay_token=relay_token(ctx.experiment_dir)) if node
                           else LocalHost(ctx.experiment_dir))
        self._host = host
        try:
            await self._open(host)
        except BaseException:
            self._host = None
            await host.close()
            raise

    async def trial_concurrency_changed(self) -> None:
        """The login node's relay pipes as many agents' connections as trialConcurrency allows jobs."""
        if isinstance(self._host, LoginNodeHost):
            await self._host.set_max_agents(self.config.trial_concurrency * self.opts.nodes)

    async def _open(self, host: SlurmHost) -> None:
        assert self.ctx is not None
        node = self.opts.login_node
        await host.open()
        base = f"{host.base_dir()}/slurm"
        await host.make_private_dir(base)
        missing = await host.missing_commands(("sbatch", "squeue", "scancel", "srun"))
        if missing:
            fix = ("install the Slurm client commands there, or fix the login node's PATH for non-interactive SSH "
                   "sessions" if node else "run the manager on a login node, set `loginNode`, or install slurm-client")
            raise SlurmError(f"`{'`, `'.join(missing)}` not found {host.where}: platform slurm runs the Slurm client "
                             f"commands {host.where} ({fix})")
        if self.ships_wheel:
            wheel = await asyncio.to_thread(build_agent_wheel, self.ctx.experiment_dir / "agent-wheel")
            self._wheel = str(wheel.path)
            self._wheel_sha256 = await asyncio.to_thread(sha256_file, wheel.path)
            if isinstance(host, LoginNodeHost):  # by SFTP to the login node's (shared) file system
                await host.make_private_dir(f"{host.base_dir()}/agent-wheel")
                self._wheel = f"{host.base_dir()}/agent-wheel/{wheel.path.name}"
                await host.put_file(str(wheel.path), self._wheel)
            # what pythonPath lacks (grpcio, protobuf, psutil), through the shared file system (see deps.py)
            try:
                self._deps = await deps.ship(host, self.python, self.deps_root(), self.config.agent_wheelhouse)
            except deps.agent_deps.DependencyError as e:
                raise SlurmError(str(e)) from None
        # a request no partition can hold fails now, in Slurm's words, not after a queue wait
        probe = EnvironmentRequest("env0", tuple(
            AgentSpec(agent_id=n, token="", hub_address="", hub_unix_socket=Path("/dev/null"), role=r, index=i)
            for n, r, i in self.member_names("env0")))
        script = self.batch_script(probe, f"{self.prefix}test", base, "127.0.0.1:1", False)
        rc, out, err = await self.run("sbatch", "--test-only", stdin=script, cwd=base)
        if rc != 0:
            words = _one_line(err or out) or f"sbatch --test-only exited {rc}"
            if "contact slurm controller" in words or "establish a configuration source" in words:
                raise SlurmError(f"Slurm's controller cannot be reached {host.where}: {words}; check that slurmctld "
                                 "runs and that SLURM_CONF / slurm.conf names it (`scontrol ping` says), then run again")
            raise SlurmError(f"Slurm refuses a trial's request ({self.request_words()}): {words}")
        if node:  # after a manager restart, running agents redial the relay
            env = next((e for e in self.ctx.environments() if e.members), None)
            if env is not None:
                await self._dial_address(env.members[0].hub_address)

    async def close(self) -> None:
        if self._host is None:
            return
        for job in self.jobs.values():
            await self.forget(job)
        if isinstance(self._host, LoginNodeHost):
            await self._host.stop_relay()
        await self._host.close()

    def build_request(self, env: EnvironmentRequest, hub: str | None = None) -> SlurmRequest:
        """`sbatch --parsable` in the job's directory with the batch script on stdin (no secret in it:
        tokens and the CA are files there), for `provision` and the dry run alike."""
        name = self.job_name(env.env_id, env.trial_id)
        job_dir = self.job_dir(name)
        hub = hub or env.members[0].hub_address
        tls = bool(env.members and env.members[0].ca_certificate)
        node = self.opts.login_node
        return {"argv": ["sbatch", "--parsable"], "cwd": job_dir, "job_name": name,
                "script": self.batch_script(env, name, job_dir, hub, tls),
                "runs_on": f"{machine_label(node)}" if node else "localhost"}

    async def prepare(self, job: Job, env: EnvironmentRequest) -> SlurmRequest:
        """The batch script; the agents' tokens (and the CA) as 0600 files in the job's directory."""
        host = self._host
        assert host is not None
        job_dir = self.job_dir(job.name)
        job.hub = await self._dial_address(env.members[0].hub_address)
        await host.make_private_dir(job_dir)
        tls = bool(env.members and env.members[0].ca_certificate)
        for m in env.members:
            await host.write_private(f"{job_dir}/{m.agent_id}.token", m.token.encode())
        if isinstance(host, LoginNodeHost):  # what the agents prove to the login node's relay
            await host.write_private(f"{job_dir}/{RELAY_TOKEN_FILE}", host.relay_token.encode())
        if tls:
            await host.write_private(f"{job_dir}/ca.crt", env.members[0].ca_certificate)
        request = self.build_request(env, job.hub)
        await host.write_text(f"{job_dir}/batch.sh", request["script"])  # for people; holds no secret
        return request

    async def submit(self, job: Job, request: SlurmRequest) -> None:
        rc, out, err = await self.run(*request["argv"], stdin=request["script"], cwd=request["cwd"])
        if rc != 0:
            raise SlurmError(f"sbatch refused {job.name}: {_one_line(err or out) or f'exit status {rc}'}")
        job.ref = out.strip().split(";")[0]

    async def list_jobs(self) -> dict[str, JobView]:
        """One `squeue --me --states=all` for every job of this experiment Slurm still knows
        (finished ones for MinJobAge); of several jobs of one name, the newest."""
        fmt = SEP.join(("%i", "%j", "%T", "%r", "%N", "%P"))
        rc, out, err = await self.run("squeue", "--me", "--noheader", "--states=all", f"--format={fmt}")
        if rc != 0:
            raise SlurmError(f"squeue failed: {_one_line(err) or f'exit status {rc}'}")
        rows = [dict(zip(("id", "name", "state", "reason", "nodes", "partition"), parts))
                for parts in (line.split(SEP) for line in out.splitlines())
                if len(parts) == 6 and parts[1].startswith(self.prefix)]
        rows.sort(key=lambda r: int(r["id"]) if r["id"].isdigit() else 0)
        return {r["name"]: self._view(r) for r in rows}

    def _view(self, row: dict[str, str]) -> JobView:
        job_id, name, state, reason = row["id"], row["name"], row["state"], row["reason"]
        phase = self.states.phase(state)
        label = f"Slurm job {job_id} ({name})"
        if state == "PENDING":
            words = f"{label} is PENDING ({reason}) for {self.request_words()}"
            if not self.opts.partition and row["partition"]:
                words = words.replace("the default partition", f"partition {row['partition']}")
        elif phase in ("waiting", "running", "unknown"):
            words = f"{label} is {state} on {row['nodes'] or '?'}"
        elif state == "CANCELLED":
            words = f"{label} was CANCELLED outside this experiment (scancel by a user or an administrator)"
        else:
            words = f"{label} ended {state}"
            if reason and reason not in ("None", "NonZeroExitCode"):
                words += f" ({reason})"
        return JobView(name, phase, words, ref=job_id, state=state)

    async def cancel(self, job: Job) -> None:
        if not job.ref:
            return
        rc, out, err = await self.run("scancel", job.ref)
        if rc != 0:
            raise SlurmError(f"scancel {job.ref}: {_one_line(err or out) or f'exit status {rc}'}")

    # ------------------------------------------------------------------ what Slurm says
    def job_label(self, job: Job) -> str:
        return f"Slurm job {job.ref} ({job.name})" if job.ref else f"Slurm job {job.name}"

    def submitted_words(self, job: Job) -> str:
        return f"{self.job_label(job)} is submitted ({self.request_words()})"

    def check_hint(self, job: Job) -> str:
        return (f"check that the compute nodes can reach {self._hub(job)} (nniManagerIp, hubPort, firewalls) "
                f"and that {self.python} there has Python >= {MIN_PYTHON_TEXT} with nni-agent "
                f"({self.job_dir(job.name)}/agent-*.log says which)")

    async def ended_words(self, job: Job, view: JobView) -> str:
        if view.state in ("FAILED", "BOOT_FAIL") and self._host is not None:
            tail = _one_line(await self._host.log_tail(self.job_dir(job.name)))[-400:]
            if tail:
                return f"{view.words}: {tail}"
        return view.words

    async def forget(self, job: Job) -> None:
        if self._host is not None:
            job_dir = self.job_dir(job.name)
            await self._host.remove([f"{job_dir}/{agent_id}.token" for agent_id in job.members]
                                    + [f"{job_dir}/{RELAY_TOKEN_FILE}"])

    async def _dial_address(self, hub: str) -> str:
        """What the agents dial: the hub itself, or (loginNode) the relay in front of it."""
        if not isinstance(self._host, LoginNodeHost):
            return hub
        async with self._relay_lock:
            if self._relay is None:
                host, port = await self._host.ensure_relay(hub)
                self._relay = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return self._relay

    async def run(self, *argv: str, stdin: str | None = None, cwd: str | None = None) -> tuple[int, str, str]:
        assert self._host is not None
        return await self._host.run(argv, stdin=stdin, cwd=cwd)

    # ------------------------------------------------------------------ dry run
    def dry_run_hub(self) -> str:
        node = self.opts.login_node
        if node:  # the relay on the login node, its port chosen at start
            return f"{node.relay_address}:{node.relay_port or '<relay port>'}"
        return super().dry_run_hub()

    def render(self) -> DryRun:
        request = self.build_request(self.dry_run_env())
        submit = command_line(request["argv"], request["cwd"])
        where = self._render_where()
        where_check = "on the login node" if self.opts.login_node else "on this host"
        text = "\n".join([
            f"# slurm: {'a pool of up to' if self.reuse else 'one job per trial, up to'} "
            f"{self.config.trial_concurrency} job(s) like this one",
            *(f"# {line}" for line in where),
            "# at start: `sbatch --test-only` with this script on stdin (a request no partition can hold fails then)",
            f"# each job: `{submit}` with this script on stdin; one `squeue --me --states=all` per poll; `scancel` to stop",
            "# (tokens and the CA are files in the job directory, mode 0600; never in the script)",
            *([f"# at start: `{self.python} - --check` (the boot step) {where_check}; what it lacks (grpcio, protobuf, "
               f"psutil) is shipped as wheels into {self.deps_root()}/{deps.DEPS_DIR}/ once for every experiment, and "
               "the batch script gets `--parts`/`--deps-to`"] if self.ships_wheel else []),
        ]) + "\n" + request["script"]
        return DryRun(self.platform, [request], text)

    def _render_where(self) -> list[str]:
        node = self.opts.login_node
        if node is None:
            return ["Slurm commands run on this host; job files under the experiment directory "
                    "(compute nodes must see it)", "agents dial the hub at nniManagerIp over TLS"]
        proxy = proxy_command_line(node)
        checked = (f"host key checked against {known_hosts_path(node)}" if node.strict_host_key_checking
                   else "host key NOT checked")
        return [
            f"Slurm commands run on login node {machine_label(node)} over SSH "
            f"({'via proxyCommand `' + proxy + '`' if proxy else 'direct'}; {checked})",
            f"job files go there by SFTP, under {self.base_dir()}/ (compute nodes must see it)",
            f"agents dial the relay {node.relay_address}:{node.relay_port or '<any free port>'} on the login node "
            f"({node.python} {self.base_dir()}/nni_slurm_relay.py), which pipes into an SSH remote forward back to the "
            "hub on this manager's 127.0.0.1 (TLS end to end; the hub's certificate names "
            f"{node.relay_address})",
        ]
