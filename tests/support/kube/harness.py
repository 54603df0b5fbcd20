"""Building NNI configs and training services against a Kubernetes emulator (tests/support/kube/fixtures.py).

Small and stable on purpose: shared by the platform tests (test_pods_platform.py,
test_operator_platforms.py). Everything goes through the backends' real code and the official client.

    cfg = config(kube, tmp_path, {"platform": "kubernetes", "dockerImage": IMAGE}, trialConcurrency=2)
    async with create_training_service(cfg) as ts: ...
"""
from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import yaml

from nni_manager.config import ExperimentConfig
from nni_manager.loader import load_config
from tests.support.images import SLIM_IMAGE  # noqa: F401 (re-exported: the system Python, no grpc / psutil)
from tests.support.kube.fixtures import namespace_of
from tests.support.manager.helpers import TRIAL

IMAGE = "nni-test/python:3.11"  # the venv's Python: has the agent's dependencies
APP = "nni-kubernetes-trial"


def code_dir(base: Path) -> Path:
    """A trial code directory holding `trial.py` (tests.support.manager.helpers.TRIAL)."""
    code = base / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "trial.py").write_text(TRIAL)
    return code


def config_dict(kube: Any, base: Path, training_service: dict[str, Any], **top: Any) -> dict[str, Any]:
    """An NNI v2 config dict: `kubeConfig` defaults to the emulator's; short grace period;
    `top` overrides top-level keys (trialConcurrency, maxTrialDuration, ...)."""
    ts = {"kubeConfig": str(kube.kubeconfig), **training_service}
    if getattr(kube, "namespace", None):  # a test's own namespace on a shared emulator (kube_ns)
        ts.setdefault("namespace", kube.namespace)
    out: dict[str, Any] = {
        # pods share the host network in the default emulator: the hub is reached directly (tests of
        # the tunnel through the API server pass nniManagerIp=None, on an isolated pod network)
        "nniManagerIp": "127.0.0.1",
        "trialCommand": "python trial.py",
        "trialCodeDirectory": str(code_dir(base)),
        "trialConcurrency": 1,
        "experimentWorkingDirectory": str(base / "exps"),
        "trialGracePeriod": 2,
        "trainingService": ts,
    }
    out.update(top)
    if out["nniManagerIp"] is None:
        del out["nniManagerIp"]
    return out


def config(kube: Any, base: Path, training_service: dict[str, Any], **top: Any) -> ExperimentConfig:
    return load_config(config_dict(kube, base, training_service, **top))


def pods_service(**extra: Any) -> dict[str, Any]:
    """`trainingService` of `platform: kubernetes` with small resources (extra keys override)."""
    return {"platform": "kubernetes", "dockerImage": IMAGE, "cpuNumber": 1, "memorySize": "512mb", **extra}


def kubeconfig_with_token(kube: Any, path: Path, token: str) -> Path:
    """A copy of the emulator's kubeconfig that authenticates with another bearer token."""
    data = yaml.safe_load(Path(kube.kubeconfig).read_text())
    data = copy.deepcopy(data)
    for user in data.get("users", []):
        user.setdefault("user", {})["token"] = token
    path.write_text(yaml.safe_dump(data))
    return path


def ours(experiment_id: str) -> str:
    """The label selector of everything an experiment created."""
    return f"app={APP},expId={experiment_id}"


def objects_of(kube: Any, experiment_id: str, namespace: str | None = None) -> dict[str, list[str]]:
    """Names of the experiment's pods, secrets and configmaps still in the namespace (the test's own)."""
    namespace = namespace or namespace_of(kube)
    core = kube.core()
    sel = ours(experiment_id)
    return {
        "pods": [p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=sel).items],
        "secrets": [s.metadata.name for s in core.list_namespaced_secret(namespace, label_selector=sel).items],
        "configmaps": [c.metadata.name for c in core.list_namespaced_config_map(namespace, label_selector=sel).items],
    }


def pod_json(kube: Any, namespace: str | None = None) -> list[dict[str, Any]]:
    """Every pod object the emulator holds in the namespace, as the API serves it."""
    namespace = namespace or namespace_of(kube)
    status, _, body = kube.raw("GET", f"/api/v1/namespaces/{namespace}/pods")
    assert status == 200, body
    return json.loads(body)["items"]


def secret_values(kube: Any, namespace: str | None = None) -> list[str]:
    """Decoded values of every Secret in the namespace (to look for tokens elsewhere)."""
    namespace = namespace or namespace_of(kube)
    out = []
    for s in kube.core().list_namespaced_secret(namespace).items:
        for v in (s.data or {}).values():
            out.append(base64.b64decode(v).decode(errors="replace"))
    return out
