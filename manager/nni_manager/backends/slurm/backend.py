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
  TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, BOOT_FAIL).
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
import time
from dataclasses import dataclass
from pathlib import Path

from nni_manager.backends.agent_command import AgentCommand, Sh
from nni_manager.backends.agent_wheel import build_agent_wheel
from nni_manager.backends.base import (
    AgentSpec, Backend, BackendContext, BackendError, DryRun, EnvironmentRequest, Role, Shape,
)
from nni_manager.backends.slurm.config import SlurmConfig, parse_slurm
from nni_manager.backends.slurm.hosts import LocalHost, SlurmHost, command_line
from nni_manager.backends.slurm.login import LoginNodeHost
from nni_manager.config import ConfigSection, ExperimentConfig
from nni_manager.ssh.connection import (
    known_hosts_path,
    machine_label,
    proxy_command_line,
)

log = logging.getLogger(__name__)

SEP = "\x1f"  # squeue field separator (unit separator: never in job names or reasons)
LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
        "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
# How a job that ended on its own ends its trials: FAILED (the trial's own doing) or SYS_CANCELED.
FAILED_STATES = {"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE"}


class SlurmError(BackendError):
    """A Slurm command refused something: one line, in Slurm's words."""


@dataclass
class Job:
    env_id: str
    name: str
    members: list[str]
    trial_id: str | None = None
    job_id: str | None = None
    done: bool = False
    missing: int = 0
    last_status: str = ""
    released: bool = False


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return "; ".join(lines[-3:]) if lines else ""


