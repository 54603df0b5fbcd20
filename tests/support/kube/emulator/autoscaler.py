"""The cluster autoscaler (kubernetes/autoscaler's cluster-autoscaler) over the node groups of the
policy (policy.NodeGroup): for a pod the scheduler cannot place, a node group whose node template
would hold it grows by one node after the group's delay (`TriggeredScaleUp` on the pod, as
`pod triggered scale-up: [{group 0->1 (max: 3)}]`); when no group can help, `NotTriggerScaleUp`
with each group's reason (`pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu, 1 max node
group size reached`). Both are Normal events from `cluster-autoscaler`. Without node groups there
is no autoscaler and no event, as on a fixed-size cluster."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from .policy import NodeGroup

SOURCE = "cluster-autoscaler"


def _group_rejects(group: NodeGroup, pod: dict, req: dict[str, float]) -> str:
    """Why a new node of `group` would not hold the pod ("" when it would)."""
    if group.added >= group.max_nodes:
        return "max node group size reached"
    sel = pod["spec"].get("nodeSelector") or {}
    if any(group.labels.get(k) != v for k, v in sel.items()):
        return "node(s) didn't match Node's node affinity/selector"
    size = {"cpu": group.cpu, "memory": float(group.memory_mi) * 2 ** 20, "nvidia.com/gpu": float(group.gpus)}
    for k in sorted(req):
        if req[k] > size.get(k, 0.0) + 1e-9:
            return f"Insufficient {k}"
    return ""


class Autoscaler:
    def __init__(self, store: Any, add_node: Callable[[NodeGroup, str], None]):
        self.store, self.add_node = store, add_node
        self.waiting: set[str] = set()  # uids of pods a node is on its way for

    def unschedulable(self, pod: dict, requests: dict[str, float]) -> None:
        groups = self.store.policy.node_groups
        uid = pod["metadata"]["uid"]
        if not groups or uid in self.waiting:
            return
        req = {k: v for k, v in requests.items() if v > 0}
        rejects: dict[str, int] = {}
        for g in groups:
            why = _group_rejects(g, pod, req)
            if not why:
                before = g.added
                g.added += 1
                name = f"{g.name}-{before}"
                self.waiting.add(uid)
                self.store.record_event(pod, "TriggeredScaleUp",
                                        f"pod triggered scale-up: [{{{g.name} {before}->{g.added} (max: {g.max_nodes})}}]",
                                        "Normal", SOURCE)

                def up(g: NodeGroup = g, name: str = name) -> None:
                    self.waiting.discard(uid)
                    self.add_node(g, name)
                asyncio.get_running_loop().call_later(g.delay, up)
                return
            rejects[why] = rejects.get(why, 0) + 1
        parts = ", ".join(f"{n} {why}" for why, n in sorted(rejects.items()))
        self.store.record_event(pod, "NotTriggerScaleUp", f"pod didn't trigger scale-up: {parts}", "Normal", SOURCE)

