"""Raw pod bodies and a phase wait for tests that drive the Kubernetes emulator directly."""
from __future__ import annotations

from tests.support.kube.fixtures import namespace_of

NS = "default"


IMG = "nni-test/python:3.11"


def pod_body(name, cmd, *, restart="Never", labels=None, **spec):
    c = {"name": "main", "image": spec.pop("image", IMG), "command": ["sh", "-c", cmd]}
    c.update(spec.pop("container", {}))
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": restart, "containers": [c], **spec}}


def wait_phase(kube, v1, name, phases=("Succeeded", "Failed"), timeout=20):
    return kube.wait_for(lambda: (lambda p: p if p.status.phase in phases else None)(
        v1.read_namespaced_pod(name, namespace_of(kube))), timeout, what=f"pod {name} in {phases}")
