"""`platform: openpai` config fields (NNI's, v2 and v1 spellings).

    trainingService:
      platform: openpai
      host: pai.example.com          # https:// is added when no scheme is given
      username: alice
      token: <application token>     # a secret: never stored, logged or shown
      nniManagerIp: 10.0.0.5         # where agents in the job's containers reach this manager's hub
      trialCpuNumber: 2
      trialMemorySize: 8gb           # or "8192mb", or an integer of MB
      trialGpuNumber: 1
      dockerImage: msranni/nni:latest  # must have Python >= 3.8 and nni-agent (or see storage below)
      virtualCluster: default
      reuseMode: true                # a pool of up to trialConcurrency jobs running trial after trial
      openpaiConfig: {...}           # or openpaiConfigFile: your own job protocol (task roles, ...)
      storageConfigName: confignfs   # optional: attached to the job for trials that write outputs there;
      localStorageMountPoint: /mnt/nfs        # with both mount points, the agent and its dependencies
      containerStorageMountPoint: /mnt/confignfs  # travel through that storage (<mount>/nni-agent/), not the image
      pollInterval: 5s               # ours: how often one listing call looks at all the jobs
      agentConnectTimeout: 10m       # ours: a job running this long without its agent dialling in fails

v1 (`trainingServicePlatform: pai`): `paiConfig {userName, token, host, reuse}` and `trial
{cpuNum, memoryMB, gpuNum, image, virtualCluster, paiStorageConfigName, paiConfigPath,
nniManagerNFSMountPath, containerNFSMountPath}`.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nni_manager.backends.rest_jobs import parse_watch_fields
from nni_manager.config import MISSING, ConfigError, ConfigSection, ExperimentConfig, parse_size_mb, yaml_file

DEFAULT_IMAGE = "msranni/nni:latest"  # NNI's default
_ROLE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # the rest-server's pattern for task role names


@dataclass
class OpenpaiConfig:
    host: str = ""
    username: str = ""
    token: str = field(default="", repr=False)
    cpus: int = 1
    memory_mb: int = 0
    gpus: int = 0
    docker_image: str = DEFAULT_IMAGE
    virtual_cluster: str | None = None
    reuse_mode: bool = True
    protocol: dict[str, Any] | None = None  # the user's own job protocol (openpaiConfig / openpaiConfigFile)
    storage_config_name: str | None = None
    local_storage_mount_point: Path | None = None
    container_storage_mount_point: str | None = None
    poll_interval: float | None = None
    connect_timeout: float | None = None

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"OpenpaiConfig(host={self.host!r}, username={self.username!r}, virtual_cluster={self.virtual_cluster!r})"


def canonical_host(host: str) -> str:
    """NNI's rule: `https://` is prepended when the host has no scheme; no trailing slash."""
    host = host.strip().rstrip("/")
    return host if "://" in host else "https://" + host


