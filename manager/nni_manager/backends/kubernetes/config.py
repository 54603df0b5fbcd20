"""The Kubernetes platforms' own config fields (NNI §9, v1 spellings too).

Shared by `kubernetes` (ours: one pod per environment), `kubeflow` (TFJob / PyTorchJob) and
`frameworkcontroller` (Framework): where the cluster is, the namespace, what each role's
container gets, reuseMode, and the optional storage NNI needed (mounted, never required).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nni_manager.config import MISSING, ConfigError, ConfigSection, ExperimentConfig, parse_size_mb, redacted_repr

DEFAULT_IMAGE = "msranni/nni:latest"

@dataclass
class RoleConfig:
    """One role's containers: NNI's KubeflowRoleConfig / FrameworkController task role."""

    name: str
    replicas: int = 1
    command: str = ""
    gpu_number: int = 0
    cpu_number: float = 1
    memory_mb: int = 1024
    docker_image: str = DEFAULT_IMAGE
    private_registry_auth_path: Path | None = None
    min_failed: int = 1  # FrameworkController's frameworkAttemptCompletionPolicy
    min_succeeded: int = -1


@dataclass
class Storage:
    kind: str  # "nfs" | "pvc" | "azureStorage"
    server: str = ""
    path: str = ""
    claim_name: str = ""


@dataclass
class KubeConfig:
    """Everything the Kubernetes backends read from `trainingService`."""

    namespace: str = "default"
    kube_config: Path | None = None  # default: $KUBECONFIG, ~/.kube/config, else in-cluster
    context: str | None = None
    reuse_mode: bool = True
    roles: list[RoleConfig] = field(default_factory=list)
    storage: Storage | None = None
    service_account_name: str | None = None
    pod_spec: dict[str, Any] = field(default_factory=dict)  # merged into every pod spec (ours)
    operator: str = ""  # kubeflow: tf-operator | pytorch-operator
    api_version: str = "v1"
    config_path: Path | None = None  # frameworkcontroller v1: a Framework template

    def __repr__(self) -> str:  # a podSpec env entry naming a secret (e.g. API_KEY) shows as ***
        return redacted_repr(self)


def _common(ts: ConfigSection, kube: KubeConfig) -> None:
    kube.namespace = ts.str_("namespace") or "default"
    kube.kube_config = ts.path_("kubeConfig", "kubeconfig")
    if kube.kube_config is not None and not kube.kube_config.is_file():
        raise ConfigError(ts.at("kubeConfig"), f"{kube.kube_config} does not exist",
                          "point it at your kubeconfig file, or remove it to use ~/.kube/config")
    kube.context = ts.str_("context", "kubeContext")
    reuse = ts.bool_("reuseMode")
    kube.reuse_mode = True if reuse is None else reuse
    kube.service_account_name = ts.str_("serviceAccountName")
    kube.storage = _storage(ts)
    for ignored in ("uploadRetryCount", "keyVault", "azureStorage"):  # Azure file shares: not needed here
        ts.take(ignored)


def _storage(ts: ConfigSection) -> Storage | None:
    """`storage` (v2), or v1's `storage: nfs` with `nfs: {server, path}`: mounted where NNI
    mounted it, for trials that write outputs there; code never needs it."""
    nfs_v1 = ts.section("nfs")
    value, path = ts.take("storage")
    if value is MISSING:
        return None
    if isinstance(value, str):
        kind, section = value, nfs_v1
    elif isinstance(value, dict):
        section = ConfigSection(value, path, ts.base)
        kind = section.str_("storageType", required=True) or ""
    else:
        raise ConfigError(path, "must be a mapping", "write `storage: {storageType: nfs, server: ..., path: ...}`")
    kinds = {"nfs": "nfs", "pvc": "pvc", "azurestorage": "azureStorage"}
    if kind.lower() not in kinds:
        raise ConfigError(f"{path}.storageType", f"unknown storage type {kind!r}", "use nfs, pvc or azureStorage")
    storage = Storage(kinds[kind.lower()])
    if section is not None:
        if storage.kind == "nfs":
            storage.server = section.str_("server", required=True) or ""
            storage.path = section.str_("path", required=True) or ""
        elif storage.kind == "pvc":
            storage.claim_name = section.str_("claimName", "path", required=True) or ""
        section.rest()  # azureStorage: azureAccount, azureShare, keyVaultName, keyVaultKey (not mounted)
    elif storage.kind == "nfs":
        raise ConfigError(ts.at("nfs"), "is required with `storage: nfs`", "add `nfs: {server: ..., path: ...}`")
    return storage


def parse_role(section: ConfigSection, name: str, *, command_required: bool = True,
               default_gpus: int | None = None) -> RoleConfig:
    """A role section; v1 keys (cpuNum, memoryMB, gpuNum, image, taskNum) accepted."""
    role = RoleConfig(name=name)
    role.replicas = section.int_("replicas", "taskNumber", "taskNum", minimum=1) or 1
    command = section.str_("command", required=command_required)
    role.command = command or ""
    gpus = section.int_("gpuNumber", "gpuNum", minimum=0)
    role.gpu_number = gpus if gpus is not None else (default_gpus or 0)
    cpus = section.number("cpuNumber", "cpuNum", minimum=0.001)
    role.cpu_number = cpus if cpus is not None else 1
    memory, path = section.take("memorySize", "memoryMB")
    if memory is not MISSING:
        role.memory_mb = parse_size_mb(memory, path)
    role.docker_image = section.str_("dockerImage", "image") or DEFAULT_IMAGE
    role.private_registry_auth_path = section.path_("privateRegistryAuthPath")
    if role.private_registry_auth_path is not None and not role.private_registry_auth_path.is_file():
        raise ConfigError(section.at("privateRegistryAuthPath"), f"{role.private_registry_auth_path} does not exist",
                          "point it at a docker config.json holding the registry's credentials")
    policy = section.section("frameworkAttemptCompletionPolicy")
    if policy is not None:
        role.min_failed = policy.int_("minFailedTaskCount", minimum=-1, required=True) or 0
        succeeded = policy.int_("minSucceedTaskCount", "minSucceededTaskCount", minimum=-1, required=True)
        role.min_succeeded = -1 if succeeded is None else succeeded
        policy.finish()
    return role


def parse_pods(ts: ConfigSection, config: ExperimentConfig) -> KubeConfig:
    """platform: kubernetes — one pod per environment."""
    kube = KubeConfig()
    _common(ts, kube)
    role = parse_role(ts, "", command_required=False, default_gpus=config.trial_gpu_number)
    role.command = ""  # trialCommand
    kube.roles = [role]
    spec = ts.mapping("podSpec")
    kube.pod_spec = spec or {}
    return kube


def parse_kubeflow(ts: ConfigSection, config: ExperimentConfig) -> KubeConfig:
    kube = KubeConfig()
    _common(ts, kube)
    kube.operator = ts.choice("operator", options=("tf-operator", "pytorch-operator"), required=True) or ""
    kube.api_version = ts.str_("apiVersion", required=True) or "v1"
    names = ("worker", "ps") if kube.operator == "tf-operator" else ("master", "worker")
    code_dirs: dict[Path, str] = {}
    for name in ("worker", "ps", "master", "chief", "evaluator"):
        section = ts.section(name)
        if section is None:
            continue
        if name not in names:
            raise ConfigError(section.path, f"is not a role of {kube.operator}",
                              f"use {' / '.join(names)} with {kube.operator}")
        code = section.path_("codeDirectory", "codeDir")  # NNI's per-role code: shipped over the agent stream
        if code is not None:
            code_dirs[code] = section.at("codeDirectory")
        kube.roles.append(parse_role(section, name, default_gpus=None))
        section.finish()
    if not kube.roles:
        raise ConfigError(ts.at(names[0]), f"is required: {kube.operator} needs at least a {names[0]} role",
                          f"add `{names[0]}: {{replicas: 1, command: python3 train.py, cpuNumber: 1, memorySize: 2gb}}`")
    if kube.operator == "pytorch-operator" and not any(r.name == "master" for r in kube.roles):
        raise ConfigError(ts.at("master"), "is required with pytorch-operator", "add a `master` role with replicas: 1")
    if len(code_dirs) > 1:
        raise ConfigError(list(code_dirs.values())[-1], "differs between roles",
                          "give every role the same codeDirectory (the trial's code is shipped once)")
    for code, field_path in code_dirs.items():  # NNI's roles name the code: it is the trial code directory
        if not code.is_dir():
            raise ConfigError(field_path, f"{code} is not an existing directory",
                              "point it at the folder holding your trial code")
        config.trial_code_directory = code
    return kube


def parse_frameworkcontroller(ts: ConfigSection, config: ExperimentConfig) -> KubeConfig:
    kube = KubeConfig()
    _common(ts, kube)
    kube.config_path = ts.path_("configPath")
    roles = ts.items("taskRoles", required=True, fix="add `taskRoles: [{name: worker, taskNumber: 1, command: ..., "
                                                      "cpuNumber: 1, memorySize: 2gb, gpuNumber: 0}]`")
    assert roles is not None
    seen: set[str] = set()
    for section in roles:
        name = section.str_("name", required=True) or ""
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) or name in seen:
            raise ConfigError(section.at("name"), f"{name!r} must be a unique lowercase DNS label",
                              "use lowercase letters, digits and '-', e.g. `worker`")
        seen.add(name)
        kube.roles.append(parse_role(section, name))
        section.finish()
    return kube
