"""What a user adds to the pods: `podSpec` (node selectors, tolerations, volumes, extra env on
the trial container) and `privateRegistryAuthPath` (an image pull Secret), on a real run."""
from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

from nni_manager.service import create_training_service
from tests.support.kube.harness import config, ours, pods_service
from tests.support.manager.helpers import form, wait_status


def test_pod_spec_overrides_and_private_registry(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(nodes=["gpu-node=4,8192,0"])
    kube.set_node("gpu-node", labels={"pool": "tuning"})
    auth = tmp_path / "docker-config.json"
    auth.write_text(json.dumps({"auths": {"registry.example": {"auth": base64.b64encode(b"u:p").decode()}}}))
    pod_spec = {
        "nodeSelector": {"pool": "tuning"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "nni", "effect": "NoSchedule"}],
        "volumes": [{"name": "datasets", "emptyDir": {}}],
        "containers": [{"name": "trial", "env": [{"name": "FROM_POD_SPEC", "value": "yes"}],
                        "volumeMounts": [{"name": "datasets", "mountPath": "/var/run/datasets"}]}],
    }
    cfg = config(kube, tmp_path, pods_service(podSpec=pod_spec, privateRegistryAuthPath=str(auth), reuseMode=True))
    core = kube.core()

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=3))
            await wait_status(ts, job.id, "SUCCEEDED", timeout=90)
            (pod,) = core.list_namespaced_pod("default", label_selector=ours(ts.experiment_id)).items
            spec = pod.spec
            assert spec.node_selector == {"pool": "tuning"} and spec.node_name == "gpu-node"
            assert "dedicated" in [t.key for t in spec.tolerations or []]  # (beside the defaults the API server adds)
            (container,) = spec.containers
            env = {e.name: e.value for e in container.env}
            assert env["FROM_POD_SPEC"] == "yes" and "NNI_AGENT_ID" in env  # merged, not replaced
            mounts = {m.mount_path for m in container.volume_mounts}
            assert {"/var/run/datasets", "/var/run/nni/secret", "/var/run/nni/work"} <= mounts
            (pull,) = spec.image_pull_secrets
            secret = core.read_namespaced_secret(pull.name, "default")
            assert secret.type == "kubernetes.io/dockerconfigjson"
            assert json.loads(base64.b64decode(secret.data[".dockerconfigjson"])) == json.loads(auth.read_text())

    asyncio.run(body())
    assert not core.list_namespaced_secret("default", label_selector="app=nni-kubernetes-trial").items  # cleaned up
