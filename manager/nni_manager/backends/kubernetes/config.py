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

from nni_manager.backends.jobs import parse_watch_fields
from nni_manager.backends.kubernetes import framework_template
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
    pod_spec: dict[str, Any] = field(default_factory=dict)  # this role's podSpec, merged after trainingService's


@dataclass
class Storage:
    kind: str  # "nfs" | "pvc" | "azureStorage"
    server: str = ""
    path: str = ""  # nfs: the export; v1 pvc: where the Framework template mounts its claim
    claim_name: str = ""  # pvc: mounted at /tmp/mount (none for v1's `pvc: {path}`: the template mounts it)


@dataclass
class KubeConfig:
    """Everything the Kubernetes backends read from `trainingService`."""

    namespace: str = "default"  # else the kubeconfig context's, or in a cluster the pod's own
    namespace_given: bool = field(default=False, compare=False)  # bookkeeping: was `namespace` written? (not an option)
    kube_config: Path | None = None  # default: $KUBECONFIG, ~/.kube/config, else in-cluster
    context: str | None = None
    reuse_mode: bool = True
    roles: list[RoleConfig] = field(default_factory=list)
    storage: Storage | None = None
    service_account_name: str | None = None
    pod_spec: dict[str, Any] = field(default_factory=dict)  # merged into every pod spec (ours)
    pod_annotations: dict[str, str] = field(default_factory=dict)  # on every pod (ours)
    environment_start_timeout: float = 600.0  # an environment none of whose pods runs by then fails
    poll_interval: float | None = None  # pollInterval: how often the objects are listed (jobs.py)
    connect_timeout: float | None = None  # agentConnectTimeout: a running job whose agents never dial fails

    def __repr__(self) -> str:  # a podSpec env entry naming a secret (e.g. API_KEY) shows as ***
        return redacted_repr(self)


# Each platform's own fields in its own class (repr=False: the redacted __repr__ above stays).
@dataclass(repr=False)
class KubeflowConfig(KubeConfig):
    """platform: kubeflow."""

    operator: str = ""  # tf-operator | pytorch-operator | trainer (Kubeflow Trainer v2: trainjob.py)
    api_version: str = "v1"
    training_runtime: str = "torch-distributed"  # trainer: the ClusterTrainingRuntime its TrainJobs reference


@dataclass(repr=False)
class FrameworkConfig(KubeConfig):
    """platform: frameworkcontroller."""

    config_path: Path | None = None  # v1: a Framework template
    framework_template: dict[str, Any] | None = None  # its content, read at load


def _common(ts: ConfigSection, kube: KubeConfig) -> None:
    namespace = ts.str_("namespace")
    kube.namespace, kube.namespace_given = namespace or "default", bool(namespace)
    kube.kube_config = ts.path_("kubeConfig", "kubeconfig")
    if kube.kube_config is not None and not kube.kube_config.is_file():
        raise ConfigError(ts.at("kubeConfig"), f"{kube.kube_config} does not exist",
                          "point it at your kubeconfig file, or remove it to use ~/.kube/config")
    kube.context = ts.str_("context", "kubeContext")
    reuse = ts.bool_("reuseMode")
    kube.reuse_mode = True if reuse is None else reuse
    kube.service_account_name = ts.str_("serviceAccountName")
    kube.poll_interval, kube.connect_timeout = parse_watch_fields(ts)
    start_timeout = ts.duration("environmentStartTimeout")
    if start_timeout is not None:
        kube.environment_start_timeout = start_timeout
    kube.storage = _storage(ts)
    _pod_overrides(ts, kube)
    for ignored in ("uploadRetryCount", "keyVault", "azureStorage"):  # Azure file shares: not needed here
        ts.take(ignored)


def _pod_overrides(ts: ConfigSection, kube: KubeConfig) -> None:
    """Ours, on every platform of the family (NNI has none): `podSpec` merged into every pod's spec
    (tolerations for tainted GPU pools, securityContext for restricted namespaces, volumes) and
    `podAnnotations` on every pod (e.g. `sidecar.istio.io/inject: "false"` in Kubeflow profiles)."""
    kube.pod_spec = ts.mapping("podSpec") or {}
    annotations = ts.mapping("podAnnotations") or {}
    for key, value in annotations.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"{ts.at('podAnnotations')}.{key}",
                              f"must be a string, got {type(value).__name__} {value!r}", f'quote it: `{key}: "{str(value).lower() if isinstance(value, bool) else value}"` '
                              "(Kubernetes annotation values are strings)")
    kube.pod_annotations = dict(annotations)


