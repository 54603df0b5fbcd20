"""platform: kubernetes — one plain pod per environment, for clusters with no operator.

Ours, beyond NNI: `dockerImage`, `cpuNumber`, `memorySize`, `gpuNumber` (or trialGpuNumber),
`namespace`, and `podSpec` merged into the pod spec (node selectors, tolerations, volumes).
"""
from __future__ import annotations


from nni_manager.backends.base import EnvironmentRequest, Shape
from nni_manager.backends.kubernetes.common import KubeBackend
from nni_manager.backends.kubernetes.config import KubeConfig, parse_pods
from nni_manager.config import ConfigSection, ExperimentConfig


class PodsBackend(KubeBackend[KubeConfig]):
    platform = "kubernetes"

    options_type = KubeConfig

    @classmethod
    def parse_options(cls, section: ConfigSection, config: ExperimentConfig) -> KubeConfig:
        return parse_pods(section, config)

    def shape(self) -> Shape:
        return Shape()

    def pod_names(self, object_name: str) -> list[tuple[str, str, int]]:
        return [(object_name, "", 0)]

    def main_object(self, env: EnvironmentRequest, name: str, meta: dict[str, object]) -> dict[str, object]:
        template = self.pod_template(self.kube.roles[0], env, meta, container="trial")
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, **template["metadata"]},
                "spec": template["spec"]}