class SlurmBackend(Backend):
    platform = "slurm"
    hub = "network"
    elastic = True
    default_reconnect_window = 300.0

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        self.experiment_id = "dryrun"
        self._ctx: BackendContext | None = None
        self._jobs: dict[str, Job] = {}  # by env id
        self._cancelled: set[str] = set()  # job ids we scancel'ed (their end is ours, not news)
        self._poller: asyncio.Task[None] | None = None
        self._host: SlurmHost | None = None
        self._wheel: str | None = None  # the agent wheel as the jobs see it (shipped when set)
        self._relay: str | None = None  # loginNode: host:port of the relay the agents dial
        self._relay_lock = asyncio.Lock()

    @classmethod
    def parse_config(cls, section: ConfigSection, config: ExperimentConfig) -> SlurmConfig:
        return parse_slurm(section, config)

    @property
    def opts(self) -> SlurmConfig:
        return self.platform_options

    @property
    def reuse(self) -> bool:
        return self.opts.reuse_mode

    def shape(self) -> Shape:
        return Shape(roles=(Role("", replicas=self.opts.nodes),))

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
    @property
    def prefix(self) -> str:
        return f"nni_exp_{self.experiment_id}_"

    def job_name(self, env_id: str, trial_id: str | None) -> str:
        if trial_id:
            return f"{self.prefix}trial_{trial_id}"
        return f"{self.prefix}env_{env_id.removeprefix('env')}"

    def base_dir(self) -> str:
        if self._host is not None:
            return self._host.base_dir()
        # dry run: the login node's $HOME is read at start (sbatch does not expand ~ in #SBATCH lines)
        return f"<$HOME on the login node>/nni-experiments/{self.experiment_id}" if self.opts.login_node \
            else "<experiment dir>"

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
        # the manager's own agent code, from its wheel (else the manager's own Python has it)
        shipped = ((self._wheel or f"{self.base_dir()}/agent-wheel/nni_agent-<version>-py3-none-any.whl",)
                   if self.ships_wheel else ())
        command = AgentCommand(
            agent_id=Sh('"$id"'), manager=hub, token_file=Sh('"$NNI_SLURM_JOB_DIR/$id.token"'),
            work_dir=Sh('"$NNI_SLURM_JOB_DIR/work-$SLURM_PROCID"'), orphan_timeout=self.orphan_timeout,
            ca_file=Sh('"$NNI_SLURM_JOB_DIR/ca.crt"') if tls else "", single_trial=bool(env.trial_id),
            python=self.python, paths=shipped, where="the compute node")
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

    async def run(self, *argv: str, stdin: str | None = None, cwd: str | None = None) -> tuple[int, str, str]:
        assert self._host is not None
        return await self._host.run(argv, stdin=stdin, cwd=cwd)

    # ------------------------------------------------------------------ lifecycle
    async def start(self, ctx: BackendContext) -> None:
        self._ctx = ctx
        self.experiment_id = ctx.experiment_id
        node = self.opts.login_node
        max_agents = self.config.trial_concurrency * self.opts.nodes
        host: SlurmHost = (LoginNodeHost(node, ctx.experiment_id, self.orphan_timeout, max_agents) if node
                           else LocalHost(ctx.experiment_dir))
        self._host = host
        try:
            await self._start(ctx, host)
        except BaseException:
            await host.close()
            raise
        self._poller = asyncio.create_task(self._poll_loop(), name="slurm-squeue")

    async def _start(self, ctx: BackendContext, host: SlurmHost) -> None:
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
            wheel = await asyncio.to_thread(build_agent_wheel, ctx.experiment_dir / "agent-wheel")
            self._wheel = str(wheel.path)
            if isinstance(host, LoginNodeHost):  # by SFTP to the login node's (shared) file system
                await host.make_private_dir(f"{host.base_dir()}/agent-wheel")
                self._wheel = f"{host.base_dir()}/agent-wheel/{wheel.path.name}"
                await host.put_file(str(wheel.path), self._wheel)
        # a request no partition can hold fails now, in Slurm's words, not after a queue wait
        probe = EnvironmentRequest("env0", tuple(
            AgentSpec(agent_id=n, token="", hub_address="", hub_unix_socket=Path("/dev/null"), role=r, index=i)
            for n, r, i in self.member_names("env0")))
        script = self.batch_script(probe, f"{self.prefix}test", base, "127.0.0.1:1", False)
        rc, out, err = await self.run("sbatch", "--test-only", stdin=script, cwd=base)
        if rc != 0:
            raise SlurmError(f"Slurm refuses a trial's request ({self.request_words()}): "
                             f"{_one_line(err or out) or f'sbatch --test-only exited {rc}'}")
        await self._reattach()

    async def _reattach(self) -> None:
        """After a manager restart: find the jobs of the environments the core still has; fail those
        whose job is gone; cancel jobs of this experiment nothing wants any more."""
        assert self._ctx is not None
        wanted: dict[str, Job] = {}
        for env in self._ctx.environments():
            name = self.job_name(env.env_id, env.trial_id)
            job = Job(env.env_id, name, [m.agent_id for m in env.members], env.trial_id)
            wanted[name] = job
            self._jobs[env.env_id] = job
            if self.opts.login_node and env.members and self._relay is None:  # running agents redial the relay
                await self._dial_address(env.members[0].hub_address)
        if not wanted:
            rows = await self._squeue()
            stale = [r["id"] for r in rows or [] if r["state"] in LIVE]
            if stale:
                await self._scancel(stale)
            return
        rows = await self._squeue()
        if rows is None:
            return  # slurmctld not answering: the poll loop finds them later
        found: set[str] = set()
        for r in sorted(rows, key=lambda r: int(r["id"]) if r["id"].isdigit() else 0):
            job = wanted.get(r["name"])
            if job is not None:
                job.job_id = r["id"]  # the newest job of that name
                found.add(r["name"])
            elif r["state"] in LIVE:
                log.info("cancelling Slurm job %s (%s): its environment is no longer used", r["id"], r["name"])
                await self._scancel([r["id"]])
        for name, job in wanted.items():
            if name not in found and job.members:
                job.done = True
                self._ctx.agent_failed(job.members[0], f"Slurm job {name} is gone (it ended while the manager was down)")

    async def provision(self, env: EnvironmentRequest) -> None:
        assert self._ctx is not None
        name = self.job_name(env.env_id, env.trial_id)
        job = self._jobs.get(env.env_id)
        if job is not None and job.job_id and not job.done:
            return  # a restarted manager re-provisioning a job that still runs
        host = self._host
        assert host is not None
        job = Job(env.env_id, name, [m.agent_id for m in env.members], env.trial_id)
        self._jobs[env.env_id] = job
        job_dir = self.job_dir(name)
        try:
            dial = await self._dial_address(env.members[0].hub_address)
            await host.make_private_dir(job_dir)
            tls = bool(env.members and env.members[0].ca_certificate)
            for m in env.members:
                await host.write_private(f"{job_dir}/{m.agent_id}.token", m.token.encode())
            if tls:
                await host.write_private(f"{job_dir}/ca.crt", env.members[0].ca_certificate)
            script = self.batch_script(env, name, job_dir, dial, tls)
            await host.write_text(f"{job_dir}/batch.sh", script)  # for people; holds no secret
        except Exception:
            job.done = True
            raise
        rc, out, err = await self.run("sbatch", "--parsable", stdin=script, cwd=job_dir)
        if rc != 0:
            job.done = True
            raise SlurmError(f"sbatch refused {name}: {_one_line(err or out) or f'exit status {rc}'}")
        job.job_id = out.strip().split(";")[0]
        if job.released:  # released while sbatch was answering
            self._cancelled.add(job.job_id)
            await self._scancel([job.job_id])
            return
        for m in job.members:
            self._ctx.agent_status(m, f"Slurm job {job.job_id} ({name}) is submitted ({self.request_words()})")

    async def _dial_address(self, hub: str) -> str:
        """What the agents dial: the hub itself, or (loginNode) the relay in front of it."""
        if not isinstance(self._host, LoginNodeHost):
            return hub
        async with self._relay_lock:
            if self._relay is None:
                host, port = await self._host.ensure_relay(hub)
                self._relay = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return self._relay

    async def release(self, env_id: str) -> None:
        job = self._jobs.get(env_id)
        if job is None:
            return
        job.released = True
        if job.job_id and not job.done:
            self._cancelled.add(job.job_id)
            await self._scancel([job.job_id])
        await self._remove_tokens(job)

    async def _remove_tokens(self, job: Job) -> None:
        if self._host is not None:
            await self._host.remove([f"{self.job_dir(job.name)}/{agent_id}.token" for agent_id in job.members])

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        if self._ctx is None or self._host is None:
            return
        rows = await self._squeue()
        live = [r["id"] for r in rows or [] if r["state"] in LIVE]
        if live:
            self._cancelled.update(live)
            await self._scancel(live)
        deadline = time.monotonic() + self.stop_deadline
        while live and time.monotonic() < deadline:  # the agents end after their grace period
            rows = await self._squeue()
            if rows is not None and not any(r["state"] in LIVE for r in rows):
                break
            await asyncio.sleep(0.5)
        else:
            if live:
                log.error("Slurm jobs of experiment %s are still ending", self.experiment_id)
        for job in self._jobs.values():
            await self._remove_tokens(job)
        if isinstance(self._host, LoginNodeHost):
            await self._host.stop_relay()
        await self._host.close()

    # ------------------------------------------------------------------ Slurm commands
    async def _squeue(self) -> list[dict[str, str]] | None:
        """Every job of this experiment Slurm still knows (finished ones for MinJobAge); None: no answer."""
        fmt = SEP.join(("%i", "%j", "%T", "%r", "%N", "%P"))
        rc, out, err = await self.run("squeue", "--me", "--noheader", "--states=all", f"--format={fmt}")
        if rc != 0:
            log.warning("squeue failed: %s", _one_line(err) or f"exit status {rc}")
            return None
        rows = []
        for line in out.splitlines():
            parts = line.split(SEP)
            if len(parts) == 6 and parts[1].startswith(self.prefix):
                rows.append(dict(zip(("id", "name", "state", "reason", "nodes", "partition"), parts)))
        return rows

    async def _scancel(self, job_ids: list[str]) -> None:
        rc, out, err = await self.run("scancel", *job_ids)
        if rc != 0:
            log.warning("scancel %s: %s", " ".join(job_ids), _one_line(err or out))

    # ------------------------------------------------------------------ watching
    async def _poll_loop(self) -> None:
        while True:
            try:
                await self._poll()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("watching the Slurm jobs")
            await asyncio.sleep(self.opts.poll_interval)

    async def _poll(self) -> None:
        ctx = self._ctx
        assert ctx is not None
        rows = await self._squeue()
        if rows is None:
            return
        by_id = {r["id"]: r for r in rows}
        for job in list(self._jobs.values()):
            if job.job_id is None or job.done:
                continue
            row = by_id.get(job.job_id)
            if row is None:
                job.missing += 1
                if job.missing >= 3:  # several polls in a row: not a glitch
                    await self._ended(job, "", f"Slurm job {job.job_id} ({job.name}) is no longer known to Slurm")
                continue
            job.missing = 0
            state, reason = row["state"], row["reason"]
            if state == "PENDING":
                words = f"Slurm job {job.job_id} ({job.name}) is PENDING ({reason}) for {self.request_words()}"
                if not self.opts.partition and row["partition"]:
                    words = words.replace("the default partition", f"partition {row['partition']}")
            elif state in LIVE:
                words = f"Slurm job {job.job_id} ({job.name}) is {state} on {row['nodes'] or '?'}"
                if state in ("RUNNING", "CONFIGURING"):
                    words += "; its agents are starting"
            else:
                await self._ended(job, state, await self._end_words(job, state, reason))
                continue
            if words != job.last_status:
                job.last_status = words
                for m in job.members:
                    ctx.agent_status(m, words)

    async def _end_words(self, job: Job, state: str, reason: str) -> str:
        words = f"Slurm job {job.job_id} ({job.name}) ended {state}"
        if reason and reason not in ("None", "NonZeroExitCode"):
            words += f" ({reason})"
        if state == "CANCELLED":
            words = (f"Slurm job {job.job_id} ({job.name}) was CANCELLED outside this experiment "
                     "(scancel by a user or an administrator)")
        if state in ("FAILED", "BOOT_FAIL"):
            assert self._host is not None
            tail = _one_line(await self._host.log_tail(self.job_dir(job.name)))[-400:]
            if tail:
                words += f": {tail}"
        return words

    async def _ended(self, job: Job, state: str, words: str) -> None:
        ctx = self._ctx
        assert ctx is not None
        job.done = True
        await self._remove_tokens(job)
        if job.job_id in self._cancelled:
            return  # released by us: the core knows
        failed = state in FAILED_STATES
        for m in job.members:  # the core tells an expected end (its one trial is over) from a loss
            ctx.agent_failed(m, words, failed=failed)

    # ------------------------------------------------------------------ dry run
    def render(self) -> DryRun:
        ts = self.config.training_service
        node = self.opts.login_node
        if node:
            hub = f"{node.relay_address}:{node.relay_port or '<relay port>'}"
        else:
            hub = f"{ts.nni_manager_ip or '<nniManagerIp>'}:{ts.hub_port or '<hubPort>'}"
        env_id = "env1" if self.reuse else "trial-dryrun"
        members = tuple(AgentSpec(agent_id=n, token="", hub_address=hub, hub_unix_socket=Path("/dev/null"),
                                  role=r, index=i) for n, r, i in self.member_names(env_id))
        env = EnvironmentRequest(env_id, members, None if self.reuse else "dryrun")
        name = self.job_name(env_id, env.trial_id)
        job_dir = self.job_dir(name)
        script = self.batch_script(env, name, job_dir, hub, ts.hub_tls)
        argv = ["sbatch", "--parsable"]
        submit = command_line(argv, job_dir)
        where = self._render_where()
        text = "\n".join([
            f"# slurm: {'a pool of up to' if self.reuse else 'one job per trial, up to'} "
            f"{self.config.trial_concurrency} job(s) like this one",
            *(f"# {line}" for line in where),
            "# at start: `sbatch --test-only` with this script on stdin (a request no partition can hold fails then)",
            f"# each job: `{submit}` with this script on stdin; one `squeue --me --states=all` per poll; `scancel` to stop",
            "# (tokens and the CA are files in the job directory, mode 0600; never in the script)",
        ]) + "\n" + script
        request = {"argv": argv, "cwd": job_dir, "job_name": name, "script": script,
                   "runs_on": f"{machine_label(node)}" if node else "localhost"}
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
