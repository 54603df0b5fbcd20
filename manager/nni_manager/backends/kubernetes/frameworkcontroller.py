"""platform: frameworkcontroller — one Framework per environment (microsoft/frameworkcontroller).

Each task's pod runs an agent behind FrameworkController's barrier, whose injector script
exports the peers' addresses (FB_<ROLE>_IPS, FB_<ROLE>_ADDRESSES) before the agent starts,
so trials inherit them. The trial ends by each role's frameworkAttemptCompletionPolicy.
"""
from __future__ import annotations

from typing import Any

from nni_manager.backends.base import Completion, EnvironmentRequest, Role, Shape
from nni_manager.backends.kubernetes.common import KubeBackend
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
        ports = " ".join(f"FB_{r.name.upper().replace('-', '_')}_PORT={BASE_PORT + i}"
                         for i, r in enumerate(self.kube.roles))
        task_roles = []
        for i, role in enumerate(self.kube.roles):
            template = self.pod_template(role, env, meta, container="framework",
                                         command_prefix=f"{ports} . {BARRIER_DIR}/injector.sh")
            spec = template["spec"]
            spec["containers"][0]["ports"] = [{"containerPort": BASE_PORT + i}]
            spec["containers"][0]["volumeMounts"].append({"name": "frameworkbarrier-volume", "mountPath": BARRIER_DIR})
            spec["initContainers"] = [{"name": "frameworkbarrier", "image": BARRIER_IMAGE,
                                       "volumeMounts": [{"name": "frameworkbarrier-volume", "mountPath": BARRIER_DIR}]}]
            spec["volumes"].append({"name": "frameworkbarrier-volume", "emptyDir": {}})
            task_roles.append({
                "name": role.name,
                "taskNumber": role.replicas,
                "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": role.min_failed,
                                                     "minSucceededTaskCount": role.min_succeeded},
                "task": {"retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                         "podGracefulDeletionTimeoutSec": int(self.config.trial_grace_period) + 15,
                         "pod": template},
            })
        return {"apiVersion": "frameworkcontroller.microsoft.com/v1", "kind": "Framework", "metadata": meta,
                "spec": {"executionType": "Start", "retryPolicy": {"fancyRetryPolicy": False, "maxRetryCount": 0},
                         "taskRoles": task_roles}}
