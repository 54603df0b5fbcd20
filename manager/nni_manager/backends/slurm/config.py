"""`platform: slurm` config fields (ours; names follow NNI's conventions).

    trainingService:
      platform: slurm
      nniManagerIp: 10.0.0.5      # where the agents on compute nodes reach this manager's hub
      partition: gpu              # optional: the cluster's default partition otherwise
      account: proj42             # optional
      qos: normal                 # optional
      timeLimit: 2h               # per job: Slurm's own format ("1-00:00:00", "90") or 30m / 2h / 1d
      trialCpuNumber: 4           # --cpus-per-task (one task per node)
      trialMemorySize: 16gb       # --mem (per node)
      trialGpuNumber: 1           # GPUs per node, as --gres=gpu:N (top-level trialGpuNumber too)
      nodes: 1                    # nodes per trial: one agent per node, started with srun
      sbatchOptions: ["--constraint=a100"]   # passed through as #SBATCH lines
      prologue: ["module load cuda", "source ~/venv/bin/activate"]  # shell before the agents start
      pythonPath: /usr/bin/python3  # the Python that runs the agent (default: the manager's own)
      reuseMode: true             # a pool of up to trialConcurrency allocations running trial after trial
      pollInterval: 5s            # how often one `squeue` call looks at all the experiment's jobs
      agentConnectTimeout: 10m    # a job RUNNING this long without its agents dialling in fails
      loginNode:                  # optional: drive the cluster over SSH (a machineList entry's fields)
        host: login.hpc.example.edu
        user: alice
        sshKeyFile: ~/.ssh/id_ed25519
        relayHost: login01        # optional: the login node's address as compute nodes reach it (default: host)
        relayPort: 0              # optional: the relay's port there (default: any free one, kept across restarts)
        pythonPath: python3       # optional: the login node's Python for the relay
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nni_manager.backends.jobs import parse_watch_fields
from nni_manager.config import MISSING, ConfigError, ConfigSection, ExperimentConfig, parse_duration, parse_size_mb
from nni_manager.ssh.machine import SshMachine, parse_machine

_SLURM_TIME = re.compile(r"(UNLIMITED|INFINITE|\d+(-\d+)?(:\d+){0,2}|\d+-\d+(:\d+){0,2})", re.IGNORECASE)
_OPTION = re.compile(r"--?[A-Za-z]")


@dataclass
class LoginNode(SshMachine):
    """`loginNode`: where the Slurm commands run, reached over SSH; also the relay's host."""

    relay_host: str | None = None  # what compute nodes dial (default: `host`)
    relay_port: int = 0  # 0: any free port, remembered on the login node for restarts
    python: str = "python3"  # runs the relay (stdlib only)

    @property
    def relay_address(self) -> str:
        return self.relay_host or self.host


@dataclass
class SlurmConfig:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None  # Slurm's format, as given to --time
    cpus: int = 1  # per node (= per task: one task per node)
    memory_mb: int | None = None  # per node; None: the partition's default
    gpus: int = 0  # per node
    nodes: int = 1
    sbatch_options: list[str] = field(default_factory=list)
    prologue: list[str] = field(default_factory=list)
    python_path: str | None = None
    reuse_mode: bool = True
    poll_interval: float = 5.0
    connect_timeout: float | None = None  # agentConnectTimeout (None: the job pattern's default)
    login_node: LoginNode | None = None


def _time_limit(value: object, path: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)  # minutes, as Slurm reads a bare number
    if isinstance(value, str) and _SLURM_TIME.fullmatch(value.strip()):
        return value.strip()
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        try:
            seconds = parse_duration(value, path)
        except ConfigError:
            seconds = None
        if seconds:
            return str(max(1, math.ceil(seconds / 60)))
    raise ConfigError(path, f"is not a time limit: {value!r}",
                      'write minutes (90), Slurm\'s format ("1-00:00:00", "2:00:00") or a duration ("2h")')


def _lines(value: object, path: str, what: str) -> list[str]:
    if isinstance(value, str):
        return value.splitlines()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(path, f"must be a string or a list of strings, got {type(value).__name__}", what)


_SLURM_NAME = re.compile(r"[\w.,:@+-]+")


def _slurm_name(ts: ConfigSection, key: str) -> str | None:
    """A partition, account or QOS name (or a comma list): it becomes an `#SBATCH` line, where a
    newline would add a line of shell to the batch script, so only name characters pass."""
    value = ts.str_(key)
    if value is not None and not _SLURM_NAME.fullmatch(value):
        raise ConfigError(ts.at(key), f"{value!r} is not a Slurm {key} name",
                          f"use the {key}'s name as `sinfo`/`sacctmgr` show it (letters, digits, _ . , : @ + -)")
    return value


def parse_slurm(ts: ConfigSection, config: ExperimentConfig) -> SlurmConfig:
    out = SlurmConfig()
    login = ts.section("loginNode")
    if login is not None:
        out.login_node = _login_node(login)
    out.partition = _slurm_name(ts, "partition")
    out.account = _slurm_name(ts, "account")
    out.qos = _slurm_name(ts, "qos")
    value, path = ts.take("timeLimit")
    if value is not MISSING:
        out.time_limit = _time_limit(value, path)
    out.cpus = ts.int_("trialCpuNumber", "cpuNumber", minimum=1) or 1
    value, path = ts.take("trialMemorySize", "memorySize")
    if value is not MISSING:
        out.memory_mb = parse_size_mb(value, path)
    out.gpus = config.trial_gpu_number or 0
    out.nodes = ts.int_("nodes", "nodeCount", minimum=1) or 1
    value, path = ts.take("sbatchOptions")
    if value is not MISSING:
        out.sbatch_options = _lines(value, path, 'write e.g. `sbatchOptions: ["--constraint=a100"]`')
        for i, opt in enumerate(out.sbatch_options):
            if not _OPTION.match(opt.strip()) or "\n" in opt:
                raise ConfigError(f"{path}[{i}]", f"{opt!r} is not an sbatch option",
                                  'write each option as one item starting with "-", e.g. "--constraint=a100"')
            if re.match(r"--?(J|job-name|o|output|e|error|parsable)\b", opt.strip()):
                raise ConfigError(f"{path}[{i}]", f"{opt!r} is set by nni-manager (job names and logs are its own)",
                                  "remove it")
    value, path = ts.take("prologue")
    if value is not MISSING:
        out.prologue = _lines(value, path, 'write e.g. `prologue: ["module load cuda"]`')
    out.python_path = ts.str_("pythonPath")
    reuse = ts.bool_("reuseMode")
    out.reuse_mode = True if reuse is None else reuse
    poll, out.connect_timeout = parse_watch_fields(ts)
    if poll is not None:
        out.poll_interval = poll
    return out


def _login_node(m: ConfigSection) -> LoginNode:
    node = parse_machine(m, LoginNode)
    node.relay_host = m.str_("relayHost")
    port = m.int_("relayPort", minimum=0)
    if port is not None:
        if port > 65535:
            raise ConfigError(m.at("relayPort"), f"must be a TCP port (1-65535), got {port}",
                              "pick a port the compute nodes may reach on the login node, or leave it out")
        node.relay_port = port
    node.python = m.str_("pythonPath") or node.python
    m.finish()
    return node
