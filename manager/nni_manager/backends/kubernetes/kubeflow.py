"""platform: kubeflow — one TFJob or PyTorchJob per environment (Kubeflow training operator).

Each replica's pod runs an agent; a trial starts its role's command on every replica, which
sees the environment the operator injected (TF_CONFIG; MASTER_ADDR, RANK, WORLD_SIZE). The
trial ends by the operator's own rule: the chief (else worker 0) for TFJob, the master for
PyTorchJob; a failed replica fails it.
"""
from __future__ import annotations

import math
from typing import Any

from nni_manager.backends.base import Completion, EnvironmentRequest, Role, Shape
from nni_manager.backends.jobs import StateTable
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
        kind, plural, _, _ = _KINDS[self.kube.operator]
        self.custom = ("kubeflow.org", self.kube.api_version, plural, kind)  # type: ignore[misc]

    options_type = KubeflowConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> KubeflowConfig:
        return parse_kubeflow(section, config)

    def shape(self) -> Shape:
        roles = tuple(Role(r.name, r.replicas, r.command) for r in self.kube.roles)
        names = {r.name for r in self.kube.roles}
        if self.kube.operator == "pytorch-operator":
            decisive = ("master", 0)
        else:
            decisive = ("chief", 0) if "chief" in names else ("master", 0) if "master" in names else ("worker", 0)
        return Shape(roles, Completion(decisive=decisive))

    def state_of(self, obj: dict[str, Any]) -> str:
        """The newest true condition (the operator appends each update and sets Running false at the end)."""
        conditions = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
        return str(conditions[-1].get("type", "")) if conditions else ""

    def pod_names(self, object_name: str) -> list[tuple[str, str, int]]:
        return [(f"{object_name}-{r.name}-{i}", r.name, i) for r in self.kube.roles for i in range(r.replicas)]

    def main_object(self, env: EnvironmentRequest, name: str, meta: dict[str, Any]) -> dict[str, Any]:
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
