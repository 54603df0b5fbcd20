"""Node sizes: a request no present node holds is said while its pod waits (an autoscaler may
add a node that does; otherwise the start deadline ends the wait)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nni_manager.backends.kubernetes.client import api_error
from nni_manager.backends.kubernetes.config import KubeConfig

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger(__name__)

RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


@dataclass
class Node:
    name: str
    labels: dict[str, str]
    sizes: dict[str, float]  # RESOURCES, allocatable (memory in bytes)


async def list_nodes(api: ApiClient) -> list[Node] | None:
    """Every node's allocatable resources; None where we may not list nodes (RBAC): no check then."""
    from kubernetes.aio import client
    from kubernetes.utils import parse_quantity

    try:
        listed = await client.CoreV1Api(api).list_node()
    except Exception as e:
        log.debug("requests are not checked against node sizes: %s", api_error(e, "listing nodes"))
        return None
    found = []
    for n in listed.items:
        alloc = (n.status.allocatable if n.status else None) or {}
        try:
            sizes = {k: float(parse_quantity(alloc.get(k, "0"))) for k in RESOURCES}
        except ValueError:
            continue
        if n.metadata is None or not n.metadata.name:  # the API server names every node
            continue
        found.append(Node(n.metadata.name, dict(n.metadata.labels or {}), sizes))
    return found


def too_big(kube: KubeConfig, nodes: list[Node]) -> str:
    """Why a role's pod fits none of these nodes (those matching its nodeSelector: trainingService's
    podSpec, then the role's), naming the request and the largest node; "" when every role fits one."""
    for role in kube.roles:
        wanted = {**(kube.pod_spec.get("nodeSelector") or {}), **(role.pod_spec.get("nodeSelector") or {})}
        candidates = [n for n in nodes if all(n.labels.get(k) == v for k, v in wanted.items())]
        req = {"cpu": float(role.cpu_number), "memory": float(role.memory_mb) * 2 ** 20,
               "nvidia.com/gpu": float(role.gpu_number)}
        if any(all(req[k] <= n.sizes[k] + 1e-9 for k in RESOURCES) for n in candidates):
            continue
        who = f"the pod of role {role.name}" if role.name else "the trial's pod"
        if not candidates:
            return (f"{who} fits no present node: none has the labels of podSpec.nodeSelector {wanted} "
                    "(waiting for a cluster autoscaler to add one, until environmentStartTimeout)")
        largest = max(candidates, key=lambda n: (sum(req[k] <= n.sizes[k] for k in RESOURCES),
                                                 n.sizes["nvidia.com/gpu"], n.sizes["cpu"], n.sizes["memory"]))
        return (f"{who} requests {_quantities(req)}, more than any present node holds: the largest, "
                f"{largest.name}, has {_quantities(largest.sizes)} allocatable (waiting for a cluster autoscaler "
                "to add a bigger node, until environmentStartTimeout; on a fixed-size cluster lower cpuNumber / "
                "memorySize / gpuNumber)")
    return ""


def _quantities(sizes: dict[str, float]) -> str:
    return ", ".join(f"{k} {v / 2 ** 20:g}Mi" if k == "memory" else f"{k} {v:g}" for k, v in sizes.items())
