"""platform: frameworkcontroller — one Framework per environment (microsoft/frameworkcontroller).

Each task's pod runs an agent behind FrameworkController's barrier, whose injector script
exports the peers' addresses (FB_<ROLE>_IPS, FB_<ROLE>_ADDRESSES) before the agent starts,
so trials inherit them. The trial ends by each role's frameworkAttemptCompletionPolicy.
With NNI v1's `configPath`, each Framework is built from that template (framework_template.py).
"""
from __future__ import annotations

import copy
from typing import Any

from nni_manager.backends.base import Completion, EnvironmentRequest, Role, Shape
from nni_manager.backends.kubernetes import framework_template
from nni_manager.backends.kubernetes.common import KubeBackend, merge_pod_spec
from nni_manager.backends.kubernetes.config import KubeConfig, parse_frameworkcontroller
from nni_manager.config import ConfigSection, ExperimentConfig

BARRIER_IMAGE = "frameworkcontroller/frameworkbarrier"
BARRIER_DIR = "/mnt/frameworkbarrier"
BASE_PORT = 4000  # NNI gave role i containerPort 4000 + i


class FrameworkControllerBackend(KubeBackend):
    platform = "frameworkcontroller"
    trial_command_required = False
    custom = ("frameworkcontroller.microsoft.com", "v1", "frameworks", "Framework")
    operator_name = "FrameworkController"

    @classmethod
    def parse_config(cls, section: ConfigSection, config: ExperimentConfig) -> KubeConfig:
        return parse_frameworkcontroller(section, config)

    def shape(self) -> Shape:
        roles = tuple(Role(r.name, r.replicas, r.command) for r in self.kube.roles)
        return Shape(roles, Completion(min_failed={r.name: r.min_failed for r in self.kube.roles},
                                       min_succeeded={r.name: r.min_succeeded for r in self.kube.roles}))

    def object_state(self, obj: dict[str, Any]) -> str:
        state = (obj.get("status") or {}).get("state", "")
        if state in ("AttemptCompleted", "Completed"):
            return "done"
        return "pending" if state in ("", "AttemptCreationPending", "AttemptCreationRequested", "AttemptPreparing") else "running"

    def pod_names(self, object_name: str) -> list[tuple[str, str, int]]:
        return [(f"{object_name}-{r.name}-{i}", r.name, i) for r in self.kube.roles for i in range(r.replicas)]

    def main_object(self, env: EnvironmentRequest, name: str, meta: dict[str, Any]) -> dict[str, Any]:
        template = self.kube.framework_template
        numbers = [framework_template.port(template, i) if template else None for i in range(len(self.kube.roles))]
        numbers = [n or BASE_PORT + i for i, n in enumerate(numbers)]  # a template's own port, else NNI's 4000 + i
        ports = " ".join(f"FB_{r.name.upper()}_PORT={n}" for r, n in zip(self.kube.roles, numbers))
        prefix = f"{ports} . {BARRIER_DIR}/injector.sh"
        task_roles = []
        for i, role in enumerate(self.kube.roles):
            if template is None:
                pod = self.pod_template(role, env, meta, container="framework", command_prefix=prefix)
            else:
                raw = template["spec"]["taskRoles"][i]
                ours = self.pod_template(role, env, meta, container=framework_template.container_name(template, i),
                                         command_prefix=prefix)
                pod = framework_template.merge_pod(raw["task"]["pod"], ours, merge_pod_spec)
                pod["spec"] = merge_pod_spec(pod["spec"], copy.deepcopy(self.kube.pod_spec))  # podSpec wins
            _with_barrier(pod["spec"], numbers[i])
            task = {"retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                    "podGracefulDeletionTimeoutSec": int(self.config.trial_grace_period) + 15, "pod": pod}
            task_roles.append({
                "name": role.name,
                "taskNumber": role.replicas,
                "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": role.min_failed,
                                                     "minSucceededTaskCount": role.min_succeeded},
                "task": task,
            })
        spec: dict[str, Any] = {"executionType": "Start", "retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                                "taskRoles": task_roles}
        if template is not None:
            metadata = template.get("metadata") or {}
            meta = {**meta, "labels": {**(metadata.get("labels") or {}), **meta["labels"]}}
            if metadata.get("annotations"):
                meta["annotations"] = dict(metadata["annotations"])
        return {"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework", "metadata": meta,
                "spec": spec}


def _with_barrier(spec: dict[str, Any], port: int) -> None:
    """FrameworkController's barrier (an init container writing the peers' addresses, sourced
    before the agent starts), unless the pod (a template's) already has it; the role's port."""
    container = spec["containers"][0]
    container.setdefault("ports", [{"containerPort": port}])
    if not any(m.get("mountPath") == BARRIER_DIR for m in container.setdefault("volumeMounts", [])):
        container["volumeMounts"].append({"name": "frameworkbarrier-volume", "mountPath": BARRIER_DIR})
    inits = spec.setdefault("initContainers", [])
    if not any(str(c.get("image", "")).startswith(BARRIER_IMAGE) for c in inits):
        inits.append({"name": "frameworkbarrier", "image": BARRIER_IMAGE,
                      "volumeMounts": [{"name": "frameworkbarrier-volume", "mountPath": BARRIER_DIR}]})
    if not any(v.get("name") == "frameworkbarrier-volume" for v in spec["volumes"]):
        spec["volumes"].append({"name": "frameworkbarrier-volume", "emptyDir": {}})
