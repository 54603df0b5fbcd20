"""Cluster-wide settings a test switches at run time (`PUT /emulator/v1/policy`): the policies a
real cluster's operator chooses and a user cannot see (feature gates, admission plugins, the
cluster autoscaler's node groups, how long images take to pull)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class NodeGroup:
    """A cluster autoscaler node group (an EKS managed node group / GKE node pool / AKS pool at
    minimum 0): nodes of one shape, added `delay` seconds after a pod no existing node fits."""
    name: str
    cpu: float
    memory_mi: int
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    max_nodes: int = 1
    delay: float = 1.0
    added: int = 0


@dataclass
class Policy:
    # kube-apiserver 1.35's AuthorizePodWebsocketUpgradeCreatePermission (beta, on): a WebSocket
    # upgrade of pods/exec|attach|portforward (an HTTP GET, authorized as `get`) also needs `create`
    websocket_create_check: bool = False
    # OpenShift's restricted-v2 SCC admission: UIDs and fsGroup from the namespace's annotations
    scc: bool = False
    # seconds the kubelet takes to pull each image (first pull on a node; then it is present)
    pull_seconds: dict[str, float] = field(default_factory=dict)
    node_groups: list[NodeGroup] = field(default_factory=list)

    def update(self, body: dict[str, Any]) -> None:
        if "websocketCreateCheck" in body:
            self.websocket_create_check = bool(body["websocketCreateCheck"])
        if "scc" in body:
            self.scc = bool(body["scc"])
        if "pullSeconds" in body:
            self.pull_seconds = {str(k): float(v) for k, v in (body["pullSeconds"] or {}).items()}
        if "nodeGroups" in body:
            self.node_groups = [NodeGroup(name=g["name"], cpu=float(g["cpu"]), memory_mi=int(g["memoryMi"]),
                                          gpus=int(g.get("gpus", 0)), labels=dict(g.get("labels") or {}),
                                          max_nodes=int(g.get("maxNodes", 1)), delay=float(g.get("delay", 1.0)))
                                for g in body["nodeGroups"] or []]