def _storage(ts: ConfigSection) -> Storage | None:
    """`storage` (v2), or v1's `storage: nfs` with `nfs: {server, path}`: mounted where NNI
    mounted it, for trials that write outputs there; code never needs it."""
    nfs_v1, pvc_v1 = ts.section("nfs"), ts.section("pvc")
    value, path = ts.take("storage")
    v1_pvc = isinstance(value, str) and value.lower() == "pvc"
    if pvc_v1 is not None and not v1_pvc:
        raise ConfigError(pvc_v1.path, "is only read with v1's `storage: pvc`",
                          "remove it, or write `storage: pvc` (v2: `storage: {storageType: pvc, claimName: ...}`)")
    if value is MISSING:
        return None
    if isinstance(value, str):
        kind, section = value, pvc_v1 if v1_pvc else nfs_v1
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
        elif storage.kind == "pvc" and section is pvc_v1:  # v1 `pvc: {path}`: where the template mounts it
            storage.path = section.str_("path") or ""
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
    if name:  # a role of an operator platform (the plain-pods platform's podSpec is trainingService's own)
        role.pod_spec = section.mapping("podSpec") or {}
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
    return kube


def parse_kubeflow(ts: ConfigSection, config: ExperimentConfig) -> KubeflowConfig:
    kube = KubeflowConfig()
    _common(ts, kube)
    kube.operator = ts.choice("operator", options=("tf-operator", "pytorch-operator", "trainer"), required=True) or ""
    if kube.operator == "trainer":  # Kubeflow Trainer v2: TrainJobs on a ClusterTrainingRuntime, one role of nodes
        kube.api_version = ts.str_("apiVersion") or "v1alpha1"
        kube.training_runtime = ts.str_("trainingRuntime") or kube.training_runtime
    else:
        kube.api_version = ts.str_("apiVersion", required=True) or "v1"
    names = {"tf-operator": ("worker", "ps"), "trainer": ("worker",)}.get(kube.operator, ("master", "worker"))
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
        role = parse_role(section, name, default_gpus=None)
        if kube.operator == "pytorch-operator" and name == "master" and role.replicas != 1:
            # the training operator's validation: "There must be only 1 master replica"
            raise ConfigError(section.at("replicas"), f"is {role.replicas}: a PyTorchJob has exactly 1 master "
                              "replica (the operator refuses any other number)",
                              "set `master.replicas: 1` and put the other replicas under `worker`")
        kube.roles.append(role)
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


# FrameworkController's CRD (pkg/apis/frameworkcontroller/v1/crd.go): taskRoles[].name; the API
# server answers 422 for anything else, so '-' (a valid DNS label) is refused at load instead.
TASK_ROLE_NAME = r"^[a-z0-9]{1,63}$"


def check_task_role_name(name: str, field_path: str, seen: set[str]) -> None:
    """A FrameworkController task role name the CRD accepts, unique within the Framework."""
    if not re.fullmatch(TASK_ROLE_NAME, name):
        suggestion = re.sub(r"[^a-z0-9]", "", name.lower())[:63] or "worker"
        raise ConfigError(field_path, f"{name!r} does not match FrameworkController's rule {TASK_ROLE_NAME} "
                          "(1-63 lowercase letters and digits; no '-', '_' or capitals): the cluster would "
                          "refuse every Framework (422)", f"rename it, e.g. `name: {suggestion}`")
    if name in seen:
        raise ConfigError(field_path, f"{name!r} is used twice: task role names must be unique",
                          "give each task role its own name")


def _template_roles(ts: ConfigSection, kube: FrameworkConfig) -> None:
    """v1's `configPath`: the task roles are the template's (NNI ignores `taskRoles` then)."""
    assert kube.config_path is not None
    field_path = ts.at("configPath")
    if ts.items("taskRoles") is not None:
        raise ConfigError(ts.at("taskRoles"), "cannot be given with configPath: the task roles come from the template",
                          "remove taskRoles, or remove configPath and describe the roles here")
    kube.framework_template = framework_template.load(kube.config_path, field_path)
    seen: set[str] = set()
    for i, raw in enumerate(kube.framework_template["spec"]["taskRoles"]):
        fields = framework_template.role_fields(raw)
        check_task_role_name(fields["name"], f"{field_path} ({kube.config_path}: spec.taskRoles[{i}].name)", seen)
        seen.add(fields["name"])
        kube.roles.append(RoleConfig(**fields))


def parse_frameworkcontroller(ts: ConfigSection, config: ExperimentConfig) -> FrameworkConfig:
    kube = FrameworkConfig()
    _common(ts, kube)
    kube.config_path = ts.path_("configPath")
    if kube.config_path is not None:
        _template_roles(ts, kube)
        return kube
    roles = ts.items("taskRoles", required=True, fix="add `taskRoles: [{name: worker, taskNumber: 1, command: ..., "
                                                      "cpuNumber: 1, memorySize: 2gb, gpuNumber: 0}]`")
    assert roles is not None
    seen: set[str] = set()
    for section in roles:
        name = section.str_("name", required=True) or ""
        check_task_role_name(name, section.at("name"), seen)
        seen.add(name)
        kube.roles.append(parse_role(section, name))
        section.finish()
    return kube
