"""platform: kubeflow — one TFJob or PyTorchJob per environment (Kubeflow training operator, Trainer
v1), or with `operator: trainer` one TrainJob on a ClusterTrainingRuntime (Kubeflow Trainer v2: trainjob.py).

Each replica's pod runs an agent; a trial starts its role's command on every replica, which
sees the environment the operator injected (TF_CONFIG; MASTER_ADDR, RANK, WORLD_SIZE). The
trial ends by the operator's own rule: the chief (else worker 0) for TFJob, the master for
PyTorchJob, every node for a TrainJob; a failed replica fails it.
"""
from __future__ import annotations

import math
from typing import Any

from nni_manager.backends.base import Completion, EnvironmentRequest, Role, Shape
from nni_manager.backends.jobs import Phase, StateTable
from nni_manager.backends.kubernetes import trainjob
from nni_manager.backends.kubernetes.common import KubeBackend
from nni_manager.backends.kubernetes.config import KubeflowConfig, parse_kubeflow
from nni_manager.config import ConfigSection, ExperimentConfig

_KINDS = {  # operator -> (kind, plural, replica specs field, container name)
    "tf-operator": ("TFJob", "tfjobs", "tfReplicaSpecs", "tensorflow"),
    "pytorch-operator": ("PyTorchJob", "pytorchjobs", "pytorchReplicaSpecs", "pytorch"),
}
_REPLICA_TYPES = {"worker": "Worker", "ps": "PS", "master": "Master", "chief": "Chief", "evaluator": "Evaluator"}


class KubeflowBackend(KubeBackend[KubeflowConfig]):
    platform = "kubeflow"
    trial_command_required = False  # each role has its command
    operator_name = "Kubeflow training operator"
    # the training operator's JobConditionType (pkg/apis/kubeflow.org/v1/common_types.go)
    states = StateTable.of(waiting=["", "Created"], running=["Running", "Restarting"], succeeded=["Succeeded"],
                           failed=["Failed"], stopped=["Suspended"])

    def __init__(self, config: ExperimentConfig) -> None:
        super().__init__(config)
        if self.trainer_v2:
            self.custom = trainjob.custom(self.kube.api_version)  # type: ignore[misc]
            self.operator_name = "Kubeflow Trainer"  # type: ignore[misc]
            return
        kind, plural, _, _ = _KINDS[self.kube.operator]
        self.custom = ("kubeflow.org", self.kube.api_version, plural, kind)  # type: ignore[misc]

    @property
    def trainer_v2(self) -> bool:
        return self.kube.operator == trainjob.OPERATOR

    options_type = KubeflowConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> KubeflowConfig:
        return parse_kubeflow(section, config)

    def shape(self) -> Shape:
        roles = tuple(Role(r.name, r.replicas, r.command) for r in self.kube.roles)
        names = {r.name for r in self.kube.roles}
        if self.trainer_v2:  # the JobSet completes when every node has
            return Shape(roles, Completion())
        if self.kube.operator == "pytorch-operator":
            decisive = ("master", 0)
        else:
            decisive = ("chief", 0) if "chief" in names else ("master", 0) if "master" in names else ("worker", 0)
        return Shape(roles, Completion(decisive=decisive))

    def state_of(self, obj: dict[str, Any]) -> str:
        """The newest true condition (the operator appends each update and sets Running false at the end)."""
        if self.trainer_v2:
            return trainjob.state_of(obj)
        conditions = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
        return str(conditions[-1].get("type", "")) if conditions else ""

    def object_phase(self, obj: dict[str, Any]) -> Phase:
        return (trainjob.STATES if self.trainer_v2 else self.states).phase(self.state_of(obj))

    def agent_of_pod(self, pod: dict[str, Any]) -> str:
        return trainjob.agent_of_pod(pod) if self.trainer_v2 else super().agent_of_pod(pod)

    async def _unserved(self, custom_api: Any) -> str:
        assert self.custom is not None
        group, version, _, kind = self.custom
        return await trainjob.unserved_line(custom_api, self.namespace, kind, (group, version))

    async def _prepare(self) -> None:
        if self.trainer_v2:  # the runtime exists (the Trainer's webhook would refuse every TrainJob)
            _, custom_api = await self._client()
            await trainjob.check_runtime(custom_api, self.kube.training_runtime, self.kube.api_version)
            role = self.kube.roles[0]  # and the pods' podSpec fits in a runtime patch: refused now, not per trial
            sample = self.pod_template(role, None, {"name": "x", "labels": {}}, container=trainjob.NODE)
            trainjob.main_object(sample, role.replicas, self.kube.training_runtime, self.kube.api_version, {})

    def pod_names(self, object_name: str) -> list[tuple[str, str, int]]:
        if self.trainer_v2:
            role = self.kube.roles[0]
            return [(trainjob.agent_id(object_name, i), role.name, i) for i in range(role.replicas)]
        return [(f"{object_name}-{r.name}-{i}", r.name, i) for r in self.kube.roles for i in range(r.replicas)]

    def main_object(self, env: EnvironmentRequest, name: str, meta: dict[str, Any]) -> dict[str, Any]:
        if self.trainer_v2:
            role = self.kube.roles[0]
            template = self.pod_template(role, env, meta, container=trainjob.NODE,
                                         command_prefix=trainjob.agent_prefix(name))
            return trainjob.main_object(template, role.replicas, self.kube.training_runtime, self.kube.api_version, meta)
        kind, _, field, container = _KINDS[self.kube.operator]
        specs = {}
        for role in self.kube.roles:
            specs[_REPLICA_TYPES[role.name]] = {
                "replicas": role.replicas,
                "restartPolicy": "Never",
                "template": self.pod_template(role, env, meta, container=container),
            }
        run_policy: dict[str, Any] = {"cleanPodPolicy": "All"}
        if self.kube.api_version == "v1":  # the v1 runPolicy has it (older APIs: not in this place)
            # the operator deletes a finished job (and its pods) this long after its end, also when
            # the manager died: by then its agents gave up and a manager back in time saw the end
            run_policy["ttlSecondsAfterFinished"] = max(1, math.ceil(self.reconnect_window))
        return {"apiVersion": f"kubeflow.org/{self.kube.api_version}", "kind": kind, "metadata": meta,
                "spec": {field: specs, "runPolicy": run_policy}}
