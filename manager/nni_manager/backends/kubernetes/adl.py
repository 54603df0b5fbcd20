"""platform: adl — one AdaptDLJob per trial (AdaptDL on Kubernetes, petuum/adaptdl).

NNI's v1 configs run unchanged (`trainingServicePlatform: adl` with `trial.image`, `namespace`,
`checkpoint`, `nfs`, `imagePullSecrets`, `adaptive`, `cpuNum`, `memorySize`; v2 `platform: adl`
takes the same fields, and `storage` as on the other Kubernetes platforms). As in NNI, the code
is built into the image: `codeDir` is a folder *inside* it (the trial's working directory), and
each trial is its own AdaptDLJob (`nniexp<exp>trial<id>`), whose pods AdaptDL's scheduler makes.

The job's pod runs the agent (`--single-trial`), which starts the trial and dials the manager's
TLS hub; its token comes from the environment's Secret, as on the other Kubernetes platforms.
AdaptDL names pods `<job>-<uid>-<group>-<rank>`, which the manager cannot know beforehand, so the
agent's id is the job's name (set by the container command) and the job runs one replica
(`maxReplicas: 1`): the trial is one agent's process, as NNI's trial keeper was. `adaptive: true`
makes the job preemptible (AdaptDL may move it; a moved trial restarts from its checkpoint in a
new pod, which this manager sees as the trial's end). `checkpoint` is a PersistentVolumeClaim of
that class and size per job, mounted at /adaptdl/checkpoint (ADAPTDL_CHECKPOINT_PATH) and
/adaptdl/share (ADAPTDL_SHARE_PATH) as NNI mounted it, owned by the job so it goes with it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nni_manager.backends.base import EnvironmentRequest, Shape
from nni_manager.backends.jobs import Job, StateTable
from nni_manager.backends.kubernetes.client import api_error
from nni_manager.backends.kubernetes.common import KubeBackend
from nni_manager.backends.kubernetes.config import KubeConfig, RoleConfig, _common
from nni_manager.config import MISSING, ConfigError, ConfigSection, ExperimentConfig, parse_size_mb

GROUP, VERSION, PLURAL, KIND = "adaptdl.petuum.com", "v1", "adaptdljobs", "AdaptDLJob"
CHECKPOINT_DIR, SHARE_DIR = "/adaptdl/checkpoint", "/adaptdl/share"
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


@dataclass(repr=False)  # the redacted __repr__ of KubeConfig stays
class AdlConfig(KubeConfig):
    adaptive: bool = False
    checkpoint_class: str | None = None
    checkpoint_size: str = "1Gi"
    nfs: tuple[str, str, str] | None = None  # server, path, containerMountPath
    image_pull_secrets: list[str] = field(default_factory=list)


def parse_adl(ts: ConfigSection, config: ExperimentConfig) -> AdlConfig:
    kube = AdlConfig()
    nfs = ts.section("nfs")  # NNI's adl `nfs` (with containerMountPath), read before the common `storage`
    if nfs is not None:
        kube.nfs = (nfs.str_("server", required=True) or "", nfs.str_("path", required=True) or "",
                    nfs.str_("containerMountPath", required=True) or "")
        nfs.finish()
    reuse = ts.data.get("reuseMode")
    if reuse:
        raise ConfigError(ts.at("reuseMode"), "must be false on platform adl (each trial is its own AdaptDLJob)",
                          "remove reuseMode")
    _common(ts, kube)
    kube.reuse_mode = False
    role = RoleConfig(name="")
    role.docker_image = ts.str_("image", "dockerImage", required=True) or ""
    role.gpu_number = config.trial_gpu_number or 0
    cpus = ts.number("cpuNum", "cpuNumber", minimum=0.001)
    role.cpu_number = cpus if cpus is not None else 1
    memory, path = ts.take("memorySize", "memoryMB")
    role.memory_mb = parse_size_mb(memory, path) if memory is not MISSING else 1024
    kube.roles = [role]
    kube.adaptive = bool(ts.bool_("adaptive"))
    checkpoint = ts.section("checkpoint")
    if checkpoint is not None:
        kube.checkpoint_class = checkpoint.str_("storageClass", required=True)
        size = checkpoint.str_("storageSize", required=True) or ""
        if not _QUANTITY.match(size):
            raise ConfigError(checkpoint.at("storageSize"), f"is not a Kubernetes quantity: {size!r}",
                              "write e.g. storageSize: 1Gi")
        kube.checkpoint_size = size
        checkpoint.finish()
    secrets, secrets_at = ts.take("imagePullSecrets")
    if secrets is not MISSING:
        if not isinstance(secrets, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str)
                                                   and set(s) == {"name"} for s in secrets):
            raise ConfigError(secrets_at, "must be a list of {name: <secret>}",
                              "write e.g. `imagePullSecrets: [{name: my-registry}]`")
        kube.image_pull_secrets = [s["name"] for s in secrets]
    return kube


class AdlBackend(KubeBackend[AdlConfig]):
    platform = "adl"
    custom = (GROUP, VERSION, PLURAL, KIND)
    operator_name = "AdaptDL scheduler (helm chart adaptdl-sched)"
    # status.phase as the AdaptDL controller moves it (Stopping: a job being moved to other nodes)
    states = StateTable.of(waiting=["", "Pending", "Starting"], running=["Running", "Stopping"],
                           succeeded=["Succeeded"], failed=["Failed"])
    code_in_image = True
    ships_code = False

    options_type = AdlConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> AdlConfig:
        return parse_adl(section, config)

    @property
    def adl(self) -> AdlConfig:
        return self.opts

    def shape(self) -> Shape:
        return Shape()

    def pod_names(self, object_name: str) -> list[tuple[str, str, int]]:
        return [(object_name, "", 0)]  # the agent's id (AdaptDL names the pod itself)

    def agent_of_pod(self, pod: dict[str, Any]) -> str:
        return str(((pod.get("metadata") or {}).get("labels") or {}).get("adaptdl/job", ""))

    def main_object(self, env: EnvironmentRequest, name: str, meta: dict[str, Any]) -> dict[str, Any]:
        a = self.adl
        # the agent's id is the job's name: AdaptDL's pod names carry the job's uid and group
        pod = self.pod_template(a.roles[0], env, meta, container="main", command_prefix=f"export NNI_AGENT_ID={name}")
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        if a.checkpoint_class is not None:
            spec["volumes"].append({"name": "adaptdl-pvc", "persistentVolumeClaim": {"claimName": f"{name}-checkpoint"}})
            container["volumeMounts"] += [
                {"name": "adaptdl-pvc", "mountPath": CHECKPOINT_DIR, "subPath": "adaptdl/checkpoint"},
                {"name": "adaptdl-pvc", "mountPath": SHARE_DIR, "subPath": "adaptdl/share"}]
            container["env"] += [{"name": "ADAPTDL_CHECKPOINT_PATH", "value": CHECKPOINT_DIR},
                                 {"name": "ADAPTDL_SHARE_PATH", "value": SHARE_DIR}]
        if a.nfs is not None:
            server, path, mount = a.nfs
            spec["volumes"].append({"name": "nfs", "nfs": {"server": server, "path": path, "readOnly": False}})
            container["volumeMounts"].append({"name": "nfs", "mountPath": mount})
        if a.image_pull_secrets:
            spec["imagePullSecrets"] = spec.get("imagePullSecrets", []) + [{"name": n} for n in a.image_pull_secrets]
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": meta,
                "spec": {"preemptible": a.adaptive, "minReplicas": 0, "maxReplicas": 1, "template": pod}}

    async def submit(self, job: Job, request: list[dict[str, Any]]) -> None:
        await super().submit(job, request)
        if self.adl.checkpoint_class is None:
            return
        core, custom = await self._client()
        name = job.name
        made = await custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": name, "uid": made["metadata"]["uid"]}
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": f"{name}-checkpoint", "namespace": self.namespace,
                              "labels": made["metadata"].get("labels", {}), "ownerReferences": [owner]},
                 "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": self.adl.checkpoint_class,
                          "resources": {"requests": {"storage": self.adl.checkpoint_size}}}}
        try:
            await core.create_namespaced_persistent_volume_claim(self.namespace, claim, field_validation="Strict")
        except Exception as e:
            if getattr(e, "status", None) != 409:
                raise api_error(e, f"creating the checkpoint claim {name}-checkpoint") from None