def parse_openpai(ts: ConfigSection, config: ExperimentConfig) -> OpenpaiConfig:
    out = OpenpaiConfig()
    host = ts.str_("host", required=True)
    assert host is not None
    out.host = canonical_host(host)
    if not re.match(r"https?://[^/\s]+", out.host):
        raise ConfigError(ts.at("host"), f"is not an OpenPAI address: {host!r}", "write e.g. `host: pai.example.com`")
    out.username = ts.str_("username", "userName", required=True) or ""
    password, path = ts.take("passWord", "password")
    token, token_path = ts.take("token")
    if password is not MISSING:
        raise ConfigError(path, "password login (OpenPAI 0.x's v1 token API) is not supported",
                          "create an application token in OpenPAI's web portal (Profile > Tokens) and give it as `token`")
    if token is MISSING or not isinstance(token, str) or not token.strip():
        raise ConfigError(token_path, "is required" if token is MISSING else "must be a non-empty string",
                          "add `token: <your OpenPAI application token>` (from the portal's Profile > Tokens)")
    out.token = token.strip()
    out.cpus = ts.int_("trialCpuNumber", "cpuNum", minimum=1) or 1
    out.protocol = _protocol(ts)
    value, path = ts.take("trialMemorySize", "memoryMB")
    if value is not MISSING:
        out.memory_mb = parse_size_mb(value, path)
    elif out.protocol is None:  # the user's protocol gives each role its resourcePerInstance
        raise ConfigError(path, "is required", 'add `trialMemorySize: 8gb` (memory per trial container)')
    out.gpus = config.trial_gpu_number or 0
    out.docker_image = ts.str_("dockerImage", "image") or DEFAULT_IMAGE
    out.virtual_cluster = ts.str_("virtualCluster")
    reuse = ts.bool_("reuseMode")
    out.reuse_mode = True if reuse is None else reuse
    out.storage_config_name = ts.str_("storageConfigName", "paiStorageConfigName")
    local = ts.str_("localStorageMountPoint", "nniManagerNFSMountPath")
    out.container_storage_mount_point = ts.str_("containerStorageMountPoint", "containerNFSMountPath")
    if local is not None:
        out.local_storage_mount_point = Path(local).expanduser()
        if not out.local_storage_mount_point.is_dir():
            raise ConfigError(ts.at("localStorageMountPoint"), f"{local} is not an existing directory",
                              "mount the OpenPAI storage on this machine there, or remove the field "
                              "(no shared storage is needed: code and parameters travel over the agent stream)")
        if out.container_storage_mount_point is None:
            raise ConfigError(ts.at("containerStorageMountPoint"), "is required with localStorageMountPoint",
                              "give the same storage's path inside the job's containers, e.g. /mnt/confignfs")
    out.poll_interval, out.connect_timeout = parse_watch_fields(ts)
    if out.protocol is None and not config.trial_command:
        raise ConfigError("trialCommand", "is required",
                          "add `trialCommand: python3 trial.py`, or give your job protocol as `openpaiConfig`")
    return out


def _protocol(ts: ConfigSection) -> dict[str, Any] | None:
    inline, inline_path = ts.take("openpaiConfig")
    file = ts.path_("openpaiConfigFile", "paiConfigPath")
    if inline is not MISSING and file is not None:
        raise ConfigError(inline_path, "given together with openpaiConfigFile", "keep only one of them")
    if file is not None:
        inline_path = ts.at("openpaiConfigFile")
        inline = yaml_file(file, inline_path, "point it at your OpenPAI job YAML", "fix the job YAML")
    if inline is MISSING:
        return None
    if not isinstance(inline, dict):
        raise ConfigError(inline_path, "must be an OpenPAI job protocol (a mapping)", "see OpenPAI's job protocol v2")
    protocol = copy.deepcopy(inline)
    roles = protocol.get("taskRoles")
    if not isinstance(roles, dict) or not roles:
        raise ConfigError(f"{inline_path}.taskRoles", "is required and must map task role names to task roles",
                          "add `taskRoles: {worker: {instances: 1, commands: [...], ...}}`")
    for name, role in roles.items():
        where = f"{inline_path}.taskRoles.{name}"
        if not isinstance(name, str) or not _ROLE_NAME.fullmatch(name):
            raise ConfigError(where, f"{name!r} is not a task role name OpenPAI accepts",
                              "use letters, digits and underscores, not starting with a digit")
        if not isinstance(role, dict):
            raise ConfigError(where, "must be a mapping", "give instances, commands, resourcePerInstance, ...")
        commands = role.get("commands")
        if not isinstance(commands, list) or not commands or not all(isinstance(c, str) for c in commands):
            raise ConfigError(f"{where}.commands", "must be a non-empty list of shell commands",
                              "write the trial's command(s) for this role, e.g. [python3 train.py]")
        instances = role.get("instances", 1)
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ConfigError(f"{where}.instances", f"must be an integer >= 1, got {instances!r}", "e.g. `instances: 2`")
    return protocol
