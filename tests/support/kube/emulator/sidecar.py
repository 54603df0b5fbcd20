"""Istio's sidecar injector, a mutating admission webhook (`istio-sidecar-injector`,
`pkg/kube/inject`): a pod created in a namespace labelled `istio-injection=enabled` gets an
`istio-proxy` container (Envoy: it runs until the pod is deleted, so a pod whose own containers
have ended stays Running) and the `sidecar.istio.io/status` annotation, unless the pod opts out
with the label or annotation `sidecar.istio.io/inject: "false"`. Mutating admission runs before
validation and the validating plug-ins (Pod Security, quota) see the injected container too.
The proxy's image is the emulator's `--sidecar-image` (an image it can run; real clusters pull
istio/proxyv2)."""
from __future__ import annotations

import json

LABEL = "istio-injection"
OPT = "sidecar.istio.io/inject"
STATUS = "sidecar.istio.io/status"
NAME = "istio-proxy"
# Envoy stand-in: serves nothing, ends only when killed (pilot-agent waits for the pod's deletion)
PROXY = "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(3600)\n"


def inject(namespace: dict | None, pod: dict, image: str | None) -> None:
    """Add the sidecar to `pod` (in place) when its namespace asks for injection and it does not opt out."""
    if image is None or namespace is None:
        return
    if ((namespace.get("metadata") or {}).get("labels") or {}).get(LABEL) != "enabled":
        return
    md = pod.setdefault("metadata", {})
    for where in (md.get("labels") or {}, md.get("annotations") or {}):
        if str(where.get(OPT, "")).lower() == "false":
            return
    spec = pod.setdefault("spec", {})
    if any(c.get("name") == NAME for c in spec.get("containers") or []):
        return
    spec.setdefault("containers", []).append({
        "name": NAME, "image": image, "command": ["python3", "-c", PROXY],
        "ports": [{"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "10m", "memory": "40Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 1337,
                            "runAsGroup": 1337, "capabilities": {"drop": ["ALL"]}, "privileged": False,
                            "readOnlyRootFilesystem": True},
    })
    md.setdefault("annotations", {})[STATUS] = json.dumps({"containers": [NAME], "initContainers": []})
